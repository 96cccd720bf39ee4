"""Concurrency limits on spec 8 runs (issue 17 item 4; PLAN "Spec 8: make it work"): the
gates run before the format routing, and a limited step is never an inline one there
either, so a spec 8 run waits, is admitted and holds its slots as a spec 9 run does."""

from __future__ import annotations

import asyncio

import pytest

from treadle import Limit

from .audit import assert_sound
from .conftest import SPEC8_CASES, MakeApp

pytestmark = pytest.mark.parametrize("open_world", SPEC8_CASES, indirect=True)


async def test_a_spec8_run_waits_on_its_limit_and_its_steps_on_theirs(
    make_app: MakeApp, spec_version: int
) -> None:
    app = make_app()
    seen: list[str] = []
    gate = asyncio.Event()
    held: list[int] = []  # which of first's two steps took the one slot (either may)

    @app.step(concurrency=Limit(key=lambda name, i: "one", max=1))
    async def part(name: str, i: int) -> str:
        seen.append(f"{name}{i} in")
        if name == "first" and not held:
            held.append(i)
            await gate.wait()
        seen.append(f"{name}{i} out")
        return f"{name}{i}"

    @app.workflow(concurrency=Limit(key=lambda name: "k", max=1))
    async def flow(name: str) -> list[str]:
        return list(await asyncio.gather(part(name, 0), part(name, 1)))

    first = await app.start(flow, "first")
    deadline = asyncio.get_running_loop().time() + 20
    while not held:
        assert asyncio.get_running_loop().time() < deadline, "the first step never ran"
        await asyncio.sleep(0.02)  # polling another task's progress
    holder, other = f"first{held[0]}", f"first{1 - held[0]}"
    second = await app.start(flow, "second")
    assert (await second.get()).waiting_on_limit is not None
    assert f"{other} in" not in seen  # the step's one slot is held by the holder
    gate.set()
    assert await first.result(timeout=30) == ["first0", "first1"]
    assert await second.result(timeout=30) == ["second0", "second1"]
    assert seen.index(f"{holder} out") < seen.index(f"{other} in")
    assert max(seen.index("first0 out"), seen.index("first1 out")) < seen.index("second0 in")
    for run in (first, second):
        assert (await run.get()).spec_version == spec_version == 8
        log = await assert_sound(run)
        assert all(not e.event.inline for e in log if e.type == "step_created")  # type: ignore[union-attr]
