"""The names treadle's spans and their attributes carry, in one place.

Seed 000 ("Observability") and seed 003 name the attributes of the orchestrator's
delivery span ``workflow.execute``; those names are kept exactly. The rest follow the
OpenTelemetry messaging conventions where one applies (``messaging.*``) and a
``workflow.`` / ``step.`` prefix otherwise. Read by ``treadle.telemetry`` and by
callers of ``telemetry.add_to_current`` (the spec 8 delivery).
"""

from __future__ import annotations

from typing import Final

# Spans.
WORKFLOW_START: Final = "workflow.start"
WORKFLOW_EXECUTE: Final = "workflow.execute"  # one orchestrator delivery (seed 000)
STEP_DELIVER: Final = "step.deliver"  # one delivery of a background step's message
STEP_EXECUTE: Final = "step.execute"  # one attempt of a step body, inline or background
QUEUE_SEND: Final = "world.queue.send"
EVENTS_CREATE: Final = "world.events.create"
EVENTS_CREATE_BATCH: Final = "world.events.create_batch"
RUNS_CREATE: Final = "world.runs.create"

# Attributes of every span about a run.
RUN_ID: Final = "workflow.run_id"
WORKFLOW_NAME: Final = "workflow.name"
SPEC_VERSION: Final = "workflow.spec_version"
DEPLOYMENT_ID: Final = "workflow.deployment_id"

# A delivery (workflow.execute, step.deliver).
MESSAGE_ID: Final = "messaging.message.id"
MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGE_KIND: Final = "workflow.message.kind"
DELIVERY_COUNT: Final = "workflow.delivery.count"
DELIVERY_ATTEMPT: Final = "workflow.delivery.attempt"
DELIVERY_RERUN: Final = "workflow.delivery.rerun"
DELIVERY_RESULT: Final = "workflow.delivery.result"  # ack, redeliver, handoff, error, cancelled
REDELIVER_SECONDS: Final = "workflow.delivery.redeliver_seconds"

# Seed 000 "Observability": counters on workflow.execute (the spec 8 delivery adds them).
INLINE_OWNED_RECOVERY_STEPS: Final = "workflow.inline_ownership.owned_recovery_steps"
INLINE_BACKSTOP_WAKES_ARMED: Final = "workflow.inline_ownership.backstop_wakes_armed"
# Seed 003: the re-send pass and the run-ahead detector, on workflow.execute.
REENQUEUE_COUNT: Final = "workflow.reenqueue.count"
REENQUEUE_SKIPPED_TOO_OLD: Final = "workflow.reenqueue.skipped_too_old"
REENQUEUE_RECOVERY: Final = "workflow.reenqueue.recovery"
RUN_AHEAD_HAZARD_STOPS: Final = "workflow.run_ahead.hazard_stops"

# A step attempt (step.execute).
STEP_ID: Final = "step.id"
STEP_NAME: Final = "step.name"
STEP_ATTEMPT: Final = "step.attempt"
STEP_OUTCOME: Final = "step.outcome"  # completed, retry, failed

# A World write or send.
EVENT_TYPE: Final = "world.event.type"
IN_BAND: Final = "world.in_band"
SEND_COUNT: Final = "world.send.count"
SEND_KEY: Final = "world.send.key"
SEND_DELAY_SECONDS: Final = "world.send.delay_seconds"
REFUSAL: Final = "world.refusal"  # the refusal's class name, on a refused write
