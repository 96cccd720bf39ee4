"""Child workflows: an order ships each item as a child run of its own, waits for them
all, and starts a receipt child it does not wait for (docs/children.md).

treadle run examples/children.py:order --input '{"items": ["book", "lamp"]}'
"""

from __future__ import annotations

import asyncio

from treadle import ChildWorkflowFailed, Workflows

app = Workflows()


@app.step
async def pack(item: str) -> str:
    if item == "anvil":
        raise ValueError("too heavy to ship")
    return f"{item}: packed"


@app.step
async def email(text: str) -> str:
    return f"sent: {text}"


@app.workflow
async def ship(item: str) -> str:
    """One item's shipment: a run of its own, a child of its order."""
    return await pack(item)


@app.workflow
async def receipt(lines: list[str]) -> str:
    return await email(", ".join(lines))


@app.workflow
async def order(items: list[str] | None = None) -> dict[str, object]:
    items = items if items is not None else ["book", "lamp", "anvil"]

    async def shipped(item: str) -> str:
        try:
            return await ship(item)  # a child run; its failure is ChildWorkflowFailed
        except ChildWorkflowFailed as exc:
            return f"{item}: not shipped ({exc.error_message})"

    lines = list(await asyncio.gather(*(shipped(item) for item in items)))
    # Started, not awaited: the receipt runs on even after the order ends ("abandon").
    handle = await app.start(receipt.options(on_parent_close="abandon"), lines)
    return {"lines": lines, "receipt_run": handle.run_id}
