"""``WorldError`` and its children: the World refused or failed an operation.

Refusals of a write (the fence's ``InBandSuperseded``, a terminal run, one outcome
per step, one creation per entity...), lookups that found nothing, queue message
refusals, and ``StorageUnavailable`` with its causes. Raised by every World and by
the rules they share (``treadle.world.storagerules``, ``queuerules``). The
World-side errors of features live with their feature (``errors.features``:
``ScheduleNotFound``; ``errors.hooks``: ``HookRunEnded``; ``errors.serve``:
``WebhookAlreadyReceived``).
"""

from __future__ import annotations

from typing import Literal

from treadle.errors.base import TreadleError


class WorldError(TreadleError):
    """The World refused or failed an operation."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class InBandSuperseded(WorldError):
    """An in-band write carried a stale count: another writer moved the fence.

    Nothing was allocated or written. The writer must stop for good.
    """

    def __init__(self, run_id: str, *, expected_seq_in_band: int, seq_in_band: int) -> None:
        super().__init__(
            f"run {run_id}: in-band write superseded: it expected seq_in_band "
            f"{expected_seq_in_band} but the run is at {seq_in_band}; nothing was written",
            run_id=run_id,
        )
        self.expected_seq_in_band = expected_seq_in_band
        self.seq_in_band = seq_in_band


class WorldContractError(WorldError):
    """The caller broke the World contract (for example an in-band write without a count)."""

    def __init__(self, message: str, *, run_id: str | None = None, slot: int | None = None) -> None:
        super().__init__(message, run_id=run_id)
        self.slot = slot


class RunNotFound(WorldError):
    """No run with this id exists in the World."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} not found", run_id=run_id)


class DeploymentRetired(WorldError):
    """``runs.create`` named a retired deployment: nothing was recorded.

    A start racing a rollout (review R1) reads the new latest and tries again.
    """

    def __init__(self, deployment_id: str, run_id: str | None = None) -> None:
        what = f"run {run_id}" if run_id else "a run"
        super().__init__(
            f"{what} not recorded: deployment {deployment_id} is retired", run_id=run_id
        )
        self.deployment_id = deployment_id


class RunExpired(WorldError):
    """The run is terminal, so this event may no longer be written."""

    def __init__(self, run_id: str, *, status: str, event_type: str) -> None:
        super().__init__(
            f"run {run_id} is {status}: a {event_type} event is refused on a terminal run",
            run_id=run_id,
        )
        self.status = status
        self.event_type = event_type


RepinRefusal = Literal["not_on_from", "ended", "unknown_target", "retired_target"]


class RunNotRepinned(WorldError):
    """``runs.repin`` refused, nothing written: the run is no longer on ``from_deployment``
    (``not_on_from``: moved already, or never there), it ``ended``, or the target is
    unknown (``unknown_target``) or retired (``retired_target``)."""

    def __init__(self, run_id: str, *, reason: RepinRefusal, detail: str) -> None:
        super().__init__(f"run {run_id} is not repinned: {detail}", run_id=run_id)
        self.reason: RepinRefusal = reason
        self.detail = detail


class StepAlreadyEnded(WorldError):
    """A step_started, or a second outcome, for a step whose outcome is already in the log.

    Nothing was allocated or written: the outcome at ``outcome_slot`` stands (another
    delivery's attempt won), so the writer of ``event_type`` has nothing left to do.
    """

    def __init__(
        self, run_id: str, *, step_id: str, outcome_slot: int, event_type: str = "step_started"
    ) -> None:
        super().__init__(
            f"run {run_id}: step {step_id} already has its outcome at slot {outcome_slot}; "
            f"a {event_type} is refused",
            run_id=run_id,
        )
        self.step_id = step_id
        self.outcome_slot = outcome_slot
        self.event_type = event_type


class StaleStepStart(WorldError):
    """A ``step_started`` whose attempt is not greater than the step's latest started attempt.

    Nothing was allocated or written: a later delivery already started attempt
    ``latest_attempt`` (this writer's delivery stalled past its lease), so that delivery
    owns the step now and this one must run no body and write nothing more.
    """

    def __init__(self, run_id: str, *, step_id: str, attempt: int, latest_attempt: int) -> None:
        super().__init__(
            f"run {run_id}: step {step_id} already started attempt {latest_attempt}; "
            f"a step_started of attempt {attempt} is stale and refused",
            run_id=run_id,
        )
        self.step_id = step_id
        self.attempt = attempt
        self.latest_attempt = latest_attempt


