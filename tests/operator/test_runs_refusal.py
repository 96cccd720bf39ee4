"""What refuses a WorkflowRun before anything is recorded."""

from __future__ import annotations

from pydantic import JsonValue

from treadle.sdk import catalogue
from treadle_operator import mirrored, runs
from treadle_operator.models import WorkflowRunSpec


async def order(order_id: str, amount: int) -> None:
    del order_id, amount


SERVED: JsonValue = catalogue.describe({"order": order})


def _spec(workflow: str = "order", input: JsonValue = None) -> WorkflowRunSpec:
    return WorkflowRunSpec(deployment="orders", workflow=workflow, input=input)


def test_good_input_is_accepted() -> None:
    assert runs.refusal(SERVED, _spec(input={"order_id": "o", "amount": 1}), "r") is None
    assert runs.refusal(SERVED, _spec(input=["o", 1]), "r") is None


def test_an_unknown_workflow_names_what_is_served() -> None:
    reason, message = runs.refusal(SERVED, _spec("refund"), "orders-1") or ("", "")
    assert reason == "UnknownWorkflow"
    assert message == "revision orders-1 serves no workflow 'refund' (it serves: order)"


def test_bad_input_says_why() -> None:
    reason, message = runs.refusal(SERVED, _spec(input="o-1"), "r") or ("", "")
    assert reason == "InvalidInput"
    assert message.startswith("spec.input must be an object")
    reason, message = runs.refusal(SERVED, _spec(input={"order_id": "o"}), "r") or ("", "")
    assert (reason, message) == (
        "InvalidInput",
        "workflow order cannot take spec.input: missing a required argument: 'amount'",
    )


def test_mirror_names_are_dns_labels() -> None:
    name = mirrored.mirror_name("Order_Flow!", "wrun_01JABCDEFGHJKMNPQRSTVWXYZ0")
    assert name == "order-flow-01jabcdefghjkmnpqrstvwxyz0"


def test_input_the_engine_cannot_store_is_refused_before_a_run_is_recorded() -> None:
    """security.md M2, M3, M4: a NUL or a nesting past TREADLE_MAX_VALUE_DEPTH in
    spec.input refuses the WorkflowRun (InvalidInput) instead of failing after the start."""
    reason, message = runs.refusal(
        SERVED, _spec(input={"order_id": "o\u0000", "amount": 1}), "r"
    ) or ("", "")
    assert reason == "InvalidInput"
    assert "argument 'order_id': a string with a NUL" in message
    deep: JsonValue = 1
    for _ in range(100):
        deep = [deep]
    reason, message = runs.refusal(SERVED, _spec(input={"order_id": "o", "amount": deep}), "r") or (
        "",
        "",
    )
    assert reason == "InvalidInput" and "TREADLE_MAX_VALUE_DEPTH" in message
