"""Regression tests of the hook, outcome and step-message bugs of the engine audit
(../shared/reviews/engine-audit.md sections 5 and 6: Bugs 5, 6, 8, 9, 10, F2, and the
hook edge cases HE1-HE3, D2-D4), each recreating its timeline on the local World and
on Postgres + NATS.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from treadle import Hook, HookConflictError, create_hook, sleep, step_metadata
from treadle.errors import HookNotFound, HookPayloadNotRecorded, HookWakeFailed, StorageUnavailable
from treadle.orchestrator import steps as step_handler
from treadle.world import events, ids, logcheck, messages, records

from .conftest import MakeApp
from .faults import FaultyWorld


class Approval(Hook):
    n: int


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 15.0) -> None:
    """Poll the World's view until ``check`` holds (another task's progress)."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _hook_live(app: Any, token: str, *, not_id: str | None = None) -> str:
    """Wait for a live hook holding ``token`` (other than ``not_id``); its hook id."""
    world = await app.world()
    found: list[records.HookRecord] = []

    async def live() -> bool:
        try:
            hook = await world.hooks.get_by_token(token)
        except HookNotFound:
            return False
        found[:] = [hook]
        return hook.hook_id != not_id

    await _until(live, f"a live hook for {token!r}")
    return found[0].hook_id


async def _types(run: Any) -> list[str]:
    return [e.type for e in await run.events()]


async def _log_is_sound(app: Any, run_id: str) -> None:
    world = await app.world()
    run = await world.runs.get(run_id)
    page = await world.events.list(run_id)
    assert logcheck.problems(run, page.events) == []


# -- Bug 5 / D3 / RL11: hook conflicts --------------------------------------------------


async def test_conflict_answers_the_same_live_and_on_replay(make_app: MakeApp) -> None:
    """Bug 5 (audit section 5; D3, RL11): the audit's timeline. Run A holds "shared"; run B
    creates it and branches on ``conflict()``: notify if taken, else await the payload and
    sleep on HookConflictError. Live, B's first pass sees no conflict yet; the conflict
    comes back from its hook write, and B must take the notify branch, as the cold replay
    of its step's completion does (before the fix: the sleep branch, then divergence x4
    and CorruptedEventLog)."""
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=0)  # notify runs on its own message: a cold replay

    @app.step
    async def notify(holder: str) -> str:
        return f"notified: held by {holder}"

    @app.workflow
    async def holder() -> str:
        await Approval.wait(token="shared")
        return "holder done"

    @app.workflow
    async def latecomer() -> str:
        hook = create_hook("shared")
        conflict = hook.conflict()
        if conflict is not None:
            return await notify(str(conflict.holder_run_id))
        try:
            await hook.payload()
        except HookConflictError:
            await sleep(0.2)
            return "slept"
        return "no conflict"

    first = await app.start(holder)
    await _hook_live(app, "shared")
    second = await app.start(latecomer)
    assert await second.result(timeout=15) == f"notified: held by {first.run_id}"
    types = await _types(second)
    assert "hook_conflict" in types
    assert "wait_created" not in types
    assert "run_failed" not in types
    await _log_is_sound(app, second.run_id)
    await app.resume_hook("shared", {"n": 1})
    assert await first.result(timeout=15) == "holder done"


