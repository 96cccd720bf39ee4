"""The kopf handlers: which change of which object calls what.

Everything here is wiring; the rules live in ``deployments`` (revisions and
workers), ``runs`` (start, cancel, mirror, TTL), ``sync`` (status from the
log) and ``schedulesync`` (WorkflowSchedule as a World schedule). ``build_registry`` binds the
handlers to one operator's ``State``.

kopf keeps its own progress in annotations under ``treadle.dev`` (never in
``status``, which the CRD schema owns), and the finalizer that makes deleting a
running WorkflowRun cancel its run is ``treadle.dev/finalizer``.
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import UTC, datetime
from typing import Any

import kopf

from treadle_operator import (
    deployments,
    metrics,
    models,
    runs,
    runstart,
    schedules,
    schedulesync,
    secretcache,
    signals,
    teardown,
)
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.handlers")

G, V = models.GROUP, models.VERSION
WFD, WFR = "workflowdeployments", "workflowruns"
FINALIZER = "treadle.dev/finalizer"


def _plain(body: Any) -> dict[str, Any]:
    """A kopf body as a plain, detached dict."""
    plain: dict[str, Any] = json.loads(json.dumps(dict(body), default=str))
    return plain


def configure(settings: kopf.OperatorSettings, *, namespaced: bool = False) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="treadle.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="treadle.dev",
        key="last-handled-configuration",
        # Review R6: no copy of a run's input in kopf's annotation (kubectl's client-side
        # apply keeps one; two passed the 256 KiB annotation limit). No handler reacts to
        # spec.input (it is immutable once started: treadle_operator.admission).
        ignored_fields=["spec.input"],
    )
    settings.persistence.finalizer = FINALIZER
    settings.peering.standalone = True
    # The operator posts its own Events (phases, revisions); kopf's only for its errors.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Serving named namespaces (chart rbac.scope namespace), the operator holds no
    # cluster-wide right: kopf must not list CRDs or Namespaces, only discover its
    # resources (allowed to everyone) and watch the namespaces it was given.
    settings.scanning.disabled = namespaced
    # A timer still inside its handler when its object is marked deleted (run_ttl is:
    # its own DELETE's watch event can arrive before the call returns) is polled again
    # only after cancellation_polling, 60 s by default, and the finalizer stays that
    # long: a TTL'd WorkflowRun outlived its TTL by a minute. Look again within a second.
    settings.background.cancellation_polling = 1.0
    settings.background.instant_exit_timeout = 0.1


def build_registry(state: State) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    cfg = state.settings
    state.starts.attempt = functools.partial(runstart.attempt, state)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, namespaced=bool(state.namespaces))

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """In a Pod, its service account; elsewhere ``$KUBECONFIG`` or ``~/.kube/config``."""
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    # -- WorkflowDeployment -----------------------------------------------------------------

    async def reconcile(body: Any) -> None:
        plain = _plain(body)
        async with state.lock(plain["metadata"]["uid"]):
            fresh = await state.kube.get(
                WFD, plain["metadata"]["namespace"], plain["metadata"]["name"]
            )
            if fresh is not None:
                where = (plain["metadata"]["namespace"], plain["metadata"]["name"])
                with metrics.timed("WorkflowDeployment", done=where):
                    await deployments.reconcile(state, fresh)

    @kopf.on.create(G, V, WFD, registry=registry)
    @kopf.on.update(G, V, WFD, field="spec", registry=registry)
    @kopf.on.resume(G, V, WFD, registry=registry)
    async def deployment_changed(body: kopf.Body, **_: Any) -> None:
        await reconcile(body)

    @kopf.on.delete(G, V, WFD, registry=registry)
    async def deployment_deleted(body: kopf.Body, **_: Any) -> None:
        """spec.deletionPolicy (``teardown``): Wait for its runs, Cancel them, or Orphan them;
        then its worker Deployments go with it (owner references) and the World retires it."""
        await teardown.delete(state, _plain(body))
        metrics.forget_deployment(body["metadata"]["namespace"], body["metadata"]["name"])

    @kopf.on.event(G, V, WFD, registry=registry)
    async def deployment_seen(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        """A ready revision on a reachable World wakes the runs waiting to start on it."""
        meta = body.get("metadata") or {}
        if event.get("type") == "DELETED":
            state.forget(str(meta.get("uid")))
            return
        if teardown.serving(_plain(body)):
            state.starts.wake_deployment(str(meta.get("namespace")), str(meta.get("name")))

    @kopf.timer(G, V, WFD, interval=cfg.TREADLE_OPERATOR_RECONCILE_SECONDS, registry=registry)
    async def deployment_tick(body: kopf.Body, **_: Any) -> None:
        with secretcache.reuse():  # a periodic look: the World Secret read of 30 s ago will do
            await reconcile(body)

    # -- WorkflowRun ------------------------------------------------------------------------

    @kopf.on.create(G, V, WFR, registry=registry)
    async def run_created(body: kopf.Body, **_: Any) -> None:
        """Started by ``starts`` (one task per object, backoff while it cannot start)."""
        state.starts.submit(_plain(body))

    @kopf.on.field(G, V, WFR, field="spec.cancel", registry=registry)
    async def cancel_changed(body: kopf.Body, new: Any, **_: Any) -> None:
        if new:
            state.starts.wake(str(body.get("metadata", {}).get("uid")))  # not started yet
            await runs.cancel(state, _plain(body), "spec.cancel is true")

    @kopf.on.delete(G, V, WFR, registry=registry)
    async def run_deleted(body: kopf.Body, retry: int, **_: Any) -> None:
        """spec.onDelete Cancel (default): cancel the run first, retrying while its World
        cannot be reached (the finalizer stays); Orphan: let the run go on."""
        plain = _plain(body)
        state.starts.forget(str(plain["metadata"].get("uid")))
        run_id = (plain.get("status") or {}).get("runId")
        if (plain.get("spec") or {}).get("onDelete") == "Orphan":
            if run_id and (plain.get("status") or {}).get("phase") not in models.FINISHED_PHASES:
                await state.kube.event(plain, "Orphaned", f"run {run_id} goes on (onDelete)")
        else:
            try:
                await runs.cancel(state, plain, "its WorkflowRun was deleted", deleting=True)
            except runs.CancelPending as exc:
                if retry % 10 == 0:  # once, then every tenth try: no Event storm
                    await state.kube.event(plain, "CancelPending", str(exc), warning=True)
                raise kopf.TemporaryError(
                    str(exc), delay=cfg.TREADLE_OPERATOR_RETRY_SECONDS
                ) from exc
        if run_id:
            state.sync.untrack(run_id)

    @kopf.on.event(G, V, WFR, registry=registry)
    async def run_seen(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        plain = _plain(body)
        run_id = (plain.get("status") or {}).get("runId")
        if event.get("type") == "DELETED":
            state.starts.forget(str(plain["metadata"].get("uid")))
            if run_id:
                state.sync.untrack(run_id)
            return
        if (plain.get("metadata") or {}).get("deletionTimestamp"):
            return
        phase = (plain.get("status") or {}).get("phase")
        if not run_id and phase not in models.FINISHED_PHASES:
            state.starts.submit(plain)  # after a restart too: kopf lists every object
        else:
            await runs.follow(state, plain)

    def finished_with_ttl(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
        return (
            spec.get("ttlSecondsAfterFinished") is not None
            and status.get("phase") in models.FINISHED_PHASES
        )

    @kopf.timer(
        G,
        V,
        WFR,
        interval=cfg.TREADLE_OPERATOR_TTL_CHECK_SECONDS,
        when=finished_with_ttl,
        registry=registry,
    )
    async def run_ttl(body: kopf.Body, **_: Any) -> None:
        plain = _plain(body)
        if runs.expired(plain, datetime.now(UTC)):
            meta = plain["metadata"]
            log.info(
                "WorkflowRun %s/%s finished and its TTL passed", meta["namespace"], meta["name"]
            )
            await state.kube.delete(WFR, meta["namespace"], meta["name"])

    signals.register(registry, state)  # WorkflowSignal: docs/operator-day2.md

    # -- WorkflowSchedule (schedulesync: put as a World schedule, synced from there) ------------

    async def schedule_sync(body: Any) -> None:
        plain = _plain(body)
        async with state.lock(plain["metadata"]["uid"]):
            fresh = await state.kube.get(
                schedules.PLURAL, plain["metadata"]["namespace"], plain["metadata"]["name"]
            )
            if fresh is not None and not fresh["metadata"].get("deletionTimestamp"):
                await schedulesync.reconcile(state, fresh)

    @kopf.on.create(G, V, schedules.PLURAL, registry=registry)
    @kopf.on.update(G, V, schedules.PLURAL, field="spec", registry=registry)
    @kopf.on.resume(G, V, schedules.PLURAL, registry=registry)
    async def schedule_changed(body: kopf.Body, **_: Any) -> None:
        await schedule_sync(body)

    @kopf.timer(
        G, V, schedules.PLURAL, interval=cfg.TREADLE_OPERATOR_SCHEDULE_SYNC_SECONDS,
        registry=registry,
    )  # fmt: skip
    async def schedule_tick(body: kopf.Body, **_: Any) -> None:
        await schedule_sync(body)

    @kopf.on.delete(G, V, schedules.PLURAL, registry=registry)
    async def schedule_deleted(body: kopf.Body, **_: Any) -> None:
        """Its World schedule goes with it (retried while the World cannot be reached)."""
        try:
            await schedulesync.delete(state, _plain(body))
            state.forget(str(body.get("metadata", {}).get("uid")))
        except runs.NotYet as exc:
            raise kopf.TemporaryError(str(exc), delay=cfg.TREADLE_OPERATOR_RETRY_SECONDS) from exc

    return registry
