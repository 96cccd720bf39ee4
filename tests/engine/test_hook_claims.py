"""Hook force-claim, token retention and the terminal drain, end to end on the local World
and on Postgres + NATS (issue 17 item 8; seed 003 "Force-claim", "Terminal hook
disposal", "Hook edge cases").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from treadle import (
    FeatureNeedsSpec9,
    HookForceClaimedError,
    HookRunEnded,
    create_hook,
    hookredirects,
)
from treadle.errors import HookNotFound
from treadle.world import events, records

from .conftest import SPEC8_CASES, MakeApp, OpenWorld
from .replaycheck import assert_replays_to_the_same_decisions


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # another task's progress, read from the World


async def _holder(app: Any, token: str) -> records.HookRecord:
    world = await app.world()
    found: list[records.HookRecord] = []

    async def held() -> bool:
        try:
            found[:] = [await world.hooks.get_by_token(token)]
        except HookNotFound:
            return False
        return True

    await _until(held, f"a hook holding {token!r}")
    return found[0]


async def _owner_is(app: Any, token: str, run_id: str) -> None:
    world = await app.world()

    async def owned() -> bool:
        try:
            return (await world.hooks.get_by_token(token)).run_id == run_id
        except HookNotFound:
            return False

    await _until(owned, f"run {run_id} holding {token!r}")


def _answered(world: Any, run_id: str) -> bool:
    """A delivery of the run's orchestrator has answered (FaultyWorld's records)."""
    ids = {
        s.meta.message_id
        for s in world.queue.started
        if s.kind == "orchestrator" and s.message.run_id == run_id
    }
    return any(a.meta.message_id in ids for a in world.queue.orchestrator_answers())


def _flows(make_app: MakeApp, world: Any = None, **settings: Any) -> Any:
    app = make_app(world=world, **settings)

    @app.step
    async def noop(x: str) -> str:
        return x

    @app.workflow
    async def holder(token: str) -> Any:
        hook = create_hook(token)
        try:
            return {"payload": await hook.payload()}
        except HookForceClaimedError as exc:
            return {"claimed_by": exc.claimed_by, "token": exc.token}

    @app.workflow
    async def careless_holder(token: str) -> Any:
        return await create_hook(token).payload()

    @app.workflow
    async def taker(token: str) -> Any:
        return await create_hook(token, force=True).payload()

    @app.workflow
    async def keeper(token: str, dispose: bool) -> str:
        hook = create_hook(token, retain_token_for="1h")
        await noop("created")  # the hook is written at this suspension
        if dispose:
            hook.dispose()  # in the last pass: the terminal drain releases it early
        return "kept"

    @app.workflow
    async def last_pass(token: str, retain: bool) -> str:
        await noop("first")
        # Created in the last pass, never awaited: written only when it retains its token.
        create_hook(token, retain_token_for="1h" if retain else None)
        return "done"

    @app.workflow
    async def plain_disposal(token: str) -> str:
        hook = create_hook(token)
        await noop("created")
        hook.dispose()  # not retained: the terminal event releases it, no hook_disposed
        return "done"

    @app.workflow
    async def conflicted(token: str) -> Any:
        hook = create_hook(token)
        await noop("written")  # the creation is written (and answered) at this suspension
        conflict = hook.conflict()
        return None if conflict is None else conflict.holder_run_id

    return app


async def test_force_claim_takes_the_token_and_the_victims_await_raises(
    make_app: MakeApp,
) -> None:
    app = _flows(make_app)
    token = "order-17"
    victim = await app.start("holder", token)
    await _owner_is(app, token, victim.run_id)
    claimer = await app.start("taker", token)
    result = await victim.result(timeout=20)
    assert result == {"claimed_by": claimer.run_id, "token": token}
    await _owner_is(app, token, claimer.run_id)
    await app.resume_hook(token, {"ok": True})
    assert await claimer.result(timeout=20) == {"ok": True}
    victim_log = [e.event for e in await victim.events()]
    disposals = [e for e in victim_log if isinstance(e, events.HookDisposed)]
    assert [d.force_claimed_by for d in disposals] == [claimer.run_id]
    created = [e for e in (e.event for e in await claimer.events()) if e.type == "hook_created"]
    assert len(created) == 1 and isinstance(created[0], events.HookCreated)
    assert (created[0].force, created[0].claimed_from) == (True, victim.run_id)
    # Both logs replay cold to the same decisions and outputs.
    assert_replays_to_the_same_decisions(app, "holder", await victim.events(), result, at_least=1)
    assert_replays_to_the_same_decisions(
        app, "taker", await claimer.events(), {"ok": True}, at_least=1
    )


async def test_an_uncaught_force_claim_fails_the_victim_once(make_app: MakeApp) -> None:
    app = _flows(make_app)
    victim = await app.start("careless_holder", "t-uncaught")
    await _owner_is(app, "t-uncaught", victim.run_id)
    claimer = await app.start("taker", "t-uncaught")
    with pytest.raises(Exception, match="force-claimed by run"):
        await victim.result(timeout=20)
    record = await victim.get()
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "HookForceClaimedError"
    types = [e.type for e in await victim.events()]
    assert types.count("run_failed") == 1 and types.count("hook_disposed") == 1
    await app.resume_hook("t-uncaught", 1)
    assert await claimer.result(timeout=20) == 1


async def test_a_resume_in_flight_follows_the_token_to_its_new_owner(
    make_app: MakeApp,
) -> None:
    """The resume looked the token up in the victim's hook; the force-claim landed before
    its write: the write is refused (HookNotFound) and the resume follows the token."""
    app = _flows(make_app)
    victim = await app.start("holder", "t-flight")
    stale = await _holder(app, "t-flight")
    claimer = await app.start("taker", "t-flight")
    await _owner_is(app, "t-flight", claimer.run_id)
    world = await app.world()
    assert await hookredirects.force_claimed_by(world, stale) == claimer.run_id
    real = world.hooks.get_by_token
    calls: list[str] = []

    async def first_stale(token: str) -> records.HookRecord:
        calls.append(token)
        return stale if len(calls) == 1 else await real(token)

    world.hooks.get_by_token = first_stale  # the lookup raced the claim
    try:
        await app.resume_hook("t-flight", "late")
    finally:
        world.hooks.get_by_token = real
    assert len(calls) == 2
    assert await claimer.result(timeout=20) == "late"
    assert (await victim.result(timeout=20))["claimed_by"] == claimer.run_id


async def test_a_retained_token_answers_run_ended_and_is_not_reused(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("keeper", "t-kept", False)
    assert await run.result(timeout=20) == "kept"
    with pytest.raises(HookRunEnded, match="has ended") as info:
        await app.resume_hook("t-kept", "late")
    assert isinstance(info.value, HookNotFound) and info.value.status == "completed"
    other = await app.start("conflicted", "t-kept")
    assert await other.result(timeout=20) == run.run_id  # the ended run still holds it
    assert "hook_received" not in [e.type for e in await run.events()]
    # A force-claim takes a retained token (no wake: the holder has ended).
    claimer = await app.start("taker", "t-kept")
    await _owner_is(app, "t-kept", claimer.run_id)
    await app.resume_hook("t-kept", "now")
    assert await claimer.result(timeout=20) == "now"


async def test_the_terminal_drain_releases_a_disposed_retained_token(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("keeper", "t-drained", True)
    assert await run.result(timeout=20) == "kept"
    types = [e.type for e in await run.events()]
    assert types[-2:] == ["hook_disposed", "run_completed"]
    with pytest.raises(HookNotFound) as info:
        await app.resume_hook("t-drained", 1)
    assert not isinstance(info.value, HookRunEnded)
    other = await app.start("conflicted", "t-drained")
    assert await other.result(timeout=20) is None


async def test_the_terminal_drain_skips_a_plain_hooks_disposal(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("plain_disposal", "t-plain")
    assert await run.result(timeout=20) == "done"
    types = [e.type for e in await run.events()]
    assert "hook_disposed" not in types and types[-1] == "run_completed"
    other = await app.start("conflicted", "t-plain")
    assert await other.result(timeout=20) is None


@pytest.mark.parametrize("retain", [True, False])
async def test_the_terminal_drain_creates_only_a_retaining_hook(
    make_app: MakeApp, retain: bool
) -> None:
    app = _flows(make_app)
    token = f"t-last-{retain}"
    run = await app.start("last_pass", token, retain)
    assert await run.result(timeout=20) == "done"
    types = [e.type for e in await run.events()]
    assert types.count("hook_created") == (1 if retain else 0)
    if retain:
        with pytest.raises(HookRunEnded):
            await app.resume_hook(token, 1)
    else:
        with pytest.raises(HookNotFound):
            await app.resume_hook(token, 1)


async def test_a_claimer_that_died_before_the_wake_repays_it_on_replay(
    make_app: MakeApp, open_world: OpenWorld
) -> None:
    """The victim's wake never reached the queue (the claimer's process died after the
    commit); the next process to replay the claimer sends it, and the victim's await
    raises."""
    from .faults import FaultyWorld

    world = FaultyWorld(await open_world())
    try:
        first = _flows(make_app, world)
        victim = await first.start("holder", "t-repay")
        await _owner_is(first, "t-repay", victim.run_id)
        # The victim's delivery ended (no linger left to see the disposal on its feed).
        await world.queue.until(lambda: _answered(world, victim.run_id))
        world.queue.drop_sends(1, lambda s: getattr(s.message, "run_id", None) == victim.run_id)
        claimer = await first.start("taker", "t-repay")
        await _owner_is(first, "t-repay", claimer.run_id)
        await world.queue.until(lambda: len(world.queue.dropped) == 1)
        await first.close(grace_seconds=2)
        assert (await victim.get()).status == "running"

        second = _flows(make_app, world)
        await second.resume_hook("t-repay", "x")  # wakes the claimer: a replay in a new process
        assert await second.get_run(claimer.run_id).result(timeout=20) == "x"
        got = await second.get_run(victim.run_id).result(timeout=20)
        assert got["claimed_by"] == claimer.run_id
    finally:
        await world.close()


def test_force_and_retention_are_refused_as_bad_input_at_the_call() -> None:
    with pytest.raises(ValueError, match="needs a token"):
        create_hook(force=True)
    with pytest.raises(ValueError, match="retain_token_for"):
        create_hook("t", retain_token_for="0s")
    with pytest.raises(ValueError, match="at most 366 days"):
        create_hook("t", retain_token_for="400d")
    with pytest.raises(ValueError, match="not a duration"):
        create_hook("t", retain_token_for="soon")


@pytest.mark.parametrize("open_world", SPEC8_CASES, indirect=True)
@pytest.mark.parametrize("workflow", ["taker", "keeper"])
async def test_a_spec8_run_fails_naming_the_feature(make_app: MakeApp, workflow: str) -> None:
    app = _flows(make_app)
    args: list[Any] = ["t-spec8"] if workflow == "taker" else ["t-spec8", False]
    run = await app.start(workflow, *args)
    with pytest.raises(Exception, match="WORKFLOW_SPEC_VERSION"):
        await run.result(timeout=20)
    record = await run.get()
    assert record.spec_version == 8 and record.error is not None
    assert record.error.type == FeatureNeedsSpec9.__name__
    feature = "force-claim" if workflow == "taker" else "token retention"
    assert feature in record.error.message
    assert "hook_created" not in [e.type for e in await run.events()]
