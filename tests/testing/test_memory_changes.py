"""The memory World's changes feed beyond the conformance suite: a dropped feed resyncs.

``MemoryBackend.drop_feeds`` is the simulation's "the feed's connection broke";
a world-wide watcher hears ``on_resync`` (a real feed reconnects by itself and
says so), and reports go on (issue 11 item 8).
"""

from __future__ import annotations

from treadle.testing.memory import MemoryWorld
from treadle.world.conformance import support
from treadle.world.conformance.changes import Heard


async def test_a_dropped_feed_makes_the_watcher_resync_and_reports_go_on() -> None:
    async with MemoryWorld() as world:
        heard = Heard()
        watch = await world.changes.watch(heard.on_change, heard.on_resync)
        try:
            world.backend.drop_feeds()
            await heard.until(lambda: heard.resyncs == 1, "a resync")
            run = await support.new_run(world, deployment_id="dpl_blue")
            await heard.until(lambda: run.run_id in heard.head, "the run after the drop")
            assert heard.changes[-1].deployment_id == "dpl_blue"
        finally:
            watch.close()


async def test_a_closed_world_closes_its_watches() -> None:
    world = await MemoryWorld().open()
    other = await MemoryWorld(world.backend).open()
    heard = Heard()
    await world.changes.watch(heard.on_change, heard.on_resync)
    await world.close()
    seen = Heard()
    watch = await other.changes.watch(seen.on_change, seen.on_resync)
    run = await support.new_run(other)
    await seen.until(lambda: run.run_id in seen.head, "the run")
    assert heard.changes == []
    watch.close()
    await other.close()
