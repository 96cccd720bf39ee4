"""The streams generator bites (docs/plans/s8-st.md, left: "the simulation's stream
invariants are thin"): ``stream_fences`` refuses turbo's first write of a run whose
first step writes a stream, so that step's early body ran before a start that was
refused and the redelivery runs it again; each chunk names the run of the body that
wrote it, so ``stream_refused_body`` sees an early body's chunks where the run-ready
barrier and the World's attempt rule are gone (seed 28; 9 of seeds 0-99 then, 3
without the fences, 0 with the rules in place: docs/plans/s9-sim.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from treadle.sdk import streams
from treadle.testing.simulation import Config, simulate
from treadle.world import streamrules

STREAMS = Config(spec="9", generators=("streams", "stream_fences"))


def test_a_refused_early_body_writes_no_chunk() -> None:
    report = simulate(28, STREAMS)
    assert report.ok, [str(v) for v in report.violations]
    assert report.faults["fence"] > 0


def test_without_the_barrier_and_the_attempt_rule_the_early_body_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = streamrules.decide

    def no_attempt_rule(state: Any, **kw: Any) -> Any:
        if state.step_attempt != kw["attempt"]:
            state = dataclasses.replace(state, step_attempt=kw["attempt"])
        return real(state, **kw)

    async def no_barrier(self: Any) -> None:
        return None

    monkeypatch.setattr(streamrules, "decide", no_attempt_rule)
    monkeypatch.setattr(streams.StreamWriter, "_behind_barrier", no_barrier)
    kinds = {v.kind for v in simulate(28, STREAMS).violations}
    assert "stream_refused_body" in kinds
