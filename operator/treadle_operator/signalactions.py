"""The four WorkflowSignal actions: ResumeHook, Wake, Rerun, Cancel.

Each takes the signal (its body, parsed spec and status) and returns an
``Outcome`` (reason, message, status fields) or raises ``SignalRefused`` /
``SignalNotYet``. World writes carry the idempotency key
``treadle.dev/signal/<uid>``; a resume's hook and a rerun's name are claimed in
status (``patch``) before the write, so a restart in between converges on the
same hook or object. ``treadle_operator.signals`` runs them once per signal.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from treadle import errors as engine_errors
from treadle import hookresume, hooktokens, serde
from treadle import runwrites as out_of_band
from treadle.orchestrator import children as child_effects
from treadle.world import events, messages
from treadle.world.records import HookRecord
from treadle_operator import models, signaltargets
from treadle_operator.errors import SignalRefused
from treadle_operator.models import ResumeHookSpec, WorkflowSignalSpec, WorkflowSignalStatus
from treadle_operator.progress import RunView
from treadle_operator.signaltargets import Target
from treadle_operator.state import State

PLURAL = "workflowsignals"
KEY_PREFIX = "treadle.dev/signal/"
RERUN_OF = "treadle.dev/rerun-of"  # label on a rerun: the WorkflowRun it reruns
RERUN_BY = "treadle.dev/rerun-by-signal"  # annotation on a rerun: the signal's uid


@dataclass(frozen=True)
class Outcome:
    reason: str
    message: str
    update: dict[str, Any] = field(default_factory=dict)


Action = Callable[
    [State, dict[str, Any], WorkflowSignalSpec, WorkflowSignalStatus], Awaitable[Outcome]
]


def status_of(body: dict[str, Any]) -> WorkflowSignalStatus:
    return models.parse_status(WorkflowSignalStatus, body.get("status"))


def where(body: dict[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _key(body: dict[str, Any]) -> str:
    return KEY_PREFIX + str(body["metadata"]["uid"])


async def patch(state: State, body: dict[str, Any], status: WorkflowSignalStatus) -> None:
    """Write the signal's status (and keep ``body`` in step)."""
    meta = body["metadata"]
    shown = status.model_copy(update={"observed_generation": meta.get("generation")})
    await state.kube.patch_status(PLURAL, meta["namespace"], meta["name"], models.dump(shown))
    body["status"] = models.dump(shown)


# -- ResumeHook -----------------------------------------------------------------------------


def _bare(stored: str, namespace: str | None) -> str:
    """The token as the workflow (and a signature) gave it."""
    if namespace and stored.startswith(namespace + "/"):
        return stored[len(namespace) + 1 :]
    return hooktokens.bare(stored)


async def _view(target: Target) -> RunView:
    view = RunView()
    while True:
        page = await target.world.events.list(target.run_id, after_slot=view.after_slot)
        for logged in page.events:
            view.apply(logged)
        if not page.has_more or not page.events:
            return view


async def _find_hook(target: Target, spec: ResumeHookSpec) -> HookRecord:
    world = target.world
    if spec.token is not None:
        tried = [hooktokens.stored(spec.token, target.hook_namespace)]
        if target.hook_namespace:
            tried.append(spec.token)
        for stored in tried:
            try:
                hook = await world.hooks.get_by_token(stored)
            except engine_errors.HookNotFound:
                continue
            if target.run is not None and hook.run_id != target.run_id:
                raise SignalRefused(
                    "HookNotOnRun", f"hook {spec.token!r} belongs to run {hook.run_id}, "
                    f"not to run {target.run_id}",
                )  # fmt: skip
            if target.run is None and not target.owns(await world.runs.get(hook.run_id)):
                break  # another deployment's hook: as good as none
            return hook
        raise SignalRefused("HookNotFound", f"no open hook holds token {spec.token!r}")
    view = await _view(target)
    open_hooks = view.hooks  # correlation id -> stored token
    if spec.hook is not None:
        token = open_hooks.get(spec.hook)
        if token is None:
            raise SignalRefused(
                "HookNotFound", f"run {target.run_id} has no open hook {spec.hook!r}"
            )
    elif len(open_hooks) == 1:
        token = next(iter(open_hooks.values()))
    elif not open_hooks:
        raise SignalRefused("HookNotFound", f"run {target.run_id} has no open hook")
    else:
        shown = ", ".join(sorted(open_hooks.values())[:5])
        raise SignalRefused(
            "AmbiguousHook",
            f"run {target.run_id} has {len(open_hooks)} open hooks ({shown}...): name one "
            "with spec.resumeHook.token or spec.resumeHook.hook",
        )
    try:
        return await world.hooks.get_by_token(token)
    except engine_errors.HookNotFound:
        raise SignalRefused("HookNotFound", f"hook {token!r} is no longer open") from None


