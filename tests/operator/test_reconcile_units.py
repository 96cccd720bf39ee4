"""Pure pieces of the reconcile work of review operator.md R5 (b) (c) and R13: the start
backoff and its wake-ups, the bounded run view, the TTL of a run cancelled before its start,
lock pruning, and "no orchestrator is never ready"."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from treadle.world import events
from treadle.worlds.local.world import LocalWorld
from treadle_operator import kube, runs, teardown, workers
from treadle_operator.models import RevisionStatus
from treadle_operator.progress import ENDED_REMEMBERED, RunView
from treadle_operator.settings import OperatorSettings
from treadle_operator.starts import Starts, backoff
from treadle_operator.state import State
from treadle_operator.sync import StatusSync
from treadle_operator.worlds import Worlds

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _body(uid: str, name: str, deployment: str = "shop", generation: int = 1) -> dict[str, object]:
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "ns", "generation": generation},
        "spec": {"deployment": deployment, "workflow": "greet"},
    }


def test_the_start_backoff_doubles_from_the_retry_delay_up_to_its_cap() -> None:
    """R5 (b): 5 s, 10 s, 20 s ... at most 300 s, never a fixed 5 s for ever."""
    assert [backoff(n, 5.0, 300.0) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert backoff(0, 5.0, 300.0) == 0
    assert backoff(10_000, 5.0, 300.0) == 300


async def test_a_blocked_start_backs_off_and_a_serving_deployment_wakes_it_at_once() -> None:
    """R5 (b): tries back off (a 30 s delay after the first); the WorkflowDeployment the run
    names becoming ready wakes it at once; another deployment's readiness does not."""
    tries: list[float] = []
    blocked = asyncio.Event()
    ready = False

    async def attempt(namespace: str, name: str) -> str | None:
        tries.append(time.monotonic())
        if ready:
            return None
        blocked.set()
        return "DeploymentNotFound"

    starts = Starts(30.0, 300.0)
    starts.attempt = attempt
    starts.submit(_body("u1", "r1"))
    starts.submit(_body("u1", "r1"))  # the same object again: still one task
    await asyncio.wait_for(blocked.wait(), 5)
    assert len(tries) == 1 and set(starts.waiting()) == {"u1"}
    assert starts.wake_deployment("ns", "other") == 0
    for _ in range(10):  # let the loop run whatever that might have woken
        await asyncio.sleep(0)
    assert len(tries) == 1  # not woken by another deployment; the 30 s delay holds
    ready = True
    began = time.monotonic()
    assert starts.wake_deployment("ns", "shop") == 1
    entry = starts.waiting()["u1"]
    assert entry.task is not None
    await asyncio.wait_for(entry.task, 5)
    assert time.monotonic() - began < 2  # at once, not after the 30 s backoff
    assert len(tries) == 2 and starts.waiting() == {}
    await starts.close()


async def test_an_edited_blocked_run_is_tried_again_and_a_forgotten_one_stops() -> None:
    """A new generation (say spec.deployment fixed) skips the delay; forget ends the task."""
    tried = asyncio.Queue[str]()

    async def attempt(namespace: str, name: str) -> str | None:
        await tried.put(name)
        return "NoReadyRevision"

    starts = Starts(60.0, 60.0)
    starts.attempt = attempt
    starts.submit(_body("u2", "r2"))
    assert await asyncio.wait_for(tried.get(), 5) == "r2"
    starts.submit(_body("u2", "r2", deployment="shop-2", generation=2))
    assert await asyncio.wait_for(tried.get(), 5) == "r2"
    assert starts.waiting()["u2"].deployment == "shop-2"
    task = starts.waiting()["u2"].task
    starts.forget("u2")
    assert starts.waiting() == {}
    assert task is not None
    with pytest.raises(asyncio.CancelledError):
        await task
    await starts.close()


async def test_an_attempt_that_raises_is_retried_with_backoff_not_lost() -> None:
    """An unexpected error is logged once and retried after the backoff."""
    calls = 0
    done = asyncio.Event()

    async def attempt(namespace: str, name: str) -> str | None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RuntimeError("the API server hiccupped")
        done.set()
        return None

    starts = Starts(0.01, 0.05)
    starts.attempt = attempt
    starts.submit(_body("u3", "r3"))
    await asyncio.wait_for(done.wait(), 5)
    assert calls == 3
    await starts.close()


def _logged(slot: int, event: events.Event) -> events.LoggedEvent:
    return events.LoggedEvent(run_id="wrun_x", slot=slot, created_at=T0, in_band=True, event=event)


def test_a_run_view_keeps_only_open_steps_by_id() -> None:
    """R13 operator memory: 10,000 ended steps leave counts and at most ENDED_REMEMBERED ids;
    open and running steps stay exact; a repeated creation of an ended step is ignored."""
    view = RunView()
    slot = 1
    for i in range(10_000):
        sid = f"s{i}"
        for event in (
            events.StepCreated(correlation_id=sid, step_name="a"),
            events.StepStarted(correlation_id=sid, step_name="a", attempt=1),
            events.StepStarted(correlation_id=sid, step_name="a", attempt=2),
            events.StepCompleted(correlation_id=sid, step_name="a")
            if i % 10
            else events.StepFailed(correlation_id=sid, step_name="a", attempt=2, error=_error()),
        ):
            slot += 1
            view.apply(_logged(slot, event))
    view.apply(_logged(slot + 1, events.StepCreated(correlation_id="s9999", step_name="a")))
    view.apply(_logged(slot + 2, events.StepCreated(correlation_id="open", step_name="a")))
    view.apply(
        _logged(slot + 3, events.StepStarted(correlation_id="run", step_name="a", attempt=1))
    )
    counts = view.steps
    assert (counts.total, counts.completed, counts.failed, counts.running) == (
        10_002,
        9_000,
        1_000,
        1,
    )
    assert set(view.open_steps) == {"open", "run"}
    assert len(view.ended) == ENDED_REMEMBERED


