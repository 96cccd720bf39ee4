"""The World wrapper: spans, metrics and trace context at the World's one doorway.

``instrument(world)`` replaces the World's ``queue``, ``events`` and ``runs`` members,
in place, with thin proxies (``TracedQueue``, ``TracedEvents``, ``TracedRuns``) that
forward every call and add: a span per send and per write (``world.queue.send``,
``world.events.create`` ...), the run's ``traceparent`` stamped on every message sent
(``tracing.stamp``), and, around every handler the queue calls, the delivery's span,
its metrics (deliveries by kind and result, redeliveries, handoffs, coalesced re-runs,
queue lag) and the run id its log lines name.

Why here and not in the orchestrator: every send site (``session.send``, the timers,
``step_send``, ``Runtime.wake_message``'s callers, the client, hook resumes, moves,
re-pins) and every write already goes through ``world.queue`` / ``world.events``, so one
wrapper covers them all, today's and spec 8's, without an edit at any of them. In place
rather than a wrapping World object, so the World keeps its identity and class (the app
tells an embedded World by its class, the CLI reaches ``world.local_queue`` and the
like). Called once per World by ``Workflows.world()``; a no-op unless tracing, metrics
or JSON logs are on (``telemetry.active()``), so a plain run pays nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from treadle import clock, metrics
from treadle.telemetry import names, tracing
from treadle.world import contract, events, messages, records


def _forward(proxy: object, name: str) -> Any:
    """What the wrapped member has under ``name`` (its other methods and attributes)."""
    inner = proxy.__dict__.get("inner")
    if inner is None:  # not set yet (a copy being built): no recursion
        raise AttributeError(name)
    return getattr(inner, name)


def _result(result: messages.HandlerResult) -> str:
    if isinstance(result, messages.Redeliver):
        return "redeliver"
    if isinstance(result, messages.Handoff):
        return "handoff"
    return "ack"


def traced_handler(handler: contract.Handler) -> contract.Handler:
    """``handler`` inside its delivery's span and metrics."""

    async def handle(
        message: messages.OrchestratorMessage | messages.StepMessage,
        meta: messages.DeliveryMeta,
    ) -> messages.HandlerResult:
        began = clock.monotonic()
        due = meta.due_at_ms
        lag = (clock.now_ms() - due) / 1000 if due is not None else None
        outcome = "error"
        with tracing.delivery(message, meta) as current:
            try:
                result = await handler(message, meta)
                outcome = _result(result)
            except asyncio.CancelledError:
                outcome = "cancelled"  # shutdown cut it off: the queue delivers it again
                raise
            else:
                if current.span is not None and isinstance(result, messages.Redeliver):
                    current.span.set_attribute(names.REDELIVER_SECONDS, result.seconds)
                return result
            finally:
                if current.span is not None:
                    current.span.set_attribute(names.DELIVERY_RESULT, outcome)
                metrics.delivery(
                    message.kind,
                    outcome,
                    clock.monotonic() - began,
                    attempt=meta.attempt,
                    rerun=meta.rerun,
                    lag=lag if meta.rerun == 0 else None,
                )

    return handle


def _send_attributes(sends: Sequence[messages.Send]) -> dict[str, tracing.AttributeValue | None]:
    first = sends[0].message if sends else None
    return {
        names.RUN_ID: first.run_id if first is not None else None,
        names.MESSAGE_KIND: ",".join(sorted({s.message.kind for s in sends})) or None,
        names.SEND_COUNT: len(sends),
        names.SEND_KEY: sends[0].key if len(sends) == 1 else None,
        names.SEND_DELAY_SECONDS: max((s.delay_seconds for s in sends), default=0.0),
    }


class TracedQueue:
    """A World's queue, with a span per send and every message stamped with its trace."""

    def __init__(self, inner: contract.Queue) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return _forward(self, name)

    async def send(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        *,
        key: str | None = None,
        delay_seconds: float = 0.0,
    ) -> messages.SendResult:
        stamped = tracing.stamp(message)
        attrs = _send_attributes([messages.Send(stamped, key, delay_seconds)])
        with tracing.span(names.QUEUE_SEND, attrs):
            result = await self.inner.send(stamped, key=key, delay_seconds=delay_seconds)
        metrics.sent([stamped.kind])
        return result

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        stamped = [messages.Send(tracing.stamp(s.message), s.key, s.delay_seconds) for s in sends]
        with tracing.span(names.QUEUE_SEND, _send_attributes(stamped)):
            results = await self.inner.send_batch(stamped)
        metrics.sent(s.message.kind for s in stamped)
        return results

    async def consume(
        self, handlers: Mapping[messages.MessageKind, contract.Handler], *, concurrency: int = 32
    ) -> contract.Consumer:
        traced = {kind: traced_handler(handler) for kind, handler in handlers.items()}
        return await self.inner.consume(traced, concurrency=concurrency)

    async def backlog(self, kind: messages.MessageKind, deployment_id: str) -> int:
        return await self.inner.backlog(kind, deployment_id)


