"""Limits and rates refused at decoration; the pure rules of ``limitrules`` (issue 17 item 4)."""

from __future__ import annotations

import pytest

from treadle import Limit, LimitKeyError, Rate, Workflows
from treadle.sdk import limiting
from treadle.world import limitrules


def test_a_bad_limit_or_rate_is_refused_at_decoration() -> None:
    app = Workflows(world="local:/nonexistent-never-opened", worker=False)
    with pytest.raises(ValueError, match="at least 1"):
        Limit(max=0)
    with pytest.raises(ValueError, match="at least 1"):
        Limit(max=True)  # a bool is no count
    with pytest.raises(ValueError, match="above 0"):
        Rate(per_second=0)
    with pytest.raises(ValueError, match="above 0"):
        Rate(per_minute=-1)
    with pytest.raises(ValueError, match="exactly one"):
        Rate(per_second=1, per_minute=1)
    with pytest.raises(ValueError, match="exactly one"):
        Rate()
    with pytest.raises(ValueError, match="over 1,000 starts"):
        Rate(per_second=5000)
    with pytest.raises(ValueError, match="burst"):
        Rate(per_second=1, burst=0)
    with pytest.raises(ValueError, match="a function of the input"):
        Limit(max=1, key="customer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"workflow wrong: concurrency= takes a treadle\.Limit"):

        @app.workflow(concurrency=3)  # type: ignore[arg-type]
        async def wrong() -> None: ...

    with pytest.raises(ValueError, match=r"step bad: rate= takes a treadle\.Rate"):

        @app.step(rate=Limit(max=1))  # type: ignore[arg-type]
        async def bad() -> None: ...

    with pytest.raises(ValueError, match="priority must be an integer"):

        @app.workflow(priority="high")  # type: ignore[arg-type]
        async def prioritised() -> None: ...


def test_rates_in_every_unit() -> None:
    assert Rate(per_second=4).interval_ms == 250
    assert Rate(per_minute=30).interval_ms == 2000
    assert Rate(per_hour=1).interval_ms == 3_600_000


def test_keys_are_strings_computed_from_the_arguments() -> None:
    def key(order: dict[str, str], *, rush: bool = False) -> str:
        return order["customer"]

    assert limiting.compute_key(key, [{"customer": "c"}], {}, where="w", limit="concurrency") == "c"
    assert limiting.compute_key(None, [], {}, where="w", limit="rate") == limiting.ALL
    for bad, problem in ((lambda: 3, "int"), (lambda: "", "1 to 256"), (lambda: 1 / 0, "Zero")):
        with pytest.raises(LimitKeyError, match=f"workflow x: the rate key .*{problem}"):
            limiting.compute_key(bad, [], {}, where="workflow x", limit="rate")


def test_gcra_reservations() -> None:
    first = limitrules.reservation(None, 1000, 100, 1)
    assert (first.at_ms, first.tat_ms) == (1000, 1100)
    second = limitrules.reservation(first.tat_ms, 1000, 100, 1)
    assert (second.at_ms, second.tat_ms) == (1100, 1200)
    idle = limitrules.reservation(second.tat_ms, 5000, 100, 1)  # a quiet bucket refills
    assert (idle.at_ms, idle.tat_ms) == (5000, 5100)
    assert limitrules.admits(holders=1, maximum=2, ahead=0)
    assert not limitrules.admits(holders=1, maximum=2, ahead=1)
    assert sorted([(0, 2), (5, 3), (0, 1)], key=lambda p: limitrules.rank_key(*p)) == [
        (5, 3), (0, 1), (0, 2),
    ]  # fmt: skip
