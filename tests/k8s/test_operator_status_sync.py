"""Status sync against the real API server (issue 11 R5 (e)): a mirrored WorkflowRun
carries its WorkflowDeployment's ``mirrorRunsTTLSecondsAfterFinished``, gets no
Running/Completed Events, and is deleted once its TTL passed.

The pacing of status patches (R5 (a)) and the mirroring gate (R5 (d)) are counted on the
local World in ``tests/operator/test_sync_local.py``; here, the same code (``sync``)
runs in the real operator process, watching the Postgres World's changes feed.
"""

from __future__ import annotations

import json
from typing import Any

from .harness import wait_for
from .operator_env import WORKFLOWS, Shop
from .test_operator import (
    nats_server,
    operator_kubeconfig,
    pg_clones,
    pg_server,
    shop,
    shop_factory,
)

__all__ = [
    "nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop", "shop_factory"
]  # fmt: skip


def _start_from_code(shop: Shop, revision: str, name: str) -> str:
    started = shop.cli(
        "start", f"{WORKFLOWS}:greet", "--input", json.dumps({"name": name}), "--json",
        revision=revision,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return str(json.loads(started.stdout)["run_id"])


def test_a_mirrored_run_lives_its_deployments_ttl_without_phase_events(shop: Shop) -> None:
    revision = shop.latest()
    spec = {"mirrorRuns": True, "mirrorRunsTTLSecondsAfterFinished": 4}
    shop.kube.rest.patch(shop.path("workflowdeployments", "shop"), {"spec": spec})
    wait_for(lambda: shop.wfd()["metadata"]["generation"] == shop.wfd()["status"].get(
        "observedGeneration"), 30, what="the change seen")  # fmt: skip
    run_id = _start_from_code(shop, revision, "ttl")

    def mirrored() -> dict[str, Any] | None:
        items = shop.kube.rest.get(shop.path("workflowruns"))["items"]
        done = [i for i in items if (i.get("status") or {}).get("phase") == "Completed"]
        return done[0] if done else None

    obj = wait_for(mirrored, 60, what="the mirrored run completed")
    name = obj["metadata"]["name"]
    assert obj["status"]["runId"] == run_id
    assert obj["status"]["mirrored"] is True
    assert obj["spec"]["ttlSecondsAfterFinished"] == 4
    assert not {"Started", "Running", "Completed"} & set(shop.events(name))
    wait_for(lambda: shop.run(name) is None, 60, what="the mirrored run removed by its TTL")