async def resume_hook(
    state: State, body: dict[str, Any], spec: WorkflowSignalSpec, status: WorkflowSignalStatus
) -> Outcome:
    hook_spec = spec.resume_hook or ResumeHookSpec()
    if hook_spec.token is not None and hook_spec.hook is not None:
        raise SignalRefused("InvalidSpec", "give spec.resumeHook.token or .hook, not both")
    namespace = body["metadata"]["namespace"]
    target = await signaltargets.resolve(state, namespace, spec, need_run=hook_spec.token is None)
    value = await signaltargets.payload(state, namespace, hook_spec)
    try:
        data = serde.encode(value, "spec.resumeHook payload")
    except engine_errors.SerializationError as exc:
        raise SignalRefused("PayloadInvalid", str(exc)) from None
    if status.hook_id and status.hook_token and status.run_id:
        # Claimed before a restart: the same write again converges (idempotency key).
        hook = HookRecord(status.hook_token, status.run_id, status.hook_id, datetime.now(UTC))
    else:
        hook = await _find_hook(target, hook_spec)
        bare = hook_spec.token or _bare(hook.token, target.hook_namespace)
        given = hook_spec.signature
        if given is None and hooktokens.requires_signature(hook.metadata) and target.hook_key:
            given = hooktokens.signature(bare, target.hook_key)  # the operator vouches
        try:
            hooktokens.check_signature(bare, hook.metadata, given, target.hook_key)
        except engine_errors.HookSignatureInvalid as exc:
            raise SignalRefused("SignatureInvalid", str(exc)) from None
        claimed = status.model_copy(
            update={"run_id": hook.run_id, "hook_id": hook.hook_id, "hook_token": hook.token,
                    "reason": "Resuming", "message": f"resuming hook {hook.token!r}"}
        )  # fmt: skip
        await patch(state, body, claimed)
    received = events.HookReceived(correlation_id=hook.hook_id, payload=data)
    try:
        await target.world.events.create(
            hook.run_id, received, in_band=False, idempotency_key=_key(body)
        )
    except (engine_errors.HookNotFound, engine_errors.RunExpired, engine_errors.RunNotFound):
        raise SignalRefused(
            "HookNotFound",
            f"hook {hook.token!r} is no longer open (resumed, disposed, or its run ended)",
        ) from None
    message = f"hook {hook.token!r} of run {hook.run_id} resumed"
    try:
        await hookresume.wake(target.world, hook.token, hook.run_id)
    except engine_errors.HookWakeFailed as exc:
        message += f" (its wake failed: {exc}; the run reads the payload on its next delivery)"
    update = {"run_id": hook.run_id, "hook_id": hook.hook_id, "hook_token": hook.token}
    return Outcome("HookResumed", message, update)


# -- Wake and Cancel ------------------------------------------------------------------------


def _ended(target: Target) -> SignalRefused:
    assert target.run is not None
    return SignalRefused(
        "RunEnded", f"run {target.run_id} has ended ({target.run.status}): nothing to do"
    )


async def _live_target(
    state: State, body: dict[str, Any], spec: WorkflowSignalSpec
) -> signaltargets.Target:
    """The signal's run, which must not have ended (``RunEnded`` otherwise)."""
    target = await signaltargets.resolve(state, body["metadata"]["namespace"], spec)
    assert target.run is not None
    if target.run.is_terminal:
        raise _ended(target)
    return target


async def _append(target: signaltargets.Target, body: dict[str, Any], event: events.Event) -> None:
    """One out-of-band event for the signal's run, keyed by the signal (done once)."""
    try:
        await target.world.events.create(
            target.run_id, event, in_band=False, idempotency_key=_key(body)
        )
    except engine_errors.RunExpired:
        raise _ended(target) from None


