"""Conformance of the world-wide changes feed (``contract.Changes``) and of
``Queue.backlog``, the two things the operator reads besides runs and events.

``ChangesConformance`` needs the storage half (runs, events, changes);
``BacklogConformance`` the queue half. Subclass them as ``Test...`` with a
``harness`` fixture (``harness.WorldHarness``). A World's own ways of losing its
feed (a dropped connection, another process's writes) are tested beside that
World; the resync they must cause is pinned here only as a name
(``RunChanged``/``on_resync``) every World shares.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from treadle.world import contract, messages
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.queue import step_message

WAIT_SECONDS = support.WAIT_SECONDS


class Heard:
    """What a watcher heard: every report, the highest slot per run, resyncs."""

    def __init__(self) -> None:
        self.changes: list[contract.RunChanged] = []
        self.head: dict[str, int] = {}
        self.resyncs = 0
        self._news = asyncio.Event()

    def on_change(self, change: contract.RunChanged) -> None:
        self.changes.append(change)
        self.head[change.run_id] = max(self.head.get(change.run_id, 0), change.slot)
        self._news.set()

    def on_resync(self) -> None:
        self.resyncs += 1
        self._news.set()

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Wait (on reports, never a fixed sleep) until ``done()``; fail naming ``what``."""

        async def wait() -> None:
            while not done():
                self._news.clear()
                await self._news.wait()

        try:
            await asyncio.wait_for(wait(), WAIT_SECONDS)
        except TimeoutError:
            raise AssertionError(f"never heard {what}; heard {self.changes}") from None


class ChangesConformance:
    """Every run's changes, world-wide; subclass it as ``Test...``."""

    async def test_a_new_run_is_reported_created_at_slot_one(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            heard = Heard()
            watch = await world.changes.watch(heard.on_change, heard.on_resync)
            try:
                run = await support.new_run(world)
                await heard.until(lambda: run.run_id in heard.head, f"run {run.run_id} created")
                first = next(c for c in heard.changes if c.run_id == run.run_id)
                assert first.slot == 1
                assert first.created
                assert first.deployment_id in (None, support.DEPLOYMENT)
            finally:
                watch.close()

    async def test_every_runs_new_events_are_reported_up_to_the_last_slot(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            heard = Heard()
            watch = await world.changes.watch(heard.on_change, heard.on_resync)
            try:
                one = await support.started_run(world)
                two = await support.started_run(world)
                for key in ("a", "b", "c"):
                    await support.out_of_band(world, one, support.attr(key))
                seq = {one: (await world.runs.get(one)).seq, two: (await world.runs.get(two)).seq}
                assert seq == {one: 5, two: 2}
                await heard.until(
                    lambda: all(heard.head.get(r, 0) >= s for r, s in seq.items()),
                    f"both runs up to their last slots {seq}",
                )
                assert all(heard.head[r] <= s for r, s in seq.items()), "a slot never written"
                assert all(not c.created for c in heard.changes if c.slot > 1)
            finally:
                watch.close()

    async def test_every_watcher_hears_every_change(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            first, second = Heard(), Heard()
            watches = [
                await world.changes.watch(first.on_change, first.on_resync),
                await world.changes.watch(second.on_change, second.on_resync),
            ]
            try:
                run_id = await support.started_run(world)
                await first.until(lambda: first.head.get(run_id, 0) >= 2, "slot 2 (first)")
                await second.until(lambda: second.head.get(run_id, 0) >= 2, "slot 2 (second)")
            finally:
                for watch in watches:
                    watch.close()

    async def test_a_closed_watch_hears_nothing_more(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            closed, open_ = Heard(), Heard()
            gone = await world.changes.watch(closed.on_change, closed.on_resync)
            kept = await world.changes.watch(open_.on_change, open_.on_resync)
            try:
                gone.close()
                gone.close()  # closing twice is harmless
                run = await support.new_run(world)
                await open_.until(lambda: run.run_id in open_.head, "the run's creation")
                assert closed.changes == []
            finally:
                kept.close()

    async def test_a_failing_watcher_does_not_stop_the_feed(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            heard = Heard()

            def boom(change: contract.RunChanged) -> None:
                heard.on_change(change)
                raise RuntimeError("watcher bug")

            watch = await world.changes.watch(boom, heard.on_resync)
            try:
                one = await support.new_run(world)
                await heard.until(lambda: one.run_id in heard.head, "the first run")
                two = await support.new_run(world)
                await heard.until(lambda: two.run_id in heard.head, "the second run")
            finally:
                watch.close()


class BacklogConformance:
    """``Queue.backlog``: due messages of one kind for one deployment, waiting or in
    flight; subclass it as ``Test...``. Sends go to ``backlog_deployment``, the one the
    harness's queue consumes for (NATS: its durable consumers)."""

    backlog_deployment = "default"

    async def test_backlog_counts_waiting_and_in_flight_messages_of_one_deployment(
        self, harness: WorldHarness
    ) -> None:
        deployment = self.backlog_deployment
        world = await harness.open()
        release = asyncio.Event()
        started = asyncio.Event()
        done = asyncio.Event()
        handled: list[object] = []

        async def hold(message: object, meta: messages.DeliveryMeta) -> messages.HandlerResult:
            started.set()
            await release.wait()
            handled.append(message)
            if len(handled) == 4:
                done.set()
            return messages.ACK

        consumer = await world.queue.consume({"step": hold}, concurrency=1)
        try:
            for n in range(4):
                await world.queue.send(
                    step_message(step_id=f"s{n}").model_copy(update={"deployment_id": deployment})
                )
            await asyncio.wait_for(started.wait(), WAIT_SECONDS)
            assert await world.queue.backlog("step", deployment) == 4  # 1 in flight, 3 waiting
            assert await world.queue.backlog("orchestrator", deployment) == 0
            assert await world.queue.backlog("step", "dpl_nobody_sends_to") == 0
            release.set()
            await asyncio.wait_for(done.wait(), WAIT_SECONDS)
            await consumer.close(grace_seconds=5)
            assert await world.queue.backlog("step", deployment) == 0
        finally:
            release.set()
            await consumer.close(grace_seconds=0)
            await world.close()
