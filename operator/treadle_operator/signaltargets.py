"""What a WorkflowSignal acts on: its run, that run's World, and a hook payload.

``resolve`` turns ``spec.run`` (a WorkflowRun of the signal's namespace) or
``spec.runId`` + ``spec.deployment`` into a ``Target``: the World of that
WorkflowDeployment, the run's record, and what the deployment says about
hooks (its ``TREADLE_HOOK_TOKEN_NAMESPACE`` and, from its World Secret's
``hook-key``, the key of signed hooks). A run is only ever acted on when it is
on a revision of a WorkflowDeployment in the signal's own namespace, so a
signal cannot reach another namespace's runs through a shared World.

``payload`` reads ``spec.resumeHook`` (inline JSON, or ``payloadFrom`` a
ConfigMap key; a Secret key is refused, see there). Everything that cannot be
done is ``SignalRefused`` with a one-line reason; what time fixes is
``SignalNotYet``.

Called by ``treadle_operator.signals``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import JsonValue

from treadle import errors as engine_errors
from treadle.world import contract, ids
from treadle.world.records import RunRecord
from treadle_operator import binding, models, runs
from treadle_operator.errors import SignalNotYet, SignalRefused, WorldUnavailable
from treadle_operator.models import (
    KeyRef,
    ResumeHookSpec,
    WorkflowDeploymentSpec,
    WorkflowSignalSpec,
)
from treadle_operator.state import State

HOOK_KEY = "hook-key"  # the World Secret's optional key of signed hooks (TREADLE_HOOK_KEY)


@dataclass
class Target:
    namespace: str
    deployment: str
    world: contract.World
    wfd: dict[str, Any]
    run: RunRecord | None = None
    wfr: dict[str, Any] | None = None
    hook_namespace: str | None = None
    hook_key: str | None = None
    revisions: set[str] = field(default_factory=set)

    @property
    def run_id(self) -> str:
        assert self.run is not None
        return self.run.run_id

    def owns(self, run: RunRecord) -> bool:
        """The run is on a revision of this signal's WorkflowDeployment."""
        return run.deployment_id in self.revisions


def _env_value(wfd: dict[str, Any], name: str) -> str | None:
    for entry in (wfd.get("spec") or {}).get("env") or []:
        if isinstance(entry, dict) and entry.get("name") == name and "value" in entry:
            return str(entry["value"]) or None
    return None


async def workflow_run(state: State, namespace: str, name: str) -> dict[str, Any]:
    wfr = await state.kube.get("workflowruns", namespace, name)
    if wfr is None:
        raise SignalRefused("RunNotFound", f"WorkflowRun {namespace}/{name} not found")
    return wfr


