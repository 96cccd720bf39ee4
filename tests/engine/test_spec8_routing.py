"""Routing a delivery to its run's format, and the writes made outside a delivery
(issue 12 item 1; seed 003 "Resolving a delivery's spec", "Writers outside the
orchestrator", "Routing edge cases"), on the local World.

- A message hinting spec 9 for a spec 8 run reaches the spec 9 delivery, which hands it
  off (sent again stamped 8, acknowledged) before anything replays or is written.
- A run of a version this build does not know (7, 12) is left for a worker that has it
  (Redeliver after 900 s, an error log), never handed off and never replayed.
- ``run.wake_up()`` on a spec 8 run completes each open wait out-of-band and sends one
  wake stamped 8; its count is of the completions.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path

import pytest

from treadle import Workflows, runwrites, settings, sleep
from treadle.orchestrator.delivery import OrchestratorDelivery
from treadle.orchestrator.worker import Worker
from treadle.world import events, messages, records
from treadle.worlds.local import LocalWorld

from .conftest import FAST, TUNING
from .faults import FaultyWorld

META = messages.DeliveryMeta(
    message_id="msg_1", delivery_count=1, attempt=1, invocation_started_at=0
)


async def _world(tmp_path: Path) -> FaultyWorld:
    return FaultyWorld(await LocalWorld(tmp_path / "world", tuning=TUNING).open())


def _app(world: FaultyWorld) -> Workflows:
    app = Workflows(world=world, settings_=settings.load({}, **FAST), worker=False)  # type: ignore[arg-type]

    @app.workflow
    async def wf() -> str:
        ran.append("replayed")
        return "done"

    return app


ran: list[str] = []


async def _run(world: FaultyWorld, spec_version: int) -> records.RunRecord:
    return await world.inner.runs.create(
        workflow_name="wf",
        input={"args": [], "kwargs": {}},
        deployment_id="local",
        spec_version=spec_version,
    )


async def test_a_spec_8_run_hinted_9_is_handed_off_before_anything_replays(
    tmp_path: Path,
) -> None:
    """Seed 003: "A wrong hint routes the message to the other orchestrator, which finds
    the run's own version on the row it loads and sends the message again with that
    version before it replays anything"."""
    world = await _world(tmp_path)
    try:
        app = _app(world)
        run = await _run(world, 8)
        ran.clear()
        wrong = messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id="local", run_spec_version=9
        )
        answer = await OrchestratorDelivery(app.runtime(world), wrong, META).run()  # type: ignore[arg-type]
        assert answer == messages.ACK
        (sent,) = world.queue.sent
        assert isinstance(sent.message, messages.OrchestratorMessage)
        assert sent.message.spec_version == 8 and sent.message.run_input is None
        assert ran == []
        assert [t for t in world.trace if t.what == "write"] == []
        assert (await world.runs.get(run.run_id)).seq == 1
    finally:
        await world.close()


@pytest.mark.parametrize("unknown", [7, 12])
async def test_a_run_of_a_version_this_build_does_not_know_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, unknown: int
) -> None:
    """Issue 12 "Bad input": a message stamped with an unknown version is never driven by
    the wrong format: the spec 9 delivery loads the run, logs an error and leaves it for a
    worker that has the format (Redeliver 900 s); nothing sent, written or replayed."""
    world = await _world(tmp_path)
    try:
        app = _app(world)
        run = await _run(world, unknown)
        ran.clear()
        message = messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=unknown)
        with caplog.at_level(logging.ERROR, logger="treadle.orchestrator.delivery"):
            answer = await OrchestratorDelivery(app.runtime(world), message, META).run()  # type: ignore[arg-type]
        assert answer == messages.Redeliver(900.0)
        assert any(f"spec version {unknown}" in r.getMessage() for r in caplog.records)
        assert world.queue.sent == [] and ran == []
        assert [t for t in world.trace if t.what == "write"] == []
    finally:
        await world.close()


async def test_wake_up_of_a_spec_8_run_completes_its_waits_out_of_band_then_wakes_it(
    tmp_path: Path,
) -> None:
    """PLAN "Spec 8" / seed 003 "Writers outside the orchestrator": on a spec 8 run
    ``wake_up`` writes ``wait_completed`` out-of-band for each open wait (one another
    writer completed first is refused and not counted), then sends one wake stamped 8;
    no ``wake_requested`` is written. A second wake_up finds nothing open."""
    world = await _world(tmp_path)
    try:
        app = _app(world)
        run = await _run(world, 8)
        due = run.created_at + timedelta(hours=1)
        for cid in ("wait_a", "wait_b", "wait_c"):
            await world.events.create(
                run.run_id,
                events.WaitCreated(correlation_id=cid, resume_at=due),
                in_band=False,
            )
        handle = app.get_run(run.run_id)
        read_before = await handle.events()  # wait_c is open in what wake_up read
        await world.events.create(
            run.run_id, events.WaitCompleted(correlation_id="wait_c"), in_band=False
        )
        record = await world.runs.get(run.run_id)
        waits = ["wait_a", "wait_b", "wait_c"]
        assert await runwrites.wake_up(world, record, read_before, waits) == 2  # type: ignore[arg-type]
        logged = [(e.type, e.correlation_id) for e in await handle.events()]
        assert logged[-2:] == [("wait_completed", "wait_a"), ("wait_completed", "wait_b")]
        assert "wake_requested" not in [t for t, _ in logged]
        (wake,) = world.queue.sent
        assert isinstance(wake.message, messages.OrchestratorMessage)
        assert wake.message.run_spec_version == 8 and wake.message.wait_continuation is None
        assert await handle.wake_up() == 0
        assert len(world.queue.sent) == 2  # the wake is sent again; nothing written
    finally:
        await world.close()


