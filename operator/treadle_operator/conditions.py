"""Conditions on the custom objects: made now, merged keeping transition times."""

from __future__ import annotations

from treadle_operator import kube
from treadle_operator.models import Condition


def condition(type_: str, ok: bool, reason: str, message: str = "") -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        last_transition_time=kube.now(),
    )


def merge_conditions(old: list[Condition], new: list[Condition]) -> list[Condition]:
    """New conditions, keeping the transition time of those whose status did not change."""
    before = {c.type: c for c in old}
    merged = []
    for c in new:
        prior = before.get(c.type)
        if prior is not None and prior.status == c.status:
            c = c.model_copy(update={"last_transition_time": prior.last_transition_time})
        merged.append(c)
    return merged
