"""Storage conformance of child workflows (docs/children.md): the parent link.

``runs.create(..., parent_run_id=, parent_correlation_id=)`` stores the link on the
child's ``run_created`` and on its record (``get``, ``list``, the create's own answer,
a retried create's answer); a run created without one has none. A child's outcome
written twice under one idempotency key is one event; outcomes are accepted on an
ended parent, and a ``child_created`` on an ended run is refused (``RunExpired``,
nothing allocated). Subclass ``ChildLinkConformance`` as ``Test...`` with a
``harness`` fixture.
"""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.world import events, ids
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


class ChildLinkConformance:
    async def test_a_child_run_carries_its_parent_link_in_both_records(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            parent = await support.new_run(world)
            child_id = ids.keyed_run_id(support.unique("child"))
            created = await world.runs.create(
                workflow_name="kid",
                input={"args": [1], "kwargs": {}},
                deployment_id=support.DEPLOYMENT,
                spec_version=9,
                run_id=child_id,
                parent_run_id=parent.run_id,
                parent_correlation_id="child_abc",
            )
            again = await world.runs.create(
                workflow_name="kid",
                input={"args": [1], "kwargs": {}},
                deployment_id=support.DEPLOYMENT,
                spec_version=9,
                run_id=child_id,
                parent_run_id=parent.run_id,
                parent_correlation_id="child_abc",
            )
            got = await world.runs.get(child_id)
            listed = [
                r
                for r in (await world.runs.list(workflow_name="kid", limit=100)).runs
                if r.run_id == child_id
            ]
            for record in (created, again, got, *listed):
                assert (record.parent_run_id, record.parent_correlation_id) == (
                    parent.run_id,
                    "child_abc",
                )
            assert len(listed) == 1
            first = (await world.events.list(child_id)).events[0].event
            assert isinstance(first, events.RunCreated)
            assert (first.parent_run_id, first.parent_correlation_id) == (
                parent.run_id,
                "child_abc",
            )
            plain = await world.runs.get(parent.run_id)
            assert (plain.parent_run_id, plain.parent_correlation_id) == (None, None)

    async def test_a_childs_outcome_is_written_once_even_on_an_ended_parent(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            parent_id = await support.started_run(world)
            created = events.ChildCreated(
                correlation_id="child_1", workflow_name="kid", child_run_id=ids.new_run_id()
            )
            await support.in_band(world, parent_id, created)
            await support.end_run(world, parent_id, "completed")
            outcome = events.ChildCompleted(
                correlation_id="child_1", child_run_id=created.child_run_id, output=7
            )
            key = f"child-outcome:{created.child_run_id}"
            first = await support.out_of_band(world, parent_id, outcome, idempotency_key=key)
            second = await support.out_of_band(world, parent_id, outcome, idempotency_key=key)
            assert (first.allocated, second.allocated) == (1, 0)
            assert second.event.slot == first.event.slot
            log = (await world.events.list(parent_id)).events
            assert [e.type for e in log].count("child_completed") == 1
            before = await world.runs.get(parent_id)
            again = events.ChildCreated(
                correlation_id="child_2", workflow_name="kid", child_run_id=ids.new_run_id()
            )
            with pytest.raises(errors.RunExpired):
                await support.in_band(world, parent_id, again)
            assert (await world.runs.get(parent_id)).snapshot == before.snapshot