class StaleStepOutcome(WorldError):
    """A step outcome (``step_completed``, ``step_failed``, ``step_retrying``) naming an
    attempt other than the step's latest started attempt (``storagerules.check_outcome_attempt``).

    Nothing was allocated or written: attempt ``latest_attempt`` started after this
    writer's attempt (its body outlived its timeout or its lease, and a redelivery ran
    the next attempt), so this outcome belongs to an abandoned attempt. The writer drops
    it and writes nothing more; the latest attempt's own outcome decides the step.
    """

    def __init__(
        self,
        run_id: str,
        *,
        step_id: str,
        attempt: int,
        latest_attempt: int,
        event_type: str = "step_completed",
    ) -> None:
        why = "started after it" if latest_attempt > attempt else "is the latest started"
        super().__init__(
            f"run {run_id}: step {step_id}'s {event_type} names attempt {attempt}, but "
            f"attempt {latest_attempt} {why}; the outcome is refused and nothing was written",
            run_id=run_id,
        )
        self.step_id = step_id
        self.attempt = attempt
        self.latest_attempt = latest_attempt
        self.event_type = event_type


class OutcomeLost(WorldError):
    """An item of an in-band batch whose answer was lost (a storage error after the batch
    committed) and that is not in the log: the World refused it, for a reason the lost
    answer held. Nothing of it was written."""

    def __init__(self, run_id: str, *, event_type: str, correlation_id: str | None) -> None:
        super().__init__(
            f"run {run_id}: {event_type} {correlation_id} is not in the log its batch "
            "committed to; the World refused it and its answer was lost",
            run_id=run_id,
        )
        self.event_type = event_type
        self.correlation_id = correlation_id


class WaitAlreadyCompleted(WorldError):
    """A second ``wait_completed`` for a wait whose completion is already in the log.

    Nothing was allocated or written; the completion at ``completed_slot`` stands.
    """

    def __init__(self, run_id: str, *, wait_id: str, completed_slot: int) -> None:
        super().__init__(
            f"run {run_id}: wait {wait_id} was completed at slot {completed_slot}; "
            "a second wait_completed is refused",
            run_id=run_id,
        )
        self.wait_id = wait_id
        self.completed_slot = completed_slot


class EntityAlreadyCreated(WorldError):
    """A creation the run's log already holds: a second ``step_created`` for a step (or
    one for a step an inline ``step_started`` created, or an inline creating start for a
    step a ``step_created`` created), a second ``wait_created``, a second ``hook_created``
    for one correlation id, or a second ``run_started`` (``correlation_id`` None).

    Nothing was allocated or written: the creation at ``slot`` stands. Spec 8 runs have
    several writers, and the loser of a race to create one entity hears this (seed 003
    "Spec 8 queues, as in earlier releases": the World's rows refuse the loser's
    duplicates); it has nothing to undo and reads the entity from the log.
    """

    def __init__(
        self, run_id: str, *, correlation_id: str | None, event_type: str, slot: int
    ) -> None:
        what = "the run's start" if correlation_id is None else correlation_id
        super().__init__(
            f"run {run_id}: {what} was already created at slot {slot}; a {event_type} "
            "is refused and nothing was written",
            run_id=run_id,
        )
        self.correlation_id = correlation_id
        self.event_type = event_type
        self.slot = slot


class StepNotFound(WorldError):
    """The run has no step with this id."""

    def __init__(self, run_id: str, *, step_id: str) -> None:
        super().__init__(f"run {run_id} has no step {step_id}", run_id=run_id)
        self.step_id = step_id


class HookNotFound(WorldError):
    """No live hook holds this token (never created, disposed, or its run ended)."""

    def __init__(
        self, token: str | None = None, *, hook_id: str | None = None, run_id: str | None = None
    ) -> None:
        what = f"token {token!r}" if token is not None else f"id {hook_id}"
        where = f" in run {run_id}" if run_id is not None and token is None else ""
        super().__init__(f"no live hook with {what}{where}", run_id=run_id)
        self.token = token
        self.hook_id = hook_id


class EarlierItemRefused(WorldError):
    """A batch item refused because an earlier item with its correlation id was refused."""

    def __init__(self, run_id: str, *, correlation_id: str, index: int) -> None:
        super().__init__(
            f"run {run_id}: batch item {index} refused: an earlier item for "
            f"{correlation_id} was refused",
            run_id=run_id,
        )
        self.correlation_id = correlation_id
        self.index = index


class MessageTooLarge(WorldError):
    """A queue message is larger than the queue accepts."""

    def __init__(self, *, size: int, limit: int, run_id: str | None = None) -> None:
        super().__init__(
            f"queue message of {size} bytes is over the {limit}-byte limit", run_id=run_id
        )
        self.size = size
        self.limit = limit


