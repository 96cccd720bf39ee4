"""WorkflowSignal (``wfs``): day-2 actions on a run from ``kubectl`` alone.

A WorkflowSignal names a run (``spec.run``: a WorkflowRun of its namespace, or
``spec.runId`` with ``spec.deployment``) and one ``spec.action``:

- ``ResumeHook``: deliver a payload (``spec.resumeHook.payload`` or
  ``payloadFrom`` a ConfigMap/Secret key) to a hook named by its token, its
  correlation id, or, with neither, the run's only open hook. A hook created
  with ``require_signature`` takes ``spec.resumeHook.signature``, or is signed
  by the operator with the World Secret's ``hook-key``.
- ``Wake``: end the run's sleeps now (``spec.wake.waits``: only these).
- ``Rerun``: a Failed or Cancelled WorkflowRun gets a new WorkflowRun with
  the same spec (``<run>-rerun-<n>``, or ``spec.rerun.name``; ``spec.rerun.input``
  replaces the input), started on the deployment's latest revision.
- ``Cancel``: cancel the run.

The operator, which holds the World's credentials, does it **once**: the
outcome is ``status.phase`` ``Done`` or ``Failed`` with ``reason``,
``message``, ``handledAt`` and the conditions ``Succeeded``/``Failed`` (so
``kubectl wait --for=condition=Succeeded wfs/x`` works), and a signal already
handled is never looked at again, across operator restarts. A restart in the
middle converges: World writes carry the idempotency key
``treadle.dev/signal/<uid>``, the hook a resume is for and the name a rerun
takes are written to status before the write. What cannot be done (unknown
run, hook not found, payload not JSON, a run that ended) is ``Failed`` with the
reason; what time may fix (World unreachable, run not started yet) is retried
until ``TREADLE_OPERATOR_SIGNAL_DEADLINE_SECONDS``. A handled signal is
deleted ``spec.ttlSecondsAfterHandled`` (default one hour) later.

The actions themselves are ``signalactions``; ``register`` binds the kopf handlers
(called by ``handlers.build_registry``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from treadle import errors as engine_errors
from treadle_operator import kube, metrics, models, signalactions
from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.errors import SignalNotYet, SignalRefused
from treadle_operator.models import WorkflowSignalSpec, WorkflowSignalStatus
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.signals")

MESSAGE_LIMIT = 1024
PLURAL = signalactions.PLURAL
_status = signalactions.status_of
_where = signalactions.where
_patch = signalactions.patch


def _one_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = "spec." + ".".join(str(p) for p in first["loc"]) if first["loc"] else "spec"
    return f"{where}: {first['msg']}"


async def handle(state: State, body: dict[str, Any]) -> None:
    """Do what the signal asks, once; ``SignalNotYet`` when it must be retried."""
    status = _status(body)
    if status.phase in models.SIGNAL_HANDLED_PHASES:
        metrics.SIGNALS_ALREADY_HANDLED.inc()
        return
    try:
        spec = WorkflowSignalSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        await finish(state, body, status, "?", ok=False, reason="InvalidSpec", msg=_one_line(exc))
        return
    try:
        if spec.run is not None and spec.run_id is not None:
            raise SignalRefused("InvalidSpec", "give spec.run or spec.runId, not both")
        outcome = await signalactions.ACTIONS[spec.action](state, body, spec, status)
    except SignalRefused as exc:
        await finish(state, body, _status(body), spec.action, False, exc.reason, str(exc))
        return
    except SignalNotYet as exc:
        await _not_yet(state, body, spec, exc)
        raise
    except (engine_errors.WorldError, OSError, ApiException) as exc:  # World or API trouble
        if isinstance(exc, ApiException):
            trouble = SignalNotYet("KubernetesError", f"Kubernetes API: {exc.status} {exc.reason}")
        else:
            trouble = SignalNotYet("WorldError", f"{type(exc).__name__}: {exc}")
        await _not_yet(state, body, spec, trouble)
        raise trouble from exc
    await finish(state, body, _status(body), spec.action, True, outcome.reason, outcome.message,
                 outcome.update)  # fmt: skip


async def _not_yet(
    state: State, body: dict[str, Any], spec: WorkflowSignalSpec, exc: SignalNotYet
) -> None:
    """Pending with the reason, or Failed once the signal's deadline has passed."""
    deadline = state.settings.TREADLE_OPERATOR_SIGNAL_DEADLINE_SECONDS
    if _age(body, datetime.now(UTC)) > deadline:
        message = f"{exc} (gave up after {deadline:g} s)"
        await finish(state, body, _status(body), spec.action, False, exc.reason, message)
        raise SignalRefused(exc.reason, message) from exc
    current = _status(body)
    pending = current.model_copy(update={"phase": "Pending", "reason": exc.reason,
                                         "message": str(exc)[:MESSAGE_LIMIT]})  # fmt: skip
    if pending != current:
        await _patch(state, body, pending)


