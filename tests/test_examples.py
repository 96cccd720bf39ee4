"""Every example under examples/ runs to the same result as a spec 8 run and as a spec 9
run (issue 12 "Done when": both formats run every example), on the local World.

Each example module is imported twice, fresh, so each copy's module-level
``Workflows()`` reads its settings from the environment the test sets
(``TREADLE_WORLD``, ``WORKFLOW_SPEC_VERSION``), as ``treadle run`` would. The two runs go
side by side on two Worlds; each must be minted in its format, end completed, give the
same output, and complete the same steps.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALL_EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# webhook.py serves HTTP and plays the payment provider itself: it runs as a program, on
# both formats, in tests/serve/test_webhooks_example.py.
# attributes.py sets attributes in workflow code, which needs spec 9 (a spec 8 run refuses
# it by name): it runs on spec 9, and its refusal on spec 8, below. children.py (child
# workflows, spec 9 only, several workflows) runs in tests/engine/test_children_example.py.
EXAMPLES = [p for p in ALL_EXAMPLES if p.name not in ("webhook.py", "attributes.py", "children.py")]
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": "300",
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": "200",
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": "0.05",
}


def _fresh(path: Path, tag: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}_{tag}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _run(module: ModuleType, spec_version: int) -> tuple[int, str, Any, list[str]]:
    """Start the example's workflow (its one, with its defaults); what the run came to."""
    app = module.app
    (workflow,) = app.workflows.values()
    try:
        run = await app.start(workflow)
        output = await run.result(timeout=60)
        record = await run.get()
        steps = sorted(
            e.event.step_name  # type: ignore[union-attr]
            for e in await run.events()
            if e.type == "step_completed"
        )
        return record.spec_version, record.status, output, steps
    finally:
        await app.close()


def test_the_examples_are_all_here() -> None:
    """So a new example joins the test below (and a removed one is noticed)."""
    assert [p.name for p in ALL_EXAMPLES] == [
        "attributes.py",
        "children.py",
        "fanout.py",
        "hello.py",
        "limits.py",
        "order.py",
        "schedules.py",
        "streams.py",
        "timeouts.py",
        "trip.py",
        "webhook.py",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
async def test_an_example_gives_the_same_result_as_spec_8_and_spec_9(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    apps: dict[int, ModuleType] = {}
    for version in (8, 9):
        monkeypatch.setenv("TREADLE_WORLD", f"local:{tmp_path / f'world{version}'}")
        monkeypatch.setenv("WORKFLOW_SPEC_VERSION", str(version))
        module = _fresh(path, f"spec{version}")
        _ = module.app.settings  # read now, under this version's environment
        apps[version] = module
    spec8, spec9 = await asyncio.gather(_run(apps[8], 8), _run(apps[9], 9))
    assert (spec8[0], spec9[0]) == (8, 9), "each run is minted in its format"
    assert spec8[1] == spec9[1] == "completed"
    assert spec8[2] == spec9[2], "the same output on both formats"
    assert spec8[3] == spec9[3] and spec8[3], "the same steps completed on both formats"


async def test_the_attributes_example_finds_its_runs_and_spec_8_refuses_it_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/attributes.py (issue 17 item 2): on spec 9 its main() finds the active pro
    customers by attribute and shows one run's attributes from every writer; on spec 8
    the workflow's set_attributes() fails the run with an error naming the feature and
    WORKFLOW_SPEC_VERSION."""
    from treadle.errors import RunFailedError

    path = ROOT / "examples" / "attributes.py"
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TREADLE_WORLD", f"local:{tmp_path / 'world9'}")
    monkeypatch.setenv("WORKFLOW_SPEC_VERSION", "9")
    spec9 = _fresh(path, "spec9")
    assert await spec9.main() == {
        "active pro customers": ["acme", "initech"],
        "globex": {
            "customer": "globex",
            "plan": "free",
            "stage": "active",
            "region": "eu-west",
            "database": "globex-db",
            "note": "asked for a demo",
        },
    }
    monkeypatch.setenv("TREADLE_WORLD", f"local:{tmp_path / 'world8'}")
    monkeypatch.setenv("WORKFLOW_SPEC_VERSION", "8")
    spec8 = _fresh(path, "spec8")
    try:
        run = await spec8.app.start(spec8.onboard)
        with pytest.raises(RunFailedError, match="WORKFLOW_SPEC_VERSION=8"):
            await run.result(timeout=60)
        assert (await run.get()).error.type == "AttributesNeedSpec9"
    finally:
        await spec8.app.close()
