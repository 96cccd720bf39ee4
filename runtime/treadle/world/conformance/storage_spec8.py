"""Storage conformance for spec 8 runs: several writers, one creation per entity.

Pins issue 12 item 2 (seed 003 "Spec 8 and spec 9 side by side", "Spec 8 queues,
as in earlier releases", "Sleeps and timers, spec 8 against spec 9"; seed 000
"Wire format"): a spec 8 run's orchestrator writes every event out-of-band and
unfenced, so several deliveries of one run may write at once, and the World
refuses the loser's duplicate creations without a hole
(``errors.EntityAlreadyCreated``, ``storagerules.created_by``); a higher attempt
re-starts a running step; ``wait_completed`` out-of-band is taken once; a spec 9
event on a spec 8 run is a contract error; ``owner_message_id`` survives storage
and listing. The creation rules hold for spec 9 runs too (their single writer
never meets them), so those tests run on both. Helpers come from ``support``.
"""

from __future__ import annotations

import asyncio

import pytest

from treadle import errors
from treadle.world import constants, contract, events, records
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.support import (
    DEPLOYMENT,
    WAIT_SECONDS,
    hook_created,
    log_and_snapshot,
    opened,
    out_of_band,
    step_completed,
    step_created,
    unique,
    wait_created,
)

SPEC_8 = constants.SPEC_VERSION_LEGACY
SPEC_9 = constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
BOTH_SPECS = (SPEC_8, SPEC_9)


async def spec_run(world: contract.World, spec_version: int) -> str:
    """A run of ``spec_version`` with run_started written out-of-band at slot 2."""
    run = await world.runs.create(
        workflow_name="wf", input=None, deployment_id=DEPLOYMENT, spec_version=spec_version
    )
    await out_of_band(world, run.run_id, events.RunStarted())
    return run.run_id


def owned_start(step_id: str, attempt: int, owner: str | None) -> events.StepStarted:
    """An inline step's start stamped with its owning message (seed 000); the first one
    creates the step and carries its input."""
    first = attempt == 1
    return events.StepStarted(
        correlation_id=step_id,
        step_name="add",
        attempt=attempt,
        inline=True,
        input=[1, 2] if first else None,
        owner_message_id=owner,
    )


async def feed(
    world: contract.World, run_id: str, *, after_slot: int, count: int
) -> list[events.LoggedEvent]:
    """The first ``count`` events ``events.subscribe`` pushes after ``after_slot``."""
    got: list[events.LoggedEvent] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_event(logged: events.LoggedEvent) -> None:
        got.append(logged)
        if len(got) >= count and not done.done():
            done.set_result(None)

    def on_error(exc: BaseException) -> None:
        if not done.done():
            done.set_exception(exc)

    subscription = world.events.subscribe(run_id, after_slot, on_event, on_error)
    try:
        await asyncio.wait_for(done, WAIT_SECONDS)
    finally:
        subscription.close()
    return got[:count]


async def assert_refused_without_a_hole(
    world: contract.World,
    run_id: str,
    event: events.Event,
    *,
    first_slot: int,
) -> errors.EntityAlreadyCreated:
    """``event`` raises EntityAlreadyCreated naming ``first_slot``; the log and counts stay."""
    before = await log_and_snapshot(world, run_id)
    with pytest.raises(errors.EntityAlreadyCreated) as refused:
        await out_of_band(world, run_id, event)
    assert (refused.value.run_id, refused.value.slot) == (run_id, first_slot)
    assert refused.value.correlation_id == event.correlation_id
    assert refused.value.event_type == event.type
    assert await log_and_snapshot(world, run_id) == before
    return refused.value