async def wake(
    state: State, body: dict[str, Any], spec: WorkflowSignalSpec, status: WorkflowSignalStatus
) -> Outcome:
    target = await _live_target(state, body, spec)
    waits = spec.wake.waits if spec.wake is not None else None
    open_waits = set((await _view(target)).waits)
    asked = open_waits if waits is None else open_waits & set(waits)
    run = target.run
    assert run is not None
    if out_of_band.completes_waits_itself(run):
        # A spec 8 run never receives a wake_requested: its waits are completed here.
        done = await out_of_band.complete_waits(target.world, run, sorted(asked))
        plural = "sleep" if done == 1 else "sleeps"
        ended = f"ended {done} {plural} of run {run.run_id}"
        return Outcome("Woken", ended, {"run_id": run.run_id})
    await _append(target, body, events.WakeRequested(waits=waits))
    await target.world.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=run.deployment_id, run_spec_version=run.spec_version
        )
    )
    plural = "sleep" if len(asked) == 1 else "sleeps"
    return Outcome(
        "Woken", f"asked {len(asked)} {plural} of run {run.run_id} to end", {"run_id": run.run_id}
    )


async def cancel(
    state: State, body: dict[str, Any], spec: WorkflowSignalSpec, status: WorkflowSignalStatus
) -> Outcome:
    target = await _live_target(state, body, spec)
    reason = (spec.cancel.reason if spec.cancel else None) or f"WorkflowSignal {where(body)}"
    await _append(target, body, events.RunCancelled(reason=reason))
    await child_effects.after_end(target.world, target.run_id)  # child workflows' policy
    if state.sync.tracks(target.run_id):
        state.sync.poke(target.run_id)
    return Outcome(
        "Cancelled", f"run {target.run_id} cancelled: {reason}", {"run_id": target.run_id}
    )


# -- Rerun ----------------------------------------------------------------------------------

RERUNNABLE = frozenset({"Failed", "Cancelled"})


async def _free_name(state: State, namespace: str, run: str) -> str:
    stem = run[:230]
    for n in range(1, 1000):
        name = f"{stem}-rerun-{n}"
        if await state.kube.get("workflowruns", namespace, name) is None:
            return name
    raise SignalRefused("RerunExists", f"WorkflowRun {run} has been rerun 999 times")


async def rerun(
    state: State, body: dict[str, Any], spec: WorkflowSignalSpec, status: WorkflowSignalStatus
) -> Outcome:
    if spec.run is None:
        raise SignalRefused("InvalidSpec", "Rerun needs spec.run (the WorkflowRun to run again)")
    namespace = body["metadata"]["namespace"]
    wfr = await signaltargets.workflow_run(state, namespace, spec.run)
    old = models.parse_status(models.WorkflowRunStatus, wfr.get("status"))
    if not status.created_run and old.phase not in RERUNNABLE:
        raise SignalRefused(
            "RunNotRerunnable",
            f"WorkflowRun {spec.run} is {old.phase}: only a Failed or Cancelled run is rerun",
        )
    new_spec = {k: v for k, v in (wfr.get("spec") or {}).items() if k not in ("runKey", "cancel")}
    if spec.rerun is not None and "input" in spec.rerun.model_fields_set:
        new_spec["input"] = spec.rerun.input
        new_spec.pop("inputFrom", None)
    name = status.created_run or (spec.rerun.name if spec.rerun else None)
    if not name:
        name = await _free_name(state, namespace, spec.run)
    if not status.created_run:  # claimed first: a restart creates this name, not another
        await patch(state, body, status.model_copy(update={"created_run": name}))
    uid = str(body["metadata"]["uid"])
    metadata: dict[str, Any] = {"name": name, "annotations": {RERUN_BY: uid}}
    if len(spec.run) <= 63:
        metadata["labels"] = {RERUN_OF: spec.run}
    made = {"apiVersion": models.API_VERSION, "kind": "WorkflowRun", "metadata": metadata,
            "spec": new_spec}  # fmt: skip
    try:
        await state.kube.create("workflowruns", namespace, made)
    except ApiException as exc:
        if exc.status != 409:
            detail = _api_message(exc)
            raise SignalRefused("RerunRefused", f"WorkflowRun {name}: {detail}") from None
        existing = await state.kube.get("workflowruns", namespace, name) or {}
        mine = ((existing.get("metadata") or {}).get("annotations") or {}).get(RERUN_BY)
        if mine != uid:
            raise SignalRefused("RerunExists", f"WorkflowRun {name} exists already") from None
    update = {"created_run": name, "run_id": old.run_id}
    return Outcome("Rerun", f"WorkflowRun {name} reruns {spec.run}", update)


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


ACTIONS: dict[str, Action] = {
    "ResumeHook": resume_hook,
    "Wake": wake,
    "Rerun": rerun,
    "Cancel": cancel,
}
