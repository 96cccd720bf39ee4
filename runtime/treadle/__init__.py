"""treadle: a durable workflow engine for Python.

Write workflows as ``async def`` functions; treadle records every decision in
an append-only event log and replays the code against it, so a run survives
crashes, redeploys and week-long sleeps::

    from treadle import Workflows, sleep

    app = Workflows()

    @app.step
    async def greet(name: str) -> str:
        return f"hello, {name}"

    @app.workflow
    async def hello(name: str) -> str:
        greeting = await greet(name)
        await sleep("1s")
        return greeting
"""

from treadle import redaction
from treadle.client import Run, Workflows

# Concurrency and rate limits (issue 17 item 4).
# Hook force-claim and token retention; sagas (issue 17 items 8 and 7).
from treadle.errors import (
    AttributeInvalid,
    AttributesNeedSpec9,
    ChildWorkflowFailed,
    ChildWorkflowsNotSupported,
    CorruptedEventLog,
    FatalError,
    FeatureNeedsSpec9,
    HookConflictError,
    HookForceClaimedError,
    HookRunEnded,
    HookSignatureInvalid,
    LimitKeyError,
    NonDeterministicCall,
    RetryableError,
    RunCancelledError,
    RunFailedError,
    RunTimedOut,
    SagaCompensated,
    SerializationError,
    StepFailed,
    StepTimedOut,
    StreamClosedError,
    StreamError,
    StreamNameInvalid,
    StreamWriteRefused,
    TreadleError,
)
from treadle.hooktokens import signature as hook_signature
from treadle.sdk.attributes import set_attributes
from treadle.sdk.children import ChildHandle  # child workflows (docs/children.md)
from treadle.sdk.context import StepMetadata, WorkflowMetadata, step_metadata, workflow_metadata
from treadle.sdk.determinism import random, uuid4
from treadle.sdk.heartbeats import step_heartbeat
from treadle.sdk.hooks import Hook, HookHandle, create_hook
from treadle.sdk.limiting import Limit, Rate
from treadle.sdk.logging import workflow_logger
from treadle.sdk.sagas import Saga
from treadle.sdk.streams import StreamWriter, get_writable
from treadle.sdk.timeouts import timeout
from treadle.sdk.timing import now, sleep
from treadle.sdk.webhooks import WebhookHandle, create_webhook
from treadle.serde_registry import register_types
from treadle.streamread import Chunk
from treadle.webhookspec import HmacSignature, StripeSignature, WebhookRequest, WebhookResponse

__version__ = "0.1.0"

# Arguments of treadle's log lines are quoted when they hold a newline (security.md L3).
redaction.install_log_quoting()

__all__ = [
    "AttributeInvalid",
    "AttributesNeedSpec9",
    "ChildHandle",
    "ChildWorkflowFailed",
    "ChildWorkflowsNotSupported",
    "Limit",
    "LimitKeyError",
    "Rate",
    "CorruptedEventLog",
    "FatalError",
    "Hook",
    "HookConflictError",
    "HookSignatureInvalid",
    "HookHandle",
    "HmacSignature",
    "NonDeterministicCall",
    "RetryableError",
    "Run",
    "RunCancelledError",
    "RunFailedError",
    "SerializationError",
    "StepFailed",
    "StepMetadata",
    "StripeSignature",
    "TreadleError",
    "WebhookHandle",
    "WebhookRequest",
    "WebhookResponse",
    "WorkflowMetadata",
    "Workflows",
    "__version__",
    "create_hook",
    "create_webhook",
    "hook_signature",
    "now",
    "random",
    "register_types",
    "set_attributes",
    "sleep",
    "step_metadata",
    "uuid4",
    "workflow_logger",
    "workflow_metadata",
    # timeouts (issue 17 item 5)
    "FeatureNeedsSpec9",
    "RunTimedOut",
    "StepTimedOut",
    "step_heartbeat",
    "timeout",
    # Streams (issue 17 item 6).
    "Chunk",
    "StreamClosedError",
    "StreamError",
    "StreamNameInvalid",
    "StreamWriteRefused",
    "StreamWriter",
    "get_writable",
    # Hook force-claim and token retention; sagas (issue 17 items 8 and 7).
    "HookForceClaimedError",
    "HookRunEnded",
    "Saga",
    "SagaCompensated",
]
