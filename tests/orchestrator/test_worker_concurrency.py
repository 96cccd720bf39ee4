"""A worker's concurrency: ``--concurrency``, else ``TREADLE_WORKER_CONCURRENCY``, else sized
from the CPUs and the step bodies (``treadle.orchestrator.concurrency``), never a fixed 32."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle import Workflows, settings
from treadle.orchestrator import concurrency
from treadle.orchestrator.worker import Worker
from treadle.worlds.local import LocalWorld


def _app(*, sync_step: bool, **overrides: object) -> Workflows:
    app = Workflows(world="memory", settings_=settings.load({}, **overrides))

    @app.step
    async def fetch(x: int) -> int:
        return x

    if sync_step:

        @app.step
        def crunch(x: int) -> int:
            return x

    return app


def test_async_steps_get_256_per_cpu_within_bounds() -> None:
    steps = _app(sync_step=False)._steps
    assert concurrency.derived(steps, 1) == 256
    assert concurrency.derived(steps, 2) == 512
    assert concurrency.derived(steps, 64) == concurrency.MAX_ASYNC_CONCURRENCY
    assert concurrency.derived({}, 1) == 256  # an orchestrator-only app: async deliveries


def test_a_sync_step_sizes_it_from_the_executors_threads() -> None:
    steps = _app(sync_step=True)._steps
    assert concurrency.derived(steps, 2) == max(32, 2 * min(32, 2 + 4))
    assert concurrency.derived(steps, 64) == 64  # 2 x the executor's 32 threads


def test_the_flag_wins_then_the_setting() -> None:
    app = _app(sync_step=False, TREADLE_WORKER_CONCURRENCY=7)
    assert concurrency.worker_concurrency(app.settings, app._steps) == 7
    assert concurrency.worker_concurrency(app.settings, app._steps, 3) == 3
    with pytest.raises(ValueError, match="at least 1"):
        concurrency.worker_concurrency(app.settings, app._steps, 0)
    with pytest.raises(Exception, match="TREADLE_WORKER_CONCURRENCY"):
        settings.load({"TREADLE_WORKER_CONCURRENCY": "0"})


async def test_a_worker_consumes_with_the_derived_concurrency(tmp_path: Path) -> None:
    world = await LocalWorld(tmp_path / "world").open()
    try:
        app = _app(sync_step=False)
        worker = Worker(app.runtime(world))
        assert worker.concurrency == concurrency.derived(app._steps, concurrency.cpus())
        assert worker.concurrency > 32
        assert Worker(app.runtime(world), concurrency=5).concurrency == 5
    finally:
        await world.close()
