"""Forged queue messages run nothing and write nothing; the victim run completes (H2).

security.md H2 showed on NATS, with a bare ``nats.connect(url)``: a step message with a
made-up step id ran the step body with the attacker's arguments and wrote a phantom
step into another run's log; a ``Treadle-Delivery-Offset: 1000`` header failed an idle
run; a fake run lease KV entry stalled one; a start message for a run that does not
exist ran workflow code. Each attack here is put straight onto the World's queue
(JetStream subjects and the lease bucket on Postgres + NATS, the ``queue_messages``
table on the local World) against a victim run idle on a hook, and each test asserts:
no step body ran (a body counter), no run's log changed (its events before and after),
the refusal was logged with the run id, and the victim still completes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from treadle import Hook, Workflows, errors, settings, sleep
from treadle.orchestrator import steps as step_handler
from treadle.world import events, ids, messages
from treadle.worlds.nats import names as nats_names

from .conftest import MakeApp, OpenWorld
from .forgery import Forger, start_payload, step_payload, wake_payload

TIMEOUT = 20.0


class Approval(Hook):
    approved: bool


@dataclass
class Victim:
    app: Workflows
    bodies: Counter[str] = field(default_factory=Counter)
    # Every input the workflow code was called with (replays included).
    workflow_inputs: set[str] = field(default_factory=set)


def _victim(make_app: MakeApp) -> Victim:
    """A run of ``victim(tag)``: one background step ``echo(tag)``, then a hook."""
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=0)
    victim = Victim(app)

    @app.step
    async def echo(text: str) -> str:
        victim.bodies[f"echo:{text}"] += 1
        return text

    @app.step
    async def wipe(text: str) -> str:
        victim.bodies[f"wipe:{text}"] += 1
        return "wiped"

    @app.workflow(name="victim")
    async def victim_flow(tag: str) -> str:
        victim.workflow_inputs.add(tag)
        first = await echo(tag)
        answer = await Approval.wait(token=f"victim:{tag}")
        assert answer is not None
        return f"{first}:{answer.approved}"

    @app.workflow(name="napper")
    async def napper(tag: str) -> str:
        victim.workflow_inputs.add(tag)
        await sleep(3)
        return await echo(tag)

    return victim


@pytest.fixture
async def forger_of(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    made: list[Forger] = []
    url = None
    if request.node.callspec.params.get("open_world") == "postgres+nats":
        url = request.getfixturevalue("nats_server").url

    async def make(app: Workflows) -> Forger:
        forger = Forger(await app.world(), url)
        made.append(forger)
        return forger

    yield make
    for forger in made:
        await forger.close()


async def _idle_victim(victim: Victim, tag: str = "v1") -> tuple[Any, str]:
    """Start the victim and wait until it is idle on its hook; the run and its step id."""
    run = await victim.app.start("victim", tag)
    world = await victim.app.world()
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            await world.hooks.get_by_token(f"victim:{tag}")
            break
        except errors.HookNotFound:
            assert time.monotonic() < deadline, "the victim never reached its hook"
            await asyncio.sleep(0.02)  # polling the World's view of the worker's progress
    log = await run.events()
    (step_id,) = [e.event.correlation_id for e in log if e.type == "step_created"]
    await Forger(world, None).quiet(run.run_id)
    return run, step_id


async def _log(world: Any, run_id: str) -> list[events.LoggedEvent]:
    return list((await world.events.list(run_id)).events)


async def _completes(victim: Victim, run: Any, tag: str = "v1") -> None:
    await victim.app.resume_hook(f"victim:{tag}", {"approved": True})
    assert await run.result(timeout=TIMEOUT) == f"{tag}:True"
    assert victim.bodies == Counter({f"echo:{tag}": 1})


def _refusals(caplog: pytest.LogCaptureFixture, run_id: str, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("treadle") and run_id in r.getMessage() and text in r.getMessage()
    ]


async def test_a_step_message_for_a_step_the_log_never_created_runs_nothing(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """H2 row 2: ``step_id: step_BOGUS``, a real step name and made-up arguments against
    a victim's running run ran the body and wrote ``step_started step_BOGUS``. Now the
    handler finds no creation of that step in the log: acked, logged, nothing run."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    for name in ("echo", "wipe"):
        forged = step_payload(
            run.run_id, "step_BOGUS", name, input={"args": ["evil"], "kwargs": {}}
        )
        await forger.settled(await forger.publish(forged), "step")
    assert victim.bodies == Counter({"echo:v1": 1})
    assert await _log(world, run.run_id) == before
    assert len(_refusals(caplog, run.run_id, "created no step step_BOGUS")) == 2
    await _completes(victim, run)


