"""Two operators, one acting; races and lost status (issue 11 item 3: review R4, R11).

Against the real kube-apiserver, as the chart's service account with the chart's RBAC
(its leader Role included):

- two ``treadle operator`` processes elect a leader on the chart's Lease; the standby
  does nothing; ``kill -9`` of the leader hands over within the Lease's duration, and
  a WorkflowRun applied meanwhile runs exactly once;
- two claims of one WorkflowRun racing (the status patch carries ``resourceVersion``):
  one wins, the loser follows the winner's run;
- a leader paused past its Lease, resumed, stops instead of acting beside the new one;
- a start whose revision retired before its run was recorded goes to the new latest
  (review R1);
- a WorkflowDeployment whose status is replaced by an empty one finds its revision
  again from its Deployments, and numbering goes on at the next rollout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException

from treadle.worlds.production import PostgresNatsWorld
from treadle_operator import kube as operator_kube
from treadle_operator import models, revisions, runs
from treadle_operator.models import WorkflowRunStatus
from treadle_operator.settings import OperatorSettings
from treadle_operator.state import State
from treadle_operator.sync import StatusSync
from treadle_operator.worlds import Worlds

from .conftest import POD_ENV
from .harness import Kube, wait_for
from .operator_env import FAST, OperatorProcess, Shop
from .rest import ApiError
from .test_operator import (
    nats_server,
    operator_kubeconfig,
    pg_clones,
    pg_server,
    shop_factory,
)

__all__ = ["nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop_factory"]

RELEASE_NS = "treadle-system"  # chart_identity's release namespace
LEASE = "treadle-operator"  # the chart's Lease name for release "treadle"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/{LEASE}"
DURATION, RENEW, RETRY = 4.0, 3.0, 0.5
ELECTION = {
    "TREADLE_OPERATOR_LEASE_NAMESPACE": RELEASE_NS,
    "TREADLE_OPERATOR_LEASE_NAME": LEASE,
    "TREADLE_OPERATOR_LEASE_DURATION_SECONDS": str(DURATION),
    "TREADLE_OPERATOR_RENEW_DEADLINE_SECONDS": str(RENEW),
    "TREADLE_OPERATOR_RETRY_PERIOD_SECONDS": str(RETRY),
}


@dataclass
class ElectedOperator(OperatorProcess):
    """An operator process that takes part in the leader election, as ``pod_name``."""

    pod_name: str = "operator-a"

    def start(self) -> None:
        env = {
            **os.environ, **POD_ENV, **FAST, **ELECTION,
            "POD_NAME": self.pod_name, "KUBECONFIG": str(self.kubeconfig),
        }  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "treadle.cli", "operator", "--namespace", self.namespace],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip


def _holder(kube: Kube) -> str | None:
    lease = kube.rest.find(LEASE_PATH)
    return None if lease is None else (lease.get("spec") or {}).get("holderIdentity") or None


def _fresh_lease(kube: Kube) -> None:
    """No Lease left by an earlier test (its holder may be a killed process)."""
    try:
        kube.rest.delete(LEASE_PATH)
    except ApiError as exc:
        if exc.status != 404:
            raise


def _world_latest(shop: Shop, register: str | None = None) -> str | None:
    """The World's latest, after ``register`` (a worker of another revision) if given."""

    async def read() -> str | None:
        world = await PostgresNatsWorld.connect(
            shop.database_url, shop.nats_url, deployment_id="test-reader"
        )
        try:
            if register is not None:
                await world.deployments.register(register, catalogue={"greet": {}})
            return await world.deployments.latest()
        finally:
            await world.close()

    with ThreadPoolExecutor(max_workers=1) as pool:  # a loop of its own
        return pool.submit(asyncio.run, read()).result()


def _greet_runs(shop: Shop) -> list[dict[str, Any]]:
    listed = shop.cli("runs", "list", "--workflow", "greet", "--json")
    assert listed.returncode == 0, listed.stderr
    found: list[dict[str, Any]] = json.loads(listed.stdout)
    return found


