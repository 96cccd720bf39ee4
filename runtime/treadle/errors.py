"""Every error treadle raises, in one hierarchy.

Callers catch the narrowest class that fits; every class carries the facts a
log line or a user needs (run id, slot, what was expected) as attributes, and
its message names them too::

    TreadleError
    ├── SettingsError                 a bad setting value (names the setting)
    │   └── WebhookSecretMissing      serve lacks the variable a webhook's signature names
    ├── SerializationError            a value cannot cross the event log (names where)
    │   ├── ValueLimitExceeded        over a limit of ``treadle.limits`` (names the setting)
    │   │   └── WebhookBodyTooLarge   a webhook call's body over TREADLE_WEBHOOK_MAX_BODY_BYTES
    │   ├── PayloadKeyMissing         an encrypted value's key id is not held here
    │   ├── AttributeInvalid          a run attribute's key or value is refused (names the key)
    │   └── PayloadDecryptionFailed   an encrypted value does not authenticate
    ├── WorkflowError                 about workflow or step code and its runs
    │   ├── FatalError                raised by a step: fail it now, no retry
    │   │   └── StreamError           streams (docs/streams.md): misuse fails the step at once
    │   │       ├── StreamNameInvalid     a name that is not 1-128 of [A-Za-z0-9_.:-]
    │   │       ├── StreamClosedError     a write to a closed writer or a closed stream
    │   │       └── StreamWriteRefused    the World refused the chunks (stale attempt, run ended)
    │   ├── RetryableError            raised by a step: retry (after retry_after)
    │   ├── StepFailed                a step's final failure, as the workflow sees it
    │   ├── HookConflictError         another run holds the hook's token
    │   ├── HookForceClaimedError     another run force-claimed the hook's token
    │   ├── FeatureNeedsSpec9         a spec 8 run used a spec 9 feature (names it)
    │   ├── SagaCompensated           a saga's body failed; its compensations ran
    │   ├── NonDeterministicCall      workflow code did I/O or read real time
    │   ├── CorruptedEventLog         replay kept diverging from the log
    │   ├── DeploymentMismatch        the run's deployment cannot be reached
    │   ├── WorkflowNotFound          no workflow registered under that name
    │   ├── RunNotMovable             a move between revisions whose workflow tags differ
    │   ├── AttributesNeedSpec9       set_attributes() in the workflow code of a spec 8 run
    │   ├── LimitKeyError             a concurrency/rate limit key not computable from the input
    │   ├── RunFailedError            ``run.result()`` of a run that failed
    │   ├── RunCancelledError         ``run.result()`` of a run that was cancelled
    │   ├── ChildWorkflowFailed       a child run failed or was cancelled (its run id, error)
    │   ├── ChildWorkflowsNotSupported  a child call on a spec 8 run (WORKFLOW_SPEC_VERSION)
    │   ├── StepTimedOut              a step attempt passed its timeout or heartbeat timeout
    │   └── RunTimedOut               a run passed its run timeout (the run fails with it)
    ├── HookWakeFailed                resume_hook recorded the payload but could not wake the run
    ├── HookSignatureInvalid          resume_hook without the signature its hook requires; no write
    │   └── WebhookSignatureInvalid   a webhook call's HMAC signature is missing, wrong or stale
    ├── WebhookRequestInvalid         a webhook call's body cannot be read (bad JSON, media type)
    ├── WebhookSpecUnreadable         a webhook's stored options are not readable here (newer?)
    ├── RequestRefused                treadle serve answers a request with a 4xx JSON error
    ├── LintInputInvalid              treadle lint: a missing path, a file that does not parse
    ├── ScheduleInvalid               a schedule's cron, time zone, overlap... (names the field)
    ├── StartOptionClash              app.start(wf, timeout=...) where wf has a timeout parameter
    └── WorldError                    the World refused or failed an operation
        ├── InBandSuperseded          fence: a stale expected_seq_in_band; nothing written
        ├── WorldContractError        the caller broke the World contract (a bug, not load)
        ├── RunNotFound               no run with that id
        ├── RunExpired                the run is terminal; the write is refused
        ├── RunNotRepinned            runs.repin refused (moved already, ended, bad target)
        ├── RunNotSupported           the run's format (spec version) is unknown here; no write
        ├── StepAlreadyEnded          a step_started or a second outcome for a step that has one
        ├── StaleStepStart            a step_started whose attempt is not past the latest started
        ├── StaleStepOutcome          an outcome naming an attempt other than the latest started
        ├── WaitAlreadyCompleted      a second wait_completed for one wait
        ├── EntityAlreadyCreated      a second creation of a step, wait, hook or the run's start
        ├── StepNotFound              no step with that id in the run
        ├── HookNotFound              no live hook with that token
        │   ├── WebhookAlreadyReceived    the webhook's hook took its payload already (409)
        │   └── HookRunEnded          the token is retained by a run that has ended
        ├── EarlierItemRefused        a batch item whose correlation id had an earlier refusal
        ├── OutcomeLost               a batch item missing from the log its lost answer committed
        ├── MessageTooLarge           a queue message over the size limit
        ├── MessageRefused            a queue message whose stamp is out of range, or that the
        │                             run's log contradicts: acknowledged, nothing run or written
        ├── HookPayloadNotRecorded    resume_hook's write failed and recorded nothing: retry it
        ├── DeadLetterNotFound        no dead letter with that message id
        ├── ScheduleNotFound          no schedule of that name
        ├── DeploymentRetired         runs.create on a retired deployment; nothing recorded
        ├── FenceNotSupported         the World lacks the in-band fence spec 9 runs need
        └── StorageUnavailable        the World's storage cannot be opened or used
            ├── StorageLocked         another process holds a local World
            ├── IncompatibleStorage   a corrupt, foreign or newer database
            ├── WorldAuthFailed       a server refused treadle's credentials or TLS
            └── ReadTimedOut          a read of a run's log did not answer in time

Only ``InBandSuperseded`` means "another orchestrator may be writing": the
orchestrator acts on it (stop, send what is owed, redeliver). Every other
refusal leaves the writer's count unchanged.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal


class TreadleError(Exception):
    """Base of every error treadle raises on purpose."""


class SettingsError(TreadleError):
    """A setting has a value treadle cannot use."""


class SerializationError(TreadleError):
    """A value cannot cross the log; ``path`` says which one."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class PayloadKeyMissing(SerializationError):
    """An encrypted value names a key id this process does not hold (TREADLE_PAYLOAD_KEY)."""

    def __init__(self, path: str, kid: str) -> None:
        super().__init__(
            path,
            f"the value is encrypted under key {kid!r}, which TREADLE_PAYLOAD_KEY does not "
            "hold here (add that key, after the one that encrypts)",
        )
        self.kid = kid


