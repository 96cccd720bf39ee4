"""A schedule in the World: a report every weekday morning, plus a trigger and a backfill.

``python examples/schedules.py`` records the schedule, lists its next firings, fires it
once now (``trigger``) and catches up two past mornings (``backfill``), then waits for
those runs. In production the cron's own firings are made by the workers (any of them,
each firing once); ``treadle schedules list`` shows the schedule.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from treadle import Workflows

app = Workflows()


@app.step
async def collect(day: str) -> int:
    return len(day)  # stands for the day's numbers


@app.workflow
async def report(team: str = "ops") -> str:
    count = await collect(team)
    return f"report for {team}: {count} items"


async def main() -> list[str]:
    schedule = await app.schedule(
        "ops-morning-report", report, cron="30 9 * * MON-FRI", timezone="Europe/Paris",
        overlap="buffer_one", catchup_window=3600, kwargs={"team": "ops"},
    )  # fmt: skip
    for t in await schedule.upcoming(3):
        print("next:", t.isoformat())
    now = await schedule.trigger()
    assert now is not None
    outputs = [await now.result(timeout=60)]
    done = await schedule.backfill(
        datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 1, 23, tzinfo=UTC), overlap="allow"
    )
    for t, decision in done:
        print("backfill:", t.isoformat(), decision)
        outputs.append(await schedule.run_at(t).result(timeout=60))
    await app.close()
    return outputs


if __name__ == "__main__":
    for line in asyncio.run(main()):
        print(line)
