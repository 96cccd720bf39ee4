"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Several operator processes (the chart's ``operator.replicas: 2``, a rollout's
overlap, a partitioned node's pod) may run at once; only the one holding the Lease
runs kopf's handlers (``main.run``). The rules are client-go's:

- ``acquire`` tries every ``retry_period`` (with jitter) to take the Lease. It may
  when the Lease does not exist, names no holder, or its record has not changed for
  ``lease_duration`` *as observed here* (local monotonic time since this process
  last saw the record change, so clock skew between nodes does not matter).
- The holder renews every ``retry_period``; a renewal not done within
  ``renew_deadline`` (shorter than ``lease_duration``) means leadership is lost:
  ``hold`` returns and the operator stops, before any standby may take over.
- Every write is a ``replace`` carrying the ``resourceVersion`` read: of two
  candidates writing at once, one wins and the other gets 409 and stays a standby.
- ``release`` (on a clean stop) empties the holder, so a standby takes over at its
  next try instead of after ``lease_duration``.

Identity: ``POD_NAME`` (the chart sets it from the downward API), else
``hostname-pid``. Called by ``main``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from treadle_operator.errors import NotConfigured

log = logging.getLogger("treadle.operator.leader")

JITTER = 1.2  # client-go's JitterFactor: tries are retry_period * (1 .. 1 + JITTER) apart
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period * JITTER:
            raise NotConfigured(
                "leader election needs leaseDuration > renewDeadline > 1.2 x retryPeriod, got "
                f"{self.lease_duration} s, {self.renew_deadline} s, {self.retry_period} s"
            )


def identity() -> str:
    """This process's name in the Lease: the Pod's name, else hostname and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def lease_namespace(configured: str) -> str | None:
    """Where the Lease lives: the setting, the Pod's namespace, the service account's."""
    if configured:
        return configured
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError:
        return None


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: client.ApiClient, config: LeaseConfig) -> None:
        self.config = config
        self._leases = client.CoordinationV1Api(api)
        self._observed: tuple[Any, ...] | None = None  # the record as last read
        self._observed_at = 0.0  # monotonic time it last changed
        self.leading = False

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until this process holds the Lease (``False`` if ``stop`` is set first)."""
        waiting_logged = False
        while stop is None or not stop.is_set():
            try:
                taken = await self._try()
            except ApiException as exc:
                if exc.status in (401, 403):
                    raise NotConfigured(
                        f"the operator may not read or write its leader Lease "
                        f"{self.config.namespace}/{self.config.name} ({exc.status} {exc.reason}): "
                        "grant permissions.leader_rules (the chart's leader Role), or set "
                        "TREADLE_OPERATOR_LEADER_ELECTION=false and run one process only"
                    ) from None
                log.warning("reading the Lease failed (retried): %s", exc)
                taken = False
            except OSError as exc:
                log.warning("reading the Lease failed (retried): %s", exc)
                taken = False
            if taken:
                log.info(
                    "%s leads: holds Lease %s/%s",
                    self.config.identity,
                    self.config.namespace,
                    self.config.name,
                )
                self.leading = True
                return True
            if not waiting_logged:
                holder = self._observed[0] if self._observed else "?"
                log.info("%s is a standby: %s holds the Lease", self.config.identity, holder)
                waiting_logged = True
            await asyncio.sleep(self._pause())
        return False

    async def hold(self) -> None:
        """Renew every retry_period; return once a renewal missed renew_deadline (lost)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.config.retry_period)
            try:
                renewed = await asyncio.wait_for(
                    self._try(), max(0.1, self.config.renew_deadline - (time.monotonic() - last))
                )
            except Exception as exc:  # any failure to renew is a renewal not done
                log.warning("renewing the Lease failed: %s", exc)
                renewed = False
            if renewed:
                last = time.monotonic()
            elif time.monotonic() - last >= self.config.renew_deadline or self._held_by_other():
                self.leading = False
                log.error(
                    "%s lost the Lease %s/%s (not renewed within %s s)",
                    self.config.identity,
                    self.config.namespace,
                    self.config.name,
                    self.config.renew_deadline,
                )
                return

    async def release(self) -> None:
        """Give the Lease up (a clean stop): a standby takes it at its next try."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self._leases.read_namespaced_lease(
                self.config.name, self.config.namespace
            )
            if lease.spec.holder_identity != self.config.identity:
                return
            now = _stamp(datetime.now(UTC))
            body = self._body(lease.metadata.resource_version, "", 1, now, now, lease)
            await self._leases.replace_namespaced_lease(
                self.config.name, self.config.namespace, body
            )
            log.info("%s released the Lease", self.config.identity)
        except Exception as exc:  # best effort: the Lease expires by itself
            log.warning("releasing the Lease failed (it expires by itself): %s", exc)

    # -- one try, as client-go's tryAcquireOrRenew -------------------------------------------

    async def _try(self) -> bool:
        cfg = self.config
        now = _stamp(datetime.now(UTC))
        duration = max(1, round(cfg.lease_duration))
        try:
            lease = await self._leases.read_namespaced_lease(cfg.name, cfg.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = self._body(None, cfg.identity, duration, now, now, None)
            try:
                await self._leases.create_namespaced_lease(cfg.namespace, body)
            except ApiException as made:
                if made.status == 409:
                    return False  # another candidate created it first
                raise
            self._see(("created", cfg.identity))
            return True
        spec = lease.spec
        record = (
            spec.holder_identity,
            spec.renew_time,
            spec.lease_transitions,
            spec.lease_duration_seconds,
        )
        self._see(record)
        holder = spec.holder_identity or ""
        mine = holder == cfg.identity
        expired = time.monotonic() - self._observed_at >= float(
            spec.lease_duration_seconds or cfg.lease_duration
        )
        if holder and not mine and not expired:
            return False
        transitions = int(spec.lease_transitions or 0)
        acquired = _stamp(spec.acquire_time) if mine and spec.acquire_time else now
        if not mine:
            transitions += 1
        body = self._body(
            lease.metadata.resource_version, cfg.identity, duration, acquired, now, lease
        )
        body["spec"]["leaseTransitions"] = transitions
        try:
            await self._leases.replace_namespaced_lease(cfg.name, cfg.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False  # someone wrote it since the read: try again later
            raise
        self._see((cfg.identity, now, transitions, duration))
        return True

    def _see(self, record: tuple[Any, ...]) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()

    def _held_by_other(self) -> bool:
        return bool(self._observed and self._observed[0] not in ("", self.config.identity))

    def _body(
        self,
        version: str | None,
        holder: str,
        duration: int,
        acquired: str,
        renewed: str,
        lease: Any,
    ) -> Any:
        """The Lease as a plain dict (the client sends a dict body as it is)."""
        metadata: dict[str, Any] = {"name": self.config.name, "namespace": self.config.namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        transitions = int(lease.spec.lease_transitions or 0) if lease is not None else 0
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "acquireTime": acquired,
                "renewTime": renewed,
                "leaseTransitions": transitions,
            },
        }

    def _pause(self) -> float:
        return self.config.retry_period * (1 + random.random() * JITTER)