class PayloadDecryptionFailed(SerializationError):
    """An encrypted value does not open: tampered, truncated, or relabelled."""


class ValueLimitExceeded(SerializationError):
    """A value, or a hook token, over one of ``treadle.limits``; ``setting`` tunes it."""

    def __init__(self, path: str, reason: str, *, setting: str, limit: int) -> None:
        super().__init__(path, reason)
        self.setting = setting
        self.limit = limit


class WorkflowError(TreadleError):
    """About workflow or step code and the runs it makes."""


class FatalError(WorkflowError):
    """Raise in a step to fail it at once, without retries."""


class RetryableError(WorkflowError):
    """Raise in a step to retry it, after ``retry_after`` (seconds or timedelta) if given."""

    def __init__(self, message: str = "", *, retry_after: float | timedelta | None = None) -> None:
        super().__init__(message)
        if isinstance(retry_after, timedelta):
            retry_after = retry_after.total_seconds()
        if retry_after is not None and not retry_after >= 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry_after}")
        self.retry_after: float | None = retry_after


class StepFailed(WorkflowError):
    """A step failed for good; awaiting it in a workflow raises this."""

    def __init__(
        self, step_name: str, message: str, *, error_type: str = "Error", code: str | None = None
    ) -> None:
        super().__init__(f"step {step_name} failed: {error_type}: {message}")
        self.step_name = step_name
        self.error_message = message
        self.error_type = error_type
        self.code = code


