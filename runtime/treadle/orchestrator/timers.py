"""Timers: keys, hops and the messages that complete waits (seed 003 "Timers and waits").

A wait's timer is an orchestrator message delayed to the wait's deadline,
carrying ``wait_continuation``. A wait longer than one hop
(``WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS``, 23 h) is reached in hops
anchored on the deadline: the last hop is due at ``resume_at``, each earlier
one a whole hop before it, and a sender sends the earliest hop still ahead of
its clock. Every hop carries a key naming the wait and the hop's deadline, so
the timers several deliveries send for one hop are one message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from treadle.world import messages


def hop_key(correlation_id: str, resume_at_ms: int, hop_at_ms: int) -> str:
    return f"wait:{correlation_id}:{resume_at_ms}:{hop_at_ms}"


def rearm_suffix(message_id: str, attempt: int) -> str:
    """What a re-arm's key adds to its hop's: the early timer's message and next attempt.

    The message id keeps a re-arm that itself comes early (a clock further behind)
    from re-arming under its own key, which the queue would drop as a duplicate of
    the message in hand, leaving the wait no timer (audit TE11); the attempt keeps
    redeliveries of one message apart, while duplicates of one delivery stay one.
    """
    return f"m{message_id}:a{attempt}"


def rearm_key(
    correlation_id: str, resume_at_ms: int, hop_at_ms: int, attempt: int, message_id: str
) -> str:
    """The re-arm a timer delivery sends for its own wait when it came early."""
    suffix = rearm_suffix(message_id, attempt)
    return f"{hop_key(correlation_id, resume_at_ms, hop_at_ms)}:{suffix}"


def near_due_key(correlation_id: str, resume_at_ms: int, now_ms: int) -> str:
    """A near-due re-arm, or a last hop sent by a delivery that is not its message's first."""
    return f"wait:{correlation_id}:{resume_at_ms}:s{now_ms // 1000}"


def is_near_due_key(key: str | None) -> bool:
    """Whether ``key`` is a ``near_due_key``: ``wait:`` and ends ``:s`` and a second (a hop
    key ends in its hop's milliseconds, a re-arm's in ``:a`` and an attempt; a step's key,
    ``step:<run>:step_...``, is no wait's at all)."""
    if key is None or not key.startswith("wait:"):
        return False
    last = key.rpartition(":")[2]
    return last.startswith("s") and last[1:].isdigit()


@dataclass(frozen=True)
class Hop:
    hop_at_ms: int
    final: bool


def next_hop(resume_at_ms: int, now_ms: int, max_hop_ms: int) -> Hop:
    """The earliest hop of a wait still ahead of ``now``, anchored on the deadline."""
    remaining = resume_at_ms - now_ms
    if remaining <= max_hop_ms:
        return Hop(resume_at_ms, final=True)
    hops_before_deadline = math.ceil(remaining / max_hop_ms) - 1
    return Hop(resume_at_ms - hops_before_deadline * max_hop_ms, final=False)


def timer_send(
    *,
    run_id: str,
    deployment_id: str | None,
    spec_version: int,
    correlation_id: str,
    resume_at_ms: int,
    now_ms: int,
    max_hop_ms: int,
    key_suffix: str | None = None,
    near_due: bool = False,
) -> messages.Send:
    """The message (and key and delay) of a wait's next timer hop."""
    hop = next_hop(resume_at_ms, now_ms, max_hop_ms)
    if hop.final and near_due:
        key = near_due_key(correlation_id, resume_at_ms, now_ms)
    else:
        key = hop_key(correlation_id, resume_at_ms, hop.hop_at_ms)
        if key_suffix:
            key = f"{key}:{key_suffix}"
    continuation = messages.WaitContinuation(
        correlation_id=correlation_id,
        hop_at_ms=hop.hop_at_ms,
        resume_at_ms=None if hop.final else resume_at_ms,
    )
    message = messages.OrchestratorMessage(
        run_id=run_id,
        deployment_id=deployment_id,
        run_spec_version=spec_version,
        wait_continuation=continuation,
    )
    return messages.Send(message, key, max(hop.hop_at_ms - now_ms, 0) / 1000)