def test_two_operators_elect_one_and_the_standby_takes_over_a_kill_9_within_the_lease(
    kube: Kube, shop_factory: Callable[[], Shop], operator_kubeconfig: Path
) -> None:
    """R4: only the Lease holder acts; kill -9 of it: the standby holds the Lease within
    leaseDuration (+ its retry) and a WorkflowRun applied meanwhile completes once.

    Then R11 on the same shop: the status replaced by an empty one, the revision is found
    again from its Deployments, the next rollout numbers on and retires the old one."""
    _fresh_lease(kube)
    shop = shop_factory()
    a = ElectedOperator(
        kube, shop.namespace, shop.operator.log_path, operator_kubeconfig, pod_name="operator-a"
    )
    b = ElectedOperator(
        kube, shop.namespace, shop.operator.log_path.with_name("operator-b.log"),
        operator_kubeconfig, pod_name="operator-b",
    )  # fmt: skip
    shop.operator = a  # the factory stops it and prints its log
    try:
        shop.secret()
        a.start()
        wait_for(lambda: _holder(kube) == "operator-a", 30, what="operator-a holding the Lease")
        b.start()
        wait_for(lambda: "is a standby" in b.log(), 30, what="operator-b waiting as a standby")
        shop.deploy(shop.deployment, "shop:1")
        revision = shop.latest()
        shop.start("before", "greet", {"name": "a"})
        assert shop.phase("before", "Completed")["revision"] == revision
        # R12: the World's latest is the operator's; a worker that registers (and may
        # then crash-loop) does not move it.
        assert _world_latest(shop, register="shop-crashlooping") == revision
        assert "serving" not in b.log(), "the standby must not run handlers"
        assert _holder(kube) == "operator-a"

        a.kill()
        killed = time.monotonic()
        shop.start("during", "greet", {"name": "b"})
        wait_for(lambda: _holder(kube) == "operator-b", 30, what="operator-b taking the Lease")
        took = time.monotonic() - killed
        # The standby waits for the record to stay unchanged for leaseDuration, tried
        # every retryPeriod x (1 .. 2.2); a second of slack for the API calls.
        assert took <= DURATION + RETRY * 2.2 + 1.5, f"takeover took {took:.1f} s"
        during = shop.phase("during", "Completed")
        greets = _greet_runs(shop)
        assert sorted(r["run_id"] for r in greets) == sorted(
            [shop.status("before")["runId"], during["runId"]]
        ), "one run per WorkflowRun, none started twice"

        _lose_status_then_roll_out(shop, revision)
    finally:
        b.stop()
        print(f"--- operator-b log (tail) ---\n{b.log()[-4000:]}")


def _lose_status_then_roll_out(shop: Shop, revision: str) -> None:
    """R11: `kubectl replace --subresource=status` with an empty status."""
    wfd = shop.wfd()
    wfd["status"] = {}
    shop.kube.rest.request(
        "PUT", shop.path("workflowdeployments", shop.deployment) + "/status", wfd
    )

    def found_again() -> dict[str, Any] | None:
        status = shop.wfd().get("status") or {}
        ids = [r["id"] for r in status.get("revisions") or []]
        return status if ids == [revision] and status.get("latestRevision") == revision else None

    status = wait_for(found_again, 30, what="the revision found again from its Deployments")
    assert status["revisionCount"] == 1
    assert status["revisions"][0]["phase"] == "Active"

    uid = shop.wfd()["metadata"]["uid"]
    shop.patch({"image": "shop:2"})
    second = revisions.revision_id(shop.namespace, shop.deployment, uid, 2, "shop:2", shop.module)
    wait_for(lambda: shop.latest() == second, 90, what="revision number 2 latest")
    wait_for(lambda: _world_latest(shop) == second, 10, what="the World's latest moved too")

    def retired() -> bool:
        phases = {r["id"]: r["phase"] for r in shop.wfd()["status"]["revisions"]}
        return phases.get(revision) == "Retired"

    wait_for(retired, 30, what="the found-again revision retired")
    listed = shop.kube.rest.get(f"/apis/apps/v1/namespaces/{shop.namespace}/deployments")
    assert {d["metadata"]["name"] for d in listed["items"]} == {
        f"{second}-orchestrator", f"{second}-steps"
    }  # fmt: skip
    assert shop.deployment_record(revision).retired  # type: ignore[union-attr]


async def test_two_claims_of_one_workflow_run_racing_one_wins(
    kube: Kube, operator_kubeconfig: Path, namespace: str
) -> None:
    """R4: the claim's status patch carries resourceVersion: of two operators claiming one
    object at once (each with its own run id), exactly one writes; the other gets 409,
    reads again and follows the winner's run."""
    body = {
        "apiVersion": models.API_VERSION, "kind": "WorkflowRun", "metadata": {"name": "race"},
        "spec": {"deployment": "nowhere", "workflow": "greet"},
    }  # fmt: skip
    path = f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowruns"
    created = kube.rest.create(path, body)
    api = await kube_config.new_client_from_config(config_file=str(operator_kubeconfig))
    client = operator_kube.Kube(api)
    state = State(
        settings=OperatorSettings(), kube=client, worlds=Worlds(client), sync=StatusSync(client)
    )
    try:
        claims = [
            WorkflowRunStatus(run_id=run_id, revision="r1", phase="Pending", reason="Starting")
            for run_id in ("wrun_" + "A" * 26, "wrun_" + "B" * 26)
        ]
        won = await asyncio.gather(
            *(runs.claim(state, json.loads(json.dumps(created)), c) for c in claims)
        )
        # The precondition itself: a claim onto the object as first read is refused now.
        stale = created["metadata"]["resourceVersion"]
        with pytest.raises(ApiException) as refused:
            await client.patch_status(
                "workflowruns", namespace, "race", {"runId": "wrun_" + "C" * 26},
                resource_version=stale,
            )  # fmt: skip
        assert refused.value.status == 409
    finally:
        await client.close()
    assert sorted(won) == [False, True], won
    winner = claims[won.index(True)].run_id
    assert kube.rest.get(f"{path}/race")["status"]["runId"] == winner


