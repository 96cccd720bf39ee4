"""The local World's changes feed beyond the conformance suite: another process's writes.

The local feed hears this process's writers as they commit; another process
(a second ``LocalWorld`` on the same directory, e.g. the CLI) is noticed only by
the half-second ``PRAGMA data_version`` check, which cannot tell which run
changed: the watcher hears ``on_resync`` (issue 11 item 8).
"""

from __future__ import annotations

from pathlib import Path

from treadle.world.conformance import support
from treadle.world.conformance.changes import Heard
from treadle.worlds.local import LocalWorld


async def test_another_processs_write_makes_the_watcher_resync(tmp_path: Path) -> None:
    async with LocalWorld(tmp_path / "w") as world, LocalWorld(tmp_path / "w") as other:
        heard = Heard()
        watch = await world.changes.watch(heard.on_change, heard.on_resync)
        try:
            mine = await support.new_run(world)
            await heard.until(lambda: mine.run_id in heard.head, "this process's run")
            assert heard.resyncs == 0
            theirs = await support.new_run(other)
            await heard.until(lambda: heard.resyncs >= 1, "a resync after another's write")
            assert theirs.run_id not in heard.head  # it cannot tell which run: it says resync
        finally:
            watch.close()


async def test_a_creation_report_names_the_runs_deployment(tmp_path: Path) -> None:
    """So a watcher that mirrors only some deployments' runs needs no read (R5 (d))."""
    async with LocalWorld(tmp_path / "w") as world:
        heard = Heard()
        watch = await world.changes.watch(heard.on_change, heard.on_resync)
        try:
            run = await support.new_run(world, deployment_id="dpl_blue")
            await heard.until(lambda: run.run_id in heard.head, "the creation")
            (created,) = [c for c in heard.changes if c.run_id == run.run_id]
            assert (created.slot, created.deployment_id) == (1, "dpl_blue")
        finally:
            watch.close()
