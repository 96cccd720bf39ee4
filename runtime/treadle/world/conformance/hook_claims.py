"""Storage conformance: hook force-claim and token retention (issue 17 item 8).

Seed 003 "Force-claim": a ``hook_created`` with ``force`` for a token another run
holds writes ``hook_disposed {force_claimed_by}`` into the holder's log and stores the
creation with ``claimed_from``; the token then belongs to the claimer. A refused claim
(fence) writes neither. A run never force-claims from itself. "Terminal hook
disposal": a hook with ``token_retention_until`` keeps its token past its run's end
(``hooks.get_by_token`` finds it with ``retained_until``; a ``hook_received`` is
``HookNotFound``; another run's plain creation is a ``hook_conflict``), a force-claim
takes it, and once the retention has passed the token is free. The rules are
``storagerules.claim_decision`` and ``holder_expired``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from treadle import clock, errors
from treadle.world import events
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


def forced(hook_id: str, token: str) -> events.HookCreated:
    return events.HookCreated(correlation_id=hook_id, token=token, force=True)


def retained(hook_id: str, token: str, seconds: float) -> events.HookCreated:
    until = clock.utcnow() + timedelta(seconds=seconds)
    return events.HookCreated(correlation_id=hook_id, token=token, token_retention_until=until)


class HookClaimConformance:
    """Force-claim and token retention; subclass it as ``Test...``."""

    async def test_force_claim_disposes_the_holders_hook_and_names_it(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            victim, claimer = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, victim, support.hook_created("hook_v", token))
            before = len(await support.full_log(world, victim))
            result = await support.in_band(world, claimer, forced("hook_c", token))
            created = result.event.event
            assert isinstance(created, events.HookCreated)
            assert (created.claimed_from, created.force) == (victim, True)
            stored = (await support.full_log(world, claimer))[result.event.slot - 1].event
            assert isinstance(stored, events.HookCreated)
            assert stored.claimed_from == victim
            victim_log = await support.full_log(world, victim)
            assert len(victim_log) == before + 1
            disposal = victim_log[-1]
            assert isinstance(disposal.event, events.HookDisposed)
            assert disposal.event.correlation_id == "hook_v"
            assert disposal.event.force_claimed_by == claimer
            assert not disposal.in_band  # the World's write, not the victim orchestrator's
            hook = await world.hooks.get_by_token(token)
            assert (hook.run_id, hook.hook_id) == (claimer, "hook_c")
            with pytest.raises(errors.HookNotFound):
                await support.out_of_band(
                    world, victim, events.HookReceived(correlation_id="hook_v")
                )

    async def test_force_on_a_free_token_is_a_plain_creation(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            claimer = await support.started_run(world)
            token = support.unique("token")
            result = await support.in_band(world, claimer, forced("hook_c", token))
            created = result.event.event
            assert isinstance(created, events.HookCreated)
            assert created.claimed_from is None
            assert (await world.hooks.get_by_token(token)).run_id == claimer

    async def test_force_never_takes_a_token_from_its_own_run(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            result = await support.in_band(world, run_id, forced("hook_2", token))
            assert isinstance(result.event.event, events.HookConflict)
            assert result.event.event.holder_run_id == run_id

    async def test_a_fenced_out_force_claim_writes_nothing_anywhere(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            victim, claimer = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, victim, support.hook_created("hook_v", token))
            victim_before = await support.full_log(world, victim)
            claimer_before = await support.full_log(world, claimer)
            with pytest.raises(errors.InBandSuperseded):
                await world.events.create(
                    claimer, forced("hook_c", token), in_band=True,
                    expected_seq_in_band=0, event_count=len(claimer_before),
                )  # fmt: skip
            assert await support.full_log(world, victim) == victim_before
            assert await support.full_log(world, claimer) == claimer_before
            assert (await world.hooks.get_by_token(token)).run_id == victim

    async def test_a_second_force_claim_takes_it_again(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            first, second, third = [await support.started_run(world) for _ in range(3)]
            token = support.unique("token")
            await support.in_band(world, first, support.hook_created("hook_1", token))
            await support.in_band(world, second, forced("hook_2", token))
            result = await support.in_band(world, third, forced("hook_3", token))
            created = result.event.event
            assert isinstance(created, events.HookCreated)
            assert created.claimed_from == second
            last = (await support.full_log(world, second))[-1].event
            assert isinstance(last, events.HookDisposed)
            assert last.force_claimed_by == third
            assert (await world.hooks.get_by_token(token)).run_id == third

    @pytest.mark.parametrize("ending", support.ENDINGS)
    async def test_a_retained_token_outlives_its_run(
        self, harness: WorldHarness, ending: str
    ) -> None:
        async with support.opened(harness) as world:
            run_id, other = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, retained("hook_1", token, 3600))
            await support.end_run(world, run_id, ending)
            hook = await world.hooks.get_by_token(token)
            assert (hook.run_id, hook.hook_id) == (run_id, "hook_1")
            assert hook.retained_until is not None
            with pytest.raises(errors.HookNotFound):
                await support.out_of_band(
                    world, run_id, events.HookReceived(correlation_id="hook_1")
                )
            result = await support.in_band(world, other, support.hook_created("hook_2", token))
            assert isinstance(result.event.event, events.HookConflict)
            assert result.event.event.holder_run_id == run_id

    async def test_a_force_claim_takes_a_retained_token(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            run_id, claimer = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, retained("hook_1", token, 3600))
            await support.end_run(world, run_id, "completed")
            result = await support.in_band(world, claimer, forced("hook_c", token))
            created = result.event.event
            assert isinstance(created, events.HookCreated)
            assert created.claimed_from == run_id
            last = (await support.full_log(world, run_id))[-1].event
            assert isinstance(last, events.HookDisposed)
            assert last.force_claimed_by == claimer
            assert (await world.hooks.get_by_token(token)).run_id == claimer

    async def test_a_disposed_retained_hook_frees_its_token(self, harness: WorldHarness) -> None:
        """The terminal drain's disposal of a retained hook releases it early."""
        async with support.opened(harness) as world:
            run_id, other = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, retained("hook_1", token, 3600))
            await support.in_band(world, run_id, events.HookDisposed(correlation_id="hook_1"))
            await support.end_run(world, run_id, "completed")
            with pytest.raises(errors.HookNotFound):
                await world.hooks.get_by_token(token)
            result = await support.in_band(world, other, support.hook_created("hook_2", token))
            assert result.event.type == "hook_created"

    async def test_a_passed_retention_frees_the_token_at_the_runs_end(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            run_id, other = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, retained("hook_1", token, -1))
            assert (await world.hooks.get_by_token(token)).run_id == run_id  # a live run's
            await support.end_run(world, run_id, "failed")
            with pytest.raises(errors.HookNotFound):
                await world.hooks.get_by_token(token)
            result = await support.in_band(world, other, support.hook_created("hook_2", token))
            assert result.event.type == "hook_created"
            assert (await world.hooks.get_by_token(token)).run_id == other

    async def test_retention_does_nothing_while_the_run_lives(self, harness: WorldHarness) -> None:
        """A live run's retained hook takes its payload and frees its token like any other."""
        async with support.opened(harness) as world:
            run_id, other = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, retained("hook_1", token, 3600))
            await support.out_of_band(world, run_id, events.HookReceived(correlation_id="hook_1"))
            await support.end_run(world, run_id, "completed")
            result = await support.in_band(world, other, support.hook_created("hook_2", token))
            assert result.event.type == "hook_created"