def _age(body: dict[str, Any], now: datetime) -> float:
    stamp = (body.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return 0.0
    made = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return (now - made).total_seconds()


async def finish(
    state: State,
    body: dict[str, Any],
    status: WorkflowSignalStatus,
    action: str,
    ok: bool,
    reason: str,
    msg: str,
    update: dict[str, Any] | None = None,
) -> None:
    """Record the outcome: Done or Failed, never done again."""
    message = msg if len(msg) <= MESSAGE_LIMIT else msg[: MESSAGE_LIMIT - 3] + "..."
    conditions = merge_conditions(
        status.conditions,
        [condition("Succeeded", ok, reason, message), condition("Failed", not ok, reason, message)],
    )
    handled = status.model_copy(
        update={
            "phase": "Done" if ok else "Failed",
            "reason": reason,
            "message": message,
            "handled_at": kube.now(),
            "conditions": conditions,
            **(update or {}),
        }
    )
    await _patch(state, body, handled)
    await state.kube.event(body, reason, message, warning=not ok)
    metrics.SIGNALS.inc(action=action, phase=handled.phase)
    (log.info if ok else log.warning)(
        "WorkflowSignal %s (%s) %s: %s", _where(body), action, handled.phase, message
    )


# -- TTL and kopf ---------------------------------------------------------------------------


def seconds_left(body: dict[str, Any], now: datetime, default_ttl: int) -> float | None:
    """How long a handled signal has before its TTL deletes it (``None``: not handled)."""
    status = _status(body)
    if status.phase not in models.SIGNAL_HANDLED_PHASES or not status.handled_at:
        return None
    ttl = (body.get("spec") or {}).get("ttlSecondsAfterHandled")
    seconds = ttl if isinstance(ttl, int) else default_ttl
    handled = datetime.strptime(status.handled_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return max(0.0, seconds - (now - handled).total_seconds())


async def _expire(state: State, body: dict[str, Any], delay: float) -> None:
    await asyncio.sleep(delay)
    meta = body["metadata"]
    current = await state.kube.get(PLURAL, meta["namespace"], meta["name"])
    if current is None or current["metadata"].get("uid") != meta["uid"]:
        return  # gone already, or a new object of that name
    log.info("WorkflowSignal %s handled and its TTL passed", _where(body))
    await state.kube.delete(PLURAL, meta["namespace"], meta["name"])


def _plain(body: Any) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(dict(body), default=str))
    return plain


def register(registry: kopf.OperatorRegistry, state: State) -> None:
    """The WorkflowSignal handlers: handle once (new, or found when the operator starts),
    then delete it when its TTL has passed.

    The TTL is a task of this process, scheduled again for every handled signal kopf
    lists at start, not a kopf timer: a timer would put kopf's finalizer on every
    signal, and ``kubectl delete wfs`` would hang while the operator is down.
    """
    cfg = state.settings
    group, version = models.GROUP, models.VERSION
    expiries: dict[str, asyncio.Task[None]] = {}

    def schedule(body: dict[str, Any]) -> None:
        uid = str(body["metadata"]["uid"])
        delay = seconds_left(body, datetime.now(UTC), cfg.TREADLE_OPERATOR_SIGNAL_TTL_SECONDS)
        if delay is None or uid in expiries:
            return
        task = asyncio.get_running_loop().create_task(_expire(state, body, delay))
        expiries[uid] = task
        task.add_done_callback(lambda _: expiries.pop(uid, None))

    @kopf.on.create(group, version, PLURAL, registry=registry)
    @kopf.on.resume(group, version, PLURAL, registry=registry)
    async def signal_seen(body: kopf.Body, **_: Any) -> None:
        plain = _plain(body)
        with metrics.timed("WorkflowSignal", expected=(kopf.TemporaryError,)):
            try:
                await handle(state, plain)
            except SignalNotYet as exc:
                delay = cfg.TREADLE_OPERATOR_RETRY_SECONDS
                raise kopf.TemporaryError(str(exc), delay=delay) from exc
            except SignalRefused:
                pass  # recorded as Failed (its deadline passed)
        schedule(plain)