class HookConflictError(WorkflowError):
    """Another run holds this hook's token."""

    def __init__(self, token: str, *, holder_run_id: str | None) -> None:
        super().__init__(f"hook token {token!r} is held by run {holder_run_id}")
        self.token = token
        self.holder_run_id = holder_run_id


class NonDeterministicCall(WorkflowError):
    """Workflow code called something that needs real I/O or real time."""

    def __init__(self, call: str) -> None:
        super().__init__(
            f"{call} is not allowed in workflow code: it is not deterministic on replay; "
            "do it in a step"
        )
        self.call = call


class CorruptedEventLog(WorkflowError):
    """Replay kept diverging from the run's log; names the position and the mismatch."""

    def __init__(self, run_id: str, *, position: int, recorded: str, reached: str) -> None:
        super().__init__(
            f"run {run_id}: the workflow diverged from its event log at position {position}: "
            f"the log records {recorded}, the code reached {reached}"
        )
        self.run_id = run_id
        self.position = position
        self.recorded = recorded
        self.reached = reached


class DeploymentMismatch(WorkflowError):
    """The run's pinned deployment cannot be reached."""


class WorkflowNotFound(WorkflowError):
    """No workflow is registered under this name."""


class RunNotMovable(WorkflowError):
    """A run cannot be moved to another revision: its workflow does not declare the same
    compatibility tag in both revisions' catalogues (``@app.workflow(compatible=...)``).
    Nothing was written."""

    def __init__(self, run_id: str, *, workflow: str, reason: str) -> None:
        super().__init__(f"run {run_id} ({workflow}) is not moved: {reason}")
        self.run_id = run_id
        self.workflow = workflow
        self.reason = reason


class RunFailedError(WorkflowError):
    """The run failed; ``error_type`` and ``error_message`` are what it recorded."""

    def __init__(self, run_id: str, message: str, *, error_type: str = "Error") -> None:
        super().__init__(f"run {run_id} failed: {error_type}: {message}")
        self.run_id = run_id
        self.error_message = message
        self.error_type = error_type


