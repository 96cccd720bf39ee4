"""``treadle.limits``: what ``serde.encode`` accepts can always be read back.

security.md M2: pydantic's JSON parser stops near 200 levels while the write path
went to ~254, so values were stored and then unreadable. At the largest depth a
setting allows (``limits.MAX_MAX_DEPTH``), every shape ``encode`` accepts must
parse back inside an event, a logged event and a queue message.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from treadle import errors, limits, register_types, serde
from treadle.sdk import functions
from treadle.world import events, ids, messages

DEEPEST = limits.Limits(max_depth=limits.MAX_MAX_DEPTH)


@dataclasses.dataclass
class Box:
    inner: Any


register_types(Box)  # no workflow names it, so it is declared explicitly (security.md H1)


def _deepest(wrap: Any, lim: limits.Limits) -> Any:
    """``wrap`` applied as often as ``encode`` accepts under ``lim``."""
    value: Any = "leaf"
    while True:
        deeper = wrap(value)
        try:
            serde.encode(deeper, limits=lim)
        except errors.ValueLimitExceeded:
            return value
        value = deeper


WRAPS = {
    "list": lambda v: [v],
    "dict": lambda v: {"k": v},
    "tuple": lambda v: (v,),
    "int-keyed dict": lambda v: {1: v},
    "frozenset": lambda v: frozenset([v]) if not isinstance(v, list | dict | set) else (v,),
    "dataclass": Box,
}


@pytest.mark.parametrize("shape", sorted(WRAPS))
def test_the_deepest_accepted_value_reads_back_as_event_and_message(shape: str) -> None:
    value = _deepest(WRAPS[shape], DEEPEST)
    data = functions.encode_arguments((value,), {}, "step s", limits_=DEEPEST)
    logged = events.LoggedEvent(
        run_id=ids.new_run_id(),
        slot=1,
        created_at=dt.datetime.now(dt.UTC),
        in_band=True,
        event=events.StepCreated(correlation_id="step_1", step_name="s", input=data),
    )
    assert events.LoggedEvent.model_validate_json(logged.model_dump_json()) == logged
    message = messages.StepMessage(
        run_id=logged.run_id,
        step_id="step_1",
        step_name="s",
        run_context=messages.RunContext(spec_version=9, workflow_name="wf"),
        step_created_at=logged.created_at,
        input=data,
    )
    parsed = messages.MESSAGE_ADAPTER.validate_json(message.model_dump_json())
    assert parsed == message
    args, _ = functions.decode_arguments(data)
    assert args == [value]


def test_depth_counts_stored_containers_and_names_the_setting() -> None:
    lim = limits.Limits(max_depth=3)
    assert serde.encode([[["x"]]], limits=lim) == [[["x"]]]
    with pytest.raises(errors.ValueLimitExceeded, match=r"value\[0\]\[0\]\[0\]: nested more"):
        serde.encode([[[["x"]]]], limits=lim)
    with pytest.raises(errors.ValueLimitExceeded) as caught:
        serde.encode(([[1]],), limits=lim)  # a tuple is {"$t": "tuple", "v": [...]}: two levels
    assert caught.value.setting == "TREADLE_MAX_VALUE_DEPTH" and caught.value.limit == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param({"a\x00": 1}, r"value<key>: a string with a NUL", id="nul-key"),
        pytest.param(["\ud800"], r"value\[0\]: a string with a lone surrogate", id="surrogate"),
        pytest.param(10**5000, "an integer of more than 4,000 digits", id="huge-int"),
    ],
)
def test_strings_and_ints_no_world_stores_alike_are_refused(value: Any, message: str) -> None:
    with pytest.raises(errors.SerializationError, match=message):
        serde.encode(value)


def test_check_value_walks_pre_encoded_json_without_recursing() -> None:
    deep: Any = 1
    for _ in range(50_000):
        deep = [deep]
    with pytest.raises(errors.ValueLimitExceeded, match="TREADLE_MAX_VALUE_DEPTH"):
        limits.check_value({"args": [deep], "kwargs": {}}, "input", envelope=2)
    limits.check_value(
        {"args": [[["x"]]], "kwargs": {}}, "input", limits.Limits(max_depth=3), envelope=2
    )


def test_storable_escapes_what_cannot_be_stored() -> None:
    assert limits.storable("card\x00declined \ud800") == "card\\x00declined \\ud800"
    assert limits.storable("plain") == "plain"
