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
from treadle.errors import (
    CorruptedEventLog,
    FatalError,
    HookConflictError,
    HookSignatureInvalid,
    NonDeterministicCall,
    RetryableError,
    RunCancelledError,
    RunFailedError,
    SerializationError,
    StepFailed,
    TreadleError,
)
from treadle.hooktokens import signature as hook_signature
from treadle.sdk.context import StepMetadata, WorkflowMetadata, step_metadata, workflow_metadata
from treadle.sdk.determinism import random, uuid4
from treadle.sdk.hooks import Hook, HookHandle, create_hook
from treadle.sdk.logging import workflow_logger
from treadle.sdk.timing import now, sleep
from treadle.sdk.webhooks import WebhookHandle, create_webhook
from treadle.serde_registry import register_types
from treadle.webhookspec import HmacSignature, StripeSignature, WebhookRequest, WebhookResponse

__version__ = "0.1.0"

# Arguments of treadle's log lines are quoted when they hold a newline (security.md L3).
redaction.install_log_quoting()

__all__ = [
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
    "sleep",
    "step_metadata",
    "uuid4",
    "workflow_logger",
    "workflow_metadata",
]