class RunCancelledError(WorkflowError):
    """The run was cancelled."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} was cancelled")
        self.run_id = run_id


# -- child workflows (issue 17 item 1; docs/children.md) ---------------------------------


class ChildWorkflowFailed(WorkflowError):
    """A child run failed or was cancelled; awaiting it (or its handle's ``result()``) in
    the parent raises this, with the child's run id and error."""

    def __init__(
        self,
        child_run_id: str,
        workflow_name: str,
        message: str,
        *,
        error_type: str = "Error",
        code: str | None = None,
        cancelled: bool = False,
    ) -> None:
        what = "was cancelled" if cancelled else f"failed: {error_type}: {message}"
        super().__init__(f"child workflow {workflow_name} (run {child_run_id}) {what}")
        self.child_run_id = child_run_id
        self.workflow_name = workflow_name
        self.error_message = message
        self.error_type = error_type
        self.code = code
        self.cancelled = cancelled


class ChildWorkflowsNotSupported(WorkflowError):
    """A child workflow started where children cannot run (a spec 8 run); nothing recorded."""


# -- timeouts (issue 17 item 5, docs/timeouts.md) ----------------------------------


class StepTimedOut(WorkflowError):
    """A step attempt passed its ``timeout`` (start-to-close) or ``heartbeat_timeout``;
    the attempt counts as a failure and is retried per the step's ``max_retries``."""

    def __init__(self, step_name: str, *, seconds: float, heartbeat: bool = False) -> None:
        what = "heartbeat_timeout" if heartbeat else "timeout"
        super().__init__(f"step {step_name} passed its {what} of {seconds:g} s")
        self.step_name = step_name
        self.seconds = seconds
        self.heartbeat = heartbeat


class RunTimedOut(WorkflowError):
    """The run passed its run timeout; it fails with this (steps running are not
    cancelled: their late outcomes are refused, the run having ended)."""

    def __init__(self, run_id: str, *, seconds: float) -> None:
        super().__init__(f"run {run_id} passed its run timeout of {seconds:g} s")
        self.run_id = run_id
        self.seconds = seconds


class FeatureNeedsSpec9(WorkflowError):
    """A spec 9 feature (timeouts, force-claims, sagas...) was asked of a spec 8 run;
    nothing was recorded for it. Names the feature (and the run, when known)."""

    def __init__(
        self, feature: str, *, run_id: str | None = None, spec_version: int | None = None
    ) -> None:
        where = f"run {run_id}: " if run_id else ""
        spec = spec_version if spec_version is not None else 8
        super().__init__(
            f"{where}{feature} needs a spec 9 run; this run is spec {spec} "
            "(set WORKFLOW_SPEC_VERSION=9, or leave it unset, on a World with the in-band "
            "fence)"
        )
        self.feature = feature
        self.run_id = run_id
        self.spec_version = spec_version


class HookWakeFailed(TreadleError):
    """``resume_hook`` recorded the payload, but the wake to the run could not be sent.

    The payload IS durable in the run's log: the run sees it on its next
    orchestrator delivery (any wake, timer, step completion or recovery), so do
    not resume the hook again (a second payload is refused). ``__cause__`` is the
    queue's last failure; ``attempts`` the sends tried.
    """

    def __init__(self, token: str, *, run_id: str, attempts: int, reason: str) -> None:
        super().__init__(
            f"resume_hook({token!r}): the payload is recorded in run {run_id}, but its wake "
            f"could not be sent ({attempts} attempts; last: {reason}); the run will see the "
            "payload on its next delivery; do not resume again"
        )
        self.token = token
        self.run_id = run_id
        self.attempts = attempts
        self.reason = reason


class HookSignatureInvalid(TreadleError):
    """``resume_hook`` of a hook created with ``require_signature=True`` carried no
    signature or a wrong one (``treadle.hook_signature``); nothing was written."""

    def __init__(self, token: str, reason: str) -> None:
        super().__init__(f"resume_hook({token!r}) refused: {reason}; nothing was recorded")
        self.token = token
        self.reason = reason


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


# -- webhooks (issue 13 item 1: treadle.serve.webhooks, treadle.webhooksig) ---------------
# Their messages name the run and the token's first characters only: a webhook's token
# is the secret part of its URL, and log lines travel further than the URL should.


def shown_token(token: str) -> str:
    """A webhook token as log lines and messages show it: its first characters."""
    return token[:7] + "..." if len(token) > 7 else token


class WebhookSecretMissing(SettingsError):
    """A webhook asks for a signature whose secret ``treadle serve`` does not hold: the
    environment variable ``secret_env`` is unset or empty where serve runs."""

    def __init__(self, secret_env: str, *, run_id: str) -> None:
        super().__init__(
            f"run {run_id}: the webhook's signature secret is read from {secret_env}, "
            "which is not set where treadle serve runs; nothing was recorded"
        )
        self.secret_env = secret_env
        self.run_id = run_id


class WebhookBodyTooLarge(ValueLimitExceeded):
    """A webhook call's body over ``TREADLE_WEBHOOK_MAX_BODY_BYTES``; refused (413)
    before anything is recorded, from Content-Length or while the body streams in."""

    def __init__(self, *, run_id: str, limit: int, size: int | None = None) -> None:
        seen = f"{size} bytes" if size is not None else "more"
        super().__init__(
            f"webhook of run {run_id}",
            f"the body is {seen}, over the limit of {limit} bytes "
            "(TREADLE_WEBHOOK_MAX_BODY_BYTES); nothing was recorded",
            setting="TREADLE_WEBHOOK_MAX_BODY_BYTES",
            limit=limit,
        )
        self.run_id = run_id
        self.size = size


class WebhookSignatureInvalid(HookSignatureInvalid):
    """A webhook call whose HMAC signature (``HmacSignature``/``StripeSignature``) is
    missing, malformed, wrong, or (Stripe style) outside its timestamp tolerance.
    Refused (401) before anything is recorded; ``reason`` names the problem."""

    def __init__(self, token: str, reason: str, *, run_id: str, header: str) -> None:
        super().__init__(token, reason)
        self.args = (
            f"webhook of run {run_id} ({shown_token(token)}) refused: {reason}; "
            "nothing was recorded",
        )
        self.run_id = run_id
        self.header = header


class WebhookRequestInvalid(TreadleError):
    """A webhook call whose body cannot become a ``WebhookRequest`` (JSON that does not
    parse, a form that is not UTF-8, a media type serve cannot read); ``status`` is
    the HTTP answer (400 or 415). Nothing was recorded."""

    def __init__(self, reason: str, *, run_id: str, status: int = 400) -> None:
        super().__init__(f"webhook of run {run_id}: {reason}; nothing was recorded")
        self.reason = reason
        self.run_id = run_id
        self.status = status


class WebhookSpecUnreadable(TreadleError):
    """A webhook's stored options (response, signature scheme) do not read here: made
    by a newer treadle (an unknown signature scheme), or damaged. serve refuses the
    call (500) rather than accept it unverified; nothing is recorded."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the webhook's stored options cannot be read by this treadle ({reason}); "
            "upgrade treadle serve; nothing was recorded"
        )
        self.reason = reason


class WebhookAlreadyReceived(HookNotFound):
    """The webhook's hook took a payload already (its run's log holds ``hook_received``
    for it): a second call is a conflict (409), never a second payload."""

    def __init__(self, token: str, *, run_id: str) -> None:
        super().__init__(token, run_id=run_id)
        self.args = (
            f"the webhook ({shown_token(token)}) of run {run_id} took its payload already; "
            "nothing was recorded",
        )


class RequestRefused(TreadleError):
    """``treadle serve`` refuses an HTTP request: ``status`` (a 4xx), a stable ``code``
    (``"unauthorized"``, ``"run_not_found"``...) and the message naming the problem.

    Answered as ``{"error": {"code": ..., "message": ...}}`` by ``treadle.serve.app``;
    raised by the serve routes and its auth (issue 13, "Bad input").
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# -- Hook force-claim and token retention; sagas (issue 17 items 8 and 7) ----------------


