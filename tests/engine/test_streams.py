"""Streams (issue 17 item 6, docs/streams.md): a step writes chunks with
``get_writable(name)``; ``run.stream(name)`` reads them, live.

Every test runs on both real Worlds (local SQLite, and Postgres + NATS on real
servers); the ones marked ``BOTH_FORMATS`` on spec 8 runs too. Ordering is proven
by gates (a step waits on an event the reader sets), never by sleeping: the live
test's step cannot write its second chunk before the reader saw the first.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from treadle import (
    StepFailed,
    StreamClosedError,
    StreamError,
    StreamNameInvalid,
    StreamWriteRefused,
    get_writable,
    step_metadata,
)
from treadle.errors import RunCancelledError, SerializationError, ValueLimitExceeded
from treadle.world import events, messages, records, streamrules

from .audit import assert_sound, cold_outcome, types
from .conftest import BOTH_FORMATS, MakeApp
from .faults import FaultyWorld
from .optimistic import HOLD_BOUND_SECONDS, TURBO_ONLY, hold_writes, is_run_started

WAIT = 30.0


async def _collect(stream: Any) -> list[Any]:
    async with asyncio.timeout(WAIT):
        return [item async for item in stream]


@BOTH_FORMATS
async def test_a_reader_sees_each_chunk_while_the_step_still_runs(make_app: MakeApp) -> None:
    """The step writes "Hel", then waits until the reader has it (the reader sets ``go``
    only then, while the run is running), then writes "lo" and closes: the reader got
    chunk 1 before chunk 2 existed, and ends at the close."""
    app = make_app()
    go = asyncio.Event()

    @app.step
    async def talk() -> str:
        tokens = get_writable("tokens")
        await tokens.write("Hel")
        await tokens.flush()
        await asyncio.wait_for(go.wait(), WAIT)
        await tokens.write("lo")
        await tokens.close()
        return "said"

    @app.workflow
    async def chat() -> str:
        return await talk()

    run = await app.start(chat)
    seen: list[str] = []
    async with asyncio.timeout(WAIT):
        async for value in run.stream("tokens"):
            seen.append(value)
            if len(seen) == 1:
                assert await run.status() == "running"
                go.set()
    assert seen == ["Hel", "lo"]
    assert await run.result(timeout=WAIT) == "said"
    await assert_sound(run)


@BOTH_FORMATS
async def test_after_the_run_ended_from_the_start_and_from_an_index(make_app: MakeApp) -> None:
    """Two steps write the default stream and never close it: the run's end ends it. Read
    afterwards from 0, from an index, past the end; chunk records name their step
    attempt, and each attempt's seqs are dense."""
    app = make_app()

    @app.step
    async def count(n: int) -> int:
        out = get_writable()
        for i in range(n):
            await out.write({"i": i})
        await out.write(b"\x00\xff")  # bytes cross too (serde)
        return n

    @app.workflow
    async def twice() -> int:
        return await count(2) + await count(1)

    run = await app.start(twice)
    assert await run.result(timeout=WAIT) == 3
    expected = [{"i": 0}, {"i": 1}, b"\x00\xff", {"i": 0}, b"\x00\xff"]
    assert await _collect(run.stream()) == expected
    assert await _collect(run.stream("default", start=3)) == expected[3:]
    assert await _collect(run.stream(start=10)) == []
    chunks = await _collect(run.stream_chunks())
    assert [c.index for c in chunks] == [0, 1, 2, 3, 4]
    assert [(c.attempt, c.seq) for c in chunks] == [(1, 0), (1, 1), (1, 2), (1, 0), (1, 1)]
    assert chunks[0].step_id == chunks[2].step_id != chunks[3].step_id
    assert [(s.name, s.count, s.closed) for s in await run.streams()] == [("default", 5, False)]
    assert await _collect(run.stream("never-written")) == []


