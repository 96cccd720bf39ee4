"""Worker liveness rules every World's queue applies the same way: pure, no I/O.

A worker has an identity (``QueueTuning.worker_id``, from ``TREADLE_WORKER_ID``:
the pod name under the operator) and beats once every ``beat_interval`` while
it consumes: one write per worker, never one per delivery. Two rules follow:

- **Restart in place.** A consumer that starts with an identity releases at
  once every delivery a previous incarnation of that identity still holds (it
  died: only one process may carry an identity), so those messages are
  delivered again now, not when their lease lapses.
- **Survivor takeover.** A worker whose last beat is older than
  ``liveness_seconds`` (``TREADLE_WORKER_LIVENESS_SECONDS``) is taken for dead:
  one survivor claims it (a compare-and-set, so never two) and releases what it
  held. The worker itself stops trusting its deliveries a ``self_margin``
  sooner (``holder_fresh``): once its own beat could not be written for that
  long it treats every delivery it holds as lost (``DeliveryMeta.lease_lost``),
  so it writes nothing more before a survivor can act.

What a lapse means for the fence (docs/recovery.md): a lapsed worker that is
still alive may still be mid-write. A spec 9 run's in-band writes are fenced
per run, so its write is refused once the new delivery wrote in-band; its
out-of-band step writes meet the stale-start and one-outcome rules; a spec 8
run's inline bodies are guarded by their ownership leases. The liveness rule
only makes the redelivery come sooner; it adds no new way to write twice.

Used by ``treadle.worlds.nats`` (a KV bucket of heartbeats), the memory World
(``treadle.testing.memory``) and, for restart in place, the local World (its one
consumer releases every lease at open).
"""

from __future__ import annotations

from typing import Final

from treadle import clock

# The longest gap between two beats of a live worker.
MAX_BEAT_INTERVAL_SECONDS: Final = 1.0


def beat_interval(liveness_seconds: float) -> float:
    """How often a worker beats: once a second, or three times per window if shorter."""
    return min(MAX_BEAT_INTERVAL_SECONDS, liveness_seconds / 3)


def self_margin(liveness_seconds: float) -> float:
    """How much sooner than its survivors a worker gives up on its own deliveries."""
    return min(0.5, liveness_seconds * 0.2)


def holder_fresh(last_beat_sent: float, now: float, liveness_seconds: float) -> bool:
    """Does a worker whose last written beat was *sent* at ``last_beat_sent`` (monotonic)
    still hold its deliveries at ``now``? False from ``liveness - self_margin`` on."""
    return now < last_beat_sent + liveness_seconds - self_margin(liveness_seconds)


def lapsed(last_beat_seen: float, now: float, liveness_seconds: float) -> bool:
    """May a survivor that last *saw* a worker beat at ``last_beat_seen`` (its own
    monotonic clock) take that worker over at ``now``?"""
    return now - last_beat_seen > liveness_seconds


def worker_id(configured: str | None) -> tuple[str, bool]:
    """The identity to consume under and whether it is stable (configured): a stable one
    releases its previous incarnation's deliveries at start; a random one never does."""
    if configured:
        return configured, True
    return f"w-{clock.token_hex(6)}", False
