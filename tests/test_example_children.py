"""examples/children.py runs (child workflows are spec 9 only, so it is not among the
examples tests/test_examples.py runs on both formats): each item ships as a child run,
the failed one is caught in the parent, and the receipt child ends on its own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from treadle.world import events

ROOT = Path(__file__).resolve().parents[1]
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": "300",
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": "200",
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": "0.05",
}


async def test_the_children_example_ships_each_item_as_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TREADLE_WORLD", f"local:{tmp_path / 'world'}")
    monkeypatch.setenv("WORKFLOW_SPEC_VERSION", "9")
    spec = importlib.util.spec_from_file_location("example_children", ROOT / "examples/children.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app
    try:
        run = await app.start(module.order)
        out = await run.result(timeout=60)
        assert out["lines"] == [
            "book: packed",
            "lamp: packed",
            "anvil: not shipped (step pack failed: ValueError: too heavy to ship)",
        ]
        assert await app.get_run(out["receipt_run"]).result(timeout=30) == (
            "sent: " + ", ".join(out["lines"])
        )
        log = await run.events()
        created = [e.event for e in log if isinstance(e.event, events.ChildCreated)]
        assert [c.workflow_name for c in created] == ["ship", "ship", "ship", "receipt"]
        assert created[-1].on_parent_close == "abandon"
    finally:
        await app.close()
