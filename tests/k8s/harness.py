"""What tests under tests/k8s get from the ``kube`` fixture, and waiting helpers.

``Kube`` bundles the running control plane and process kubelet: the kubeconfig
path, server URL and admin token, a small sync client (``rest``), factories for
kubernetes_asyncio clients, and the kubelet's pod helpers (logs, pids, signals).
``wait_for`` / ``wait_for_async`` poll an API read at a short interval until it
returns something truthy (API state has no event a test could await more
simply). Fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio import client

from .cluster import ControlPlane
from .kubelet import ProcessKubelet, api_configuration
from .rest import Rest

T = TypeVar("T")
POLL_SECONDS = 0.1
# A tiny CRD of the harness's own (not in crds/): the ``widget_crd`` fixture installs it.
WIDGET_GROUP = "harness.test.treadle.dev"
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{WIDGET_GROUP}"},
    "spec": {
        "group": WIDGET_GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "required": ["size"],
                         "properties": {"size": {"type": "integer", "minimum": 1}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }}},
        }],
    },
}  # fmt: skip


@dataclass(frozen=True)
class Kube:
    control_plane: ControlPlane
    kubelet: ProcessKubelet

    @property
    def kubeconfig(self) -> Path:
        """A token kubeconfig (context ``treadle-test``, namespace ``default``)."""
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    @property
    def token(self) -> str:
        return self.control_plane.token

    @property
    def rest(self) -> Rest:
        return self.control_plane.rest

    @property
    def node_name(self) -> str:
        return self.kubelet.node_name

    def environ(self) -> dict[str, str]:
        """What a child process (kopf, kubectl) needs to reach this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def configuration(self) -> client.Configuration:
        return api_configuration(self.server, self.token)

    def api_client(self) -> client.ApiClient:
        """A kubernetes_asyncio client for the calling loop; use ``async with``."""
        return client.ApiClient(self.configuration())

    def pod_log(self, name: str, namespace: str = "default", stream: str = "stdout") -> str:
        return self.kubelet.pod_log(name, namespace, stream)

    def logs_tail(self, namespace: str, limit: int = 2000) -> str:
        """The end of each Pod's stdout and stderr in ``namespace`` (for failure messages)."""
        return self.kubelet.logs_tail(namespace, limit)

    def pod_pid(self, name: str, namespace: str = "default") -> int | None:
        return self.kubelet.pod_pid(name, namespace)

    def kill_pod_process(self, name: str, sig: int, namespace: str = "default") -> int:
        return self.kubelet.kill_pod_process(name, sig, namespace)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, object]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        items: list[dict[str, object]] = self.rest.get(
            f"/api/v1/namespaces/{namespace}/pods{query}"
        )["items"]
        return items


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "the condition") -> T:
    """Calls ``predicate`` every 0.1 s until its result is truthy; returns that result."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f} s (last: {result!r})")
        time.sleep(POLL_SECONDS)


async def wait_for_async(
    predicate: Callable[[], Awaitable[T]], timeout: float = 30.0, what: str = "the condition"
) -> T:
    """``wait_for`` for a coroutine predicate (say a kubernetes_asyncio read)."""
    deadline = time.monotonic() + timeout
    while True:
        result = await predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f} s (last: {result!r})")
        await asyncio.sleep(POLL_SECONDS)
