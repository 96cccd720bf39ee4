"""StatusSync on a real local World: runs executed by a real worker, status computed
from the World's changes feed and written through a recording ``StatusSink``.

Issue 11 item 8 (the operator speaks to the World only through ``treadle.world``,
so its logic runs on the local World) and R5 (a) (patches paced: phase changes at
once, the rest at most once per interval), (d) (no read for a run nobody mirrors),
(e) (a mirrored run gets an Event only when it fails).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from treadle import Workflows, settings
from treadle.world import contract, events
from treadle.worlds.local import LocalWorld
from treadle_operator.models import WorkflowRunStatus
from treadle_operator.sync import StatusSync

FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)
WAIT = 30.0


class Recorder:
    """A ``StatusSink`` that keeps what StatusSync would write to the API server."""

    def __init__(self) -> None:
        self.statuses: list[tuple[str, dict[str, Any]]] = []
        self.labels: list[tuple[str, dict[str, str | None]]] = []
        self.events: list[tuple[str, str, bool]] = []
        self._news = asyncio.Event()

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> bool:
        assert (plural, namespace) == ("workflowruns", "shop")
        self.statuses.append((name, status))
        self._news.set()
        return True

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str | None]
    ) -> bool:
        self.labels.append((name, labels))
        return True

    async def event(
        self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None:
        self.events.append((obj["metadata"]["name"], reason, warning))

    def of(self, name: str) -> list[dict[str, Any]]:
        return [status for n, status in self.statuses if n == name]

    def last(self, name: str) -> dict[str, Any]:
        return (self.of(name) or [{}])[-1]

    async def until(self, done: Callable[[], bool], what: str) -> None:
        async def wait() -> None:
            while not done():
                self._news.clear()
                await self._news.wait()

        try:
            await asyncio.wait_for(wait(), WAIT)
        except TimeoutError:
            raise AssertionError(f"never patched {what}; patched {self.statuses}") from None


def _body(name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": name, "generation": 1},
        "spec": {"deployment": "shop", "workflow": "order"},
    }


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[LocalWorld]:
    opened = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    try:
        yield opened
    finally:
        await opened.close()


def _app(world: LocalWorld) -> Workflows:
    app = Workflows(world=world, settings_=settings.load({}, **FAST), worker=True)

    @app.step
    async def add(n: int, pause: float) -> int:
        await asyncio.sleep(pause)
        return n + 1

    @app.workflow
    async def order(count: int, pause: float = 0.0) -> int:
        total = 0
        for n in range(count):
            total += await add(n, pause)
        return total

    @app.workflow
    async def broken() -> None:
        raise ValueError("out of stock")

    return app


async def _sync(recorder: Recorder, world: LocalWorld, **kwargs: Any) -> StatusSync:
    sync = StatusSync(recorder, **kwargs)
    await sync.watch(world)
    return sync


async def test_a_run_is_patched_through_its_phases_to_the_exact_final_status(
    world: LocalWorld,
) -> None:
    recorder = Recorder()
    sync = await _sync(recorder, world)
    app = _app(world)
    try:
        run = await app.start("order", 3)
        sync.track(run.run_id, world, _body("o-1"), WorkflowRunStatus(run_id=run.run_id))
        await recorder.until(lambda: recorder.last("o-1").get("phase") == "Completed", "Completed")
        final = recorder.last("o-1")
        assert final["steps"] == {"total": 3, "completed": 3, "failed": 0, "running": 0}
        assert final["output"] == "6"
        assert {c["type"]: c["status"] for c in final["conditions"]}["Succeeded"] == "True"
        assert [reason for _, reason, _ in recorder.events][-1] == "Completed"
        assert recorder.labels[-1][1]["treadle.dev/phase"] == "Completed"
    finally:
        await sync.close()
        await app.close(grace_seconds=2)


async def test_two_hundred_fast_steps_cost_a_bounded_number_of_patches(
    world: LocalWorld,
) -> None:
    """R5 (a): phase changes at once, the rest at most once a second per object; the last
    patch is exact. Without pacing this run costs one patch per refresh (~ tens a second)."""
    recorder = Recorder()
    sync = await _sync(recorder, world, interval=1.0)
    app = _app(world)
    try:
        began = time.monotonic()
        run = await app.start("order", 200, 0.01)  # ~10 ms a step: 2 s of changes
        sync.track(run.run_id, world, _body("o-200"), WorkflowRunStatus(run_id=run.run_id))
        await recorder.until(lambda: recorder.last("o-200").get("phase") == "Completed", "done")
        elapsed = time.monotonic() - began
        patches = recorder.of("o-200")
        final = patches[-1]
        assert final["steps"] == {"total": 200, "completed": 200, "failed": 0, "running": 0}
        assert final["output"] == str(sum(range(1, 201)))
        # At most: one per phase change (Pending, Running, Completed) and one a second.
        bound = 3 + math.ceil(elapsed / 1.0) + 1
        print(f"200 steps in {elapsed:.1f} s: {len(patches)} status patches (bound {bound})")
        assert len(patches) <= bound
        phases = [p["phase"] for p in patches]
        assert phases[-1] == "Completed"
        assert phases.count("Completed") == 1
        # Progress went out while the run ran (paced, not dropped).
        assert any(p["phase"] == "Running" and p["steps"]["completed"] > 0 for p in patches)
        # No patch arrives after the final one: the paced timer found nothing to add.
        await asyncio.sleep(0)  # (what was due is already written; nothing is pending)
        assert not sync._later
    finally:
        await sync.close()
        await app.close(grace_seconds=2)


async def test_a_change_inside_the_interval_is_written_when_it_is_up_and_exact(
    world: LocalWorld,
) -> None:
    """R5 (a): two step creations right after the first patch make one more patch, no
    sooner than the interval after the first, holding both; then nothing more."""
    recorder = Recorder()
    sync = await _sync(recorder, world, interval=0.5)
    try:
        run = await world.runs.create(
            workflow_name="order", input=None, deployment_id="shop-1", spec_version=9
        )
        sync.track(run.run_id, world, _body("o-p"), WorkflowRunStatus(run_id=run.run_id))
        await recorder.until(lambda: len(recorder.of("o-p")) == 1, "the first status")
        first_at = time.monotonic()
        for step in ("s1", "s2"):
            created = events.StepCreated(correlation_id=step, step_name="add")
            await world.events.create(run.run_id, created, in_band=False)
        await recorder.until(lambda: len(recorder.of("o-p")) == 2, "the paced status")
        assert time.monotonic() - first_at >= 0.5 * 0.9
        assert recorder.of("o-p")[1]["steps"]["total"] == 2
        assert recorder.of("o-p")[1]["phase"] == "Pending"
        assert not sync._later  # nothing left pending
    finally:
        await sync.close()
    assert len(recorder.of("o-p")) == 2


async def test_a_failure_is_an_event_even_for_a_mirrored_run_and_completion_is_not(
    world: LocalWorld,
) -> None:
    """R5 (e): a mirrored WorkflowRun (started from code) gets no Running/Completed
    Events, only a Warning when its run fails; its first status is one patch."""
    recorder = Recorder()
    sync = await _sync(recorder, world)
    app = _app(world)
    try:
        good = await app.start("order", 1)
        bad = await app.start("broken")
        for name, run in (("m-good", good), ("m-bad", bad)):
            base = WorkflowRunStatus(run_id=run.run_id, mirrored=True)
            sync.track(run.run_id, world, _body(name), base, shown=WorkflowRunStatus())
        await recorder.until(
            lambda: (
                recorder.last("m-good").get("phase") == "Completed"
                and recorder.last("m-bad").get("phase") == "Failed"
            ),
            "both ends",
        )
        assert recorder.of("m-good")[0]["runId"] == good.run_id  # the first patch has it all
        assert recorder.of("m-good")[0]["mirrored"] is True
        assert [(n, r, w) for n, r, w in recorder.events] == [("m-bad", "Failed", True)]
    finally:
        await sync.close()
        await app.close(grace_seconds=2)


async def test_a_run_nobody_mirrors_is_never_read_and_one_mirrored_is_handed_over(
    world: LocalWorld,
) -> None:
    """R5 (d): a creation on a deployment that no WorkflowDeployment mirrors spawns
    nothing (the local World names the deployment in the report, so not even a read)."""
    handed: list[str] = []
    arrived = asyncio.Event()

    async def on_new_run(_world: contract.World, run_id: str) -> None:
        handed.append(run_id)
        arrived.set()

    recorder = Recorder()
    sync = await _sync(
        recorder, world, on_new_run=on_new_run, mirrors=lambda dep: dep == "dpl_mirrored"
    )
    try:
        quiet = await world.runs.create(
            workflow_name="order", input=None, deployment_id="dpl_quiet", spec_version=9
        )
        shown = await world.runs.create(
            workflow_name="order", input=None, deployment_id="dpl_mirrored", spec_version=9
        )
        await asyncio.wait_for(arrived.wait(), WAIT)
        assert handed == [shown.run_id]
        assert quiet.run_id not in handed
        assert recorder.statuses == []
    finally:
        await sync.close()


async def test_another_processs_write_reaches_the_status_through_a_resync(
    world: LocalWorld, tmp_path: Path
) -> None:
    """The local feed cannot tell which run another process changed: it says resync,
    and every tracked run is read again (as after a lost Postgres listener)."""
    recorder = Recorder()
    sync = await _sync(recorder, world)
    try:
        run = await world.runs.create(
            workflow_name="order", input=None, deployment_id="shop-1", spec_version=9
        )
        sync.track(run.run_id, world, _body("o-x"), WorkflowRunStatus(run_id=run.run_id))
        await recorder.until(lambda: recorder.last("o-x").get("phase") == "Pending", "Pending")
        async with LocalWorld(tmp_path / "world") as other:  # e.g. `treadle cancel` elsewhere
            await other.events.create(run.run_id, events.RunCancelled(reason="cli"), in_band=False)
        await recorder.until(lambda: recorder.last("o-x").get("phase") == "Cancelled", "Cancel")
    finally:
        await sync.close()


async def test_a_tracked_run_follows_its_world_when_the_world_object_is_replaced(
    world: LocalWorld, tmp_path: Path
) -> None:
    """A rotated Secret makes a new World object (operator ``worlds``); ``repoint``
    moves the runs tracked on the old one, which is then closed."""
    recorder = Recorder()
    sync = await _sync(recorder, world)
    old = await LocalWorld(tmp_path / "world").open()
    try:
        await sync.watch(old)
        run = await old.runs.create(
            workflow_name="order", input=None, deployment_id="shop-1", spec_version=9
        )
        sync.track(run.run_id, old, _body("o-r"), WorkflowRunStatus(run_id=run.run_id))
        await recorder.until(lambda: recorder.last("o-r").get("phase") == "Pending", "Pending")
        await sync.repoint(old, world)
        await old.close()
        tracked = sync.tracked(run.run_id)
        assert tracked is not None and tracked.world is world
        await world.events.create(run.run_id, events.RunCancelled(reason="x"), in_band=False)
        await recorder.until(lambda: recorder.last("o-r").get("phase") == "Cancelled", "Cancel")
    finally:
        await sync.close()
        await old.close()


class _EndsBetweenTheReads:
    """The World as StatusSync sees it, where the run ends right after StatusSync has
    read its events and before it reads its record (the CI failure on 2026-12-02: a
    Completed status that still counted its last step as running)."""

    def __init__(self, world: LocalWorld, run_id: str) -> None:
        self.events = world.events
        self.runs = self
        self._world = world
        self._run_id = run_id
        self.armed = False

    async def get(self, run_id: str) -> Any:
        if self.armed and run_id == self._run_id:
            self.armed = False
            step = events.StepCompleted(correlation_id="s1", step_name="add", result=1, attempt=1)
            await self._world.events.create(run_id, step, in_band=False)
            await self._world.events.create(run_id, events.RunCompleted(output=1), in_band=False)
        return await self._world.runs.get(run_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._world, name)


async def test_a_run_that_ends_between_the_events_and_the_record_reads_counts_its_last_step(
    world: LocalWorld,
) -> None:
    recorder = Recorder()
    sync = await _sync(recorder, world)
    try:
        run = await world.runs.create(
            workflow_name="order", input=None, deployment_id="shop-1", spec_version=9
        )
        seen = _EndsBetweenTheReads(world, run.run_id)
        await world.events.create(run.run_id, events.RunStarted(), in_band=False)
        for event in (
            events.StepCreated(correlation_id="s1", step_name="add"),
            events.StepStarted(correlation_id="s1", step_name="add", attempt=1),
        ):
            await world.events.create(run.run_id, event, in_band=False)
        sync.track(run.run_id, seen, _body("o-e"), WorkflowRunStatus(run_id=run.run_id))  # type: ignore[arg-type]
        await recorder.until(lambda: recorder.last("o-e").get("phase") == "Running", "Running")
        assert recorder.last("o-e")["steps"]["running"] == 1
        seen.armed = True
        sync.poke(run.run_id)
        await recorder.until(lambda: recorder.last("o-e").get("phase") == "Completed", "done")
        assert not seen.armed  # the run did end between the two reads
        assert recorder.last("o-e")["steps"] == {
            "total": 1, "completed": 1, "failed": 0, "running": 0,
        }  # fmt: skip
    finally:
        await sync.close()