async def test_a_retried_steps_chunks_follow_the_abandoned_attempts(make_app: MakeApp) -> None:
    """The retry rule: append-only, each chunk marked with its attempt. Attempt 1 writes
    and fails; attempt 2 writes and closes: the reader sees both, in order, and can tell
    them apart (``stream_chunks``)."""
    app = make_app()

    @app.step(max_retries=2)
    async def flaky() -> str:
        attempt = step_metadata().attempt
        log = get_writable("log")
        await log.write(f"try {attempt}")
        if attempt == 1:
            await log.flush()
            raise RuntimeError("boom")
        await log.write("done")
        await log.close()
        return "ok"

    @app.workflow
    async def flow() -> str:
        return await flaky()

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == "ok"
    chunks = await _collect(run.stream_chunks("log"))
    assert [(c.value, c.attempt, c.seq) for c in chunks] == [
        ("try 1", 1, 0),
        ("try 2", 2, 0),
        ("done", 2, 1),
    ]
    latest = max(c.attempt for c in chunks)
    assert [c.value for c in chunks if c.attempt == latest] == ["try 2", "done"]


async def test_a_refused_optimistic_start_leaves_no_chunks(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003: "Stream and attribute writes waiting on the barrier fail instead of
    writing". The fence refuses turbo's run_started after the early body wrote a chunk:
    that chunk waited on the barrier and fails (``start_refused``); the redelivery runs
    the body again and its chunk is the only one stored."""
    app = make_app(world=faulty, **TURBO_ONLY)
    ran: Counter[str] = Counter()
    refusals: list[str] = []

    @app.step
    async def work() -> str:
        ran["work"] += 1
        out = get_writable("s")
        await out.write(f"body {ran['work']}")
        try:
            await out.close()
        except StreamWriteRefused as exc:
            refusals.append(exc.reason)
            raise
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    faulty.events.refuse_in_band(1, when=is_run_started)
    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == "w"
    assert ran == Counter(work=2)
    assert refusals == ["start_refused"]
    chunks = await _collect(run.stream_chunks("s"))
    assert [(c.value, c.attempt, c.seq) for c in chunks] == [("body 2", 1, 0)]
    kinds = types(await assert_sound(run))
    assert kinds.count("step_started") == 1


async def test_a_run_cancelled_before_run_started_stores_no_chunk(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """The early body wrote while run_started was held; the run was cancelled meanwhile,
    so run_started (and the step's start) are refused: the chunk is refused too."""
    gate = hold_writes(faulty, is_run_started)
    app = make_app(world=faulty, **TURBO_ONLY)
    entered = asyncio.Event()
    refusals: list[str] = []

    @app.step
    async def work() -> str:
        out = get_writable("s")
        await out.write("early")
        entered.set()
        try:
            await out.flush()
        except StreamWriteRefused as exc:
            refusals.append(exc.reason)
            raise
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    await asyncio.wait_for(entered.wait(), HOLD_BOUND_SECONDS)
    await run.cancel()
    gate.release.set()
    with pytest.raises(RunCancelledError):
        await run.result(timeout=WAIT)
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    assert await _collect(run.stream("s")) == []
    assert (await streamrules.streams_of(faulty).read(run.run_id, "s")).count == 0
    assert refusals == ["start_refused"]


class _HeldStreams:
    """The World's streams with every append held until ``release`` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.release = asyncio.Event()
        self.held = asyncio.Event()

    async def append(self, *args: Any, **kwargs: Any) -> records.StreamAppend:
        self.held.set()
        await asyncio.wait_for(self.release.wait(), HOLD_BOUND_SECONDS)
        result: records.StreamAppend = await self.inner.append(*args, **kwargs)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_step_returning_while_its_stream_flushes_hands_the_delivery_off(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Stream-flush handoff": the inline step returns while its chunk is still
    on its way (the append is held). Its outcome is written, and the delivery ends with a
    handoff (the same message again at once, not counted) once no body runs; the flush
    finishes and the run continues in the handoff."""
    held = _HeldStreams(faulty.inner.streams)
    faulty.streams = held
    app = make_app(world=faulty)

    @app.step
    async def respond() -> str:
        await get_writable("response").write("ok")
        return "sent"  # the chunk is still flushing

    @app.workflow
    async def webhook() -> str:
        return await respond() + "!"

    run = await app.start(webhook)
    await asyncio.wait_for(held.held.wait(), HOLD_BOUND_SECONDS)
    queue = faulty.queue
    await queue.until(
        lambda: any(isinstance(a.result, messages.Handoff) for a in queue.orchestrator_answers())
    )
    kinds = types(await run.events())
    assert "step_completed" in kinds and "run_completed" not in kinds
    assert (await faulty.inner.streams.read(run.run_id, "response")).count == 0
    held.release.set()
    assert await run.result(timeout=WAIT) == "sent!"
    answers = queue.orchestrator_answers()
    assert isinstance(answers[0].result, messages.Handoff)
    handoff = answers[0].meta.message_id
    assert any(a.meta.message_id == handoff and a.result == messages.ACK for a in answers[1:])
    assert await _collect(run.stream("response")) == ["ok"]
    await assert_sound(run)


async def test_bad_input_is_a_clear_error_at_the_call_and_records_nothing(
    make_app: MakeApp,
) -> None:
    """Over the size limit, a type serde cannot encode, a write after close, a bad name,
    get_writable in workflow code: each raises at the call, naming what is wrong, and
    nothing is stored."""
    app = make_app(TREADLE_MAX_STREAM_CHUNK_BYTES=1024)
    caught: dict[str, BaseException] = {}

    @app.step
    async def misuse() -> str:
        out = get_writable("s")
        for what, chunk in [("big", "x" * 2000), ("type", object())]:
            try:
                await out.write(chunk)
            except SerializationError as exc:
                caught[what] = exc
        try:
            get_writable("no spaces allowed")
        except StreamNameInvalid as exc:
            caught["name"] = exc
        closed = get_writable("closed")
        await closed.close()
        try:
            await closed.write("late")
        except StreamClosedError as exc:
            caught["closed"] = exc
        return "checked"

    @app.workflow
    async def flow() -> str:
        try:
            get_writable("s")
        except StreamError as exc:
            caught["workflow"] = exc
        return await misuse()

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == "checked"
    big = caught["big"]
    assert isinstance(big, ValueLimitExceeded)
    assert big.setting == "TREADLE_MAX_STREAM_CHUNK_BYTES" and "1024-byte limit" in str(big)
    assert "stream 's' chunk 0" in str(caught["type"])
    assert "no spaces allowed" in str(caught["name"])
    assert "this writer was closed" in str(caught["closed"])
    assert "workflow code" in str(caught["workflow"])
    assert await _collect(run.stream("s")) == []
    assert [(s.name, s.count) for s in await run.streams()] == [("closed", 0)]
    with pytest.raises(StreamNameInvalid):
        run.stream("bad name")
    with pytest.raises(ValueError, match="start must be an index"):
        run.stream("s", start=-1)


async def test_a_misused_stream_fails_the_step_at_once(make_app: MakeApp) -> None:
    """A stream error is a FatalError: a step that lets it escape fails without retries."""
    app = make_app()
    ran: Counter[int] = Counter()

    @app.step(max_retries=3)
    async def oversize() -> None:
        ran[step_metadata().attempt] += 1
        out = get_writable()
        await out.close()
        await out.write("after close")  # StreamClosedError: a FatalError

    @app.workflow
    async def flow() -> str:
        try:
            await oversize()
        except StepFailed as exc:
            return str(exc)
        return "no"

    run = await app.start(flow)
    assert "this writer was closed" in await run.result(timeout=WAIT)
    assert ran == Counter({1: 1})


async def test_a_sync_step_writes_through_the_sync_methods(make_app: MakeApp) -> None:
    app = make_app()

    @app.step
    def progress(n: int) -> int:
        out = get_writable("progress")
        for i in range(n):
            out.write_sync(i)
        out.close_sync()
        return n

    @app.workflow
    async def flow() -> int:
        return await progress(3)

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == 3
    assert await _collect(run.stream("progress")) == [0, 1, 2]


async def test_a_finished_runs_log_replays_to_the_same_outcome(make_app: MakeApp) -> None:
    """Streams write nothing to the log: a finished run's log replays cold to the same
    result, with no new decision (chunks are not replayed)."""
    app = make_app()

    @app.step
    async def emit(word: str) -> str:
        out = get_writable("words")
        await out.write(word)
        await out.flush()
        return word.upper()

    @app.workflow
    async def flow() -> str:
        return await emit("a") + await emit("b")

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == "AB"
    log = await assert_sound(run)
    assert cold_outcome(flow, log) == ("completed", "AB")
    assert not any(isinstance(e.event, events.AttrSet) for e in log)
    assert await _collect(run.stream("words")) == ["a", "b"]
