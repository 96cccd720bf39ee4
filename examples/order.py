"""An order: a fan-out over inline and background steps, a step that retries once,
an approval hook with a timeout, and a durable sleep.

    treadle run examples/order.py:order --input '{"order_id": "A-1"}'

Nobody approves it within 2 s, so the hook times out and the order is held for
review. To approve it in time, start it with ``treadle start``, serve it with
``treadle worker examples/order.py`` and, from another shell::

    treadle hooks resume approval-A-1 --payload '{"approved": true, "by": "ann"}'
"""

from __future__ import annotations

import asyncio

from treadle import Hook, RetryableError, Workflows, sleep, step_metadata

app = Workflows()

ITEMS = ["tea", "cups", "pot", "tray", "spoon"]
PRICES = {"tea": 4.5, "cups": 12.0, "pot": 30.0, "tray": 8.25, "spoon": 1.5}


class Approval(Hook):
    """What an approver sends to the order's hook."""

    approved: bool
    by: str = "someone"


@app.step
async def reserve(item: str) -> float:
    """Reserve one item; its price. The orchestrator runs the first few inline."""
    return PRICES.get(item, 10.0)


@app.step
async def charge(order_id: str, amount: float) -> str:
    """Charge the card; the first attempt finds the processor busy and is retried."""
    meta = step_metadata()
    if meta.attempt == 1:
        raise RetryableError("the card processor is busy", retry_after=0.2)
    return f"charged {amount:.2f} for {order_id} on attempt {meta.attempt}"


@app.step
def ship(order_id: str, items: list[str]) -> str:  # a sync step runs in a thread
    return f"shipped {len(items)} items of {order_id}"


@app.workflow
async def order(order_id: str = "A-1", items: list[str] | None = None) -> dict[str, object]:
    items = items or ITEMS
    prices = await asyncio.gather(*(reserve(item) for item in items))
    receipt = await charge(order_id, sum(prices))
    await sleep("1s")  # let the payment settle
    approval = await Approval.wait(token=f"approval-{order_id}", timeout="2s")
    if approval is None or not approval.approved:
        return {"order_id": order_id, "receipt": receipt, "status": "held for review"}
    shipment = await ship(order_id, items)
    return {
        "order_id": order_id,
        "receipt": receipt,
        "status": shipment,
        "approved_by": approval.by,
    }