async def test_no_inline_step_starts_while_a_hook_conflict_is_unseen(make_app: MakeApp) -> None:
    """D3 / seed 003 "Hook conflicts": a suspension holding a hook creation whose answer is
    a conflict starts none of its inline steps; the fresh pass, which sees the conflict
    at creation, decides instead (here: returns without the step)."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step
    async def side_effect() -> str:
        ran["side_effect"] += 1
        return "side effect"

    @app.workflow
    async def holder() -> str:
        await Approval.wait(token="taken")
        return "holder done"

    @app.workflow
    async def careful() -> str:
        hook = create_hook("taken")
        side = side_effect()
        conflict = hook.conflict()
        if conflict is not None:
            return f"conflict with {conflict.holder_run_id}"
        await side
        try:
            await hook.payload()
        except HookConflictError:
            return "conflict seen late"
        return "no conflict"

    first = await app.start(holder)
    await _hook_live(app, "taken")
    second = await app.start(careful)
    assert await second.result(timeout=15) == f"conflict with {first.run_id}"
    assert ran == Counter()
    assert not [t for t in await _types(second) if t.startswith("step_")]
    await app.resume_hook("taken", {"n": 1})
    assert await first.result(timeout=15) == "holder done"


async def test_each_conflicting_hook_gets_its_own_fresh_pass(make_app: MakeApp) -> None:
    """D3 / seed 003 "one in-place continuation per conflicting hook": two hooks created one
    after the other, both held elsewhere; each conflict is continued in place once, and the
    run ends with both conflicts seen by ``conflict()`` (before the fix: the second
    ``payload()`` raised HookConflictError and failed the run)."""
    app = make_app()

    @app.step
    async def note(seen: list[str | None]) -> list[str | None]:
        return seen

    @app.workflow
    async def holder() -> str:
        await asyncio.gather(Approval.wait(token="t1"), Approval.wait(token="t2"))
        return "holder done"

    @app.workflow
    async def both() -> list[str | None]:
        seen: list[str | None] = []
        for token in ("t1", "t2"):
            hook = create_hook(token)
            conflict = hook.conflict()
            seen.append(None if conflict is None else conflict.holder_run_id)
            if conflict is None:
                await hook.payload()
        result = await note(seen)
        await sleep(0.05)  # the timer's delivery replays cold: it must agree
        return result

    first = await app.start(holder)
    await _hook_live(app, "t1")
    await _hook_live(app, "t2")
    second = await app.start(both)
    assert await second.result(timeout=15) == [first.run_id, first.run_id]
    assert (await _types(second)).count("hook_conflict") == 2
    await _log_is_sound(app, second.run_id)
    await app.resume_hook("t1", {"n": 1})
    await app.resume_hook("t2", {"n": 2})
    assert await first.result(timeout=15) == "holder done"


# -- Bug 6 / D4: one payload per hook, disposal and re-creation ------------------------------


async def test_a_run_waits_on_the_same_token_twice(make_app: MakeApp) -> None:
    """Bug 6: ``a = await Ok.wait(token="t"); b = await Ok.wait(token="t")``. The first
    payload frees the token, so the second wait creates a hook, not a conflict with the
    run's own first hook (before the fix: HookConflictError naming its own run)."""
    app = make_app()

    @app.workflow
    async def twice() -> list[int]:
        a = await Approval.wait(token="again")
        b = await Approval.wait(token="again")
        assert a is not None
        assert b is not None
        return [a.n, b.n]

    run = await app.start(twice)
    first_hook = await _hook_live(app, "again")
    await app.resume_hook("again", {"n": 1})
    await _hook_live(app, "again", not_id=first_hook)
    await app.resume_hook("again", {"n": 2})
    assert await run.result(timeout=15) == [1, 2]
    types = await _types(run)
    assert types.count("hook_created") == 2
    assert "hook_conflict" not in types


async def test_create_dispose_and_recreate_a_token_in_one_pass(make_app: MakeApp) -> None:
    """Bug 6 (the ordering gap): creating, disposing and re-creating one token in one pass
    writes hook_created, hook_disposed, hook_created in that order, so the second creation
    takes the token instead of conflicting with the run's own first hook."""
    app = make_app()

    @app.workflow
    async def recreate() -> Any:
        first = create_hook("cycle")
        first.dispose()
        second = create_hook("cycle")
        return await second.payload()

    run = await app.start(recreate)
    await _until(lambda: _has(run, "hook_disposed"), "the first hook's disposal")
    await _hook_live(app, "cycle")
    await app.resume_hook("cycle", {"n": 7})
    assert await run.result(timeout=15) == {"n": 7}
    hooks = [t for t in await _types(run) if t.startswith("hook_")]
    assert hooks == ["hook_created", "hook_disposed", "hook_created", "hook_received"]


async def _has(run: Any, event_type: str) -> bool:
    return event_type in await _types(run)


