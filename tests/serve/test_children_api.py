"""The run detail shows a run's tree of child workflows (issue 17 item 1): a parent lists
its children (run id, workflow, status, close policy, the outcome reported), a child
names its parent; on both Worlds."""

from __future__ import annotations

from treadle import ChildWorkflowFailed

from .conftest import Served


async def test_the_run_detail_shows_the_parent_and_its_children(served_any: Served) -> None:
    app = served_any.app

    @app.workflow
    async def leaf(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    @app.workflow
    async def tree() -> list[object]:
        got: list[object] = [await leaf(1)]
        try:
            await leaf.options(on_parent_close="abandon")(-1)
        except ChildWorkflowFailed as exc:
            got.append(exc.error_type)
        return got

    run = await app.start(tree)
    assert await run.result(timeout=20) == [1, "ValueError"]
    detail = (await served_any.client.get(f"/api/runs/{run.run_id}")).json()
    assert detail["parent_run_id"] is None
    children = detail["children"]
    assert [(c["workflow"], c["status"], c["outcome"]) for c in children] == [
        ("leaf", "completed", "completed"),
        ("leaf", "failed", "failed"),
    ]
    assert [c["on_parent_close"] for c in children] == ["cancel", "abandon"]
    child = (await served_any.client.get(f"/api/runs/{children[0]['run_id']}")).json()
    assert child["parent_run_id"] == run.run_id
    assert child["parent_correlation_id"] == children[0]["correlation_id"]
    assert child["children"] == []