def test_a_leader_paused_past_its_lease_stops_acting_when_it_wakes(
    kube: Kube, operator_kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    """R4, split brain: the leader stalls (SIGSTOP) past leaseDuration, the standby takes
    over; the old leader, resumed, sees the Lease held by another and stops its handlers
    and exits (LeadershipLost) instead of acting beside the new one."""
    _fresh_lease(kube)
    a = ElectedOperator(
        kube, namespace, tmp_path / "a.log", operator_kubeconfig, pod_name="operator-a"
    )
    b = ElectedOperator(
        kube, namespace, tmp_path / "b.log", operator_kubeconfig, pod_name="operator-b"
    )
    try:
        a.start()  # both at once: whichever wins is the leader, the other the standby
        b.start()
        holder = wait_for(lambda: _holder(kube), 30, what="a holder of the Lease")
        leader, standby = (a, b) if holder == "operator-a" else (b, a)
        wait_for(lambda: "is a standby" in standby.log(), 30, what="the other a standby")
        assert leader.proc is not None
        leader.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: _holder(kube) == standby.pod_name, 30, what="the standby taking the Lease")
        leader.proc.send_signal(signal.SIGCONT)
        code = leader.proc.wait(30)
        assert code != 0, "a leader that lost its Lease must not go on"
        assert "lost the Lease" in leader.log()
        assert _holder(kube) == standby.pod_name
    finally:
        for process in (a, b):
            process.stop()
        print(f"--- operator-a ---\n{a.log()[-3000:]}\n--- operator-b ---\n{b.log()[-3000:]}")


async def test_a_start_refused_on_a_revision_retired_meanwhile_goes_to_the_new_latest(
    kube: Kube, operator_kubeconfig: Path, shop_factory: Callable[[], Shop]
) -> None:
    """R1: the start read revision "old"; before its run was recorded a rollout made "new"
    latest and retired "old". The World refuses the run on "old" (DeploymentRetired,
    nothing recorded); the start reads the WorkflowDeployment again, writes "new" to the
    WorkflowRun and records the run there, same run id."""
    shop = shop_factory()  # a namespace and a World of its own; no operator serves it
    wfd_body = {
        "apiVersion": models.API_VERSION, "kind": "WorkflowDeployment",
        "metadata": {"name": "shop"}, "spec": {"image": "shop:1", "module": "m"},
    }  # fmt: skip
    wfd = kube.rest.create(shop.path("workflowdeployments"), wfd_body)
    wfd["status"] = {"latestRevision": "shop-new"}
    kube.rest.request("PUT", shop.path("workflowdeployments", "shop") + "/status", wfd)
    shop.start("order", "greet", {"name": "x"})
    body = kube.rest.get(shop.path("workflowruns", "order"))

    world = await PostgresNatsWorld.connect(
        shop.database_url, shop.nats_url, deployment_id="test-operator"
    )
    api = await kube_config.new_client_from_config(config_file=str(operator_kubeconfig))
    client = operator_kube.Kube(api)
    state = State(
        settings=OperatorSettings(), kube=client, worlds=Worlds(client), sync=StatusSync(client)
    )
    run_id = "wrun_" + "R" * 26
    try:
        await world.deployments.register("shop-old", catalogue={"greet": {}})
        await world.deployments.register("shop-new", catalogue={"greet": {}})
        await world.deployments.retire("shop-old")  # the rollout, between read and write
        chosen = WorkflowRunStatus(
            run_id=run_id, revision="shop-old", phase="Pending", reason="Starting"
        )
        spec = models.WorkflowRunSpec.model_validate(body["spec"])
        ended = await runs._record_on_latest(state, world, body, spec, chosen, 9)
        run = await world.runs.get(run_id)
        on_old = await world.runs.list(deployment_id="shop-old")
    finally:
        await client.close()
        await world.close()
    assert ended.revision == "shop-new"
    assert run.deployment_id == "shop-new"
    assert on_old.runs == ()
    assert kube.rest.get(shop.path("workflowruns", "order"))["status"]["revision"] == "shop-new"
