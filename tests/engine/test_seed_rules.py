"""Seed 003 rules the spec 9 engine had missing (issue 10 item 5; audit section 7, rows
H4, H5, RO5, RO7 and the "Observations" of section 5), on both Worlds.

- The fence capability: a World that does not declare ``capabilities.in_band_fence``
  never gets a spec 9 run: ``start`` mints spec 8 there, a spec 9 ``start_run`` is
  refused, and the orchestrator refuses to drive one, before anything is written.
- ``RunNotSupported``: out-of-band writes to a run of a format this worker does not
  know are refused with nothing written; reads still work.
- ``WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS``: a tail read that hangs releases the run
  (the delivery gives up after three attempts and the queue redelivers it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest

from treadle import Hook, runstart
from treadle.client import start_run
from treadle.errors import FenceNotSupported, ReadTimedOut, RunNotSupported
from treadle.world import events, messages, records

from .conftest import MakeApp
from .faults import Answer, FaultyWorld


class SignallingAnswers(list[Answer]):
    """The queue spy's record of handler answers, which sets ``changed`` on each one."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def append(self, answer: Answer) -> None:
        super().append(answer)
        self.changed.set()

    async def until(self, condition: Callable[[], bool], timeout: float = 15.0) -> None:
        """Wait for ``condition`` to hold after some answer, failing after ``timeout``."""
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def _without_fence(world: FaultyWorld) -> FaultyWorld:
    world.capabilities = dataclasses.replace(world.capabilities, in_band_fence=False)
    return world


# -- the fence capability (H4, RO5, RO7) ---------------------------------------------------