async def resolve(
    state: State, namespace: str, spec: WorkflowSignalSpec, *, need_run: bool = True
) -> Target:
    """The run and World the signal acts on (``need_run`` False: a hook token alone will do)."""
    wfr: dict[str, Any] | None = None
    run_id = spec.run_id
    deployment = spec.deployment
    if spec.run is not None:
        wfr = await workflow_run(state, namespace, spec.run)
        deployment = str((wfr.get("spec") or {}).get("deployment") or "")
        status = models.parse_status(models.WorkflowRunStatus, wfr.get("status"))
        run_id = status.run_id
        if not run_id:
            if status.phase in models.FINISHED_PHASES:
                raise SignalRefused(
                    "RunNotStarted",
                    f"WorkflowRun {spec.run} ended {status.phase} before any run was recorded",
                )
            raise SignalNotYet("RunNotStarted", f"WorkflowRun {spec.run} has no run yet")
    if not deployment:
        raise SignalRefused("InvalidSpec", "spec.runId (or a hook token) needs spec.deployment")
    if run_id is not None and not ids.is_run_id(run_id):
        raise SignalRefused("InvalidSpec", f"spec.runId {run_id!r} is not a run id")
    try:
        world, wfd = await runs.world_of(state, namespace, deployment)
    except runs.NotYet as exc:
        if exc.reason == "DeploymentNotFound":
            raise SignalRefused("DeploymentNotFound", str(exc)) from None
        raise SignalNotYet(exc.reason, str(exc)) from None
    revisions = {
        str(r.get("id")) for r in (wfd.get("status") or {}).get("revisions") or [] if r.get("id")
    }
    target = Target(
        namespace=namespace,
        deployment=deployment,
        world=world,
        wfd=wfd,
        wfr=wfr,
        hook_namespace=_env_value(wfd, "TREADLE_HOOK_TOKEN_NAMESPACE"),
        hook_key=await _hook_key(state, namespace, wfd),
        revisions=revisions,
    )
    if run_id is None:
        if need_run:
            raise SignalRefused("InvalidSpec", "name the run: spec.run or spec.runId")
        return target
    try:
        run = await world.runs.get(run_id)
    except engine_errors.RunNotFound:
        raise SignalRefused(
            "RunNotFound", f"run {run_id} not found in the World of {deployment}"
        ) from None
    if wfr is not None:
        problem = binding.refusal(run, wfr, wfd)
        if problem is not None:
            raise SignalRefused("RunNotOwned", problem)
    elif not target.owns(run):
        raise SignalRefused(
            "RunNotOwned",
            f"run {run_id} is not on a revision of WorkflowDeployment {namespace}/{deployment}",
        )
    target.run = run
    return target


async def _hook_key(state: State, namespace: str, wfd: dict[str, Any]) -> str | None:
    spec = WorkflowDeploymentSpec.model_validate(wfd.get("spec") or {})
    try:
        data = await state.kube.secret(namespace, spec.world.secret_name)
    except WorldUnavailable:
        return None
    if data is None:
        return None
    return data.get(HOOK_KEY) or None


async def payload(state: State, namespace: str, spec: ResumeHookSpec) -> JsonValue:
    """The hook payload the signal carries, read and parsed.

    Never from a Secret: the only Secrets the operator may read are World Secrets (RBAC
    ``resourceNames``), so a ``secretKeyRef`` payload would hand the World's credentials to
    whoever may create a WorkflowSignal, and a payload is not secret anyway (it is in the
    run's log, and the run may return it)."""
    source = spec.payload_from
    if source is None:
        return spec.payload
    if spec.payload is not None:
        raise SignalRefused("InvalidSpec", "give spec.resumeHook.payload or payloadFrom, not both")
    if source.secret_key_ref is not None:
        raise SignalRefused(
            "PayloadForbidden",
            "spec.resumeHook.payloadFrom.secretKeyRef is refused: the operator reads only "
            "World Secrets, and a payload lands in the run's log; use configMapKeyRef",
        )
    ref = source.config_map_key_ref
    if ref is None:
        raise SignalRefused("InvalidSpec", "payloadFrom needs configMapKeyRef")
    where = f"ConfigMap {namespace}/{ref.name}"
    text = await _config_map_key(state, namespace, ref)
    if text is None:
        raise SignalRefused("PayloadNotFound", f"{where} has no key {ref.key}")
    try:
        parsed: JsonValue = json.loads(text)
    except ValueError as exc:
        raise SignalRefused("PayloadInvalid", f"{where} key {ref.key} is not JSON: {exc}") from None
    return parsed


async def _config_map_key(state: State, namespace: str, ref: KeyRef) -> str | None:
    try:
        found = await state.kube.core.read_namespaced_config_map(ref.name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise SignalRefused(
                "PayloadNotFound", f"ConfigMap {namespace}/{ref.name} not found"
            ) from None
        if exc.status == 403:
            raise SignalRefused(
                "PayloadForbidden", f"the operator may not read ConfigMap {namespace}/{ref.name}"
            ) from None
        raise
    value = (found.data or {}).get(ref.key)
    return None if value is None else str(value)
