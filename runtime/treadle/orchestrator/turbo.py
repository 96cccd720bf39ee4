"""Turbo's optimistic starts: a first delivery's inline bodies before their start commits.

Seed 003 "Turbo": the start message's first delivery (it carries the run's input,
``attempt`` 1, ``delivery_count`` 1, and the run's record shows a pending run with
nothing after its creation: ``turbo_start_from_record``) skips the log
load and queues ``run_started`` on the in-band writer without waiting for it. On
that delivery no other orchestrator exists yet, so ``OptimisticStarts`` also
starts an inline step's body before its ``step_started`` commits: at a suspension
whose every new operation is a step that runs inline here (no wait, no hook, no
disposal, no step whose input failed to serialize), each body of a step that
allows retries starts at once, while its start batch is still queued behind
``run_started``. A ``max_retries=0`` step never does: it waits for its start to
commit, as on every other delivery. The first suspension with a hook or a wait
(new, or open in the log) ends optimistic starts for the rest of the delivery, as
does a divergence recovery (a cold reload), since another writer may then exist.

An early body's outcome is written only once its start committed (``gate``):
``confirm`` marks the starts the batch committed, ``close_batch`` refuses the rest
(a refused item, or a batch that failed). ``run_started`` is written ``required``:
any failure of it stops the writer, so nothing queued behind it (the start batch,
an outcome, the run's end) reaches the World. The delivery then ends as an awaited
``run_started`` failing the same way would (``deciding``): a fence refusal is
redelivered in a second, a run that already ended (cancelled before its first
delivery) is acknowledged with nothing written, anything else is retried. Bodies
that started settle first; their outcomes are discarded. Such a body ran without a
committed start, so a redelivery runs it again: the one documented cost of
optimistic starts (docs/turbo.md), counted by the simulation as a residual risk.

A step body's own out-of-band writes (``set_attributes()``: ``orchestrator.attributes``)
wait on the run-ready barrier the seed describes (``run_ready``): ``deciding`` sets it
for the delivery, and every body the delivery starts inherits it; a failed
``run_started`` fails those writes, so nothing of a body lands before ``run_started``.
An early body's stream chunks (``get_writable``) wait on its start gate, which
comes True only once its start committed behind ``run_started``, and fail instead
of writing when it comes False (``orchestrator.streamflush``, docs/streams.md). Any
other out-of-band write added later must wait the same way (``run_ready``).

The background step's opt-in counterpart, ``WORKFLOW_OPTIMISTIC_BACKGROUND_START``,
is decided here too (``optimistic_background_start``, ``discard_early_body``) and
run by ``orchestrator.steps``.

Used by ``orchestrator.delivery`` (and ``orchestrator.inline`` for the gate) and
``orchestrator.steps``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from treadle import settings as settings_module
from treadle.orchestrator import attributes as attribute_writes
from treadle.orchestrator.logstate import LogState
from treadle.replay import engine, operations
from treadle.world import constants, contract, events, messages

log = logging.getLogger("treadle.orchestrator.turbo")

T = TypeVar("T")


def may_run_before_its_start(max_retries: int) -> bool:
    """A body may start before its start commits only if a second run of it is allowed:
    a ``max_retries=0`` step always waits for its committed start (seed 003
    ``mayRunBeforeItsStart``)."""
    return max_retries > 0


def optimistic_background_start(
    settings: settings_module.Settings,
    message: messages.StepMessage,
    meta: messages.DeliveryMeta,
    attempt: int,
    max_retries: int,
) -> bool:
    """``WORKFLOW_OPTIMISTIC_BACKGROUND_START`` (used by ``steps``): a spec 9 step that
    allows retries, on the plain first delivery of its message (attempt 1 by the message
    and by the log), starts its body while its ``step_started`` is in flight. An explicit
    ``WORKFLOW_OPTIMISTIC_INLINE_START=0`` (its default is on, so False is an explicit 0)
    wins (seed 003 ``forceOptimisticStart``). The outcome waits for the start."""
    return (
        settings.WORKFLOW_OPTIMISTIC_BACKGROUND_START
        and settings.WORKFLOW_OPTIMISTIC_INLINE_START
        and message.spec_version >= constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
        and may_run_before_its_start(max_retries)
        and attempt == 1
        and message.step_attempt == 1
        and meta.delivery_count == 1
    )


async def discard_early_body(
    body: asyncio.Task[Any] | None, message: messages.StepMessage, attempt: int
) -> None:
    """A background body started before its start, which was refused or failed: it
    settles (never cut off mid side effect) and its outcome is discarded (seed 003
    "Background body before a refused start"). Used by ``steps``."""
    if body is None:
        return
    await asyncio.wait([body])
    if not body.cancelled():
        body.exception()  # retrieved: discarded with the outcome
    log.info(
        "run %s: step %s attempt %d ran before its start, which did not commit; its "
        "outcome is discarded",
        message.run_id,
        message.step_name,
        attempt,
    )


class OptimisticStarts:
    """One delivery's optimistic inline starts (off until ``engage``)."""

    def __init__(self, settings: settings_module.Settings, run_id: str) -> None:
        self.run_id = run_id
        self._enabled = settings.WORKFLOW_OPTIMISTIC_INLINE_START
        self.active = False
        self.ended: str | None = None  # why optimistic starts ended, once they did
        self._run_started: asyncio.Future[events.LoggedEvent] | None = None
        # Step id -> whether its start committed (resolved before ``creations_written``).
        self._gates: dict[str, asyncio.Future[bool]] = {}
        self.early: list[str] = []  # every step id started early, in order (tests, logs)

    def engage(self, run_started: asyncio.Future[events.LoggedEvent]) -> None:
        """The delivery went turbo; ``run_started`` is in flight, written ``required``."""
        self._run_started = run_started
        self.active = self._enabled
        if not self._enabled:
            self.ended = "WORKFLOW_OPTIMISTIC_INLINE_START=0"

    def end(self, why: str) -> None:
        """No body starts before its start for the rest of the delivery."""
        if self.active:
            log.debug("run %s: optimistic inline starts end: %s", self.run_id, why)
            self.active = False
            self.ended = why

    # -- deciding a boundary ----------------------------------------------------------

    def boundary(self, suspended: engine.Suspended, slots: int, state: LogState) -> bool:
        """Whether this suspension's inline bodies start before their starts commit.

        A suspension with a hook or a wait (new, to dispose, or open) ends optimistic
        starts for the delivery; one with a background step (no free inline slot) or a
        step whose input failed to serialize commits its creations first, and later
        suspensions may still start early."""
        if not self.active:
            return False
        if self._run_started is not None and self._run_started.done():
            failed = self._run_started.cancelled() or self._run_started.exception() is not None
            if failed:
                self.end("run_started failed")
                return False
        new = suspended.new
        if (
            suspended.dispose
            or any(not isinstance(op, operations.StepCall) for op in new)
            or state.open_hooks
            or state.open_waits()
        ):
            self.end("a suspension with a hook or a wait")
            return False
        calls = [op for op in new if isinstance(op, operations.StepCall)]
        return bool(calls) and len(calls) <= slots and all(call.may_run_inline for call in calls)

    def split(
        self, starts: dict[str, operations.StepCall]
    ) -> tuple[list[operations.StepCall], dict[str, operations.StepCall]]:
        """Of a boundary's inline starts: those that start now, and those that wait for
        their start to commit (``max_retries=0``)."""
        early = [c for c in starts.values() if may_run_before_its_start(c.max_retries)]
        awaited = {
            cid: c for cid, c in starts.items() if not may_run_before_its_start(c.max_retries)
        }
        return early, awaited

    def gate(self, step_id: str) -> asyncio.Future[bool]:
        """The future an early body's outcome waits on: True once its start committed."""
        gate = asyncio.get_running_loop().create_future()
        self._gates[step_id] = gate
        self.early.append(step_id)
        return gate

    # -- the start batch's answer -------------------------------------------------------

    def confirm(self, committed: Sequence[events.LoggedEvent]) -> None:
        """Starts the batch committed: their early bodies' outcomes may be written."""
        for logged in committed:
            event = logged.event
            if isinstance(event, events.StepStarted) and event.correlation_id is not None:
                gate = self._gates.pop(event.correlation_id, None)
                if gate is not None and not gate.done():
                    gate.set_result(True)

    def close_batch(self) -> None:
        """The boundary's batches are written (or failed): a start not confirmed was
        refused, and its early body's outcome is discarded."""
        for step_id, gate in self._gates.items():
            if not gate.done():
                log.info(
                    "run %s: step %s's body started before its start, which did not "
                    "commit; its outcome is discarded",
                    self.run_id,
                    step_id,
                )
                gate.set_result(False)
        self._gates.clear()

    # -- the delivery's end ----------------------------------------------------------------

    async def run_ready(self) -> None:
        """Wait for turbo's ``run_started`` (raising its failure): the barrier an early
        body's own out-of-band write would wait on."""
        if self._run_started is not None:
            await self._run_started

    async def deciding(self, work: Awaitable[T]) -> T:
        """``work``, with a failure surfaced by any write behind a failed turbo
        ``run_started`` replaced by ``run_started``'s own error, which decides the
        delivery (seed 003 "Failed turbo run_started"). Bodies started meanwhile see
        ``run_ready`` as their out-of-band writes' barrier (``attributes.RUN_READY``)."""
        barrier = attribute_writes.RUN_READY.set(self.run_ready)
        try:
            return await work
        except Exception as exc:
            started = self._run_started
            if started is None:
                raise
            await asyncio.wait([started])
            if started.cancelled():
                raise
            cause = started.exception()
            if cause is None or cause is exc:
                raise
            log.info(
                "run %s: turbo's run_started failed (%s); it decides the delivery",
                self.run_id,
                cause,
            )
            raise cause from exc
        finally:
            attribute_writes.RUN_READY.reset(barrier)


async def turbo_start_from_record(
    world: contract.World, run_id: str, start: messages.RunInput, message_id: str
) -> messages.RunInput | None:
    """Turbo's log of one ``run_created``, from the run's record, never from the message
    (security review H2: a forged start names no run, or another input): the record
    (one row, not the log) must show a pending run with nothing after its creation, or
    the delivery loads the log. A start whose ``run_input`` differs from the record is
    logged and served from the record."""
    record = await world.runs.get(run_id)
    if record.status != "pending" or record.snapshot != events.Snapshot(
        seq=1, seq_in_band=constants.IN_BAND_SEQ_AT_RUN_CREATION
    ):
        return None
    logged = messages.RunInput(
        workflow_name=record.workflow_name,
        input=record.input,
        spec_version=record.spec_version,
        deployment_id=record.deployment_id,
        created_at=record.created_at,
        attributes=dict(record.attributes),
    )
    sent = (start.workflow_name, start.input, start.spec_version)
    if sent != (logged.workflow_name, logged.input, logged.spec_version) or (
        start.deployment_id not in (None, record.deployment_id)
    ):
        log.warning(
            "run %s: start message %s carries a run_input other than the run's record "
            "(forged or stale); the record's is used",
            run_id,
            message_id,
        )
    return logged
