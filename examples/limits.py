"""Concurrency and rate limits (docs/limits.md): one sync per customer at a time, at most
five syncs in flight in the whole World, and the mail API called at most 20 times a second.

treadle run examples/limits.py:sync_orders --input '{"customer": "acme"}'
"""

from __future__ import annotations

import asyncio

from treadle import Limit, Rate, Workflows

app = Workflows()


@app.step(
    concurrency=Limit(key=lambda customer, order: customer, max=1),  # one per customer
    rate=Rate(per_second=20),  # the mail API's quota, shared by every worker
)
async def send_receipt(customer: str, order: int) -> str:
    return f"receipt {order} sent to {customer}"


@app.workflow(concurrency=Limit(max=5), priority=0)  # five syncs at a time, World-wide
async def sync_orders(customer: str = "acme", orders: int = 3) -> list[str]:
    return list(await asyncio.gather(*(send_receipt(customer, n) for n in range(orders))))
