"""Attribute conformance: the fold of ``attr_set`` into the run's record, and
``runs.list(attributes=...)`` (issue 17 item 2, docs/attributes.md).

Every World folds ``run_created.attributes`` and each ``attr_set`` (in-band or out of
band, the last write of a key winning) into ``RunRecord.attributes``, and answers an
attribute filter (scalars, equality, ANDed over the keys) alike: a string never equals
a number, ``true`` never equals ``1``, ``3`` equals ``3.0``, a list or an object is
stored but never matched. ``treadle.world.attributes`` holds the shared rules.
"""

from __future__ import annotations

import pytest
from pydantic import JsonValue

from treadle import errors
from treadle.world import attributes, contract, events
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


async def _run_with(
    world: contract.World, name: str, seeded: dict[str, JsonValue] | None = None
) -> str:
    run = await world.runs.create(
        workflow_name=name,
        input=None,
        deployment_id=support.DEPLOYMENT,
        spec_version=support.SPEC_VERSION,
        attributes=seeded,
    )
    await support.in_band(world, run.run_id, events.RunStarted())
    return run.run_id


async def _found(world: contract.World, name: str, **wanted: JsonValue) -> set[str]:
    page = await world.runs.list(workflow_name=name, attributes=wanted)
    return {r.run_id for r in page.runs}


class AttributesConformance:
    """Attribute folds and filters; subclass it as ``Test...``."""

    async def test_record_holds_the_fold_of_seed_and_attr_sets(self, harness: WorldHarness) -> None:
        """runs.get shows run_created's attributes, then each attr_set in slot order."""
        async with support.opened(harness) as world:
            name = support.unique("wf")
            run_id = await _run_with(world, name, {"tier": "gold", "n": 1})
            await support.in_band(world, run_id, events.AttrSet(key="stage", value="a", position=0))
            await support.out_of_band(world, run_id, events.AttrSet(key="tier", value="silver"))
            await support.out_of_band(world, run_id, events.AttrSet(key="doc", value={"x": [1]}))
            await support.in_band(world, run_id, events.AttrSet(key="stage", value="b"))
            record = await world.runs.get(run_id)
            log = await support.full_log(world, run_id)
            sets = [
                (e.event.key, e.event.value) for e in log if isinstance(e.event, events.AttrSet)
            ]
            assert record.attributes == attributes.fold({"tier": "gold", "n": 1}, sets)
            assert record.attributes == {"tier": "silver", "n": 1, "stage": "b", "doc": {"x": [1]}}

    async def test_runs_list_filters_by_attribute_equality_anded(
        self, harness: WorldHarness
    ) -> None:
        """runs.list(attributes={k: v, ...}) lists the runs holding every pair."""
        async with support.opened(harness) as world:
            name = support.unique("wf")
            gold_eu = await _run_with(world, name, {"tier": "gold", "region": "eu"})
            gold_us = await _run_with(world, name, {"tier": "gold", "region": "us"})
            plain = await _run_with(world, name)
            await support.out_of_band(world, plain, events.AttrSet(key="tier", value="gold"))
            assert await _found(world, name, tier="gold") == {gold_eu, gold_us, plain}
            assert await _found(world, name, tier="gold", region="eu") == {gold_eu}
            assert await _found(world, name, tier="bronze") == set()
            # An overwrite moves the run out of the old value's answer.
            await support.out_of_band(world, gold_us, events.AttrSet(key="tier", value="silver"))
            assert await _found(world, name, tier="gold") == {gold_eu, plain}
            assert await _found(world, name, tier="silver") == {gold_us}
            other = await world.runs.list(attributes={"tier": "gold"}, workflow_name="nope")
            assert other.runs == ()

    async def test_attribute_filter_is_typed(self, harness: WorldHarness) -> None:
        """A string never equals a number, true never equals 1, 3 equals 3.0, null matches
        a key set to null (not a missing key), a list or an object is never matched."""
        async with support.opened(harness) as world:
            name = support.unique("wf")
            number = await _run_with(world, name, {"v": 3})
            text = await _run_with(world, name, {"v": "3"})
            flag = await _run_with(world, name, {"v": True})
            one = await _run_with(world, name, {"v": 1})
            empty = await _run_with(world, name, {"v": None})
            listed = await _run_with(world, name, {"v": ["3"]})
            await _run_with(world, name)
            assert await _found(world, name, v=3) == {number}
            assert await _found(world, name, v=3.0) == {number}
            assert await _found(world, name, v="3") == {text}
            assert await _found(world, name, v=True) == {flag}
            assert await _found(world, name, v=1) == {one}
            assert await _found(world, name, v=None) == {empty}
            assert listed not in await _found(world, name, v="3")
            # A list value set later leaves the index too.
            await support.out_of_band(world, number, events.AttrSet(key="v", value=[3]))
            assert await _found(world, name, v=3) == set()

    async def test_attribute_filter_pages_with_the_cursor(self, harness: WorldHarness) -> None:
        """A filtered list pages through next_cursor, each matching run once."""
        async with support.opened(harness) as world:
            name = support.unique("wf")
            matching = {await _run_with(world, name, {"batch": 7}) for _ in range(5)}
            await _run_with(world, name, {"batch": 8})
            seen: list[str] = []
            cursor: str | None = None
            for _ in range(10):
                page = await world.runs.list(
                    workflow_name=name, attributes={"batch": 7}, limit=2, cursor=cursor
                )
                seen += [r.run_id for r in page.runs]
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert sorted(seen) == sorted(matching)

    async def test_bad_attribute_filter_is_a_contract_error(self, harness: WorldHarness) -> None:
        """A filter on a list or object value, a bad key or a value over the filter size
        limit is a WorldContractError naming the key."""
        async with support.opened(harness) as world:
            cases: list[dict[str, JsonValue]] = [
                {"tier": ["gold"]},
                {"tier": {"a": 1}},
                {"bad key": "x"},
                {"tier": "x" * (attributes.MAX_FILTER_VALUE_BYTES + 1)},
            ]
            for bad in cases:
                with pytest.raises(errors.WorldContractError, match="attribute filter"):
                    await world.runs.list(attributes=bad)

    async def test_attributes_survive_a_reopen(self, harness: WorldHarness) -> None:
        """The fold and its index are durable: a reopened World answers the same filter."""
        name = support.unique("wf")
        async with support.opened(harness) as world:
            run_id = await _run_with(world, name, {"tier": "gold"})
            await support.out_of_band(world, run_id, events.AttrSet(key="stage", value="x"))
        async with support.opened(harness) as world:
            assert await _found(world, name, tier="gold", stage="x") == {run_id}
            assert (await world.runs.get(run_id)).attributes == {"tier": "gold", "stage": "x"}