@pytest.mark.parametrize(("requested", "minted"), [(None, 9), (9, 9), (8, 8)])
async def test_start_mints_the_run_format_from_the_setting_and_the_worlds_fence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, requested: int | None, minted: int
) -> None:
    """Seed 003 "How new runs get their version" with treadle's default: on a World with
    the fence, unset and 9 mint 9, 8 mints 8, with no warning; the start message carries
    the minted version (``run_input``)."""
    world = await _world(tmp_path)
    try:
        overrides = {} if requested is None else {"WORKFLOW_SPEC_VERSION": requested}
        app = Workflows(
            world=world,  # type: ignore[arg-type]
            settings_=settings.load({}, **FAST, **overrides),
            worker=False,
        )

        @app.workflow
        async def wf() -> str:
            return "done"

        with caplog.at_level(logging.WARNING, logger="treadle.client"):
            run = await app.start(wf)
        assert (await run.get()).spec_version == minted
        (start,) = world.queue.sent
        assert isinstance(start.message, messages.OrchestratorMessage)
        assert start.message.run_input is not None
        assert start.message.run_input.spec_version == minted
        assert caplog.records == []
    finally:
        await world.close()


@pytest.mark.parametrize(("run_version", "hint"), [(8, 9), (9, 8)])
async def test_a_wrongly_hinted_wake_still_drives_the_run_in_its_own_format(
    tmp_path: Path, run_version: int, hint: int
) -> None:
    """Seed 003 "Resolving a delivery's spec", end to end with a worker: a sleeping run's
    wait is completed out-of-band and a wake hinting the other format is sent. The wrong
    orchestrator sends it again with the run's version (one hand-off, stamped
    ``run_version``) and the run's own orchestrator completes it; a run never changes
    format."""
    world = await _world(tmp_path)
    app = Workflows(
        world=world,  # type: ignore[arg-type]
        settings_=settings.load({}, **FAST, WORKFLOW_SPEC_VERSION=run_version),
        worker=True,
    )
    try:

        @app.workflow
        async def napping() -> str:
            await sleep("1h")
            return "rested"

        run = await app.start(napping)
        waits: list[str | None] = []
        async with asyncio.timeout(10):
            while not waits:  # the World's view of the worker's progress
                waits = [e.correlation_id for e in await run.events() if e.type == "wait_created"]
                await asyncio.sleep(0.02)
        (wait,) = waits
        assert wait is not None
        await world.events.create(
            run.run_id, events.WaitCompleted(correlation_id=wait), in_band=False
        )
        sent_before = len(world.queue.sent)
        await world.queue.send(
            messages.OrchestratorMessage(
                run_id=run.run_id, deployment_id="local", run_spec_version=hint
            )
        )
        assert await run.result(timeout=15) == "rested"
        assert (await run.get()).spec_version == run_version
        later = [
            s.message
            for s in world.queue.sent[sent_before + 1 :]
            if isinstance(s.message, messages.OrchestratorMessage)
            and s.message.wait_continuation is None
        ]
        assert later and later[0].run_spec_version == run_version, "handed off, re-stamped"
        assert all(m.spec_version == run_version for m in later)
    finally:
        await app.close()
        await world.close()


@pytest.mark.parametrize("spec_version", [8, 9])
async def test_an_unstamped_message_for_another_deployment_is_rerouted_stamped(
    tmp_path: Path, spec_version: int
) -> None:
    """Seed 003 "Stamps at every send site" (the deployment re-route): an unstamped wake
    naming another deployment is re-sent to the run's deployment stamped with the run's
    version, which the worker read once to route it; nothing replayed or written."""
    world = await _world(tmp_path)
    try:
        await world.deployments.register("blue")
        run = await world.inner.runs.create(
            workflow_name="wf", input={"args": [], "kwargs": {}}, deployment_id="blue",
            spec_version=spec_version,
        )  # fmt: skip
        app = _app(world)
        worker = Worker(app.runtime(world))  # type: ignore[arg-type]
        ran.clear()
        unstamped = messages.OrchestratorMessage(run_id=run.run_id, deployment_id="green")
        assert await worker.handle(unstamped, META) == messages.ACK
        (sent,) = world.queue.sent
        assert isinstance(sent.message, messages.OrchestratorMessage)
        assert (sent.message.deployment_id, sent.message.run_spec_version) == (
            "blue",
            spec_version,
        )
        assert sent.message.reroute_count == 1 and sent.delay_seconds == 1.0
        assert ran == [] and [t for t in world.trace if t.what == "write"] == []
    finally:
        await world.close()