async def test_a_world_without_the_fence_mints_spec_8_runs_and_refuses_a_spec_9_one(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 003 "How new runs get their version" (issue 12 item 1): on a World that does not
    declare the fence, ``start`` mints spec 8 (unset, and 9 asked for) with a warning logged
    once per process; a spec 9 run asked for explicitly (``start_run``) is refused, naming
    the capability, with nothing recorded and nothing sent."""
    runstart._mint_warned.clear()  # its warning is logged once per process
    app = make_app(world=_without_fence(faulty), WORKFLOW_SPEC_VERSION=9)

    @app.workflow
    async def flow() -> str:
        return "never"

    await app.world()
    with caplog.at_level(logging.WARNING, logger="treadle.client"):
        first = await app.start(flow)
        second = await app.start(flow)
    assert [(await r.get()).spec_version for r in (first, second)] == [8, 8]
    starts = [s.message for s in faulty.queue.sent if s.message.kind == "orchestrator"]
    assert [m.spec_version for m in starts][:2] == [8, 8]
    warned = [r for r in caplog.records if "in-band writer fence" in r.getMessage()]
    assert len(warned) == 1 and "new runs are spec 8" in warned[0].getMessage()

    with pytest.raises(FenceNotSupported) as refused:
        await start_run(
            faulty, name="flow", data={"args": [], "kwargs": {}}, deployment_id="local",
            spec_version=9, run_id="wrun_01JZZZZZZZZZZZZZZZZZZZZZZY",
        )  # fmt: skip
    text = str(refused.value)
    assert "FaultyWorld" in text
    assert "capabilities.in_band_fence" in text
    assert "WORKFLOW_SPEC_VERSION" in text
    assert len((await faulty.runs.list()).runs) == 2


async def test_the_orchestrator_refuses_to_drive_a_spec_9_run_on_a_world_without_the_fence(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003: checked "at the start of every spec 9 orchestrator delivery ... before
    anything is written". A run recorded by a fenced process reaches a worker whose World
    declares no fence: each delivery fails with FenceNotSupported, the body never runs and
    the log stays at run_created."""
    ran: list[str] = []
    await start_run(
        faulty.inner,
        name="flow",
        data={"args": [], "kwargs": {}},
        deployment_id="local",
        spec_version=9,
        run_id=(run_id := "wrun_01JZZZZZZZZZZZZZZZZZZZZZZZ"),
    )
    app = make_app(world=_without_fence(faulty))

    @app.step
    async def work() -> str:
        ran.append("work")
        return "ok"

    @app.workflow
    async def flow() -> str:
        return await work()

    answers = faulty.queue.answers = SignallingAnswers()
    await app.world()  # the worker starts and takes the start message

    def refusals() -> list[Answer]:
        return [
            a for a in faulty.queue.orchestrator_answers() if isinstance(a.error, FenceNotSupported)
        ]

    await answers.until(lambda: len(refusals()) >= 2)  # refused, redelivered, refused again
    assert all(a.result is None for a in faulty.queue.orchestrator_answers())
    assert f"drive run {run_id}" in str(refusals()[0].error)
    run = await faulty.runs.get(run_id)
    assert (run.status, run.seq) == ("pending", 1)
    assert [e.type for e in (await faulty.events.list(run_id)).events] == ["run_created"]
    assert ran == []


# -- RunNotSupported (H5, audit section 7) -----------------------------------------------


class Approval(Hook):
    ok: bool


async def _spec_7_run_with_a_hook(world: Any, token: str) -> records.RunRecord:
    """A run another release created (spec 7: neither 8 nor 9), holding a live hook."""
    run = await world.runs.create(
        workflow_name="flow",
        input={"args": [], "kwargs": {}},
        deployment_id="local",
        spec_version=7,
    )
    await world.events.create(
        run.run_id,
        events.HookCreated(correlation_id="hook_1", token=token, position=0),
        in_band=True,
        expected_seq_in_band=1,
        event_count=1,
    )
    return await world.runs.get(run.run_id)


async def test_out_of_band_writes_to_a_run_of_an_unknown_format_are_refused_with_nothing_written(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "The rollback floor": a worker that does not know a run's format fails its
    writes with RunNotSupported (resume_hook, cancel, wake_up) and sends nothing; reads of
    the run (status, events) still work."""
    app = make_app(world=faulty)
    await app.world()
    before = await _spec_7_run_with_a_hook(faulty, "old-token")
    handle = app.get_run(before.run_id)

    with pytest.raises(RunNotSupported, match=r"spec version 7.*supports 8, 9"):
        await app.resume_hook("old-token", Approval(ok=True))
    with pytest.raises(RunNotSupported) as refused:
        await handle.cancel(reason="no")
    assert refused.value.run_id == before.run_id and refused.value.spec_version == 7
    with pytest.raises(RunNotSupported):
        await handle.wake_up()

    after = await faulty.runs.get(before.run_id)
    assert (after.status, after.seq, after.seq_in_band) == ("pending", 2, 2)
    assert [e.type for e in await handle.events()] == ["run_created", "hook_created"]
    assert await handle.status() == "pending"
    assert faulty.queue.sent == []


async def test_a_step_message_of_an_unknown_format_runs_no_body_and_writes_nothing(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "The rollback floor": on a shared queue a worker can take a message of a
    run whose format it does not know; it must not write to that run. The step's body never
    runs, the log is unchanged and the message is left for 900 s (Redeliver), never acked."""
    ran: list[str] = []
    app = make_app(world=faulty)

    @app.step
    async def work() -> str:
        ran.append("work")
        return "ok"

    answers = faulty.queue.answers = SignallingAnswers()
    await app.world()
    run = await _spec_7_run_with_a_hook(faulty, "old-step-token")
    await faulty.queue.send(
        messages.StepMessage(
            run_id=run.run_id,
            deployment_id="local",
            step_id="step_1",
            step_name="work",
            step_created_at=run.created_at,
            run_context=messages.RunContext(
                spec_version=7, deployment_id="local", workflow_name="flow"
            ),
            input={"args": [], "kwargs": {}},
        ),
        key=f"step:{run.run_id}:step_1",
    )
    await answers.until(lambda: any(a.kind == "step" for a in answers))
    (answer,) = [a for a in answers if a.kind == "step"]
    assert answer.result == messages.Redeliver(900.0)
    assert ran == []
    after = await faulty.runs.get(run.run_id)
    assert (after.status, after.seq) == ("pending", run.seq)


# -- WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS (audit section 5 "Observations") -----------------


class HangingEvents:
    """The World's events, except that the next ``hang`` tail reads (``after_slot > 0``)
    of a run never answer: they wait until the caller gives up (cancels them)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hang = 0
        self.hung = 0
        self.abandoned = 0
        self.any_abandoned = asyncio.Event()

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        if after_slot > 0 and self.hang > 0:
            self.hang -= 1
            self.hung += 1
            try:
                await asyncio.Event().wait()  # a read that never returns
            except asyncio.CancelledError:
                self.abandoned += 1
                if self.hang == 0:
                    self.any_abandoned.set()
                raise
        return await self._inner.list(run_id, after_slot=after_slot, limit=limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_hung_tail_read_releases_the_run_and_the_next_delivery_completes_it(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003: a read that does not answer within the read timeout is sent again with
    twice the deadline; after three attempts the delivery fails (retryable) and the queue
    redelivers the run. Before, a hung tail read held the run for ever.

    Timeline: the first delivery creates a hook and reads the log tail; that read and its
    two retries hang (100 + 200 + 400 ms). The delivery ends with ReadTimedOut, every hung
    read cancelled; the message's redelivery replays the run, reads the tail and ends
    suspended on the hook, whose payload then completes the run. (A hook, not a short
    sleep: CI once ran this on a machine so loaded that the sleep was due before any tail
    read, and the run completed without one.)"""
    hanging = HangingEvents(faulty.events)
    faulty.events = hanging  # type: ignore[assignment]
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS=100)

    @app.workflow
    async def flow() -> str:
        approval = await Approval.wait(token="hung-read")
        return "done" if approval.ok else "refused"

    hanging.hang = 3
    run = await app.start(flow)
    await faulty.queue.until(lambda: len(faulty.queue.orchestrator_answers()) >= 1)
    answers = faulty.queue.orchestrator_answers()
    first = answers[0]
    assert isinstance(first.error, ReadTimedOut)
    assert first.error.attempts == 3 and first.error.waited_ms == 700
    assert first.meta.delivery_count == 1
    assert (hanging.hung, hanging.abandoned, hanging.hang) == (3, 3, 0)

    def redelivered() -> list[Answer]:
        return [
            a
            for a in faulty.queue.orchestrator_answers()[1:]
            if a.meta.message_id == first.meta.message_id
        ]

    await faulty.queue.until(lambda: bool(redelivered()))
    again = redelivered()[0]
    assert again.meta.delivery_count == 2 and again.error is None
    await app.resume_hook("hung-read", Approval(ok=True))
    assert await run.result(timeout=20) == "done"
    assert [e.type for e in await run.events()].count("run_completed") == 1


async def test_a_hung_poll_while_an_inline_step_runs_is_abandoned_and_the_delivery_goes_on(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 003 "The client side": each poll of the tail runs under the read deadline with
    a single attempt, "so one held read cannot stop later polls". Three polls in a row hang
    while an inline step runs; each is abandoned and counts as a failed poll, the delivery
    neither fails nor stalls, and the step's outcome completes the run in that delivery."""
    hanging = HangingEvents(faulty.events)
    faulty.events = hanging  # type: ignore[assignment]
    app = make_app(
        world=faulty,
        WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS=100,
        WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS=100,
        WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS=0,  # poll at 100 ms with the feed up too
    )

    @app.step
    async def slow() -> str:
        await hanging.any_abandoned.wait()  # runs until every hung poll was given up
        return "ok"

    @app.workflow
    async def flow() -> str:
        return await slow()

    hanging.hang = 3
    caplog.set_level(logging.WARNING, logger="treadle.orchestrator.reads")
    run = await app.start(flow)
    assert await run.result(timeout=20) == "ok"
    assert (hanging.hung, hanging.abandoned) == (3, 3)
    given_up = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(given_up) == 3 and all("(attempt 1 of 1)" in m for m in given_up), given_up
    (answer,) = faulty.queue.orchestrator_answers()
    assert answer.error is None and answer.result == messages.ACK


# -- the live feed failing under a linger (EP15, RL13) ------------------------------------


class FailingFeedEvents:
    """The World's events, with live-feed subscriptions a test can fail (``on_error``, and
    nothing pushed after it), and a signal when a tail read from ``watch_after`` returned."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._subs: list[_FailableSubscription] = []
        self.watch_after = 10**9
        self.tail_read = asyncio.Event()

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        page = await self._inner.list(run_id, after_slot=after_slot, limit=limit)
        if after_slot >= self.watch_after:
            self.tail_read.set()
        return page

    def subscribe(
        self, run_id: str, after_slot: int, on_event: Any, on_error: Any
    ) -> _FailableSubscription:
        sub = _FailableSubscription(on_event, on_error)
        sub.inner = self._inner.subscribe(run_id, after_slot, sub.pushed, on_error)
        self._subs.append(sub)
        return sub

    def fail_feeds(self, exc: BaseException) -> None:
        for sub in self._subs:
            sub.fail(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _FailableSubscription:
    def __init__(self, on_event: Any, on_error: Any) -> None:
        self._on_event = on_event
        self._on_error = on_error
        self.inner: Any = None
        self.failed = False

    def pushed(self, event: events.LoggedEvent) -> None:
        if not self.failed:
            self._on_event(event)

    def fail(self, exc: BaseException) -> None:
        if not self.failed:
            self.failed = True
            self.inner.close()
            self._on_error(exc)

    def close(self) -> None:
        self.inner.close()


class Go(Hook):
    n: int


async def test_a_feed_error_while_lingering_ends_the_linger_and_the_delivery_acks(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 003 ``WORKFLOW_ORCHESTRATOR_LINGER_MS``: "a subscription that fails, at the start
    or during the linger, ends it" (EP15: the feed failure is logged and the delivery goes
    on). Timeline: the first delivery creates a hook and lingers on it (20 s); the feed
    fails; the delivery acks at once, not failed and not after the 20 s; a later resume
    wakes the run, which completes."""
    feed = FailingFeedEvents(faulty.events)
    faulty.events = feed  # type: ignore[assignment]
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=20_000)
    answers = faulty.queue.answers = SignallingAnswers()

    @app.workflow
    async def flow() -> int:
        got = await Go.wait(token="go-1")
        return got.n if got is not None else -1

    caplog.set_level(logging.INFO, logger="treadle.orchestrator.session")
    feed.watch_after = 3  # run_created, run_started, hook_created: then the tail read
    run = await app.start(flow)
    async with asyncio.timeout(15):
        await feed.tail_read.wait()  # read, found nothing: the delivery now lingers
    assert not answers
    began = asyncio.get_running_loop().time()
    feed.fail_feeds(ConnectionError("injected: the live feed dropped"))
    await answers.until(lambda: bool(faulty.queue.orchestrator_answers()))
    took = asyncio.get_running_loop().time() - began
    (first,) = faulty.queue.orchestrator_answers()
    assert first.error is None and first.result == messages.ACK
    assert took < 5, f"the delivery lingered {took:.1f} s after its feed failed"
    assert any("live feed error" in r.getMessage() for r in caplog.records)
    await app.resume_hook("go-1", Go(n=7))
    assert await run.result(timeout=15) == 7
