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

The classes are defined in one module per family and re-exported here, the one
place callers import them from (``from treadle import errors``, then
``errors.RunNotFound``); each one's ``__module__`` is ``treadle.errors``, so
tracebacks, ``repr`` and pickles name them as before the split:

- ``base``: the roots, and ``SerializationError``'s family (payload keys, limits);
- ``workflow``: ``WorkflowError``'s core family (steps, replay, ``run.result()``);
- ``hooks``: hook waits, ``resume_hook``'s answers, force-claims, retained tokens;
- ``world``: ``WorldError`` and its children (refused writes, storage);
- ``serve``: ``treadle serve``'s webhooks and refused requests (issue 13);
- ``features``: the issue 17 features (children, timeouts, attributes, lint,
  schedules, limits, streams, sagas).
"""

from __future__ import annotations

import types as _types

from treadle.errors.base import (
    PayloadDecryptionFailed,
    PayloadKeyMissing,
    SerializationError,
    SettingsError,
    TreadleError,
    ValueLimitExceeded,
    WorkflowError,
)
from treadle.errors.features import (
    AttributeInvalid,
    AttributesNeedSpec9,
    ChildWorkflowFailed,
    ChildWorkflowsNotSupported,
    FeatureNeedsSpec9,
    LimitKeyError,
    LintInputInvalid,
    RunTimedOut,
    SagaCompensated,
    ScheduleInvalid,
    ScheduleNotFound,
    StartOptionClash,
    StepTimedOut,
    StreamClosedError,
    StreamError,
    StreamNameInvalid,
    StreamRefusal,
    StreamWriteRefused,
)
from treadle.errors.hooks import (
    HookConflictError,
    HookForceClaimedError,
    HookRunEnded,
    HookSignatureInvalid,
    HookWakeFailed,
)
from treadle.errors.serve import (
    RequestRefused,
    WebhookAlreadyReceived,
    WebhookBodyTooLarge,
    WebhookRequestInvalid,
    WebhookSecretMissing,
    WebhookSignatureInvalid,
    WebhookSpecUnreadable,
    shown_token,
)
from treadle.errors.workflow import (
    CorruptedEventLog,
    DeploymentMismatch,
    FatalError,
    NonDeterministicCall,
    RetryableError,
    RunCancelledError,
    RunFailedError,
    RunNotMovable,
    StepFailed,
    WorkflowNotFound,
)
from treadle.errors.world import (
    DeadLetterNotFound,
    DeploymentRetired,
    EarlierItemRefused,
    EntityAlreadyCreated,
    FenceNotSupported,
    HookNotFound,
    HookPayloadNotRecorded,
    InBandSuperseded,
    IncompatibleStorage,
    MessageRefused,
    MessageTooLarge,
    OutcomeLost,
    ReadTimedOut,
    RepinRefusal,
    RunExpired,
    RunNotFound,
    RunNotRepinned,
    RunNotSupported,
    StaleStepOutcome,
    StaleStepStart,
    StepAlreadyEnded,
    StepNotFound,
    StorageLocked,
    StorageUnavailable,
    WaitAlreadyCompleted,
    WorldAuthFailed,
    WorldContractError,
    WorldError,
)

__all__ = [
    "TreadleError",
    "SettingsError",
    "WebhookSecretMissing",
    "SerializationError",
    "ValueLimitExceeded",
    "WebhookBodyTooLarge",
    "PayloadKeyMissing",
    "AttributeInvalid",
    "PayloadDecryptionFailed",
    "WorkflowError",
    "FatalError",
    "StreamError",
    "StreamNameInvalid",
    "StreamClosedError",
    "StreamWriteRefused",
    "RetryableError",
    "StepFailed",
    "HookConflictError",
    "HookForceClaimedError",
    "FeatureNeedsSpec9",
    "SagaCompensated",
    "NonDeterministicCall",
    "CorruptedEventLog",
    "DeploymentMismatch",
    "WorkflowNotFound",
    "RunNotMovable",
    "AttributesNeedSpec9",
    "LimitKeyError",
    "RunFailedError",
    "RunCancelledError",
    "ChildWorkflowFailed",
    "ChildWorkflowsNotSupported",
    "StepTimedOut",
    "RunTimedOut",
    "HookWakeFailed",
    "HookSignatureInvalid",
    "WebhookSignatureInvalid",
    "WebhookRequestInvalid",
    "WebhookSpecUnreadable",
    "RequestRefused",
    "LintInputInvalid",
    "ScheduleInvalid",
    "StartOptionClash",
    "WorldError",
    "InBandSuperseded",
    "WorldContractError",
    "RunNotFound",
    "RunExpired",
    "RunNotRepinned",
    "RunNotSupported",
    "StepAlreadyEnded",
    "StaleStepStart",
    "StaleStepOutcome",
    "WaitAlreadyCompleted",
    "EntityAlreadyCreated",
    "StepNotFound",
    "HookNotFound",
    "WebhookAlreadyReceived",
    "HookRunEnded",
    "EarlierItemRefused",
    "OutcomeLost",
    "MessageTooLarge",
    "MessageRefused",
    "HookPayloadNotRecorded",
    "DeadLetterNotFound",
    "ScheduleNotFound",
    "DeploymentRetired",
    "FenceNotSupported",
    "StorageUnavailable",
    "StorageLocked",
    "IncompatibleStorage",
    "WorldAuthFailed",
    "ReadTimedOut",
    "StreamRefusal",
    "shown_token",
    "RepinRefusal",
]

# The public path of every class and function, whatever submodule defines it (as httpx
# does): tracebacks, reprs and pickles name ``treadle.errors.X``, as before the split.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type | _types.FunctionType):
        _obj.__module__ = __name__
del _name, _obj
