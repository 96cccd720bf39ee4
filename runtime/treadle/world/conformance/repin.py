"""Storage conformance of ``runs.repin``: moving a run to another deployment.

Pins the rule of ``treadle.world.contract.Runs.repin`` (issue 11 item 5, docs/
operator-templates.md "Moving pinned runs"): the run row's ``deployment_id`` and a
``run_repinned`` event (out-of-band: ``seq`` moves, ``seq_in_band`` does not)
change together; a move from a deployment the run is not on, of an ended run, or
to an unknown or retired deployment is ``RunNotRepinned`` and writes nothing;
``events.create`` never writes a ``run_repinned``; the event is in the log and the
live feed. Subclass ``RepinConformance`` as ``Test...`` with a ``harness`` fixture.
"""

from __future__ import annotations

import asyncio

import pytest

from treadle import errors
from treadle.world import contract, events
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


async def _two_deployments(world: contract.World) -> tuple[str, str]:
    source, target = support.unique("dep_a"), support.unique("dep_b")
    for deployment in (source, target):
        await world.deployments.register(deployment)
    return source, target


class RepinConformance:
    """``runs.repin`` on any World's storage."""

    async def test_a_repin_moves_the_run_row_and_logs_run_repinned(
        self, harness: WorldHarness
    ) -> None:
        """The row's deployment, the log's last event and the counters move together."""
        async with support.opened(harness) as world:
            source, target = await _two_deployments(world)
            run = await support.new_run(world, deployment_id=source)
            await support.in_band(world, run.run_id, events.RunStarted())
            moved = await world.runs.repin(
                run.run_id, from_deployment=source, to_deployment=target, reason="rollback"
            )
            assert moved.deployment_id == target
            assert (await world.runs.get(run.run_id)).deployment_id == target
            assert (moved.seq, moved.seq_in_band) == (3, 2)  # out-of-band: seq only
            log, snapshot = await support.log_and_snapshot(world, run.run_id)
            assert (snapshot.seq, snapshot.seq_in_band) == (3, 2)
            last = log[-1]
            assert (last.slot, last.in_band) == (3, False)
            assert last.event == events.RunRepinned(
                from_deployment=source, to_deployment=target, reason="rollback"
            )
            on_target = await world.runs.list(deployment_id=target)
            assert [r.run_id for r in on_target.runs] == [run.run_id]
            assert not (await world.runs.list(deployment_id=source)).runs

    async def test_a_repin_from_a_deployment_the_run_is_not_on_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """A second mover (or one naming the wrong source) loses: nothing is written."""
        async with support.opened(harness) as world:
            source, target = await _two_deployments(world)
            run = await support.new_run(world, deployment_id=source)
            await world.runs.repin(run.run_id, from_deployment=source, to_deployment=target)
            third = support.unique("dep_c")
            await world.deployments.register(third)
            with pytest.raises(errors.RunNotRepinned) as refused:
                await world.runs.repin(run.run_id, from_deployment=source, to_deployment=third)
            assert refused.value.reason == "not_on_from"
            assert target in str(refused.value)
            assert (await world.runs.get(run.run_id)).deployment_id == target
            assert (await world.runs.get(run.run_id)).seq == 2

    @pytest.mark.parametrize("ending", support.ENDINGS)
    async def test_a_repin_of_an_ended_run_is_refused(
        self, harness: WorldHarness, ending: str
    ) -> None:
        """An ended run stays where it ended, whatever ended it."""
        async with support.opened(harness) as world:
            source, target = await _two_deployments(world)
            run = await support.new_run(world, deployment_id=source)
            await support.in_band(world, run.run_id, events.RunStarted())
            await support.end_run(world, run.run_id, ending)
            before = await world.runs.get(run.run_id)
            with pytest.raises(errors.RunNotRepinned) as refused:
                await world.runs.repin(run.run_id, from_deployment=source, to_deployment=target)
            assert refused.value.reason == "ended"
            after = await world.runs.get(run.run_id)
            assert (after.deployment_id, after.seq) == (source, before.seq)

    async def test_a_repin_to_a_retired_or_unknown_deployment_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """Never to a deployment no worker serves: retired, or never registered."""
        async with support.opened(harness) as world:
            source, target = await _two_deployments(world)
            await world.deployments.retire(target)
            run = await support.new_run(world, deployment_id=source)
            with pytest.raises(errors.RunNotRepinned) as retired:
                await world.runs.repin(run.run_id, from_deployment=source, to_deployment=target)
            assert retired.value.reason == "retired_target"
            with pytest.raises(errors.RunNotRepinned) as unknown:
                await world.runs.repin(
                    run.run_id, from_deployment=source, to_deployment=support.unique("never")
                )
            assert unknown.value.reason == "unknown_target"
            with pytest.raises(errors.WorldContractError):
                await world.runs.repin(run.run_id, from_deployment=source, to_deployment=source)
            with pytest.raises(errors.RunNotFound):
                await world.runs.repin(
                    support.unique("wrun_missing"), from_deployment=source, to_deployment=target
                )
            after = await world.runs.get(run.run_id)
            assert (after.deployment_id, after.seq) == (source, 1)

    async def test_events_create_never_writes_run_repinned(self, harness: WorldHarness) -> None:
        """Only runs.repin writes it, with the row change: events.create is a contract error."""
        async with support.opened(harness) as world:
            source, target = await _two_deployments(world)
            run = await support.new_run(world, deployment_id=source)
            forged = events.RunRepinned(from_deployment=source, to_deployment=target)
            with pytest.raises(errors.WorldContractError, match=r"runs\.repin"):
                await support.out_of_band(world, run.run_id, forged)
            after = await world.runs.get(run.run_id)
            assert (after.deployment_id, after.seq) == (source, 1)

    async def test_the_run_repinned_event_reaches_a_subscriber(self, harness: WorldHarness) -> None:
        """A reader following the run (``treadle inspect --follow``) sees the move."""
        async with support.opened(harness) as world:
            source, target = await _two_deployments(world)
            run = await support.new_run(world, deployment_id=source)
            seen: asyncio.Queue[events.LoggedEvent] = asyncio.Queue()
            failed: list[BaseException] = []
            subscription = world.events.subscribe(run.run_id, 1, seen.put_nowait, failed.append)
            try:
                await world.runs.repin(run.run_id, from_deployment=source, to_deployment=target)
                logged = await asyncio.wait_for(seen.get(), timeout=10)
            finally:
                subscription.close()
            assert not failed
            assert (logged.slot, logged.type) == (2, "run_repinned")