async def test_a_step_message_naming_a_real_step_under_another_name_runs_nothing(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """H2: the real step id with another registered step's name (``wipe``) and the log's
    input, or the real name with another input (an older sender's message carrying
    ``input``): refused, neither body runs, nothing is written."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, step_id = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    creation = next(e.event for e in before if e.type == "step_created")
    assert isinstance(creation, events.StepCreated)
    evil = json.loads(json.dumps(creation.input).replace('"v1"', '"evil"'))
    assert evil != creation.input
    await forger.settled(await forger.publish(step_payload(run.run_id, step_id, "wipe")), "step")
    await forger.settled(
        await forger.publish(step_payload(run.run_id, step_id, "echo", input=evil)), "step"
    )
    assert victim.bodies == Counter({"echo:v1": 1})
    assert await _log(world, run.run_id) == before
    assert _refusals(caplog, run.run_id, "as 'echo', not 'wipe'")
    assert _refusals(caplog, run.run_id, "its input differs")
    await _completes(victim, run)


async def test_a_start_message_for_a_run_that_does_not_exist_runs_and_writes_nothing(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """H2 row 1: a start message (``run_input``) for a run that does not exist ran the
    workflow against a log synthesized from the message (turbo). Now turbo takes the log
    from the run's record: there is none, so the message is acked and logged; no
    workflow code runs, no run is created, and the victim's log is untouched."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    ghost = ids.new_run_id()
    forged = start_payload(ghost, "victim", {"args": ["evil"], "kwargs": {}})
    await forger.settled(await forger.publish(forged))
    assert "evil" not in victim.workflow_inputs
    with pytest.raises(errors.RunNotFound):
        await world.runs.get(ghost)
    assert await _log(world, run.run_id) == before
    assert _refusals(caplog, ghost, "names no run")
    await _completes(victim, run)


async def test_a_start_message_for_a_live_run_is_served_from_the_runs_record(
    make_app: MakeApp, forger_of: Any
) -> None:
    """A forged start naming the victim with made-up input: the run is already started,
    so the delivery loads the log like any wake; the workflow never sees the made-up
    input and the victim completes with its own."""
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    forged = start_payload(run.run_id, "victim", {"args": ["evil"], "kwargs": {}})
    await forger.settled(await forger.publish(forged))
    assert victim.workflow_inputs == {"v1"}
    assert await _log(world, run.run_id) == before
    await _completes(victim, run)


async def test_a_forged_complete_waits_cuts_no_sleep_short(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A wake naming a sleeping run's wait in ``complete_waits`` completed it at once (the
    message was trusted). Only the log's ``wake_requested`` wakes a wait early now: the
    sleep ends at its time and the run completes."""
    victim = _victim(make_app)
    run = await victim.app.start("napper", "n1")
    world = await victim.app.world()
    deadline = time.monotonic() + TIMEOUT
    while not [e for e in await _log(world, run.run_id) if e.type == "wait_created"]:
        assert time.monotonic() < deadline, "the napper never slept"
        await asyncio.sleep(0.02)  # polling the World's view of the worker's progress
    created = next(e for e in await _log(world, run.run_id) if e.type == "wait_created")
    assert isinstance(created.event, events.WaitCreated)
    forger = await forger_of(victim.app)
    wake = wake_payload(run.run_id, complete_waits=[created.event.correlation_id])
    await forger.settled(await forger.publish(wake))
    assert "wait_completed" not in [e.type for e in await _log(world, run.run_id)]
    assert await run.result(timeout=TIMEOUT) == "n1"
    completed = next(e for e in await _log(world, run.run_id) if e.type == "wait_completed")
    assert completed.created_at >= created.event.resume_at


async def test_a_forged_delivery_offset_fails_no_run(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """H2 row 3: a wake with ``Treadle-Delivery-Offset: 1000`` failed an idle run at once
    (``delivered 1001 times``). Now an offset past the dead-letter bound is refused at the
    queue (dead-lettered, logged, no handler); one inside it (60, past the cap of 48) only
    counts as deliveries the headers vouch for, on which no run is failed: it is a wake.
    On the local World the same forgery is a row whose counts are out of range."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    wake = wake_payload(run.run_id)
    if forger.is_nats:
        far = await forger.publish(wake, headers={nats_names.DELIVERY_OFFSET: "1000"})
        near = await forger.publish(wake, headers={nats_names.DELIVERY_OFFSET: "60"})
        await forger.settled(near)
        assert far in await forger.dead_letter_ids()
        assert near not in await forger.dead_letter_ids()
        assert _refusals(caplog, run.run_id, "more than the 64 after which")
    else:
        forged = await forger.publish(wake, delivery_count=-5)
        await forger.settled(forged)
        assert forged in await forger.dead_letter_ids()
        assert _refusals(caplog, run.run_id, "delivery stamp is out of range")
    assert (await world.runs.get(run.run_id)).status == "running"
    assert await _log(world, run.run_id) == before
    await _completes(victim, run)


async def test_a_forged_handoff_count_is_refused(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """H2 row 5: ``Treadle-Handoffs: 999999`` made ``attempt = max(1, count - handoffs)``,
    so any message could evade the delivery cap. Handoffs past ``MAX_HANDOFFS``, or more
    handoffs than the deliveries they followed, are refused at the queue."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    wake = wake_payload(run.run_id)
    if forger.is_nats:
        forged: list[dict[str, Any]] = [
            {"headers": {nats_names.HANDOFFS: "999999"}},
            {"headers": {nats_names.HANDOFFS: "5", nats_names.DELIVERY_OFFSET: "2"}},
            {"headers": {nats_names.HANDOFFS: "-1"}},
        ]
    else:
        forged = [
            {"handoffs": 999_999, "delivery_count": 1_000_000},
            {"handoffs": 7, "delivery_count": 2},
        ]
    sent = []
    for stamp in forged:  # one at a time: none is coalesced into another's delivery
        sent.append(await forger.publish(wake, **stamp))
        await forger.settled(sent[-1])
    assert set(sent) <= await forger.dead_letter_ids()
    assert len(_refusals(caplog, run.run_id, "refused")) >= len(sent)
    assert await _log(world, run.run_id) == before
    await _completes(victim, run)


async def test_a_squatted_run_lease_stalls_no_run(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """H2 row 4 (NATS): the KV entry ``{"holder": "msg_evil", "expires_at_ms":
    99999999999999}`` on the victim's lease key swallowed the hook resume's wake (it was
    coalesced into the fake holder) and the run stayed running. An entry out of range is
    logged and treated as a free run: the wake takes the lease and the run completes."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    forger = await forger_of(victim.app)
    if not forger.is_nats:
        print("the local World has no lease KV: its run gate is its queue table's own state")
        assert await run.status() == "running"
        await _completes(victim, run)
        return
    await forger.put_lease(
        run.run_id,
        {"holder": "msg_evil", "token": "x", "expires_at_ms": 99999999999999, "coalesced": 0},
    )
    await _completes(victim, run)
    assert _refusals(caplog, "", "out of range (forged or corrupt)")


async def test_an_older_senders_step_message_with_the_logs_input_still_runs(
    open_world: OpenWorld,
) -> None:
    """Backward compatibility: a step message of an older sender carries the input
    (``input_in_log`` false). Checked against the step's creation in the log, it runs
    with the log's input when they agree; a message of this runtime carries no input and
    runs with the log's. A different input is refused with nothing written. (The handler
    is called directly, no worker consuming: its wakes stay queued.)"""
    world = await open_world()
    app = Workflows(world=world, settings_=settings.load({}), worker=False)
    bodies: Counter[str] = Counter()

    @app.step
    async def echo(text: str) -> str:
        bodies[text] += 1
        return text

    try:
        rt = app.runtime(world)
        record = await world.runs.create(
            workflow_name="victim", input=None, deployment_id="local", spec_version=9
        )
        args = {"args": ["old"], "kwargs": {}}
        for step_id in ("step_same", "step_other", "step_new"):
            await world.events.create(
                record.run_id,
                events.StepCreated(correlation_id=step_id, step_name="echo", input=args),
                in_band=False,
            )

        def message(step_id: str, **fields: Any) -> messages.StepMessage:
            return messages.StepMessage.model_validate(
                step_payload(record.run_id, step_id, "echo", **fields)
            )

        def meta(n: int) -> messages.DeliveryMeta:
            return messages.DeliveryMeta(
                message_id=ids.new_message_id(),
                delivery_count=1,
                attempt=1,
                invocation_started_at=n,
            )

        other = {"args": ["evil"], "kwargs": {}}
        before = await _log(world, record.run_id)
        answer = await step_handler.handle_step_message(
            rt, message("step_other", input=other), meta(1)
        )
        assert answer == messages.ACK
        assert await _log(world, record.run_id) == before
        assert bodies == Counter()
        await step_handler.handle_step_message(rt, message("step_same", input=args), meta(2))
        await step_handler.handle_step_message(rt, message("step_new", input_in_log=True), meta(3))
        assert bodies == Counter({"old": 2})
        done = {
            e.event.correlation_id
            for e in await _log(world, record.run_id)
            if e.type == "step_completed"
        }
        assert done == {"step_same", "step_new"}
    finally:
        await app.close(grace_seconds=1)
        await world.close()


async def test_a_forged_deployment_stamp_fails_no_run(
    make_app: MakeApp, forger_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A wake for the victim stamped ``deployment_id: gone`` on this worker's queue was
    re-routed by its stamp: deployment ``gone`` is unknown, so the run was failed as
    pinned to it (``DeploymentMismatch``). The run's record says where it is pinned now:
    here, so the message is served as a wake, logged, and the run is unharmed."""
    caplog.set_level(logging.WARNING, logger="treadle")
    victim = _victim(make_app)
    run, _ = await _idle_victim(victim)
    world = await victim.app.world()
    forger = await forger_of(victim.app)
    before = await _log(world, run.run_id)
    forged = {**wake_payload(run.run_id), "deployment_id": "gone"}
    await forger.settled(await forger.publish(forged))
    assert (await world.runs.get(run.run_id)).status == "running"
    assert await _log(world, run.run_id) == before
    assert _refusals(caplog, run.run_id, "stamped for deployment gone")
    await _completes(victim, run)
