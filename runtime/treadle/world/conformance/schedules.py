"""Storage conformance of ``contract.Schedules`` (issue 17 item 3): the schedules table.

Pins what ``treadle.schedules`` relies on in every World: ``put`` creates or replaces
a spec by name, keeping the firing state but ``paused`` and ``next_fire_at``; every
write moves ``version``; ``update`` is a compare-and-set (a stale version writes
nothing, and of two updates racing on one version exactly one wins); times keep their
microseconds; a reopened World holds what the last one stored. Subclass
``SchedulesConformance`` as ``Test...`` with a ``harness`` fixture.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from treadle import errors
from treadle.world import contract, records
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness

AT = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)


def table(world: contract.World) -> contract.Schedules:
    found = getattr(world, "schedules", None)
    assert isinstance(found, contract.Schedules), f"{world!r} has no schedules table"
    return found


def spec(name: str, **changes: object) -> records.ScheduleSpec:
    base = records.ScheduleSpec(
        name=name, workflow_name="nightly", cron="0 * * * *", timezone="Europe/Paris",
        overlap="buffer_one", catchup_window_seconds=90.5,
        input={"args": [1, "two"], "kwargs": {"k": [None, True]}},
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


class SchedulesConformance:
    """``world.schedules`` on any World's storage."""

    async def test_put_creates_and_get_reads_it_back(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            name = support.unique("sched")
            made = await table(world).put(spec(name), next_fire_at=AT)
            assert made.spec == spec(name)
            assert made.state == records.ScheduleState(paused=False, next_fire_at=AT)
            assert made.version == 1
            assert made.created_at.tzinfo is not None
            assert await table(world).get(name) == made
            listed = [r for r in await table(world).list() if r.name == name]
            assert listed == [made]

    async def test_a_pinned_deployment_and_catchup_latest_are_stored_and_changed_by_put(
        self, harness: WorldHarness
    ) -> None:
        """The operator's WorkflowSchedule: ``deployment_id`` and ``catchup`` round-trip,
        and a put moving the deployment (a rollout) keeps them and the state."""
        async with support.opened(harness) as world:
            name = support.unique("sched")
            pinned = spec(name, deployment_id="shop-rev1", catchup="latest")
            made = await table(world).put(pinned, next_fire_at=AT)
            assert made.spec == pinned
            assert (await table(world).get(name)).spec.deployment_id == "shop-rev1"
            moved = await table(world).put(
                dataclasses.replace(pinned, deployment_id="shop-rev2"), next_fire_at=AT
            )
            assert (moved.spec.deployment_id, moved.spec.catchup) == ("shop-rev2", "latest")
            assert moved.version > made.version
            plain = await table(world).put(spec(name), next_fire_at=AT)
            assert (plain.spec.deployment_id, plain.spec.catchup) == (None, "all")

    async def test_put_if_writes_only_onto_the_version_read(self, harness: WorldHarness) -> None:
        """``put_if``: 0 creates only when absent; the version read replaces; a stale one
        (a claim moved it meanwhile) writes nothing and answers None."""
        async with support.opened(harness) as world:
            name = support.unique("sched")
            made = await table(world).put_if(spec(name), next_fire_at=AT, expected_version=0)
            assert made is not None
            assert made.version == 1
            again = await table(world).put_if(spec(name), next_fire_at=AT, expected_version=0)
            assert again is None, "0 created over an existing schedule"
            claimed = dataclasses.replace(made.state, next_fire_at=AT + timedelta(hours=1))
            moved = await table(world).update(name, expected_version=made.version, state=claimed)
            assert moved is not None
            stale = await table(world).put_if(
                spec(name, overlap="allow"), next_fire_at=AT, expected_version=made.version
            )
            assert stale is None
            held = await table(world).get(name)
            assert held == moved, "a stale put_if wrote"
            won = await table(world).put_if(
                spec(name, overlap="allow"), next_fire_at=held.state.next_fire_at,
                expected_version=held.version,
            )  # fmt: skip
            assert won is not None
            assert won.spec.overlap == "allow"
            assert won.version > held.version
            assert won.state.last_run_id == held.state.last_run_id

    async def test_put_again_replaces_the_spec_and_keeps_the_firing_state(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            name = support.unique("sched")
            made = await table(world).put(spec(name), next_fire_at=AT)
            fired = records.ScheduleState(
                paused=False, next_fire_at=AT + timedelta(hours=1), last_fired_at=AT,
                last_run_id="wrun_00000000000000000000000001", skipped=3, missed=2,
                buffered_at=AT + timedelta(minutes=5),
            )  # fmt: skip
            after = await table(world).update(name, expected_version=made.version, state=fired)
            assert after is not None
            assert after.version == 2
            changed = spec(name, cron="*/5 * * * *", overlap="allow", paused=True)
            replaced = await table(world).put(changed, next_fire_at=None)
            assert replaced.spec == changed
            assert replaced.version == 3
            assert replaced.state == dataclasses.replace(fired, paused=True, next_fire_at=None)
            assert replaced.created_at == made.created_at

    async def test_update_is_a_compare_and_set_on_the_version(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            name = support.unique("sched")
            made = await table(world).put(spec(name), next_fire_at=AT)
            first = dataclasses.replace(made.state, last_fired_at=AT, skipped=1)
            won = await table(world).update(name, expected_version=made.version, state=first)
            assert won is not None
            assert won.state == first
            assert won.version == made.version + 1
            stale = dataclasses.replace(made.state, missed=9)
            assert (
                await table(world).update(name, expected_version=made.version, state=stale) is None
            )
            assert (await table(world).get(name)).state == first

    async def test_of_two_updates_racing_on_one_version_exactly_one_wins(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            name = support.unique("sched")
            made = await table(world).put(spec(name), next_fire_at=AT)
            states = [dataclasses.replace(made.state, last_run_id=f"r{i}") for i in range(6)]
            answers = await asyncio.gather(
                *(table(world).update(name, expected_version=made.version, state=s) for s in states)
            )
            winners = [a for a in answers if a is not None]
            assert len(winners) == 1
            assert (await table(world).get(name)).state == winners[0].state

    async def test_unknown_and_deleted_schedules(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            name = support.unique("sched")
            with pytest.raises(errors.ScheduleNotFound) as missing:
                await table(world).get(name)
            assert name in str(missing.value)
            made = await table(world).put(spec(name), next_fire_at=AT)
            assert await table(world).delete(name) is True
            assert await table(world).delete(name) is False
            with pytest.raises(errors.ScheduleNotFound):
                await table(world).get(name)
            gone = await table(world).update(name, expected_version=made.version, state=made.state)
            assert gone is None

    async def test_list_is_by_name_and_bounded(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            prefix = support.unique("listed")
            for suffix in ("c", "a", "b"):
                await table(world).put(spec(f"{prefix}-{suffix}"), next_fire_at=None)
            names = [r.name for r in await table(world).list() if r.name.startswith(prefix)]
            assert names == [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
            assert len(await table(world).list(limit=2)) == 2

    async def test_a_reopened_world_holds_the_schedules(self, harness: WorldHarness) -> None:
        name = support.unique("sched")
        async with support.opened(harness) as world:
            made = await table(world).put(spec(name, paused=True), next_fire_at=AT)
        async with support.opened(harness) as world:
            assert await table(world).get(name) == made
