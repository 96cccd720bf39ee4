"""The spec 8 delivery drives a run end to end on both Worlds (issue 12 item 1)."""

from __future__ import annotations

import asyncio

from treadle import Hook, sleep

from .conftest import MakeApp


class Go(Hook):
    ok: bool


async def test_a_spec_8_run_of_steps_a_sleep_and_a_hook_completes(make_app: MakeApp) -> None:
    """Inline and eager steps, a retry, a sleep and a hook: the run completes, its log is
    written out-of-band only (no fence), and the run stays spec 8."""
    app = make_app(WORKFLOW_SPEC_VERSION=8, WORKFLOW_MAX_INLINE_STEPS=2)
    tries: list[int] = []

    @app.step
    async def add(a: int, b: int) -> int:
        return a + b

    @app.step(max_retries=2)
    async def flaky(n: int) -> int:
        tries.append(n)
        if len(tries) < 2:
            raise RuntimeError("first try fails")
        return n * 10

    @app.workflow
    async def flow(x: int) -> int:
        first = await add(x, 1)
        both = await asyncio.gather(add(first, 1), add(first, 2), add(first, 3))
        await sleep(0.2)
        answer = await Go.wait(token=f"go:{x}")
        assert answer is not None and answer.ok
        return sum(both) + await flaky(first)

    run = await app.start(flow, 1)
    world = await app.world()
    for _ in range(500):
        if "hook_created" in [e.type for e in await run.events()]:
            break
        await asyncio.sleep(0.02)
    await app.resume_hook("go:1", {"ok": True})
    assert await run.result(timeout=20) == (3 + 4 + 5) + 20
    record = await world.runs.get(run.run_id)
    assert record.spec_version == 8
    logged = await run.events()
    assert all(not e.in_band for e in logged[1:])
    types = [e.type for e in logged]
    assert types.count("run_started") == 1
    assert "step_retrying" in types and "wait_completed" in types
    owned = [
        e.event
        for e in logged
        if e.type == "step_started" and getattr(e.event, "owner_message_id", None)
    ]
    assert owned, "inline starts carry their owner"