class Spec8StorageConformance:
    """Spec 8 storage rules; subclass it as ``Test...`` with a harness."""

    async def test_a_second_creation_is_refused_without_a_hole_on_either_spec(
        self, harness: WorldHarness
    ) -> None:
        """A second run_started, step_created, wait_created or hook_created is refused with
        the first creation's slot; nothing is allocated, no counter moves."""
        async with opened(harness) as world:
            for spec in BOTH_SPECS:
                run_id = await spec_run(world, spec)
                token = unique("token")
                firsts: list[events.Event] = [
                    step_created("s1"),
                    wait_created("w1"),
                    hook_created("h1", token),
                ]
                slots = [(await out_of_band(world, run_id, e)).event.slot for e in firsts]
                assert slots == [3, 4, 5]
                again: list[tuple[events.Event, int]] = [
                    (events.RunStarted(), 2),
                    (step_created("s1"), 3),
                    (wait_created("w1"), 4),
                    (hook_created("h1", token), 5),
                    # Another token does not make it another hook.
                    (hook_created("h1", unique("token")), 5),
                ]
                for event, slot in again:
                    refused = await assert_refused_without_a_hole(
                        world, run_id, event, first_slot=slot
                    )
                    assert str(slot) in str(refused)
                run = await world.runs.get(run_id)
                assert (run.seq, run.status) == (5, "running")
                held = await world.hooks.get_by_token(token)
                assert (held.run_id, held.hook_id) == (run_id, "h1")

    async def test_in_band_second_creation_is_refused_after_the_fence(
        self, harness: WorldHarness
    ) -> None:
        """On a spec 9 run an in-band duplicate at the current count is refused the same way
        (the fence is decided first; a stale count stays InBandSuperseded)."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_9)
            await out_of_band(world, run_id, step_created("s1"))
            run = await world.runs.get(run_id)
            with pytest.raises(errors.EntityAlreadyCreated) as refused:
                await world.events.create(
                    run_id,
                    step_created("s1"),
                    in_band=True,
                    expected_seq_in_band=run.seq_in_band,
                    event_count=run.seq,
                )
            assert refused.value.slot == 3
            with pytest.raises(errors.InBandSuperseded):
                await world.events.create(
                    run_id,
                    step_created("s1"),
                    in_band=True,
                    expected_seq_in_band=run.seq_in_band + 5,
                    event_count=run.seq,
                )
            assert (await world.runs.get(run_id)).seq == run.seq

    async def test_racing_creations_have_one_winner_and_no_hole(
        self, harness: WorldHarness
    ) -> None:
        """Several deliveries of a spec 8 run creating the same step, wait and hook at once:
        one write of each lands, every other hears EntityAlreadyCreated naming its slot, and
        the log holds no gap."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            token = unique("token")
            racers: list[events.Event] = [
                creation
                for _ in range(4)
                for creation in (step_created("s1"), wait_created("w1"), hook_created("h1", token))
            ]
            outcomes = await asyncio.gather(
                *(out_of_band(world, run_id, e) for e in racers), return_exceptions=True
            )
            won = [o for o in outcomes if isinstance(o, records.EventResult)]
            lost = [o for o in outcomes if isinstance(o, errors.EntityAlreadyCreated)]
            assert (len(won), len(lost)) == (3, len(racers) - 3), outcomes
            slot_of = {w.event.correlation_id: w.event.slot for w in won}
            assert sorted(slot_of.values()) == [3, 4, 5]
            assert all(refused.slot == slot_of[refused.correlation_id] for refused in lost)
            logged, snapshot = await log_and_snapshot(world, run_id)
            assert [e.slot for e in logged] == list(range(1, 6))
            assert (snapshot.seq, snapshot.seq_in_band) == (5, 1)

    async def test_step_created_for_a_step_an_inline_start_created_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """A step an inline step_started created refuses a step_created (the eager loser)."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            started = await out_of_band(world, run_id, owned_start("s1", 1, "msg_a"))
            await assert_refused_without_a_hole(
                world, run_id, step_created("s1"), first_slot=started.event.slot
            )
            step = await world.steps.get(run_id, "s1")
            assert (step.status, step.attempt, step.inline) == ("running", 1, True)

    async def test_inline_creating_start_for_a_created_step_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """An inline creating start (attempt 1) for a step a step_created created is refused
        (EntityAlreadyCreated); the step message's bare start of it is not. A second inline
        creating start of an inline step stays StaleStepStart."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            created = await out_of_band(world, run_id, step_created("s1"))
            await assert_refused_without_a_hole(
                world, run_id, owned_start("s1", 1, "msg_b"), first_slot=created.event.slot
            )
            bare = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=1)
            assert (await out_of_band(world, run_id, bare)).allocated == 1
            await out_of_band(world, run_id, owned_start("s2", 1, "msg_a"))
            before = await log_and_snapshot(world, run_id)
            with pytest.raises(errors.StaleStepStart):
                await out_of_band(world, run_id, owned_start("s2", 1, "msg_b"))
            assert await log_and_snapshot(world, run_id) == before

    async def test_hook_recreation_is_refused_before_the_token_check(
        self, harness: WorldHarness
    ) -> None:
        """A delivery re-creating its own run's hook hears EntityAlreadyCreated, and no
        hook_conflict is stored; a hook whose creation was stored as hook_conflict refuses a
        second creation too (at the conflict's slot)."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            other = await spec_run(world, SPEC_8)
            mine, theirs = unique("token"), unique("token")
            own = await out_of_band(world, run_id, hook_created("h1", mine))
            await out_of_band(world, other, hook_created("h9", theirs))
            clash = await out_of_band(world, run_id, hook_created("h2", theirs))
            assert isinstance(clash.event.event, events.HookConflict)
            await assert_refused_without_a_hole(
                world, run_id, hook_created("h1", mine), first_slot=own.event.slot
            )
            await assert_refused_without_a_hole(
                world, run_id, hook_created("h2", theirs), first_slot=clash.event.slot
            )
            logged, _ = await log_and_snapshot(world, run_id)
            assert [e.type for e in logged].count("hook_conflict") == 1

    async def test_batch_reports_a_second_creation_per_item(self, harness: WorldHarness) -> None:
        """In create_batch a second creation is refused per item, and every later item of
        its correlation id is EarlierItemRefused; a duplicate within one batch is refused at
        the slot the batch gave the first."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            await out_of_band(world, run_id, step_created("s1"))
            await out_of_band(world, run_id, wait_created("w1"))
            batch: list[events.Event] = [
                step_created("s1"),
                events.StepStarted(correlation_id="s1", step_name="fetch", attempt=1),
                step_created("s2"),
                wait_created("w1"),
                step_created("s2"),
            ]
            result = await world.events.create_batch(run_id, batch, in_band=False)
            first, later, s2, w1, s2_again = result.items
            assert isinstance(first.error, errors.EntityAlreadyCreated)
            assert first.error.slot == 3
            assert isinstance(later.error, errors.EarlierItemRefused)
            assert s2.event is not None
            assert s2.event.slot == 5
            assert isinstance(w1.error, errors.EntityAlreadyCreated)
            assert w1.error.slot == 4
            assert isinstance(s2_again.error, errors.EntityAlreadyCreated)
            assert s2_again.error.slot == 5
            assert result.allocated == 1
            assert (await world.runs.get(run_id)).seq == 5

    async def test_a_spec_8_run_takes_every_orchestrator_event_out_of_band_unfenced(
        self, harness: WorldHarness
    ) -> None:
        """A spec 8 run's orchestrator writes all land out-of-band with no count: seq moves,
        seq_in_band stays at the creation's, the run's views follow."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            token = unique("token")
            writes: list[events.Event] = [
                owned_start("s1", 1, "msg_a"),
                step_created("s2"),
                events.StepStarted(correlation_id="s2", step_name="fetch", attempt=1),
                wait_created("w1"),
                hook_created("h1", token),
                events.WaitCompleted(correlation_id="w1"),
                step_completed("s1"),
                step_completed("s2", "fetch"),
                events.HookDisposed(correlation_id="h1"),
                events.RunCompleted(output="done"),
            ]
            for event in writes:
                result = await out_of_band(world, run_id, event)
                assert (result.allocated, result.event.in_band) == (1, False)
            run = await world.runs.get(run_id)
            assert (run.seq, run.seq_in_band) == (2 + len(writes), 1)
            assert (run.status, run.output, run.spec_version) == ("completed", "done", SPEC_8)
            steps = {s.step_id: s.status for s in await world.steps.list(run_id)}
            assert steps == {"s1": "completed", "s2": "completed"}

    async def test_a_higher_attempt_restarts_a_running_step_and_owners_are_kept(
        self, harness: WorldHarness
    ) -> None:
        """step_started with a higher attempt on a running step is accepted (owner recovery's
        re-stamp, or a retry's bare start); owner_message_id survives the write, the listing
        and the live feed, and a bare start stores none."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            starts = [
                owned_start("s1", 1, "msg_owner"),
                owned_start("s1", 2, "msg_owner"),
                events.StepStarted(correlation_id="s1", step_name="add", attempt=3),
            ]
            results = [await out_of_band(world, run_id, start) for start in starts]
            assert [r.event.event for r in results] == starts
            listed = [e.event for e in (await world.events.list(run_id, after_slot=2)).events]
            assert listed == starts
            owners = [getattr(e, "owner_message_id", None) for e in listed]
            assert owners == ["msg_owner", "msg_owner", None]
            fed = await feed(world, run_id, after_slot=2, count=len(starts))
            assert [e.event for e in fed] == starts
            step = await world.steps.get(run_id, "s1")
            assert (step.status, step.attempt) == ("running", 3)
            with pytest.raises(errors.StaleStepStart):
                await out_of_band(world, run_id, owned_start("s1", 2, "msg_late"))

    async def test_wait_completed_out_of_band_is_taken_once(self, harness: WorldHarness) -> None:
        """A spec 8 delivery (or run.wake_up()) completes a wait out-of-band; the second
        completion, from a delivery that lost the race, is WaitAlreadyCompleted."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            await out_of_band(world, run_id, wait_created("w1"))
            done = await out_of_band(world, run_id, events.WaitCompleted(correlation_id="w1"))
            assert (done.event.in_band, done.event.slot) == (False, 4)
            before = await log_and_snapshot(world, run_id)
            with pytest.raises(errors.WaitAlreadyCompleted) as refused:
                await out_of_band(world, run_id, events.WaitCompleted(correlation_id="w1"))
            assert refused.value.completed_slot == 4
            assert await log_and_snapshot(world, run_id) == before

    async def test_a_spec_9_event_on_a_spec_8_run_is_a_contract_error(
        self, harness: WorldHarness
    ) -> None:
        """wake_requested on a spec 8 run is a WorldContractError naming the run and its
        version, nothing written; a spec 9 run takes it."""
        async with opened(harness) as world:
            run_id = await spec_run(world, SPEC_8)
            before = await log_and_snapshot(world, run_id)
            with pytest.raises(errors.WorldContractError) as refused:
                await out_of_band(world, run_id, events.WakeRequested())
            text = str(refused.value)
            assert run_id in text
            assert "spec 8" in text
            assert "a spec 8 run never receives a spec 9 event" in text
            assert refused.value.run_id == run_id
            assert await log_and_snapshot(world, run_id) == before
            spec9 = await spec_run(world, SPEC_9)
            assert (await out_of_band(world, spec9, events.WakeRequested())).allocated == 1