class HookForceClaimedError(WorkflowError):
    """Another run took this hook's token (``create_hook(token, force=True)``)."""

    def __init__(self, token: str, *, claimed_by: str) -> None:
        super().__init__(f"hook token {token!r} was force-claimed by run {claimed_by}")
        self.token = token
        self.claimed_by = claimed_by


class HookRunEnded(HookNotFound):
    """The token is still reserved (``retain_token_for``) by a run that has ended."""

    def __init__(self, token: str, *, run_id: str, status: str) -> None:
        super().__init__(token, run_id=run_id)
        self.args = (
            f"hook token {token!r} belongs to run {run_id}, which has ended ({status}); "
            "its token is retained, so nothing was recorded",
        )
        self.status = status


# -- attributes (issue 17 item 2: treadle.world.attributes, treadle.sdk.attributes) --------


class AttributeInvalid(SerializationError):
    """A run attribute refused at the call, before anything is recorded: a key outside
    ``treadle.world.attributes.KEY_PATTERN``, or a value that is not JSON; ``path``
    names the key (``attribute 'tier'``)."""


class AttributesNeedSpec9(WorkflowError):
    """``set_attributes()`` in workflow code needs a spec 9 run (an in-band ``attr_set``
    the run's one orchestrator writes); a spec 8 run raises this where the code calls
    it. Step code and ``run.set_attributes()`` work on both formats."""

    def __init__(self, run_id: str, spec_version: int) -> None:
        super().__init__(
            f"run {run_id}: set_attributes() in workflow code needs a spec 9 run, and this "
            f"run is spec {spec_version} (started with WORKFLOW_SPEC_VERSION="
            f"{spec_version}); set attributes from a step or with run.set_attributes(), "
            "or start the workflow's runs at WORKFLOW_SPEC_VERSION=9"
        )
        self.run_id = run_id
        self.spec_version = spec_version


# -- the determinism linter (issue 17 item 9: treadle.lint) ------------------------------


