"""A background step's delivery reads its own step's events, never the run's whole log
(seed 003 follow-up 3, issue 15 item 5: "no full re-reads on background step retries
and redeliveries").

Counted by ``FaultyEvents.events_read``: every log read (``events.list`` or
``events.list_entity``) with the number of events it returned and the delivery that
made it, on the local World and on Postgres + NATS.
"""

from __future__ import annotations

from treadle import RetryableError

from .conftest import MakeApp
from .faults import FaultyWorld

STEPS = 40
# A step's own events on a delivery's read: step_created, step_started, step_retrying,
# step_started (the retry), step_completed: never more, however long the log.
OWN_EVENTS = 5


async def test_step_deliveries_read_only_their_steps_events(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """40 background steps one after another (every 4th failing once, so retries and
    their redeliveries are in it): the run's log grows past 150 events, yet no read a
    step delivery makes returns more than its step's own handful, and the last steps'
    reads return no more than the first steps' did."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    failed_once: set[int] = set()

    @app.step
    async def work(i: int) -> int:
        if i % 4 == 0 and i not in failed_once:
            failed_once.add(i)
            raise RetryableError(f"step {i}: first attempt fails", retry_after=0.01)
        return i

    @app.workflow
    async def flow() -> int:
        total = 0
        for i in range(STEPS):
            total += await work(i)
        return total

    run = await app.start(flow)
    assert await run.result(timeout=120) == sum(range(STEPS))
    record = await faulty.inner.runs.get(run.run_id)
    assert record.seq > 3 * STEPS, f"the log holds only {record.seq} events"
    step_reads = [
        (n, by) for n, by in faulty.events.events_read if by is not None and by.kind == "step"
    ]
    # Every step delivery read (at least once), retries included.
    read_steps = {by.message.step_id for _, by in step_reads}
    assert len(read_steps) == STEPS
    retried = [by for _, by in step_reads if by.meta.delivery_count > 1]
    assert retried, "no step delivery was a redelivery"
    counts = [n for n, _ in step_reads]
    assert max(counts) <= OWN_EVENTS, (
        f"a step delivery read {max(counts)} events (the log holds {record.seq})"
    )
    # Flat: the last tenth of the steps read no more than the first tenth.
    order = [by.message.step_id for _, by in step_reads]
    ids_in_order = list(dict.fromkeys(order))
    early, late = set(ids_in_order[:4]), set(ids_in_order[-4:])
    early_max = max(n for n, by in step_reads if by.message.step_id in early)
    late_max = max(n for n, by in step_reads if by.message.step_id in late)
    assert late_max <= early_max
