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
