"""What a run waits on among the World's limits, for the readers that show runs
(``treadle runs get/list``, ``Run.get``, ``treadle serve``'s API): issue 17 item 4."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from treadle import clock
from treadle.world import contract, limitrules, records


def store(world: contract.World) -> contract.LimitStore | None:
    """The World's limits (``world.limits``), or None when it keeps none."""
    found = getattr(world, "limits", None)
    return found if isinstance(found, contract.LimitStore) else None


async def waiting_on(
    world: contract.World, run_ids: Sequence[str]
) -> dict[str, limitrules.WaitingOn]:
    limits = store(world)
    if limits is None or not run_ids:
        return {}
    return await limits.waiting(run_ids, now_ms=clock.now_ms())


async def annotate(
    world: contract.World, runs: Sequence[records.RunRecord]
) -> list[records.RunRecord]:
    """The runs with ``waiting_on_limit`` filled (for ``runs get/list`` and the API)."""
    live = [r.run_id for r in runs if not r.is_terminal]
    found = await waiting_on(world, live)
    return [
        dataclasses.replace(r, waiting_on_limit=found[r.run_id]) if r.run_id in found else r
        for r in runs
    ]


def waiting_dict(found: limitrules.WaitingOn | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {
        "limit": found.limit,
        "scope": found.scope,
        "key": found.key,
        "holder": found.holder,
        "priority": found.priority,
        "position": found.position or None,
        "since": found.since.isoformat() if found.since else None,
        "until": found.until.isoformat() if found.until else None,
        "text": found.describe(),
    }
