"""The World contract's numbers, named as seed 003 names them.

Imported by the Worlds, the orchestrator and the conformance suite; nothing
here is a setting (settings live in ``treadle.settings``).
"""

from __future__ import annotations

from typing import Final

# A new run holds one in-band position: run_created counts as in-band.
IN_BAND_SEQ_AT_RUN_CREATION: Final = 1

SPEC_VERSION_LEGACY: Final = 8
SPEC_VERSION_SINGLE_ORCHESTRATOR: Final = 9
# The formats this build drives: spec 8 (multi-writer) and spec 9 (single orchestrator).
SUPPORTED_SPEC_VERSIONS: Final = frozenset({SPEC_VERSION_LEGACY, SPEC_VERSION_SINGLE_ORCHESTRATOR})

HOUR_MS: Final = 3_600_000

# A keyed send is deduplicated for at least this long after the first send.
QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS: Final = 24 * HOUR_MS
# A failing step message keeps being redelivered for at least this long.
QUEUE_MIN_STEP_REDELIVERY_SPAN_MS: Final = HOUR_MS
# The runtime stops re-sending a step this long inside the dedupe window.
STEP_RESEND_DEDUPE_MARGIN_MS: Final = HOUR_MS
STEP_RESEND_MAX_AGE_MS: Final = QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS - STEP_RESEND_DEDUPE_MARGIN_MS
# A long wait is reached in hops at most this far apart.
MAX_TIMER_HOP_MS: Final = 23 * HOUR_MS

# Creation batches of one suspension.
MAX_IN_BAND_CREATION_BATCH_EVENTS: Final = 64
MAX_IN_BAND_CREATION_BATCH_BYTES: Final = 512 * 1024
# The largest batch a World accepts in one create_batch call.
MAX_BATCH_EVENTS: Final = MAX_IN_BAND_CREATION_BATCH_EVENTS
# The skipped-slot report carries at most this many events; past it, has_more.
MAX_SKIPPED_SLOT_REPORT: Final = 1_000

# Queue limits.
MAX_MESSAGE_BYTES: Final = 128 * 1024
MAX_COALESCED_RERUNS: Final = 32
# Handoffs of one message before a further Handoff is an ordinary, counted redelivery
# (every queue, through ``messages.handoff_counted``): a delivery that keeps handing off
# then reaches WORKFLOW_MAX_QUEUE_DELIVERIES instead of looping for ever.
MAX_HANDOFFS: Final = 10_000
MAX_LOCAL_HANDOFFS: Final = MAX_HANDOFFS  # the older name
# The longest Redeliver delay; a longer or non-finite one is clamped to it.
MAX_REDELIVER_SECONDS: Final = 900.0
FENCE_REFUSAL_REDELIVERY_SECONDS: Final = 1.0
