"""A worker killed before its run lease's token was listed still has that lease released.

A delivery is listed in its worker's heartbeat entry as soon as it is taken, but its
run lease's token only in the beat after (up to ``HELD_CHANGE_DELAY_SECONDS`` later).
A kill -9 inside that window (the benchmark's recovery scenario: a step that hangs a
few milliseconds into the run's first delivery) left the lease held: the message, sent
again at once by the restart's NAK, waited the whole lease out behind its own dead
delivery (30 s by default). The entry now lists the lease's holder (the message id)
from the first beat, and a restart in place releases the lease by it.
"""

from __future__ import annotations

from treadle.worlds.nats import leases, liveness

from .conftest import NatsHarness

RUN = "wrun_liveness_release"


async def _restart_over(harness: NatsHarness, entry: liveness.Beat) -> None:
    """A new incarnation of ``entry``'s worker starts (restart in place) and stops."""
    queue = await harness.connect()
    try:
        kv = await liveness.ensure_worker_bucket(queue.js, queue.names)
        await kv.put(queue.names.worker_key(entry.worker), entry.encode())
        again = liveness.WorkerLiveness(
            queue.nc,
            kv,
            queue.names,
            queue.leases,
            worker_id=entry.worker,
            liveness_seconds=3.0,
            lease_seconds=30.0,
        )
        await again.start()
        assert again.released_at_start == len(entry.held)
        await again.close()
    finally:
        await queue.close()


async def test_a_lease_listed_without_its_token_is_released_by_its_holder(
    harness: NatsHarness,
) -> None:
    queue = await harness.connect()
    try:
        key = queue.names.lease_key(RUN)
        assert isinstance(await queue.leases.take(key, "msg-dead"), leases.Held)
        ack = f"$JS.ACK.{queue.names.stream}.none.1.1.1.1.0"
        dead = liveness.Beat("pod-a", "old", 3000, (liveness.Held(ack, key, None, "msg-dead"),))
        await _restart_over(harness, dead)
        # Free: the message's next delivery takes it at once, not after the lease.
        taken = await queue.leases.take(key, "msg-dead")
        assert isinstance(taken, leases.Held), taken
    finally:
        await queue.close()


async def test_a_lease_another_message_holds_is_kept(harness: NatsHarness) -> None:
    queue = await harness.connect()
    try:
        key = queue.names.lease_key(RUN)
        live = await queue.leases.take(key, "msg-live")
        assert isinstance(live, leases.Held)
        ack = f"$JS.ACK.{queue.names.stream}.none.1.1.1.1.0"
        dead = liveness.Beat("pod-b", "old", 3000, (liveness.Held(ack, key, None, "msg-dead"),))
        await _restart_over(harness, dead)
        # Still the live holder's: another message coalesces into it.
        assert await queue.leases.coalesce(key)
    finally:
        await queue.close()


def test_an_entry_of_the_previous_format_still_decodes() -> None:
    old = b'{"worker":"w","incarnation":"i","liveness_ms":3000,"held":[["r","k","t"]]}'
    beat = liveness.Beat.decode(old)
    assert beat is not None
    assert beat.held == (liveness.Held("r", "k", "t", None),)
