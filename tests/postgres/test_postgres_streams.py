"""Streams on Postgres across processes (issue 17 item 6): an append NOTIFYs
``treadle_streams``, so a subscriber on another connection pool (another process's
World) hears it; migration 0012's tables hold what ``streams.read`` returns."""

from __future__ import annotations

import asyncio

from treadle.world import events
from treadle.world.conformance import support
from treadle.worlds.postgres import PostgresStorage


async def test_a_subscriber_on_another_storage_hears_an_append_by_notify(pg_dsn: str) -> None:
    writer = await PostgresStorage.connect(pg_dsn)
    reader = await PostgresStorage.connect(pg_dsn)
    try:
        world = writer  # a storage is enough for runs, events and streams
        run = await support.new_run(world)  # type: ignore[arg-type]
        await support.in_band(world, run.run_id, events.RunStarted())  # type: ignore[arg-type]
        await support.in_band(world, run.run_id, support.inline_start("s1"))  # type: ignore[arg-type]
        heard = asyncio.Event()
        sub = reader.streams.subscribe(run.run_id, "tokens", heard.set)
        try:
            # The listener connects in the background: append until it hears one.
            for seq in range(100):
                await writer.streams.append(
                    run.run_id, "tokens", [seq], step_id="s1", attempt=1, first_seq=seq
                )
                try:
                    async with asyncio.timeout(0.2):
                        await heard.wait()
                    break
                except TimeoutError:
                    continue
            assert heard.is_set()
        finally:
            sub.close()
        page = await reader.streams.read(run.run_id, "tokens")
        assert [c.data for c in page.chunks] == list(range(page.count))
    finally:
        await writer.close()
        await reader.close()