def _error() -> events.ErrorInfo:
    return events.ErrorInfo(type="Boom", message="boom")


def test_a_run_cancelled_before_its_start_lives_its_ttl_from_the_cancel() -> None:
    """R13 TTL edge: with completedAt, from it; without (an older operator's), from the
    object's creation: never deleted at the first check."""
    made = (T0 - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"creationTimestamp": made},
        "spec": {"deployment": "shop", "workflow": "greet", "ttlSecondsAfterFinished": 60},
        "status": {"phase": "Cancelled", "reason": "CancelledBeforeStart"},
    }
    assert not runs.expired(body, T0)
    assert runs.expired(body, T0 + timedelta(seconds=56))
    body["status"]["completedAt"] = T0.strftime("%Y-%m-%dT%H:%M:%SZ")  # type: ignore[index]
    assert not runs.expired(body, T0 + timedelta(seconds=56))
    assert runs.expired(body, T0 + timedelta(seconds=60))


async def test_locks_of_deployments_that_went_are_pruned() -> None:
    """R13 lock leak: State.forget drops an object's lock (not while a reconcile holds it)."""
    api = client.ApiClient()
    try:
        k = kube.Kube(api)
        state = State(settings=OperatorSettings(), kube=k, worlds=Worlds(k), sync=StatusSync(k))
        for i in range(100):
            async with state.lock(f"uid-{i}"):
                pass
        held = state.lock("uid-held")
        await held.acquire()
        assert state.lock_count() == 101
        for i in range(100):
            state.forget(f"uid-{i}")
        state.forget("uid-held")
        assert state.lock_count() == 1  # the one a reconcile holds stays
        held.release()
        state.forget("uid-held")
        assert state.lock_count() == 0
    finally:
        await api.close()


def _deployment(name: str, replicas: int, ready: int) -> client.V1Deployment:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(),
            template=client.V1PodTemplateSpec(),
        ),
        status=client.V1DeploymentStatus(ready_replicas=ready),
    )


def test_a_revision_without_an_orchestrator_is_never_ready_and_says_why() -> None:
    """R13 health: orchestrator replicas 0 is not ready (NoOrchestrator); steps at 0 are."""
    revision = RevisionStatus(id="shop-abc123", image="i", module="m", created_at="now")
    seen = workers.Workers(
        deployments={
            "shop-abc123-orchestrator": _deployment("shop-abc123-orchestrator", 0, 0),
            "shop-abc123-steps": _deployment("shop-abc123-steps", 0, 0),
        }
    )
    observed = workers.observed(seen, revision, registered=True, active_runs=0)
    assert not observed.ready
    assert observed.stalled == workers.NO_ORCHESTRATOR
    assert "orchestrator.replicas is 0" in observed.message
    serving = workers.Workers(
        deployments={
            "shop-abc123-orchestrator": _deployment("shop-abc123-orchestrator", 1, 1),
            "shop-abc123-steps": _deployment("shop-abc123-steps", 0, 0),
        }
    )
    assert workers.observed(serving, revision, registered=True, active_runs=0).ready


def test_only_a_ready_deployment_on_a_reachable_world_wakes_waiting_runs() -> None:
    status = {
        "latestRevision": "shop-abc123",
        "conditions": [{"type": "WorldReachable", "status": "True"}],
    }
    assert teardown.serving({"metadata": {}, "status": status})
    assert not teardown.serving({"metadata": {"deletionTimestamp": "x"}, "status": status})
    assert not teardown.serving({"metadata": {}, "status": {}})
    unreachable = {**status, "conditions": [{"type": "WorldReachable", "status": "False"}]}
    assert not teardown.serving({"metadata": {}, "status": unreachable})


async def test_cancel_policy_cancels_every_active_run_of_the_revisions_only(
    tmp_path: Path,
) -> None:
    """R7 Cancel: every pending or running run on the deployment's revisions is cancelled
    through the World (one runs.count per revision tells how many are left); ended runs
    and other deployments' runs are untouched."""
    world = await LocalWorld(tmp_path / "world.db").open()
    try:
        ids = {}
        for name, revision in (("a", "shop-1"), ("b", "shop-1"), ("c", "shop-2"), ("x", "other")):
            run = await world.runs.create(
                workflow_name="wf", input=None, deployment_id=revision, spec_version=9
            )
            ids[name] = run.run_id
        await world.events.create(ids["b"], events.RunStarted(), in_band=False)
        done = await world.runs.create(
            workflow_name="wf", input=None, deployment_id="shop-2", spec_version=9
        )
        await world.events.create(done.run_id, events.RunCancelled(reason="x"), in_band=False)
        assert await teardown.count_active(world, ["shop-1", "shop-2"]) == 3
        assert await teardown.cancel_active(world, ["shop-1", "shop-2"]) == 3
        assert await teardown.count_active(world, ["shop-1", "shop-2"]) == 0
        for name in "abc":
            assert (await world.runs.get(ids[name])).status == "cancelled"
        assert (await world.runs.get(ids["x"])).status == "pending"
    finally:
        await world.close()
