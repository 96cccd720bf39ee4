"""Postgres errors as treadle errors.

The append functions (``migrations/0001_init.sql``, ``0004_one_outcome.sql``,
``0006_stale_step_start.sql``, ``0008_deployment_rollout.sql``,
``0010_spec8_one_creation.sql``, ``0011_grouped_appends.sql``,
``0019_outcome_attempt.sql``) raise with
SQLSTATEs of the class ``TRD`` and a JSON ``DETAIL`` carrying the error's
attributes; batch item and grouped write refusals come back as rows with the
same code and detail. ``world_error`` turns either into the
``treadle.errors`` type the local World raises, with the same attributes and
message. ``storage_error`` maps everything else: a login the server refuses (a
password, a certificate, TLS) is ``WorldAuthFailed`` (``transport``), a lost or
refused connection is ``StorageUnavailable``, a database without treadle's schema is
``IncompatibleStorage``.

Called by ``database``.
"""

from __future__ import annotations

import json
from typing import Any

from treadle import errors
from treadle.world import storagerules
from treadle.worlds.transport import postgres_refusal

SUPERSEDED = "TRD01"
CONTRACT = "TRD02"
RUN_NOT_FOUND = "TRD03"
RUN_EXPIRED = "TRD04"
STEP_ALREADY_ENDED = "TRD05"
HOOK_NOT_FOUND = "TRD06"
EARLIER_ITEM_REFUSED = "TRD07"
WAIT_ALREADY_COMPLETED = "TRD08"  # migration 0004
STALE_STEP_START = "TRD09"  # migration 0006
DEPLOYMENT_RETIRED = "TRD10"  # migration 0008
ENTITY_ALREADY_CREATED = "TRD11"  # migration 0010
SPEC_EVENT_REFUSED = "TRD12"  # migration 0010: a spec 9 event on an earlier run
STALE_STEP_OUTCOME = "TRD20"  # migration 0019: an outcome of a superseded attempt

# SQLSTATE classes of a connection that is gone or refused (08, 53, 57) and of
# functions or tables that do not exist (the schema is missing or behind).
_UNAVAILABLE_CLASSES = ("08", "53", "57")
_UNDEFINED = ("42883", "42P01", "42704")
# JSONB cannot hold a NUL character (\u0000) or text that is not UTF-8.
_UNSTORABLE = ("22P05", "22021")

MIGRATE_HINT = "run `treadle migrate` against this database"


def is_treadle_code(code: str | None) -> bool:
    return code is not None and code.startswith("TRD")


def world_error(
    code: str, message: str | None, detail: str | dict[str, Any] | None
) -> errors.WorldError:
    """The treadle error for one of the append functions' refusals."""
    facts: dict[str, Any] = json.loads(detail) if isinstance(detail, str) else dict(detail or {})
    run_id = str(facts.get("run_id", ""))
    if code == SUPERSEDED:
        return errors.InBandSuperseded(
            run_id,
            expected_seq_in_band=int(facts["expected_seq_in_band"]),
            seq_in_band=int(facts["seq_in_band"]),
        )
    if code == CONTRACT:
        slot = facts.get("slot")
        return errors.WorldContractError(
            message or "World contract broken",
            run_id=run_id or None,
            slot=None if slot is None else int(slot),
        )
    if code == RUN_NOT_FOUND:
        return errors.RunNotFound(run_id)
    if code == RUN_EXPIRED:
        return errors.RunExpired(
            run_id, status=str(facts["status"]), event_type=str(facts["event_type"])
        )
    if code == STEP_ALREADY_ENDED:
        return errors.StepAlreadyEnded(
            run_id,
            step_id=str(facts["step_id"]),
            outcome_slot=int(facts["outcome_slot"]),
            event_type=str(facts.get("event_type", "step_started")),
        )
    if code == STALE_STEP_START:
        return errors.StaleStepStart(
            run_id,
            step_id=str(facts["step_id"]),
            attempt=int(facts["attempt"]),
            latest_attempt=int(facts["latest_attempt"]),
        )
    if code == STALE_STEP_OUTCOME:
        return errors.StaleStepOutcome(
            run_id,
            step_id=str(facts["step_id"]),
            attempt=int(facts["attempt"]),
            latest_attempt=int(facts["latest_attempt"]),
            event_type=str(facts.get("event_type", "step_completed")),
        )
    if code == WAIT_ALREADY_COMPLETED:
        return errors.WaitAlreadyCompleted(
            run_id, wait_id=str(facts["wait_id"]), completed_slot=int(facts["completed_slot"])
        )
    if code == HOOK_NOT_FOUND:
        return errors.HookNotFound(hook_id=str(facts["hook_id"]), run_id=run_id)
    if code == ENTITY_ALREADY_CREATED:
        cid = facts.get("correlation_id")
        return errors.EntityAlreadyCreated(
            run_id,
            correlation_id=None if cid is None else str(cid),
            event_type=str(facts["event_type"]),
            slot=int(facts["slot"]),
        )
    if code == SPEC_EVENT_REFUSED:
        return storagerules.spec_event_refused(
            run_id, int(facts["spec_version"]), str(facts["event_type"])
        )
    if code == DEPLOYMENT_RETIRED:
        return errors.DeploymentRetired(str(facts["deployment_id"]), run_id or None)
    if code == EARLIER_ITEM_REFUSED:
        return errors.EarlierItemRefused(
            run_id, correlation_id=str(facts["correlation_id"]), index=int(facts["index"])
        )
    return errors.StorageUnavailable(
        f"Postgres refused a write with unknown code {code}: {message}"
    )


def storage_error(exc: BaseException, where: str) -> errors.WorldError:
    """A driver or server error as the treadle error a caller can act on."""
    code: str | None = getattr(exc, "sqlstate", None)
    if code is not None and is_treadle_code(code):
        return world_error(code, getattr(exc, "message", str(exc)), getattr(exc, "detail", None))
    refused = postgres_refusal(exc, where)
    if refused is not None:
        return refused  # a wrong password, a certificate, TLS the server requires
    text = str(exc).strip() or type(exc).__name__
    if code in _UNDEFINED:
        return errors.IncompatibleStorage(
            f"{where}: the database lacks treadle's schema ({text}); {MIGRATE_HINT}"
        )
    if code in _UNSTORABLE:
        return errors.WorldContractError(
            f"{where}: Postgres cannot store this value ({text}); JSONB holds no NUL "
            "characters (\\u0000)"
        )
    if code is None or code[:2] in _UNAVAILABLE_CLASSES:
        return errors.StorageUnavailable(f"{where}: Postgres is unavailable: {text}")
    return errors.StorageUnavailable(f"{where}: Postgres failed: {text} (SQLSTATE {code})")
