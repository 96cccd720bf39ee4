"""Checks a run's event log for the invariants every World and the orchestrator keep.

``problems(run, log)`` returns what is wrong, as sentences (empty when the log is
sound): slots dense from 1 and ending at the run's ``seq``; ``run_created`` at
slot 1 and in-band; the in-band events counting up to the run's ``seq_in_band``
(the fence's arithmetic); at most one terminal run event, and only outcomes,
waits' completions, hook disposals and attributes after it; per step, a creation
before any start, attempts that never go down, at most one outcome, and outcomes
only from the latest started attempt (``storagerules.check_outcome_attempt``); per
wait, at most one completion. The World enforces the last three itself (a second
outcome is ``StepAlreadyEnded``, a superseded attempt's ``StaleStepOutcome``, a second
completion ``WaitAlreadyCompleted``; DESIGN.md 10, ``treadle.world.contract``), so a
log breaking them points at a World bug or a log written some other way. Used by the
soak tests and ``treadle inspect``-style tools.
"""

from __future__ import annotations

from collections.abc import Sequence

from treadle import errors
from treadle.world import events, records, storagerules

_AFTER_TERMINAL = frozenset(
    {"step_completed", "step_failed", "wait_completed", "hook_disposed", "attr_set", "noop"}
    # A child's outcome reaches its parent whenever the child ends (child workflows).
    | events.CHILD_OUTCOME_TYPES
)


def problems(run: records.RunRecord, log: Sequence[events.LoggedEvent]) -> list[str]:
    found: list[str] = []
    slots = [e.slot for e in log]
    if slots != list(range(1, len(log) + 1)):
        found.append(f"slots are not dense from 1: {slots[:10]}...")
    if len(log) != run.seq:
        found.append(f"{len(log)} events but the run's seq is {run.seq}")
    if not log or log[0].type != "run_created" or not log[0].in_band:
        found.append("slot 1 is not an in-band run_created")
    in_band = sum(1 for e in log if e.in_band)
    if in_band != run.seq_in_band:
        found.append(f"{in_band} in-band events but the run's seq_in_band is {run.seq_in_band}")
    terminal_at: int | None = None
    steps: dict[str, tuple[bool, int, int]] = {}  # created, highest attempt, outcomes
    waits: dict[str, int] = {}
    for e in log:
        kind, cid = e.type, e.correlation_id
        if kind in events.RUN_TERMINAL_TYPES:
            if terminal_at is not None:
                found.append(f"a second terminal event ({kind}) at slot {e.slot}")
            terminal_at = terminal_at or e.slot
        elif terminal_at is not None and kind not in _AFTER_TERMINAL:
            found.append(f"{kind} at slot {e.slot} after the run ended at slot {terminal_at}")
        if cid is None:
            continue
        if kind in (
            "step_created",
            "step_started",
            "step_retrying",
            "step_completed",
            "step_failed",
        ):
            created, attempt, outcomes = steps.get(cid, (False, 0, 0))
            if kind == "step_created" or (
                isinstance(e.event, events.StepStarted) and e.event.inline
            ):
                created = True
            if kind != "step_created" and not created:
                found.append(f"step {cid}: {kind} at slot {e.slot} before its creation")
            if isinstance(e.event, events.StepStarted) and outcomes == 0:
                if e.event.attempt < attempt:
                    found.append(f"step {cid}: attempt {e.event.attempt} after {attempt}")
                attempt = max(attempt, e.event.attempt)
            try:
                storagerules.check_outcome_attempt(run.run_id, e.event, attempt)
            except errors.StaleStepOutcome as exc:
                found.append(f"step {cid}: slot {e.slot}: {exc}")
            if kind in events.STEP_OUTCOME_TYPES:
                outcomes += 1
                if outcomes > 1:
                    found.append(f"step {cid}: a second outcome at slot {e.slot}")
            steps[cid] = (created, attempt, outcomes)
        elif kind == "wait_completed":
            waits[cid] = waits.get(cid, 0) + 1
            if waits[cid] > 1:
                found.append(f"wait {cid}: completed twice (slot {e.slot})")
    return found