async def test_a_timed_out_hook_frees_its_token_for_the_next_wait(make_app: MakeApp) -> None:
    """Bug 6 / D4: a Hook.wait that times out disposes its hook with hook_disposed while the
    run goes on, so a later wait on the same token in the same run creates a new hook."""
    app = make_app()

    @app.workflow
    async def patient() -> str:
        early = await Approval.wait(token="late", timeout=0.2)
        answer = await Approval.wait(token="late")
        assert answer is not None
        return f"early={early} then n={answer.n}"

    run = await app.start(patient)
    await _until(lambda: _has(run, "hook_disposed"), "the timed-out hook's disposal")
    await _hook_live(app, "late")
    await app.resume_hook("late", {"n": 3})
    assert await run.result(timeout=15) == "early=None then n=3"
    types = await _types(run)
    assert types.count("hook_created") == 2
    assert "hook_conflict" not in types
    assert types.index("hook_disposed") < len(types) - 1 - types[::-1].index("hook_created")


async def test_a_run_ending_with_hooks_open_frees_them_without_disposals(
    make_app: MakeApp,
) -> None:
    """D4 (seed 003 "Terminal hook disposal"): the workflow returns with two hooks open; the
    terminal event frees both without a hook_disposed, and another run takes both tokens."""
    app = make_app()

    @app.workflow
    async def leaves_open() -> str:
        create_hook("open-1")
        create_hook("open-2")
        await sleep(0.05)  # the hooks are written at this suspension
        return "done"

    @app.workflow
    async def takes(token: str) -> int:
        answer = await Approval.wait(token=token)
        assert answer is not None
        return answer.n

    first = await app.start(leaves_open)
    assert await first.result(timeout=15) == "done"
    types = await _types(first)
    assert types.count("hook_created") == 2
    assert "hook_disposed" not in types
    assert types[-1] == "run_completed"
    runs = [await app.start(takes, "open-1"), await app.start(takes, "open-2")]
    for n, token in enumerate(("open-1", "open-2")):
        await _hook_live(app, token)
        await app.resume_hook(token, {"n": n})
    assert [await r.result(timeout=15) for r in runs] == [0, 1]


# -- Bug 10 / HE3, HE1, HE2 / D2: resume_hook ---------------------------------------------------


