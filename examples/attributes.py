"""Run attributes: searchable labels on runs (docs/attributes.md).

    python examples/attributes.py
    treadle run examples/attributes.py:onboard --input '{"customer": "acme"}'
    treadle runs list --attr plan=pro --attr stage=active

``app.start(..., attributes=...)`` seeds a run's attributes; ``set_attributes()`` sets
more from workflow code (recorded in the log, replayed, never written twice) and from
step code; ``run.set_attributes()`` from outside. ``app.list_runs(attributes=...)``
(and ``treadle runs list --attr``, the API's ``/api/runs?attributes=``) finds runs by
them. Workflow-code attributes need spec 9 runs (the default).
"""

from __future__ import annotations

import asyncio

from treadle import Workflows, set_attributes

app = Workflows()

CUSTOMERS = [("acme", "pro"), ("globex", "free"), ("initech", "pro")]


@app.step
async def provision(customer: str) -> str:
    """Create the customer's database; the step labels the run with its region."""
    await set_attributes({"region": "eu-west"})
    return f"{customer}-db"


@app.workflow
async def onboard(customer: str = "acme", plan: str = "pro") -> str:
    set_attributes({"stage": "provisioning"})
    database = await provision(customer)
    set_attributes({"stage": "active", "database": database})
    return database


async def main() -> dict[str, object]:
    async with app:
        runs = [
            await app.start(
                onboard, customer, plan, attributes={"customer": customer, "plan": plan}
            )
            for customer, plan in CUSTOMERS
        ]
        for run in runs:
            await run.result(timeout=60)
        await runs[1].set_attributes({"note": "asked for a demo"})
        active_pro = await app.list_runs(
            workflow="onboard", attributes={"plan": "pro", "stage": "active"}
        )
        return {
            "active pro customers": sorted(str(r.attributes["customer"]) for r in active_pro),
            "globex": await runs[1].attributes(),
        }


if __name__ == "__main__":
    print(asyncio.run(main()))
