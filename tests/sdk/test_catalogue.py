"""The catalogue: a deployment's workflows as data, and argument checks made from it."""

from __future__ import annotations

import json

from treadle.sdk import catalogue


async def order(order_id: str, amount: int, *, note: str = "", **extra: object) -> None:
    del order_id, amount, note, extra


async def varargs(*items: int) -> None:
    del items


def test_a_catalogue_is_json_and_rebuilds_the_signature() -> None:
    """What a worker records survives JSON and checks arguments like the function does."""
    described = json.loads(json.dumps(catalogue.describe({"order": order, "varargs": varargs})))
    signature = catalogue.signature_of(described["order"])
    assert signature is not None
    assert catalogue.check_arguments(signature, [], {"order_id": "o-1", "amount": 3}) is None
    assert catalogue.check_arguments(signature, ["o-1", 3], {"colour": "red"}) is None
    missing = catalogue.check_arguments(signature, [], {"order_id": "o-1"})
    assert missing == "missing a required argument: 'amount'"
    many = catalogue.check_arguments(catalogue.signature_of(described["varargs"]), [1, 2], {"x": 1})
    assert many == "got an unexpected keyword argument 'x'"


def test_an_entry_it_cannot_read_checks_nothing() -> None:
    """Unknown shapes (a newer worker's catalogue, say) never refuse a start."""
    for entry in (None, {"params": None}, {"params": [{"name": "a", "kind": "SOMETHING"}]}, 3):
        assert catalogue.signature_of(entry) is None
    assert catalogue.check_arguments(None, [1], {"a": 2}) is None


def test_a_declared_compatibility_tag_is_in_the_catalogue_entry() -> None:
    """Issue 11 item 5: ``@app.workflow(compatible=...)`` reaches the catalogue a worker
    registers; a workflow without one has no ``compatible`` key (nothing is moved)."""
    import treadle

    app = treadle.Workflows()

    @app.workflow(compatible="orders-v3")
    async def tagged(order_id: str) -> str:
        return order_id

    @app.workflow
    async def plain() -> None:
        return None

    workflows = app.workflows
    described = catalogue.describe(
        {n: wf.fn for n, wf in workflows.items()}, {n: wf.compatible for n, wf in workflows.items()}
    )
    assert described["tagged"] == {
        "params": [{"name": "order_id", "kind": "POSITIONAL_OR_KEYWORD", "required": True}],
        "compatible": "orders-v3",
    }
    assert "compatible" not in described["plain"]  # type: ignore[operator]
    assert catalogue.compatible_of(described["tagged"]) == "orders-v3"
    assert catalogue.compatible_of(described["plain"]) is None
    assert catalogue.compatible_of(None) is None


def test_a_bad_compatibility_tag_is_refused_at_decoration() -> None:
    """An empty, over-long, non-string or odd-character tag is a one-line error naming the
    workflow and the tag, raised where the workflow is declared."""
    import pytest

    import treadle

    app = treadle.Workflows()
    for bad in ("", " v3", "x" * 64, "a/b", 3):
        with pytest.raises(
            ValueError, match=r"workflow wf: compatible=.* is not a compatibility tag"
        ):

            @app.workflow(name="wf", compatible=bad)  # type: ignore[arg-type]
            async def wf() -> None:
                return None

    assert "wf" not in app.workflows