class MessageRefused(WorldError):
    """A queue message refused at the boundary: a header or field out of its range (a
    delivery offset, an attempt count, a spec version, an id of the wrong shape), or a
    message the run's log contradicts (a step the log never created, another step name or
    input). Nothing is run or written for it (security review H2)."""

    def __init__(
        self, reason: str, *, message_id: str | None = None, run_id: str | None = None
    ) -> None:
        where = f"run {run_id}: " if run_id else ""
        which = f"message {message_id}" if message_id else "a message"
        super().__init__(f"{where}{which} refused: {reason}", run_id=run_id)
        self.reason = reason
        self.message_id = message_id


class HookPayloadNotRecorded(WorldError):
    """``resume_hook``'s ``hook_received`` write failed and recorded nothing.

    The payload is not in the run's log and no wake was sent: calling
    ``resume_hook`` again is safe (``retryable`` is always True). ``__cause__``
    is the World's failure.
    """

    retryable = True

    def __init__(self, token: str, *, run_id: str, reason: str) -> None:
        super().__init__(
            f"resume_hook({token!r}): the payload for run {run_id} was not recorded ({reason}); "
            "nothing was written, so resume_hook may be called again",
            run_id=run_id,
        )
        self.token = token
        self.reason = reason


class DeadLetterNotFound(WorldError):
    """No dead letter has this message id (never dead, or requeued or dropped already)."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"no dead letter with message id {message_id!r}")
        self.message_id = message_id


class RunNotSupported(WorldError):
    """The run was created in a format (spec version) this worker does not know.

    Out-of-band writes to it (``resume_hook``, ``cancel``, ``wake_up``) are
    refused before anything is written; reads still work. A worker of the
    release that created the run can write to it (seed 003 "The rollback floor").
    """

    def __init__(self, run_id: str, *, spec_version: int, supported: frozenset[int]) -> None:
        known = ", ".join(str(v) for v in sorted(supported))
        super().__init__(
            f"run {run_id} has spec version {spec_version}, which this worker does not "
            f"support (it supports {known}); the write is refused and nothing was written "
            "(reads still work; use a worker of the release that created the run)",
            run_id=run_id,
        )
        self.spec_version = spec_version
        self.supported = supported


class FenceNotSupported(WorldError):
    """The World does not declare the in-band fence (``capabilities.in_band_fence``).

    Spec 9 runs need the fence; treadle refuses to create or drive one on such a
    World, before anything is written. Spec 8 runs need no fence: ``start`` mints 8
    on a World without it (``specversions.mint``, with a one-time warning).
    """

    def __init__(self, world: str, *, spec_version: int, run_id: str | None = None) -> None:
        what = f"drive run {run_id}" if run_id is not None else "create a run"
        super().__init__(
            f"cannot {what} of spec version {spec_version} on the World {world}: it does not "
            "declare the in-band fence (capabilities.in_band_fence) that spec 9 runs need; "
            "such a World drives spec 8 runs only (WORKFLOW_SPEC_VERSION=8 or unset), or use "
            "a World that implements the fence",
            run_id=run_id,
        )
        self.world = world
        self.spec_version = spec_version


class StorageUnavailable(WorldError):
    """The World's storage cannot be opened or used."""


class StorageLocked(StorageUnavailable):
    """Another live process holds this local World."""


class IncompatibleStorage(StorageUnavailable):
    """The storage is corrupt, belongs to something else, or has a newer schema."""


class WorldAuthFailed(StorageUnavailable):
    """A World server (NATS or PostgreSQL) refused the connection for good: a wrong or
    missing credential, a certificate it does not trust, or TLS it requires.

    Retrying cannot fix it, so it is raised at once, at start. ``server``
    (``"NATS"`` or ``"PostgreSQL"``), ``where`` (what was being connected to, by
    host, never the URL), ``what`` failed and the ``hint`` naming the setting to
    fix; no secret is ever in it.
    """

    def __init__(self, server: str, where: str, what: str, hint: str) -> None:
        super().__init__(f"{where}: {what}; {hint}")
        self.server = server
        self.where = where
        self.what = what
        self.hint = hint


class ReadTimedOut(StorageUnavailable):
    """A read of a run's log kept not answering (``WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS``).

    The delivery gives up so that the queue redelivers the run, rather than
    holding it on a read that may never return.
    """

    def __init__(self, run_id: str, *, what: str, attempts: int, waited_ms: int) -> None:
        super().__init__(
            f"run {run_id}: {what} did not answer in {attempts} attempt(s) over {waited_ms} ms "
            "(WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS); giving the delivery up for a redelivery",
            run_id=run_id,
        )
        self.what = what
        self.attempts = attempts
        self.waited_ms = waited_ms