class TracedDeadLetterQueue(TracedQueue):
    """A traced queue that keeps dead letters (``contract.DeadLetters``), so checks of
    the protocol (``treadle dead-letters``) still find it."""

    async def dead_letters(self, *, limit: int = 100) -> list[records.DeadLetter]:
        queue: Any = self.inner
        letters: list[records.DeadLetter] = await queue.dead_letters(limit=limit)
        return letters

    async def requeue_dead_letter(self, message_id: str) -> None:
        queue: Any = self.inner
        await queue.requeue_dead_letter(message_id)

    async def drop_dead_letter(self, message_id: str) -> None:
        queue: Any = self.inner
        await queue.drop_dead_letter(message_id)


class TracedEvents:
    """A World's event log, with a span per write and refusals counted."""

    def __init__(self, inner: contract.Events) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return _forward(self, name)

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
        attrs: dict[str, tracing.AttributeValue | None] = {
            names.RUN_ID: run_id,
            names.EVENT_TYPE: event.type,
            names.IN_BAND: in_band,
        }
        with tracing.span(names.EVENTS_CREATE, attrs, on_refusal=metrics.refusal):
            result = await self.inner.create(
                run_id,
                event,
                in_band=in_band,
                expected_seq_in_band=expected_seq_in_band,
                event_count=event_count,
                occurred_at=occurred_at,
                idempotency_key=idempotency_key,
            )
        metrics.write([event.type], in_band)
        return result

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
        types = [e.type for e in batch]
        attrs: dict[str, tracing.AttributeValue | None] = {
            names.RUN_ID: run_id,
            names.EVENT_TYPE: ",".join(sorted(set(types))),
            names.IN_BAND: in_band,
            names.SEND_COUNT: len(batch),
        }
        with tracing.span(names.EVENTS_CREATE_BATCH, attrs, on_refusal=metrics.refusal):
            result = await self.inner.create_batch(
                run_id,
                batch,
                in_band=in_band,
                expected_seq_in_band=expected_seq_in_band,
                event_count=event_count,
                occurred_at=occurred_at,
            )
        metrics.write(types, in_band)
        return result

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        return await self.inner.list(run_id, after_slot=after_slot, limit=limit)

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> contract.Subscription:
        return self.inner.subscribe(run_id, after_slot, on_event, on_error)


class TracedRuns:
    """A World's runs, with a span per ``create`` (the run's first write)."""

    def __init__(self, inner: contract.Runs) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return _forward(self, name)

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
        attrs = {
            names.RUN_ID: run_id,
            names.WORKFLOW_NAME: workflow_name,
            names.SPEC_VERSION: spec_version,
            names.DEPLOYMENT_ID: deployment_id,
        }
        with tracing.span(names.RUNS_CREATE, attrs, on_refusal=metrics.refusal):
            return await self.inner.create(
                workflow_name=workflow_name,
                input=input,
                deployment_id=deployment_id,
                spec_version=spec_version,
                run_id=run_id,
                attributes=attributes,
                parent_run_id=parent_run_id,
                parent_correlation_id=parent_correlation_id,
            )

    async def get(self, run_id: str) -> records.RunRecord:
        return await self.inner.get(run_id)

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
        return await self.inner.list(
            status=status,
            workflow_name=workflow_name,
            deployment_id=deployment_id,
            limit=limit,
            cursor=cursor,
            attributes=attributes,
        )

    async def count(
        self,
        *,
        statuses: Sequence[records.RunStatus] | None = None,
        deployment_id: str | None = None,
        limit: int | None = None,
    ) -> int:
        return await self.inner.count(statuses=statuses, deployment_id=deployment_id, limit=limit)

    async def repin(
        self,
        run_id: str,
        *,
        from_deployment: str,
        to_deployment: str,
        reason: str | None = None,
    ) -> records.RunRecord:
        return await self.inner.repin(
            run_id, from_deployment=from_deployment, to_deployment=to_deployment, reason=reason
        )


def instrument(world: contract.World) -> contract.World:
    """Wrap ``world``'s queue, events and runs in place (once); returns ``world``."""
    if isinstance(world.queue, TracedQueue):
        return world
    inner = world.queue
    world.queue = (
        TracedDeadLetterQueue(inner)
        if isinstance(inner, contract.DeadLetters)
        else TracedQueue(inner)
    )
    world.events = TracedEvents(world.events)
    world.runs = TracedRuns(world.runs)
    return world
