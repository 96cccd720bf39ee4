"""Hooks and sleeps on the local World (seed 003 "Hooks", "Timers and waits")."""

from __future__ import annotations

import asyncio
import time

import pytest

from treadle import Hook, HookConflictError, create_hook, sleep
from treadle.errors import HookNotFound, RunExpired, WorldContractError
from treadle.world import events

from .conftest import BOTH_FORMATS, MakeApp

# Spec 9 on both Worlds and spec 8 on the local one.
pytestmark = BOTH_FORMATS


class Approval(Hook):
    approved: bool


async def _wait_for_status(run: object, status: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (current := await run.status()) != status:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"run still {current}, expected {status}"
        await asyncio.sleep(0.02)  # polling the World's view of another task's progress


async def _wait_for_hook(app: object, token: str, timeout: float = 10) -> None:
    world = await app.world()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while True:
        try:
            await world.hooks.get_by_token(token)
            return
        except HookNotFound:
            assert time.monotonic() < deadline, f"hook {token} never created"
            await asyncio.sleep(0.02)


async def test_resume_hook_delivers_the_payload(make_app: MakeApp) -> None:
    """A suspended run wakes on resume_hook and sees the validated payload."""
    app = make_app()

    @app.workflow
    async def flow(order: str) -> str:
        answer = await Approval.wait(token=f"approve:{order}")
        assert answer is not None
        return f"{order} approved={answer.approved}"

    run = await app.start(flow, "o-1")
    await _wait_for_hook(app, "approve:o-1")
    await app.resume_hook("approve:o-1", {"approved": True})
    assert await run.result(timeout=10) == "o-1 approved=True"


async def test_hook_timeout_returns_none_and_frees_the_token(make_app: MakeApp) -> None:
    """Hook.wait(timeout=) returns None when the sleep wins, and the token is free after.

    D4 (seed 003 "Terminal hook disposal"): the workflow returns right after disposing,
    so the terminal event frees the hook and no hook_disposed is written; a disposal in
    a run that goes on is pinned by test_bugs_hooks.py (the timed-out hook's test)."""
    app = make_app()

    @app.workflow
    async def flow() -> str:
        answer = await Approval.wait(token="slow", timeout=0.3)
        return "timed out" if answer is None else "answered"

    run = await app.start(flow)
    assert await run.result(timeout=10) == "timed out"
    types = [e.type for e in await run.events()]
    assert types[-1] == "run_completed"
    assert "wait_completed" in types
    assert "hook_received" not in types
    assert "hook_disposed" not in types
    with pytest.raises(HookNotFound):
        await (await app.world()).hooks.get_by_token("slow")


async def test_a_taken_token_is_a_conflict_for_the_second_run(make_app: MakeApp) -> None:
    """D3: run B's hook with run A's token gets hook_conflict; its await raises."""
    app = make_app()

    @app.workflow
    async def holder() -> str:
        await Approval.wait(token="shared")
        return "holder done"

    @app.workflow
    async def latecomer() -> str:
        hook = create_hook("shared")
        try:
            await hook.payload()
        except HookConflictError as exc:
            return f"conflict with {exc.holder_run_id}"
        return "no conflict"

    first = await app.start(holder)
    await _wait_for_hook(app, "shared")
    second = await app.start(latecomer)
    assert await second.result(timeout=10) == f"conflict with {first.run_id}"
    assert "hook_conflict" in [e.type for e in await second.events()]
    await app.resume_hook("shared", {"approved": False})
    assert await first.result(timeout=10) == "holder done"


async def test_a_finished_run_frees_its_open_hooks(make_app: MakeApp) -> None:
    """Audit D4: the terminal event frees a hook left open (no hook_disposed is written for
    it); a new run can take the token."""
    app = make_app()

    @app.workflow
    async def leaves_hook_open() -> str:
        create_hook("reusable")
        await sleep(0.05)  # a suspension: the hook is written (and held) before the end
        return "done"

    @app.workflow
    async def takes_it() -> str:
        answer = await Approval.wait(token="reusable")
        return f"approved={answer.approved if answer else None}"

    first = await app.start(leaves_hook_open)
    assert await first.result(timeout=10) == "done"
    first_types = [e.type for e in await first.events()]
    assert "hook_created" in first_types
    assert "hook_disposed" not in first_types
    second = await app.start(takes_it)
    await _wait_for_hook(app, "reusable")
    await app.resume_hook("reusable", {"approved": True})
    assert await second.result(timeout=10) == "approved=True"


async def test_resume_of_an_unknown_token_is_hook_not_found(make_app: MakeApp) -> None:
    """D2: resuming a token nobody holds raises HookNotFound and writes nothing."""
    app = make_app()
    with pytest.raises(HookNotFound, match="nobody"):
        await app.resume_hook("nobody", {})


async def test_two_concurrent_sleeps_complete_in_order(make_app: MakeApp) -> None:
    """C4: gather(sleep 0.3, sleep 0.6): both complete, the shorter first, none early."""
    app = make_app()

    @app.workflow
    async def flow() -> str:
        await asyncio.gather(sleep(0.6), sleep(0.3))
        return "slept"

    started = time.monotonic()
    run = await app.start(flow)
    assert await run.result(timeout=10) == "slept"
    assert time.monotonic() - started >= 0.6
    log = await run.events()
    created = {e.correlation_id: e.event.resume_at for e in log if e.type == "wait_created"}
    done = [e for e in log if e.type == "wait_completed"]
    assert len(done) == 2
    assert [created[e.correlation_id] for e in done] == sorted(created.values())
    for event in done:
        assert event.created_at >= created[event.correlation_id], "a wait completed early"


async def test_wake_up_ends_a_sleep_at_once(make_app: MakeApp) -> None:
    """C9 / follow-up 1: wake_up() is recorded, so the orchestrator completes the wait now."""
    app = make_app()

    @app.workflow
    async def flow() -> str:
        await sleep("1h")
        return "woke early"

    run = await app.start(flow)
    world = await app.world()
    deadline = time.monotonic() + 10
    while "wait_created" not in [e.type for e in await run.events()]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    del world
    assert await run.wake_up() == 1
    assert await run.result(timeout=10) == "woke early"


async def test_wake_up_of_an_ended_run_returns_zero_and_records_nothing(
    make_app: MakeApp, spec_version: int
) -> None:
    """A wake_up() after the run ended is 0, no error, and adds nothing after the end.

    Simulation seeds 215, 336, 338: a wake_requested landed after run_completed
    (logcheck: only outcomes, completions, disposals and attributes may follow it).
    The World refuses it as RunExpired (events.REFUSED_ON_TERMINAL_RUN).
    """
    app = make_app()

    @app.workflow
    async def flow() -> str:
        await sleep(0.05)
        return "done"

    run = await app.start(flow)
    assert await run.result(timeout=10) == "done"
    before = await run.events()
    assert before[-1].type == "run_completed"
    assert await run.wake_up() == 0
    assert await run.wake_up(waits=["anything"]) == 0
    after = await run.events()
    assert [e.slot for e in after] == [e.slot for e in before]
    world = await app.world()
    # A spec 8 run never receives a wake_requested at all (a spec 9 event).
    refused = RunExpired if spec_version == 9 else WorldContractError
    with pytest.raises(refused):
        await world.events.create(run.run_id, events.WakeRequested(), in_band=False)
    assert (await world.runs.get(run.run_id)).seq == before[-1].slot