class _EndsRunAfterLookup:
    """``hooks`` whose token lookup is followed by the run's end (a cancel) before the
    caller's write: the Bug 10 race, recreated in order."""

    def __init__(self, inner: Any, world: Any) -> None:
        self._inner = inner
        self._world = world

    async def get_by_token(self, token: str) -> records.HookRecord:
        hook: records.HookRecord = await self._inner.get_by_token(token)
        await self._world.events.create(
            hook.run_id, events.RunCancelled(reason="ends under the resume"), in_band=False
        )
        return hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_resume_to_a_run_that_just_ended_is_hook_not_found(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Bug 10 / HE3: the run ends between resume_hook's token lookup and its write; the
    resume raises HookNotFound for the token (not RunExpired) and writes nothing."""
    app = make_app(world=faulty)

    @app.workflow
    async def waits() -> str:
        await Approval.wait(token="ending")
        return "answered"

    run = await app.start(waits)
    await _hook_live(app, "ending")
    faulty.hooks = _EndsRunAfterLookup(faulty.inner.hooks, faulty.inner)
    with pytest.raises(HookNotFound, match="ending"):
        await app.resume_hook("ending", {"n": 1})
    types = await _types(run)
    assert types[-1] == "run_cancelled"
    assert "hook_received" not in types


def _is_wake(send: messages.Send) -> bool:
    """A plain wake (resume_hook's): an orchestrator message without key or start input."""
    message = send.message
    return (
        isinstance(message, messages.OrchestratorMessage)
        and send.key is None
        and message.run_input is None
    )


async def _suspended_without_delivery(app: Any, faulty: FaultyWorld, token: str) -> None:
    """The hook is live and the delivery that created it has ended (no linger holds it)."""
    await _hook_live(app, token)
    await _until(
        lambda: _true(bool([a for a in faulty.queue.orchestrator_answers() if a.result])),
        "the creating delivery's answer",
    )


async def _true(value: bool) -> bool:
    return value


async def test_a_failed_hook_wake_is_retried_after_25_and_100_ms(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """HE1 / D2 (seed 003 "Hook edge cases", item 5 of the issue): the wake after
    hook_received committed fails twice; resume_hook sends it again after 25 ms, then
    after 100 ms, and the run is woken by the third send."""
    app = make_app(world=faulty)

    @app.workflow
    async def waits() -> int:
        answer = await Approval.wait(token="flaky-wake")
        assert answer is not None
        return answer.n

    run = await app.start(waits)
    await _suspended_without_delivery(app, faulty, "flaky-wake")
    tried: list[float] = []

    def failing(send: messages.Send) -> bool:
        if _is_wake(send):
            tried.append(time.monotonic())
            return True
        return False

    faulty.queue.fail_sends(2, when=failing)
    await app.resume_hook("flaky-wake", {"n": 5})
    assert await run.result(timeout=15) == 5
    assert len(tried) == 2
    wakes = [s for s in faulty.queue.sent if _is_wake(s) and s.message.run_id == run.run_id]
    assert len(wakes) == 1
    assert tried[1] - tried[0] >= 0.02


async def test_a_hook_wake_that_keeps_failing_says_the_payload_is_recorded(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """HE1 / D2: every wake send fails; resume_hook raises HookWakeFailed (never
    HookNotFound) saying the payload is recorded, and the run's next delivery consumes it."""
    app = make_app(world=faulty)

    @app.workflow
    async def waits() -> int:
        answer = await Approval.wait(token="lost-wake")
        assert answer is not None
        return answer.n

    run = await app.start(waits)
    await _suspended_without_delivery(app, faulty, "lost-wake")
    faulty.queue.fail_sends(3, when=_is_wake)
    started = time.monotonic()
    with pytest.raises(HookWakeFailed, match="payload is recorded") as failed:
        await app.resume_hook("lost-wake", {"n": 9})
    assert time.monotonic() - started >= 0.12  # 25 ms + 100 ms between the three sends
    assert (failed.value.run_id, failed.value.attempts) == (run.run_id, 3)
    assert "hook_received" in await _types(run)
    with pytest.raises(HookNotFound):  # the payload is taken: a second resume is refused
        await app.resume_hook("lost-wake", {"n": 10})
    record = await (await app.world()).runs.get(run.run_id)
    await faulty.inner.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )
    )
    assert await run.result(timeout=15) == 9


class _FailingReceivedWrites:
    """``events`` whose next hook_received write fails before reaching the World."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.failures = 1

    async def create(self, run_id: str, event: events.Event, **kw: Any) -> Any:
        if isinstance(event, events.HookReceived) and self.failures > 0:
            self.failures -= 1
            raise StorageUnavailable("injected: the storage dropped the write")
        return await self._inner.create(run_id, event, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_resume_whose_write_recorded_nothing_is_retryable(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """HE2 / D2: the hook_received write fails having committed nothing; resume_hook raises
    HookPayloadNotRecorded (retryable, not a raw storage error or HookNotFound), the hook
    stays live, and calling resume_hook again delivers the payload."""
    app = make_app(world=faulty)

    @app.workflow
    async def waits() -> int:
        answer = await Approval.wait(token="retry-me")
        assert answer is not None
        return answer.n

    run = await app.start(waits)
    await _hook_live(app, "retry-me")
    faulty.events = _FailingReceivedWrites(faulty.events)  # type: ignore[assignment]
    with pytest.raises(HookPayloadNotRecorded) as failed:
        await app.resume_hook("retry-me", {"n": 4})
    assert failed.value.retryable
    assert isinstance(failed.value.__cause__, StorageUnavailable)
    assert "hook_received" not in await _types(run)
    await app.resume_hook("retry-me", {"n": 4})
    assert await run.result(timeout=15) == 4


# -- F2: the World refuses a stalled delivery's second outcome ---------------------------------


async def test_a_stalled_step_deliverys_late_outcome_is_refused(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """F2 (audit section 6): delivery 1 runs the body and stalls; the message's redelivery
    runs attempt 2, completes the step, and the run completes; then delivery 1 resumes and
    writes its outcome. The World refuses it, delivery 1 acknowledges, and the log keeps
    one outcome (before the fix: a second step_completed after run_completed)."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    stalled = asyncio.Event()
    release = asyncio.Event()

    @app.step
    async def body() -> str:
        attempt = step_metadata().attempt
        if attempt == 1:
            stalled.set()
            await release.wait()
        return f"done at attempt {attempt}"

    @app.workflow
    async def flow() -> str:
        return await body()

    run = await app.start(flow)
    await asyncio.wait_for(stalled.wait(), 15)
    original = next(s.message for s in faulty.queue.sent if s.message.kind == "step")
    assert isinstance(original, messages.StepMessage)
    redelivery = messages.DeliveryMeta(
        message_id="redelivered", delivery_count=2, attempt=2, invocation_started_at=0
    )
    rt = app.runtime(faulty)
    assert await step_handler.handle_step_message(rt, original, redelivery) == messages.ACK
    assert await run.result(timeout=15) == "done at attempt 2"
    release.set()
    await _until(
        lambda: _true(bool([a for a in faulty.queue.answers if a.kind == "step"])),
        "the stalled delivery's answer",
    )
    (stale,) = [a for a in faulty.queue.answers if a.kind == "step"]
    assert (stale.result, stale.error) == (messages.ACK, None)
    log = await run.events()
    outcomes = [e for e in log if e.type in events.STEP_OUTCOME_TYPES]
    assert len(outcomes) == 1
    assert isinstance(outcomes[0].event, events.StepCompleted)
    assert outcomes[0].event.result == "done at attempt 2"
    assert log[-1].type == "run_completed"
    await _log_is_sound(app, run.run_id)


# -- Bug 8, Bug 9: step messages ------------------------------------------------------------------


def _step_message(run_id: str, *, spec_version: int = 9, resent: bool = False) -> Any:
    return messages.StepMessage(
        run_id=run_id,
        step_id="step_x",
        step_name="work",
        step_created_at=datetime.now(UTC),
        step_resent=resent,
        run_context=messages.RunContext(spec_version=spec_version, workflow_name="wf"),
    )


async def test_a_step_message_for_a_missing_run_is_acknowledged_and_logged(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug 8 / H2: a step message naming a run the World does not hold ends: the queue's
    delivery answers Ack (no exception, so no redelivery loop) and a warning names the run,
    on a first delivery and on a re-sent one (which reads the log first)."""
    app = make_app(world=faulty)

    @app.step
    async def work() -> str:
        return "never"

    await app.world()  # starts the worker on the World under test
    missing = ids.new_run_id()
    caplog.set_level("WARNING", logger="treadle.orchestrator.steps")
    for resent in (False, True):
        await faulty.queue.send(_step_message(missing, resent=resent))
    await _until(
        lambda: _true(len([a for a in faulty.queue.answers if a.kind == "step"]) >= 2),
        "both step deliveries' answers",
    )
    answers = [a for a in faulty.queue.answers if a.kind == "step"]
    assert [(a.result, a.error) for a in answers] == [(messages.ACK, None)] * 2
    assert len([r for r in caplog.records if missing in r.getMessage()]) >= 2


async def test_a_step_completion_wake_carries_the_runs_spec_version(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Bug 9 / RO3: the wake a step delivery sends after the outcome is stamped with the
    run's spec version, not the one this worker mints for new runs (here 9 while the run
    is 8). Since H2 the stamp is the run's log's (run_created), never the message's: the
    message here says 7 and the wake still carries 8."""
    app = make_app(world=faulty)

    @app.step
    async def work() -> str:
        return "ok"

    run = await faulty.runs.create(
        workflow_name="wf", input=None, deployment_id="local", spec_version=8
    )
    await faulty.events.create(
        run.run_id,
        events.StepCreated(correlation_id="step_x", step_name="work", input=None),
        in_band=False,
    )
    message = _step_message(run.run_id, spec_version=7)
    meta = messages.DeliveryMeta(
        message_id="m", delivery_count=1, attempt=1, invocation_started_at=0
    )
    rt = app.runtime(faulty)  # no worker: the wake stays on the queue
    assert await step_handler.handle_step_message(rt, message, meta) == messages.ACK
    (wake,) = [s.message for s in faulty.queue.sent if s.message.kind == "orchestrator"]
    assert isinstance(wake, messages.OrchestratorMessage)
    assert wake.run_spec_version == 8
    assert app.settings.spec_version == 9
