"""Spec 8 timers: one delayed continuation for a run's earliest open wait (seed 003
"Sleeps and timers, spec 8 against spec 9").

Every spec 8 suspension sends the continuation again; the queue's key dedupe keeps
it one message. Keys, all scoped to the wait's correlation id (itself unique to its
run):

- ``<cid>``: the last hop (the wait comes due within one hop);
- ``<cid>:hop-<n>``: an earlier hop of a long sleep, ``n`` the hops still to go
  counted from the sender's clock (hops of at most 23 h; the first is a full one,
  the last what is left), so each hop's re-send has its own key;
- ``<cid>:<second>``: a wait within the near-elapsed threshold, re-armed once per
  second of the sender's clock, so a re-arm never dedupes against the message in hand;
- ``<cid>:a<attempt>:<message>``: the re-arm a timer delivery sends when it came
  before its wait was due (a clock behind the sender's). The seed's key is
  ``:a<attempt>``; treadle adds the early message's id, as its spec 9 re-arm does
  (audit TE11): a re-arm that itself comes early is a new message with attempt 1,
  and without the id it would dedupe against itself and the wait would lose its timer.

A hop delivery is a full replay (no intermediate-hop shortcut: the continuation
carries no ``resume_at_ms``). Pure; called by ``spec8.delivery``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from treadle.world import messages


@dataclass(frozen=True)
class Timer:
    correlation_id: str
    resume_at_ms: int


def key_and_delay(
    wait: Timer,
    *,
    now_ms: int,
    max_hop_ms: int,
    near_elapsed_ms: int,
    early: tuple[int, str] | None = None,
) -> tuple[str, int]:
    """The continuation's idempotency key and its delay in ms.

    ``early`` is ``(attempt, message_id)`` of a timer delivery for this wait that came
    while the wait was not yet due on this clock.
    """
    cid = wait.correlation_id
    remaining = max(wait.resume_at_ms - now_ms, 0)
    if remaining > max_hop_ms:
        hops_left = math.ceil(remaining / max_hop_ms)
        return f"{cid}:hop-{hops_left}", max_hop_ms
    if early is not None:
        attempt, message_id = early
        return f"{cid}:a{attempt}:{message_id}", remaining
    if remaining <= near_elapsed_ms:
        return f"{cid}:{now_ms // 1000}", remaining
    return cid, remaining


def continuation(
    *,
    run_id: str,
    deployment_id: str | None,
    spec_version: int,
    wait: Timer,
    now_ms: int,
    max_hop_ms: int,
    near_elapsed_ms: int,
    early: tuple[int, str] | None = None,
) -> messages.Send:
    """The delayed orchestrator message that replays the run when ``wait`` (or its next
    hop) comes due, stamped with the run's version."""
    key, delay_ms = key_and_delay(
        wait, now_ms=now_ms, max_hop_ms=max_hop_ms, near_elapsed_ms=near_elapsed_ms, early=early
    )
    message = messages.OrchestratorMessage(
        run_id=run_id,
        deployment_id=deployment_id,
        run_spec_version=spec_version,
        wait_continuation=messages.WaitContinuation(
            correlation_id=wait.correlation_id, hop_at_ms=now_ms + delay_ms
        ),
    )
    return messages.Send(message, key, delay_ms / 1000)
