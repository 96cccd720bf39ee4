"""The public names, pinned (httpx's test_exported_members, in our words)."""

from __future__ import annotations

import logging

import pytest

import treadle
from treadle import sleep, workflow_logger

from .conftest import MakeApp

PUBLIC = {
    "CorruptedEventLog", "FatalError", "Hook", "HookConflictError", "HookHandle",
    "HookSignatureInvalid", "hook_signature",
    "NonDeterministicCall", "RetryableError", "Run", "RunCancelledError", "RunFailedError",
    "SerializationError", "StepFailed", "StepMetadata", "TreadleError", "WorkflowMetadata",
    "Workflows", "__version__", "create_hook", "now", "random", "register_types", "sleep",
    "step_metadata", "uuid4", "workflow_logger", "workflow_metadata",
    # Webhooks (issue 13: a workflow waits on an HTTP callback; docs/webhooks.md).
    "create_webhook", "WebhookHandle", "WebhookRequest", "WebhookResponse",
    "HmacSignature", "StripeSignature",
    # Run attributes (issue 17 item 2; docs/attributes.md).
    "set_attributes", "AttributeInvalid", "AttributesNeedSpec9",
    # Child workflows (issue 17 item 1; docs/children.md).
    "ChildHandle", "ChildWorkflowFailed", "ChildWorkflowsNotSupported",
    # Concurrency and rate limits (issue 17 item 4; docs/limits.md).
    "Limit", "LimitKeyError", "Rate",
    # Timeouts (issue 17 item 5: run, step and heartbeat timeouts; docs/timeouts.md).
    "FeatureNeedsSpec9", "RunTimedOut", "StepTimedOut", "step_heartbeat", "timeout",
    # Streams (issue 17 item 6; docs/streams.md).
    "get_writable", "StreamWriter", "Chunk", "StreamError", "StreamClosedError",
    "StreamNameInvalid", "StreamWriteRefused",
    # Hook force-claim and token retention; sagas (issue 17 items 8 and 7; docs/hooks.md,
    # docs/sagas.md).
    "HookForceClaimedError", "HookRunEnded", "Saga", "SagaCompensated",
}  # fmt: skip


def test_the_public_api_is_exactly_these_names() -> None:
    """Adding or dropping a public name is a decision, so it fails this test first."""
    assert set(treadle.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(treadle, name), name


async def test_workflow_logger_is_silent_while_replaying(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """Each line logs once, when the code first reaches it, not on every replay."""
    app = make_app()
    log = workflow_logger("treadle.test.workflow")

    @app.step
    async def noop(i: int) -> int:
        return i

    @app.workflow
    async def flow() -> str:
        log.info("before")
        await noop(1)
        await sleep(0.05)  # a second delivery replays "before" and the first step
        log.info("after")
        return "ok"

    with caplog.at_level(logging.INFO, logger="treadle.test.workflow"):
        run = await app.start(flow)
        assert await run.result(timeout=10) == "ok"
    lines = [r.getMessage() for r in caplog.records if r.name == "treadle.test.workflow"]
    assert lines == ["before", "after"]