class LintInputInvalid(TreadleError):
    """``treadle lint`` cannot read its input: a path that does not exist, a file that is
    not UTF-8 or does not parse. The message is one line naming the file (and line)."""

    def __init__(self, path: str, reason: str, *, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class StartOptionClash(TreadleError, TypeError):
    """``app.start(workflow, ..., option=...)`` where ``option`` (``attributes``,
    ``priority``, ``timeout``: the start's own keywords) is also a parameter of the
    workflow that the call's positional arguments leave unfilled: which one is meant
    cannot be told. Raised at the call, nothing recorded; the message names the way
    out (``workflow.options(...)`` binds the start's options, and then every keyword
    of the call is the workflow's)."""

    def __init__(self, workflow: str, option: str, meaning: str) -> None:
        super().__init__(
            f"app.start({workflow}, {option}=...): workflow {workflow} has a parameter "
            f"named {option!r}, and app.start reads {option}= as the run's {meaning}. "
            f"Bind the run's options with .options() and every keyword goes to the "
            f"workflow: app.start({workflow}.options({option}=...), ..., {option}=...) "
            f"(or pass the workflow's {option!r} by position). Nothing was recorded"
        )
        self.workflow = workflow
        self.option = option


# -- schedules (issue 17 item 3) -----------------------------------------------------------


class ScheduleInvalid(TreadleError, ValueError):
    """A schedule's ``field`` (cron, timezone, overlap, workflow...) cannot be used;
    raised at the call, before anything is recorded. The message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ScheduleNotFound(WorldError):
    """No schedule of that name in the World."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


# -- concurrency and rate limits (issue 17 item 4) ------------------------------------------


class LimitKeyError(WorkflowError):
    """A limit's key function raised, or returned no string, for the given input: nothing
    was recorded (``app.start`` refused, or the step call refused before its creation)."""

    def __init__(self, where: str, limit: str, problem: str) -> None:
        self.where = where
        self.limit = limit
        self.problem = problem
        super().__init__(f"{where}: the {limit} key cannot be computed from its input: {problem}")


# -- streams (issue 17 item 6, docs/streams.md) ------------------------------------------

StreamRefusal = Literal["run_ended", "stale_attempt", "not_started", "start_refused"]


class StreamError(FatalError):
    """A stream misused at the call (nothing recorded), or its chunks refused. A
    ``FatalError``: raised in a step it fails the step at once (a retry would fail alike)."""


class StreamNameInvalid(StreamError, ValueError):
    """A stream name that is not 1 to 128 characters of letters, digits, ``_.:-``."""

    def __init__(self, name: object, reason: str) -> None:
        super().__init__(f"stream name {name!r} is invalid: {reason}; nothing was recorded")
        self.name = name


class StreamClosedError(StreamError):
    """A write to a writer that was closed, or to a stream a writer closed (closing is
    final: a retried step cannot reopen it). Nothing was recorded."""

    def __init__(self, run_id: str, name: str, detail: str = "it was closed") -> None:
        super().__init__(
            f"run {run_id}: stream {name!r} refuses the write: {detail}; nothing was recorded"
        )
        self.run_id = run_id
        self.name = name


class StreamWriteRefused(StreamError):
    """The World (or the run-ready barrier) refused a step attempt's chunks, none
    written: the run ended, a later attempt of the step started, the attempt's start
    is not in the log, or its optimistic start was refused (``reason``)."""

    def __init__(self, run_id: str, name: str, reason: StreamRefusal, detail: str) -> None:
        super().__init__(f"run {run_id}: chunks for stream {name!r} refused: {detail}")
        self.run_id = run_id
        self.name = name
        self.reason = reason


class SagaCompensated(WorkflowError):
    """A saga's body failed and its compensations ran (in reverse order).

    ``error`` is the body's original failure (also ``__cause__``);
    ``compensation_errors`` the compensations that failed after their retries,
    as ``(name, error)`` pairs, in the order they ran.
    """

    def __init__(
        self, error: BaseException, compensation_errors: list[tuple[str, BaseException]]
    ) -> None:
        failed = ", ".join(name for name, _ in compensation_errors)
        tail = f"; compensations that failed: {failed}" if failed else ""
        super().__init__(f"saga failed ({type(error).__name__}: {error}); compensated{tail}")
        self.error = error
        self.compensation_errors = compensation_errors
