"""Storage conformance, second half: hook tokens, read views, the live feed, restarts.

Pins the rest of the storage contract (``treadle.world.contract``, DESIGN.md 3.1):
hook token ownership and ``hook_conflict`` (seed 003 "Hook conflicts", "Terminal
hook disposal"), the read views folded from the log (``runs``, ``steps``,
``hooks``), ``events.subscribe`` and what survives a close and reopen. Helpers
are shared with ``storage``.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import JsonValue

from treadle import errors
from treadle.world import events, ids, records
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


class StorageViewsConformance:
    """Hooks, read views, the live feed and restarts; subclass it as ``Test...``."""

    async def test_live_hook_holds_its_token(self, harness: WorldHarness) -> None:
        """hooks.get_by_token finds the live hook holding a token; HookNotFound otherwise."""
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            hook = await world.hooks.get_by_token(token)
            assert (hook.token, hook.run_id, hook.hook_id) == (token, run_id, "hook_1")
            with pytest.raises(errors.HookNotFound):
                await world.hooks.get_by_token(support.unique("token"))

    async def test_hook_created_for_a_held_token_stores_hook_conflict(
        self, harness: WorldHarness
    ) -> None:
        """A hook_created for a held token stores hook_conflict in the creator's log instead."""
        async with support.opened(harness) as world:
            holder, creator = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, holder, support.hook_created("hook_1", token))
            result = await support.in_band(world, creator, support.hook_created("hook_b", token))
            assert result.allocated == 1
            conflict = result.event.event
            assert isinstance(conflict, events.HookConflict)
            assert (conflict.token, conflict.holder_run_id) == (token, holder)
            assert conflict.correlation_id == "hook_b"
            logged = await support.full_log(world, creator)
            assert logged[result.event.slot - 1].event == conflict
            assert (await world.hooks.get_by_token(token)).run_id == holder

    async def test_disposed_hook_frees_its_token(self, harness: WorldHarness) -> None:
        """After hook_disposed the token is free and another run's hook can take it."""
        async with support.opened(harness) as world:
            first, second = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, first, support.hook_created("hook_1", token))
            await support.in_band(world, first, events.HookDisposed(correlation_id="hook_1"))
            with pytest.raises(errors.HookNotFound):
                await world.hooks.get_by_token(token)
            result = await support.in_band(world, second, support.hook_created("hook_2", token))
            assert result.event.type == "hook_created"
            hook = await world.hooks.get_by_token(token)
            assert (hook.run_id, hook.hook_id) == (second, "hook_2")

    @pytest.mark.parametrize("ending", support.ENDINGS)
    async def test_run_end_frees_its_live_hooks(self, harness: WorldHarness, ending: str) -> None:
        """A run's terminal event frees its live hooks (seed 003 "Terminal hook disposal")."""
        async with support.opened(harness) as world:
            run_id, other = await support.started_run(world), await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            await support.end_run(world, run_id, ending)
            with pytest.raises(errors.HookNotFound):
                await world.hooks.get_by_token(token)
            result = await support.in_band(world, other, support.hook_created("hook_2", token))
            assert result.event.type == "hook_created"

    async def test_hook_received_is_accepted_while_the_hook_lives(
        self, harness: WorldHarness
    ) -> None:
        """A resume's out-of-band hook_received for a live hook is appended to its run's log."""
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            hook = await world.hooks.get_by_token(token)
            received = events.HookReceived(correlation_id=hook.hook_id, payload={"x": 1})
            result = await support.out_of_band(world, hook.run_id, received)
            assert (result.allocated, result.event.in_band) == (1, False)
            assert (await support.full_log(world, run_id))[-1].event == received

    async def test_hook_received_frees_the_token_and_a_second_payload_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """Bug 6: a hook takes one payload; recording it frees the token, so the run (or
        another) may create a hook with it again, and a second hook_received for the same
        hook is HookNotFound, allocating nothing."""
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            received = events.HookReceived(correlation_id="hook_1", payload={"n": 1})
            await support.out_of_band(world, run_id, received)
            with pytest.raises(errors.HookNotFound):
                await world.hooks.get_by_token(token)
            before = await support.log_and_snapshot(world, run_id)
            again = events.HookReceived(correlation_id="hook_1", payload={"n": 2})
            with pytest.raises(errors.HookNotFound):
                await support.out_of_band(world, run_id, again)
            assert await support.log_and_snapshot(world, run_id) == before
            result = await support.in_band(world, run_id, support.hook_created("hook_2", token))
            assert result.event.type == "hook_created"
            assert (await world.hooks.get_by_token(token)).hook_id == "hook_2"

    @pytest.mark.parametrize("ending", support.ENDINGS)
    async def test_hook_received_for_an_ended_run_is_hook_not_found(
        self, harness: WorldHarness, ending: str
    ) -> None:
        """Bug 10, HE3: a resume that looked the token up before the run ended hears
        HookNotFound (the end freed the hook), not RunExpired; nothing is written."""
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            token = support.unique("token")
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            hook = await world.hooks.get_by_token(token)
            await support.end_run(world, run_id, ending)
            before = await support.log_and_snapshot(world, run_id)
            received = events.HookReceived(correlation_id=hook.hook_id, payload=1)
            with pytest.raises(errors.HookNotFound):
                await support.out_of_band(world, hook.run_id, received)
            assert await support.log_and_snapshot(world, run_id) == before

    async def test_steps_list_folds_step_events(self, harness: WorldHarness) -> None:
        """steps.list and steps.get fold status, attempt, name and inline from step events."""
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            await support.in_band(world, run_id, support.inline_start("s1"))
            await support.in_band(world, run_id, support.step_completed("s1"))
            await support.in_band(world, run_id, support.step_created("s2"))
            for event in (
                events.StepStarted(correlation_id="s2", step_name="fetch", attempt=1),
                events.StepRetrying(
                    correlation_id="s2", step_name="fetch", attempt=1, error=support.BOOM
                ),
                events.StepStarted(correlation_id="s2", step_name="fetch", attempt=2),
                support.step_failed("s2", attempt=2),
            ):
                await support.out_of_band(world, run_id, event)
            await support.in_band(world, run_id, support.step_created("s3"))
            steps = {s.step_id: s for s in await world.steps.list(run_id)}
            assert set(steps) == {"s1", "s2", "s3"}
            s1, s2, s3 = steps["s1"], steps["s2"], steps["s3"]
            assert (s1.status, s1.attempt, s1.step_name, s1.inline) == ("completed", 1, "add", True)
            assert s1.result == 3
            assert s1.completed_at is not None
            assert (s2.status, s2.attempt, s2.step_name, s2.inline) == ("failed", 2, "fetch", False)
            assert s2.error == support.BOOM
            assert (s3.status, s3.inline) == ("created", False)
            assert await world.steps.get(run_id, "s1") == s1

    async def test_runs_list_filters_by_status_workflow_and_deployment(
        self, harness: WorldHarness
    ) -> None:
        """runs.list keeps only the runs matching status, workflow_name and deployment_id."""
        async with support.opened(harness) as world:
            name, other_name = support.unique("wf"), support.unique("wf")
            done = await support.started_run(world, workflow_name=name)
            await support.end_run(world, done, "completed")
            running = await support.started_run(world, workflow_name=name)
            deployment = support.unique("dpl")
            elsewhere = await support.new_run(
                world, workflow_name=other_name, deployment_id=deployment
            )
            by_name = await world.runs.list(workflow_name=name)
            assert {r.run_id for r in by_name.runs} == {done, running}
            finished = await world.runs.list(status="completed", workflow_name=name)
            assert [r.run_id for r in finished.runs] == [done]
            record = finished.runs[0]
            assert (record.output, record.is_terminal) == ("done", True)
            assert record.completed_at is not None
            completed = await world.runs.list(status="completed")
            assert done in {r.run_id for r in completed.runs}
            assert all(r.status == "completed" for r in completed.runs)
            in_deployment = await world.runs.list(deployment_id=deployment)
            assert [r.run_id for r in in_deployment.runs] == [elsewhere.run_id]

    async def test_runs_count_counts_matching_runs_in_one_call_up_to_its_limit(
        self, harness: WorldHarness
    ) -> None:
        """runs.count(statuses, deployment_id, limit): the runs matching any of the statuses
        on that deployment, stopping at the limit (limit=1 is "any?"); bad arguments are a
        WorldContractError (review operator.md R5 (c): the operator's active-run count)."""
        async with support.opened(harness) as world:
            deployment, other = support.unique("dpl"), support.unique("dpl")
            pending = [await support.new_run(world, deployment_id=deployment) for _ in range(3)]
            running = await support.new_run(world, deployment_id=deployment)
            await support.in_band(world, running.run_id, events.RunStarted())
            ended = await support.new_run(world, deployment_id=deployment)
            await support.in_band(world, ended.run_id, events.RunStarted())
            await support.end_run(world, ended.run_id, "completed")
            await support.new_run(world, deployment_id=other)
            active: tuple[records.RunStatus, ...] = ("pending", "running")
            assert await world.runs.count(statuses=active, deployment_id=deployment) == 4
            assert await world.runs.count(statuses=["running"], deployment_id=deployment) == 1
            assert await world.runs.count(statuses=["completed"], deployment_id=deployment) == 1
            assert await world.runs.count(deployment_id=deployment) == 5
            assert await world.runs.count(statuses=active, deployment_id=deployment, limit=2) == 2
            assert await world.runs.count(statuses=active, deployment_id=deployment, limit=1) == 1
            assert await world.runs.count(statuses=active, deployment_id=other) == 1
            nobody = support.unique("dpl")
            assert await world.runs.count(statuses=active, deployment_id=nobody, limit=1) == 0
            assert await world.runs.count() >= 6
            await support.end_run(world, pending[0].run_id, "cancelled")
            assert await world.runs.count(statuses=active, deployment_id=deployment) == 3
            with pytest.raises(errors.WorldContractError):
                await world.runs.count(statuses=[], deployment_id=deployment)
            with pytest.raises(errors.WorldContractError):
                await world.runs.count(deployment_id=deployment, limit=0)
            with pytest.raises(errors.WorldContractError):
                await world.runs.count(statuses=["sleeping"])  # type: ignore[list-item]

    async def test_runs_list_pages_without_duplicates(self, harness: WorldHarness) -> None:
        """runs.list(limit=2) pages through next_cursor, each run exactly once."""
        async with support.opened(harness) as world:
            name = support.unique("wf")
            created = {(await support.new_run(world, workflow_name=name)).run_id for _ in range(5)}
            seen: list[str] = []
            cursor: str | None = None
            for _ in range(10):
                page = await world.runs.list(workflow_name=name, limit=2, cursor=cursor)
                assert len(page.runs) <= 2
                seen.extend(r.run_id for r in page.runs)
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert sorted(seen) == sorted(created)

    async def test_subscribe_pushes_committed_events_in_slot_order_until_closed(
        self, harness: WorldHarness
    ) -> None:
        """events.subscribe pushes every committed event after after_slot, in slot order."""
        async with support.opened(harness) as world:
            if not world.capabilities.live_feed:
                pytest.skip("the World declares no live feed")
            run_id = await support.started_run(world)
            loop = asyncio.get_running_loop()
            pushed: asyncio.Queue[events.LoggedEvent] = asyncio.Queue()
            failures: list[BaseException] = []

            def on_event(event: events.LoggedEvent) -> None:
                loop.call_soon_threadsafe(pushed.put_nowait, event)

            subscription = world.events.subscribe(run_id, 1, on_event, failures.append)
            try:
                await asyncio.gather(
                    support.in_band(world, run_id, support.attr("in")),
                    *(
                        support.out_of_band(world, run_id, support.attr(f"out{i}"))
                        for i in range(4)
                    ),
                )
                await support.in_band(world, run_id, support.attr("last"))
                seq = (await world.runs.get(run_id)).seq
                received = [
                    await asyncio.wait_for(pushed.get(), support.WAIT_SECONDS)
                    for _ in range(2, seq + 1)
                ]
                logged = await support.full_log(world, run_id)
                assert [support.stored(e) for e in received] == [
                    support.stored(e) for e in logged[1:]
                ]
            finally:
                subscription.close()
            await support.out_of_band(world, run_id, support.attr("after close"))
            await asyncio.sleep(support.QUIET_SECONDS)
            assert pushed.empty()
            assert failures == []

    async def test_writes_survive_a_restart(self, harness: WorldHarness) -> None:
        """Events, counters and hooks survive close and reopen; the fence holds across it."""
        token = support.unique("token")
        async with support.opened(harness) as world:
            run_id = await support.started_run(world)
            await support.in_band(world, run_id, support.hook_created("hook_1", token))
            await support.out_of_band(world, run_id, support.attr("a"))
            before = await support.log_and_snapshot(world, run_id)
            run = await world.runs.get(run_id)
        async with support.opened(harness) as world:
            assert await support.log_and_snapshot(world, run_id) == before
            assert await world.runs.get(run_id) == run
            assert (await world.hooks.get_by_token(token)).run_id == run_id
            with pytest.raises(errors.InBandSuperseded):
                await world.events.create(
                    run_id,
                    support.attr("stale"),
                    in_band=True,
                    expected_seq_in_band=2,
                    event_count=2,
                )
            result = await world.events.create(
                run_id, support.attr("b"), in_band=True, expected_seq_in_band=3, event_count=4
            )
            assert result.event.slot == 5

    async def test_deployments_are_recorded_and_the_latest_is_known(
        self, harness: WorldHarness
    ) -> None:
        """register is idempotent; the latest is the newest not retired; get says retired."""
        first, second = support.unique("blue"), support.unique("green")
        async with support.opened(harness) as world:
            made = await world.deployments.register(first)
            again = await world.deployments.register(first)
            assert again == made
            assert not made.retired
            await world.deployments.register(second)
            assert await world.deployments.latest() == second
            await world.deployments.retire(second)
            assert await world.deployments.latest() == first
            record = await world.deployments.get(second)
            assert record is not None
            assert record.retired
            assert await world.deployments.get(support.unique("never")) is None

    async def test_deployments_list_is_every_deployment_newest_registered_first(
        self, harness: WorldHarness
    ) -> None:
        """list: each deployment once, the most recently registered first, retired ones
        too (marked), up to its limit (treadle serve's deployments page)."""
        first, second, third = (support.unique(n) for n in ("one", "two", "three"))
        async with support.opened(harness) as world:
            for name in (first, second, third):
                await world.deployments.register(name)
            await world.deployments.register(first)  # a second registration moves nothing
            await world.deployments.retire(second)
            listed = [d for d in await world.deployments.list() if d.deployment_id in
                      (first, second, third)]  # fmt: skip
            assert [d.deployment_id for d in listed] == [third, second, first]
            assert [d.retired for d in listed] == [False, True, False]
            limited = await world.deployments.list(limit=1)
            assert len(limited) == 1

    async def test_a_deployment_keeps_the_catalogue_its_workers_registered(
        self, harness: WorldHarness
    ) -> None:
        """The catalogue is replaced by a registration that names one, kept by one that does not."""
        deployment = support.unique("catalogued")
        first: JsonValue = {"order": {"params": [{"name": "order_id", "kind": "KEYWORD_ONLY"}]}}
        second: JsonValue = {"order": {"params": []}, "refund": {"params": None}}
        async with support.opened(harness) as world:
            made = await world.deployments.register(deployment, catalogue=first)
            assert made.catalogue == first
            kept = await world.deployments.register(deployment)
            assert kept.catalogue == first
            assert kept.created_at == made.created_at
            await world.deployments.register(deployment, catalogue=second)
            record = await world.deployments.get(deployment)
            assert record is not None
            assert record.catalogue == second
            assert record.created_at == made.created_at

    async def test_runs_create_refuses_a_retired_deployment(self, harness: WorldHarness) -> None:
        """Review R1: a new run on a retired deployment is DeploymentRetired, nothing recorded.

        A start that read "latest" a moment before a rollout retired it must not
        record its run there (nobody would serve it); a retried create of a run
        made before the retire still returns that run.
        """
        deployment = support.unique("retiring")
        async with support.opened(harness) as world:
            await world.deployments.register(deployment)
            before = await support.new_run(world, deployment_id=deployment)
            await world.deployments.retire(deployment)
            refused_id = ids.new_run_id()
            with pytest.raises(errors.DeploymentRetired) as caught:
                await support.new_run(world, deployment_id=deployment, run_id=refused_id)
            assert caught.value.deployment_id == deployment
            with pytest.raises(errors.RunNotFound):
                await world.runs.get(refused_id)
            page = await world.runs.list(deployment_id=deployment)
            assert [r.run_id for r in page.runs] == [before.run_id]
            again = await support.new_run(world, deployment_id=deployment, run_id=before.run_id)
            assert again.run_id == before.run_id

    async def test_a_retire_racing_creates_orders_before_or_after_each(
        self, harness: WorldHarness
    ) -> None:
        """Review R1: creates racing a retire each succeed (recorded) or are refused (nothing).

        Every create that returned is in the log; once ``retire`` returned, no create
        is accepted.
        """
        deployment = support.unique("racing")
        async with support.opened(harness) as world:
            await world.deployments.register(deployment)

            async def create() -> str | None:
                try:
                    return (await support.new_run(world, deployment_id=deployment)).run_id
                except errors.DeploymentRetired:
                    return None

            results = await asyncio.gather(
                *(create() for _ in range(10)),
                world.deployments.retire(deployment),
                *(create() for _ in range(10)),
            )
            made = {r for r in results if isinstance(r, str)}
            page = await world.runs.list(deployment_id=deployment)
            assert {r.run_id for r in page.runs} == made
            with pytest.raises(errors.DeploymentRetired):
                await support.new_run(world, deployment_id=deployment)

    async def test_latest_is_the_newest_promoted_deployment(self, harness: WorldHarness) -> None:
        """Review R12: once promoted, a registration no longer moves the latest; promote does."""
        blue, green, red = (support.unique(c) for c in ("blue", "green", "red"))
        async with support.opened(harness) as world:
            try:
                await world.deployments.register(blue)
                await world.deployments.promote(blue)
                await world.deployments.promote(blue)  # idempotent
                assert await world.deployments.latest() == blue
                made = await world.deployments.register(green, catalogue={"wf": {}})
                assert not made.promoted
                assert await world.deployments.latest() == blue  # registered, not promoted
                await world.deployments.promote(green)
                assert await world.deployments.latest() == green
                promoted = await world.deployments.get(green)
                assert promoted is not None
                assert promoted.promoted
                await world.deployments.promote(blue)  # a rollback
                assert await world.deployments.latest() == blue
                await world.deployments.retire(blue)
                assert await world.deployments.latest() == green
                with pytest.raises(errors.DeploymentRetired):
                    await world.deployments.promote(blue)
                await world.deployments.promote(red)  # unknown: recorded, then promoted
                record = await world.deployments.get(red)
                assert record is not None
                assert not record.retired
                assert await world.deployments.latest() == red
            finally:  # leave no promoted deployment behind for Worlds shared across tests
                for deployment in (blue, green, red):
                    await world.deployments.retire(deployment)
            assert await world.deployments.latest() not in (blue, green, red)
