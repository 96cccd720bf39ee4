"""Storage conformance of streams (``contract.Streams``, ``world.streamrules``).

Pins the append rules every World makes in one transaction (run, step attempt,
closed stream, idempotent retry, dense seq), the read page's snapshot (chunks,
count, closed, run ended), ``list``, the append notification and a restart.
Subclass ``StreamsConformance`` as ``Test...`` with a ``harness`` fixture.
"""

from __future__ import annotations

import asyncio

import pytest

from treadle import errors
from treadle.world import contract, events, streamrules
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


def _streams(world: contract.World) -> contract.Streams:
    return streamrules.streams_of(world)


async def _run_with_step(world: contract.World, step_id: str = "s1") -> str:
    """A started run whose inline step ``step_id`` has attempt 1 started."""
    run_id = await support.started_run(world)
    await support.in_band(world, run_id, support.inline_start(step_id))
    return run_id


class StreamsConformance:
    """``world.streams`` on any World's storage."""

    async def test_appends_take_the_next_indexes_with_their_attempt_and_seq(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            first = await streams.append(
                run_id, "tokens", ["a", {"b": [1, 2.5, None]}], step_id="s1", attempt=1, first_seq=0
            )
            assert (first.first_index, first.count, first.closed) == (0, 2, False)
            second = await streams.append(
                run_id, "tokens", ["ü €"], step_id="s1", attempt=1, first_seq=2
            )
            assert (second.first_index, second.count) == (2, 1)
            page = await streams.read(run_id, "tokens")
            assert [c.data for c in page.chunks] == ["a", {"b": [1, 2.5, None]}, "ü €"]
            assert [(c.index, c.step_id, c.attempt, c.seq) for c in page.chunks] == [
                (0, "s1", 1, 0),
                (1, "s1", 1, 1),
                (2, "s1", 1, 2),
            ]
            assert (page.count, page.closed, page.run_ended) == (3, False, False)
            tail = await streams.read(run_id, "tokens", start=1, limit=1)
            assert [c.index for c in tail.chunks] == [1]
            assert tail.count == 3
            other = await streams.read(run_id, "other")
            assert (other.chunks, other.count, other.closed) == ((), 0, False)
            assert [(s.name, s.count, s.closed) for s in await streams.list(run_id)] == [
                ("tokens", 3, False)
            ]

    async def test_only_the_steps_latest_started_attempt_appends(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            await streams.append(run_id, "s", ["x"], step_id="s1", attempt=1, first_seq=0)
            with pytest.raises(errors.StreamWriteRefused) as unstarted:
                await streams.append(run_id, "s", ["y"], step_id="s1", attempt=2, first_seq=0)
            assert unstarted.value.reason == "not_started"
            with pytest.raises(errors.StreamWriteRefused) as unknown:
                await streams.append(run_id, "s", ["y"], step_id="nope", attempt=1, first_seq=0)
            assert unknown.value.reason == "not_started"
            await support.in_band(
                world,
                run_id,
                events.StepRetrying(
                    correlation_id="s1", step_name="add", attempt=1, error=support.BOOM
                ),
            )
            # The abandoned attempt may still flush until the next one starts.
            await streams.append(run_id, "s", ["x2"], step_id="s1", attempt=1, first_seq=1)
            await support.out_of_band(world, run_id, support.inline_start("s1", attempt=2))
            with pytest.raises(errors.StreamWriteRefused) as stale:
                await streams.append(run_id, "s", ["late"], step_id="s1", attempt=1, first_seq=2)
            assert stale.value.reason == "stale_attempt"
            await streams.append(run_id, "s", ["z"], step_id="s1", attempt=2, first_seq=0)
            # After its outcome, the attempt's flush still lands.
            await support.out_of_band(world, run_id, support.step_completed("s1"))
            await streams.append(run_id, "s", ["z2"], step_id="s1", attempt=2, first_seq=1)
            page = await streams.read(run_id, "s")
            assert [(c.data, c.attempt, c.seq) for c in page.chunks] == [
                ("x", 1, 0),
                ("x2", 1, 1),
                ("z", 2, 0),
                ("z2", 2, 1),
            ]

    async def test_a_created_step_never_started_appends_nothing(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            await support.in_band(world, run_id, support.step_created("bg"))
            with pytest.raises(errors.StreamWriteRefused) as refused:
                await _streams(world).append(
                    run_id, "s", ["x"], step_id="bg", attempt=1, first_seq=0
                )
            assert refused.value.reason == "not_started"
            assert (await _streams(world).read(run_id, "s")).count == 0
            assert await _streams(world).list(run_id) == []

    @pytest.mark.parametrize("ending", support.ENDINGS)
    async def test_an_ended_run_takes_no_chunk(self, harness: WorldHarness, ending: str) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            await streams.append(run_id, "s", ["x"], step_id="s1", attempt=1, first_seq=0)
            await support.end_run(world, run_id, ending)
            with pytest.raises(errors.StreamWriteRefused) as refused:
                await streams.append(run_id, "s", ["y"], step_id="s1", attempt=1, first_seq=1)
            assert refused.value.reason == "run_ended"
            page = await streams.read(run_id, "s")
            assert (page.count, page.run_ended, page.closed) == (1, True, False)

    async def test_a_closed_stream_refuses_chunks_and_closing_again_stores_nothing(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            closed = await streams.append(
                run_id, "s", ["last"], step_id="s1", attempt=1, first_seq=0, close=True
            )
            assert closed.closed
            with pytest.raises(errors.StreamClosedError):
                await streams.append(run_id, "s", ["more"], step_id="s1", attempt=1, first_seq=1)
            again = await streams.append(
                run_id, "s", [], step_id="s1", attempt=1, first_seq=1, close=True
            )
            assert again.replayed
            assert again.closed
            only_close = await streams.append(
                run_id, "empty", [], step_id="s1", attempt=1, first_seq=0, close=True
            )
            assert (only_close.count, only_close.closed) == (0, True)
            page = await streams.read(run_id, "s")
            assert (page.count, page.closed) == (1, True)
            assert (await streams.read(run_id, "empty")).closed

    async def test_a_retried_append_converges_and_a_gap_is_a_contract_error(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            await streams.append(run_id, "s", ["a", "b"], step_id="s1", attempt=1, first_seq=0)
            retried = await streams.append(
                run_id, "s", ["a", "b"], step_id="s1", attempt=1, first_seq=0
            )
            assert retried.replayed
            assert retried.count == 0
            with pytest.raises(errors.WorldContractError):
                await streams.append(run_id, "s", ["d"], step_id="s1", attempt=1, first_seq=3)
            assert (await streams.read(run_id, "s")).count == 2

    async def test_bad_calls_are_refused_before_anything_is_stored(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            for bad in ["", "has space", "-dash", "x" * 129, "tab\t"]:
                with pytest.raises(errors.StreamNameInvalid):
                    await streams.append(run_id, bad, ["x"], step_id="s1", attempt=1, first_seq=0)
                with pytest.raises(errors.StreamNameInvalid):
                    await streams.read(run_id, bad)
            with pytest.raises(errors.WorldContractError):
                await streams.append(run_id, "s", [], step_id="s1", attempt=1, first_seq=0)
            with pytest.raises(errors.RunNotFound):
                await streams.append("wrun_nope", "s", ["x"], step_id="s1", attempt=1, first_seq=0)
            with pytest.raises(errors.RunNotFound):
                await streams.read("wrun_nope", "s")
            with pytest.raises(errors.RunNotFound):
                await streams.list("wrun_nope")
            assert await streams.list(run_id) == []

    async def test_concurrent_appends_of_two_steps_keep_indexes_dense(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world, "s1")
            await support.in_band(world, run_id, support.inline_start("s2"))
            streams = _streams(world)

            async def writer(step_id: str) -> None:
                for seq in range(10):
                    await streams.append(
                        run_id, "s", [f"{step_id}-{seq}"], step_id=step_id, attempt=1, first_seq=seq
                    )

            await asyncio.gather(writer("s1"), writer("s2"))
            page = await streams.read(run_id, "s")
            assert [c.index for c in page.chunks] == list(range(20))
            for step_id in ("s1", "s2"):
                mine = [c for c in page.chunks if c.step_id == step_id]
                assert [c.seq for c in mine] == list(range(10))
                assert [c.data for c in mine] == [f"{step_id}-{i}" for i in range(10)]

    async def test_a_subscriber_hears_an_append(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            streams = _streams(world)
            heard = asyncio.Event()
            sub = streams.subscribe(run_id, "s", heard.set)
            try:
                # A listener may take a moment to be in place: append until heard.
                for seq in range(50):
                    await streams.append(run_id, "s", [seq], step_id="s1", attempt=1, first_seq=seq)
                    try:
                        async with asyncio.timeout(0.2):
                            await heard.wait()
                        break
                    except TimeoutError:
                        continue
                assert heard.is_set()
            finally:
                sub.close()

    async def test_chunks_survive_a_restart(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            run_id = await _run_with_step(world)
            await _streams(world).append(
                run_id, "s", ["kept"], step_id="s1", attempt=1, first_seq=0, close=True
            )
        async with support.opened(harness) as world:
            page = await _streams(world).read(run_id, "s")
            assert ([c.data for c in page.chunks], page.closed) == (["kept"], True)
