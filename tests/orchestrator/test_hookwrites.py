"""The hook-conflict bound of one delivery (seed 003 "Hook conflicts"; audit Bug 5, D3, RL11):
each conflicting hook id gets one in-place continuation, then the delivery hands off."""

from __future__ import annotations

from treadle.orchestrator.hookwrites import ConflictContinuations


def test_each_conflicting_hook_is_continued_in_place_once_then_handed_off() -> None:
    """A conflict of a new hook id continues in place; the same id again hands off, and a
    set naming any hook already continued hands off too."""
    bound = ConflictContinuations("wrun_x")
    assert bound.may_continue(["hook_a"])
    assert bound.may_continue(["hook_b"])
    assert not bound.may_continue(["hook_a"])
    assert not bound.may_continue(["hook_c", "hook_b"])
    assert bound.continued == {"hook_a", "hook_b"}


def test_each_delivery_starts_with_no_continuations() -> None:
    """The bound is per delivery: a fresh delivery (the handoff's) may continue again."""
    first, second = ConflictContinuations("wrun_x"), ConflictContinuations("wrun_x")
    assert first.may_continue(["hook_a"])
    assert second.may_continue(["hook_a"])
