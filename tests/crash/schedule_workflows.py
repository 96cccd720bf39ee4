"""The workflow the schedule crash tests fire, in ``treadle worker`` subprocesses.

Its step appends ``fired <scheduled time> <pid>`` to ``TREADLE_TEST_EFFECTS`` (the side
effect the tests count: one line per firing, whichever worker ran it). With
``TREADLE_TEST_KILL_AFTER_CLAIM`` set, the worker kills itself with SIGKILL right after
its first won claim of a firing (the schedules table's ``update`` returned the new
state naming a new run), before that run is started: the firing must still happen
exactly once, started by the next worker that reads the schedule.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from treadle import Workflows, workflow_metadata

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


@app.step
async def note(run_id: str) -> str:
    record(f"fired {run_id} {os.getpid()}")
    return run_id


@app.workflow
async def scheduled() -> str:
    return await note(workflow_metadata().run_id)


def _die_after_a_claim(table_class: Any) -> None:
    update = table_class.update

    async def update_or_die(self: Any, name: str, **kw: Any) -> Any:
        held = await self.get(name)
        won = await update(self, name, **kw)
        if won is not None and won.state.last_run_id not in (None, held.state.last_run_id):
            record(f"killed after claiming {won.state.last_run_id}")
            os.kill(os.getpid(), signal.SIGKILL)
        return won

    table_class.update = update_or_die


if os.environ.get("TREADLE_TEST_KILL_AFTER_CLAIM"):
    from treadle.worlds.local.schedules import LocalSchedules

    _die_after_a_claim(LocalSchedules)
    if os.environ.get("TREADLE_WORLD") == "postgres":
        from treadle.worlds.postgres.schedules import PostgresSchedules

        _die_after_a_claim(PostgresSchedules)
