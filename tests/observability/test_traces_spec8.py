"""Seed 000's span attributes on a spec 8 run's ``workflow.execute`` (issue 12 item 3,
issue 13 item 3): a wake that defers to the owner of a running inline step counts the
backstop it armed (``workflow.inline_ownership.backstop_wakes_armed``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treadle import Workflows, create_hook
from treadle.errors import HookNotFound
from treadle.telemetry import names


async def test_a_wake_beside_a_running_inline_step_counts_its_backstop_on_its_span(
    spans: InMemorySpanExporter, local_app: Callable[..., Workflows]
) -> None:
    app = local_app(WORKFLOW_SPEC_VERSION=8)
    started, release = asyncio.Event(), asyncio.Event()

    @app.step
    async def long() -> str:
        started.set()
        await release.wait()
        return "done"

    @app.workflow
    async def flow() -> str:
        hook = create_hook(token="spec8-span")
        body = asyncio.ensure_future(long())
        await hook.payload()
        return await body

    run = await app.start(flow)
    await asyncio.wait_for(started.wait(), 10)
    world = await app.world()
    for _ in range(500):  # the hook's creation commits in the same suspension as the start
        try:
            await world.hooks.get_by_token("spec8-span")
            break
        except HookNotFound:
            await asyncio.sleep(0.02)
    await app.resume_hook("spec8-span", {"ok": True})
    armed: list[object] = []
    for _ in range(500):  # the wake's delivery ends (and its span closes) while the body runs
        armed = [
            (s.attributes or {}).get(names.INLINE_BACKSTOP_WAKES_ARMED)
            for s in spans.get_finished_spans()
            if s.name == names.WORKFLOW_EXECUTE
        ]
        if any(armed):
            break
        await asyncio.sleep(0.02)
    release.set()
    assert await run.result(timeout=20) == "done"
    assert 1 in armed, armed
