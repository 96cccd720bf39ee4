"""The in-memory World's storage half, as one process sees it: runs, events, steps,
hooks, deployments.

Each facade belongs to one ``MemoryWorld`` and goes through that World's fault
points (``points.Points``): it awaits the interceptor, then makes the call on the
shared ``log.Store`` (synchronous, so atomic on the loop), publishes what it
committed to the live feed, and raises afterwards on ``"fail_after"``. Reads
return private copies. Built by ``world.MemoryWorld``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from pydantic import JsonValue

from treadle import clock, errors
from treadle.testing.memory import points as fault_points
from treadle.testing.memory.feed import Subscription
from treadle.testing.memory.log import WriteParams
from treadle.world import attributes as run_attributes
from treadle.world import contract, events, ids, records, storagerules

if TYPE_CHECKING:
    from treadle.testing.memory.backend import MemoryBackend

T = TypeVar("T")
_ENDED = frozenset({"completed", "failed", "cancelled"})


class _Facade:
    def __init__(self, backend: MemoryBackend, points: fault_points.Points) -> None:
        self._backend = backend
        self._store = backend.store
        self._points = points

    async def _enter(self, point: str, run_id: str | None) -> bool:
        """Await the interceptor; True when the call must raise once it is made."""
        return await self._points.before(point, run_id) == "fail_after"

    @staticmethod
    def _leave(fail_after: bool, point: str, run_id: str | None, result: T) -> T:
        if fail_after:
            raise fault_points.failed_after(point, run_id)
        return result


def _cursor(run: records.RunRecord) -> tuple[datetime, str]:
    return run.created_at, run.run_id


class MemoryRuns(_Facade):
    async def create(
        self,
        *,
        workflow_name: str,
        input: JsonValue,
        deployment_id: str,
        spec_version: int,
        run_id: str | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
        parent_run_id: str | None = None,
        parent_correlation_id: str | None = None,
    ) -> records.RunRecord:
        storagerules.check_run_id(run_id)
        rid = run_id or ids.new_run_id()
        fail = await self._enter("runs.create", rid)
        deployment = self._backend.deployments.get(deployment_id)
        if deployment is not None and deployment.retired and rid not in self._store.runs:
            raise errors.DeploymentRetired(deployment_id, rid)
        created, state = self._store.create_run(
            run_id=rid, workflow_name=workflow_name, input=input, deployment_id=deployment_id,
            spec_version=spec_version, attributes=dict(attributes or {}),
            parent=(parent_run_id, parent_correlation_id),
        )  # fmt: skip
        if created:
            self._backend.feeds.publish(rid)
        return self._leave(fail, "runs.create", rid, copy.deepcopy(state.record))

    async def get(self, run_id: str) -> records.RunRecord:
        fail = await self._enter("runs.get", run_id)
        record = copy.deepcopy(self._store.run(run_id).record)
        return self._leave(fail, "runs.get", run_id, record)

    async def repin(
        self,
        run_id: str,
        *,
        from_deployment: str,
        to_deployment: str,
        reason: str | None = None,
    ) -> records.RunRecord:
        fail = await self._enter("runs.repin", run_id)
        self._store.repin(
            run_id, from_deployment=from_deployment, to_deployment=to_deployment, reason=reason,
            target=self._backend.deployments.get(to_deployment),
        )  # fmt: skip
        self._backend.feeds.publish(run_id)
        record = copy.deepcopy(self._store.run(run_id).record)
        return self._leave(fail, "runs.repin", run_id, record)

    async def list(
        self,
        *,
        status: records.RunStatus | None = None,
        workflow_name: str | None = None,
        deployment_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
    ) -> records.RunPage:
        if limit < 1:
            raise errors.WorldContractError(f"runs.list needs limit >= 1, got {limit}")
        wanted = run_attributes.check_filter(attributes)
        after: tuple[datetime, str] | None = None
        if cursor is not None:
            created_s, _, last_id = cursor.partition("|")
            try:
                after = (datetime.fromisoformat(created_s), last_id)
            except ValueError:
                raise errors.WorldContractError(
                    f"runs.list cursor {cursor!r} is not valid"
                ) from None
            if not last_id:
                raise errors.WorldContractError(f"runs.list cursor {cursor!r} is not valid")
        fail = await self._enter("runs.list", None)
        matching = [
            s.record
            for s in self._store.runs.values()
            if (status is None or s.record.status == status)
            and (workflow_name is None or s.record.workflow_name == workflow_name)
            and (deployment_id is None or s.record.deployment_id == deployment_id)
            and (after is None or _cursor(s.record) < after)
            and run_attributes.matches(s.record.attributes, wanted)
        ]
        matching.sort(key=_cursor, reverse=True)
        page = tuple(copy.deepcopy(r) for r in matching[:limit])
        next_cursor = None
        if len(matching) > limit:
            last = page[-1]
            next_cursor = f"{last.created_at.isoformat()}|{last.run_id}"
        return self._leave(fail, "runs.list", None, records.RunPage(page, next_cursor))

    async def count(
        self,
        *,
        statuses: Sequence[records.RunStatus] | None = None,
        deployment_id: str | None = None,
        limit: int | None = None,
    ) -> int:
        wanted = storagerules.check_count(statuses, limit)
        fail = await self._enter("runs.count", None)
        total = 0
        for state in self._store.runs.values():
            if limit is not None and total >= limit:
                break
            record = state.record
            if (wanted is None or record.status in wanted) and (
                deployment_id is None or record.deployment_id == deployment_id
            ):
                total += 1
        return self._leave(fail, "runs.count", None, total)


class MemoryEvents(_Facade):
    def __init__(self, backend: MemoryBackend, points: fault_points.Points) -> None:
        super().__init__(backend, points)
        self.subscriptions: list[Subscription] = []

    async def create(
        self,
        run_id: str,
        event: events.Event,
        *,
        in_band: bool,
        expected_seq_in_band: int | None = None,
        event_count: int | None = None,
        occurred_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> records.EventResult:
        params = WriteParams(in_band, expected_seq_in_band, event_count, occurred_at)
        fail = await self._enter("events.create", run_id)
        committed, allocated, report, has_more = self._store.append(
            run_id, event, params, idempotency_key
        )
        if allocated:
            self._backend.feeds.publish(run_id)
        while self._store.foreign:  # a force-claim wrote into the holder's log too
            self._backend.feeds.publish(self._store.foreign.pop())
        result = records.EventResult(committed[0], allocated, tuple(report), has_more)
        return self._leave(fail, "events.create", run_id, result)

    async def create_batch(
        self,
        run_id: str,
        batch: Sequence[events.Event],
        *,
        in_band: bool,
        expected_seq_in_band: int | None = None,
        event_count: int | None = None,
        occurred_at: datetime | None = None,
    ) -> records.BatchResult:
        params = WriteParams(in_band, expected_seq_in_band, event_count, occurred_at)
        fail = await self._enter("events.create_batch", run_id)
        items, allocated, report, has_more = self._store.append_batch(run_id, list(batch), params)
        if allocated:
            self._backend.feeds.publish(run_id)
        result = records.BatchResult(
            items=tuple(
                records.BatchItemResult(error=item)
                if isinstance(item, errors.WorldError)
                else records.BatchItemResult(event=item)
                for item in items
            ),
            allocated=allocated,
            report=tuple(report),
            has_more=has_more,
        )
        return self._leave(fail, "events.create_batch", run_id, result)

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        if limit < 1 or after_slot < 0:
            raise errors.WorldContractError(
                f"events.list needs limit >= 1 and after_slot >= 0 "
                f"(got limit {limit}, after_slot {after_slot})",
                run_id=run_id,
            )
        fail = await self._enter("events.list", run_id)
        state = self._store.run(run_id)
        tail = state.log[after_slot : after_slot + limit + 1]
        page = tuple(s.read() for s in tail[:limit])
        result = records.EventPage(
            events=page,
            snapshot=state.record.snapshot,
            has_more=len(tail) > limit,
            cursor=page[-1].slot if page else after_slot,
        )
        return self._leave(fail, "events.list", run_id, result)

    async def list_entity(
        self, run_id: str, correlation_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        storagerules.check_list_args(run_id, after_slot, limit, "events.list_entity")
        fail = await self._enter("events.list_entity", run_id)
        state = self._store.run(run_id)
        after = [s for s in state.by_entity.get(correlation_id, ()) if s.logged.slot > after_slot]
        page = tuple(s.read() for s in after[:limit])
        result = records.EventPage(
            events=page,
            snapshot=state.record.snapshot,
            has_more=len(after) > limit,
            cursor=page[-1].slot if page else after_slot,
        )
        return self._leave(fail, "events.list_entity", run_id, result)

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> Subscription:
        sub = self._backend.feeds.subscribe(run_id, after_slot, on_event, on_error)
        self.subscriptions = [s for s in self.subscriptions if not s.closed] + [sub]
        return sub


class MemorySteps(_Facade):
    async def list(self, run_id: str) -> list[records.StepRecord]:
        fail = await self._enter("steps.list", run_id)
        steps = sorted(
            self._store.run(run_id).steps.values(), key=lambda s: (s.created_at, s.step_id)
        )
        return self._leave(fail, "steps.list", run_id, copy.deepcopy(steps))

    async def get(self, run_id: str, step_id: str) -> records.StepRecord:
        fail = await self._enter("steps.get", run_id)
        state = self._store.runs.get(run_id)
        step = None if state is None else state.steps.get(step_id)
        if step is None:
            raise errors.StepNotFound(run_id, step_id=step_id)
        return self._leave(fail, "steps.get", run_id, copy.deepcopy(step))


class MemoryHooks(_Facade):
    async def get_by_token(self, token: str) -> records.HookRecord:
        fail = await self._enter("hooks.get_by_token", None)
        hook = self._store.hooks.get(token)
        if hook is not None and storagerules.holder_expired(
            run_ended=self._store.runs[hook.run_id].record.status in _ENDED,
            retained_until=hook.retained_until,
            now=clock.utcnow(),
        ):
            hook = None
        if hook is None:
            raise errors.HookNotFound(token)
        return self._leave(fail, "hooks.get_by_token", hook.run_id, copy.deepcopy(hook))


class MemoryDeployments(_Facade):
    async def register(
        self, deployment_id: str, *, catalogue: JsonValue = None
    ) -> records.DeploymentRecord:
        if not deployment_id:
            raise errors.WorldContractError("a deployment id must not be empty")
        fail = await self._enter("deployments.register", None)
        known = self._backend.deployments
        held = known.get(deployment_id)
        if held is None:
            held = records.DeploymentRecord(deployment_id=deployment_id, created_at=clock.utcnow())
        if catalogue is not None:
            held = records.DeploymentRecord(
                deployment_id, held.created_at, held.retired, copy.deepcopy(catalogue)
            )
        known[deployment_id] = held  # a dict keeps the first registration's order
        return self._leave(fail, "deployments.register", None, self._shown(held))

    def _shown(self, held: records.DeploymentRecord) -> records.DeploymentRecord:
        promoted = held.deployment_id in self._backend.promoted
        return dataclasses.replace(copy.deepcopy(held), promoted=promoted)

    async def get(self, deployment_id: str) -> records.DeploymentRecord | None:
        fail = await self._enter("deployments.get", None)
        held = self._backend.deployments.get(deployment_id)
        shown = None if held is None else self._shown(held)
        return self._leave(fail, "deployments.get", None, shown)

    async def latest(self) -> str | None:
        fail = await self._enter("deployments.latest", None)
        live = [d.deployment_id for d in self._backend.deployments.values() if not d.retired]
        promoted = sorted(
            (self._backend.promoted[d], d) for d in live if d in self._backend.promoted
        )
        latest = promoted[-1][1] if promoted else live[-1] if live else None
        return self._leave(fail, "deployments.latest", None, latest)

    async def list(self, *, limit: int = 1000) -> list[records.DeploymentRecord]:
        fail = await self._enter("deployments.list", None)
        newest_first = list(reversed(self._backend.deployments.values()))[:limit]
        return self._leave(fail, "deployments.list", None, [self._shown(d) for d in newest_first])

    async def retire(self, deployment_id: str) -> None:
        fail = await self._enter("deployments.retire", None)
        held = self._backend.deployments.get(deployment_id)
        if held is not None:
            self._backend.deployments[deployment_id] = records.DeploymentRecord(
                deployment_id, held.created_at, True, held.catalogue
            )
        self._leave(fail, "deployments.retire", None, None)

    async def promote(self, deployment_id: str) -> None:
        if not deployment_id:
            raise errors.WorldContractError("a deployment id must not be empty")
        fail = await self._enter("deployments.promote", None)
        known, order = self._backend.deployments, self._backend.promoted
        held = known.get(deployment_id)
        if held is None:
            known[deployment_id] = records.DeploymentRecord(
                deployment_id=deployment_id, created_at=clock.utcnow()
            )
        elif held.retired:
            raise errors.DeploymentRetired(deployment_id)
        top = max(order.values(), default=0)
        if order.get(deployment_id) != top or top == 0:
            order[deployment_id] = top + 1
        self._leave(fail, "deployments.promote", None, None)
