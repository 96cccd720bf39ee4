"""WorkflowRun: start once, track, cancel, mirror, expire.

Starting is idempotent across retries and operator restarts: the run id is
chosen and written to ``status.runId`` *before* the run is recorded, and the
World's ``runs.create`` with an existing id returns that run. So a handler
that dies anywhere in between, retried, starts the same run, never a second.

The run id derives from the object (``binding.run_id``: namespace, name and
``spec.runKey``). A WorkflowRun deleted (by TTL or by hand) and applied again
finds the run that exists and *adopts* it (its binding checked, status synced
from it, nothing started): GitOps self-heal never re-runs a workflow.

Deleting a WorkflowRun cancels its run (``spec.onDelete: Cancel``, the
default) or leaves it running (``Orphan``). A cancel that cannot reach the
World raises ``CancelPending``: the handler keeps the finalizer and retries,
with a Warning Event, instead of letting the run go on unseen (review R8).

Everything a start can be refused for is checked before anything is recorded:
an unknown workflow, input that is not an object or array, arguments the
workflow's signature cannot take (from the catalogue its workers registered).
Those end the object in phase ``Failed`` with the reason; problems that time
fixes (no such WorkflowDeployment yet, no ready revision, the World's Secret
missing) leave it ``Pending`` with a condition, and are retried.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from treadle import errors as engine_errors
from treadle import limits, payloads
from treadle.client import start_run
from treadle.sdk import catalogue, functions
from treadle.world import contract, events
from treadle.world.records import RunRecord
from treadle_operator import admission, binding, inputs, metrics, models, runstatus, specmint
from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.errors import WorldUnavailable
from treadle_operator.models import WorkflowDeploymentSpec, WorkflowRunSpec, WorkflowRunStatus
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.runs")

PLURAL = "workflowruns"
MIRRORED = "treadle.dev/mirrored-run"
INPUT_OMITTED = "treadle.dev/input-omitted"  # a mirrored run's input too large to show
STARTED_BY = binding.STARTED_BY


class NotYet(Exception):
    """The run cannot start yet (retried); the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class CancelPending(Exception):
    """A deleted WorkflowRun's run could not be cancelled yet (the World is unreachable)."""


def _status(body: dict[str, Any]) -> WorkflowRunStatus:
    return models.parse_status(WorkflowRunStatus, body.get("status"))


async def _patch(state: State, body: dict[str, Any], status: WorkflowRunStatus) -> None:
    meta = body["metadata"]
    shown = runstatus.present_for(body, status)
    await label(state, body, shown)  # before the status, as in sync: they never disagree
    await state.kube.patch_status(PLURAL, meta["namespace"], meta["name"], models.dump(shown))


async def label(state: State, body: dict[str, Any], status: WorkflowRunStatus) -> None:
    """Bring the object's deployment, revision and phase labels up to date."""
    meta = body["metadata"]
    deployment = str((body.get("spec") or {}).get("deployment") or "")
    patch = runstatus.label_patch(body, runstatus.labels(deployment, status))
    if patch:
        await state.kube.patch_labels(PLURAL, meta["namespace"], meta["name"], patch)
        have = dict(meta.get("labels") or {})
        have.update({k: v for k, v in patch.items() if v is not None})
        meta["labels"] = {k: v for k, v in have.items() if patch.get(k, v) is not None}


async def waiting(state: State, body: dict[str, Any], exc: NotYet) -> None:
    """The object stays Pending and says why (``Started`` False with the reason)."""
    current = _status(body)
    pending = current.model_copy(
        update={
            "phase": "Pending",
            "reason": exc.reason,
            "conditions": started(current, False, exc.reason, str(exc)),
        }
    )
    shown = runstatus.present(pending, body["metadata"].get("generation"))
    if shown != current:
        await _patch(state, body, pending)


async def world_of(
    state: State, namespace: str, deployment: str
) -> tuple[contract.World, dict[str, Any]]:
    """The World of a WorkflowDeployment, and the object; ``NotYet`` when either is missing."""
    wfd = await state.kube.get("workflowdeployments", namespace, deployment)
    if wfd is None:
        raise NotYet("DeploymentNotFound", f"WorkflowDeployment {namespace}/{deployment} not found")
    spec = WorkflowDeploymentSpec.model_validate(wfd.get("spec") or {})
    try:
        world = await state.worlds.get(namespace, spec.world)
        # Inputs are encoded (and checked) under the deployment's own payload keys, in
        # this handler's task: encrypted as its workers encrypt, never stored plaintext.
        payloads.use(await state.worlds.payload_keys(namespace, spec.world))
    except WorldUnavailable as exc:
        raise NotYet("WorldUnavailable", str(exc)) from exc
    return world, wfd


def arguments(value: Any) -> tuple[list[Any], dict[str, Any]] | str:
    """``spec.input`` as call arguments, or why it cannot be."""
    if value is None:
        return [], {}
    if isinstance(value, dict):
        return [], dict(value)
    if isinstance(value, list):
        return list(value), {}
    return f"spec.input must be an object (keyword arguments) or an array, not {value!r}"


async def start(state: State, body: dict[str, Any]) -> None:
    """Start the run this WorkflowRun asks for (or pick up the one already started)."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    spec = WorkflowRunSpec.model_validate(body.get("spec") or {})
    status = _status(body)
    if status.phase in models.FINISHED_PHASES:
        return
    annotated = (meta.get("annotations") or {}).get(MIRRORED)
    adopting = bool(annotated) and not status.run_id
    if adopting:
        status = status.model_copy(update={"run_id": str(annotated), "mirrored": True})

    world, wfd = await world_of(state, namespace, spec.deployment)
    if status.run_id:
        run_id = status.run_id
        try:
            run = await world.runs.get(run_id)
        except engine_errors.RunNotFound:
            if adopting:
                await refuse(state, body, f"run {status.run_id} does not exist")
                return
            if status.mirrored or not status.revision:
                raise
            # Chosen and recorded here, then the handler stopped before the run was.
            spec, _ = await judged_input(state, body, spec, wfd)
            version = _spec_version(wfd, world)
            status = await _record_on_latest(state, world, body, spec, status, version)
        else:
            foreign = binding.refusal(run, body, wfd)
            if foreign is not None:
                await refuse(state, body, foreign)
                return
        if adopting:
            # A mirror's first status (run id, phase, labels) is written by the sync's
            # first refresh, in one patch (R5 (e)).
            state.sync.track(run_id, world, body, status, payloads.active(), shown=_status(body))
            return
        state.sync.track(run_id, world, body, status, payloads.active())
        return

    run_id = binding.run_id(namespace, meta["name"], spec.run_key)
    try:
        existing = await world.runs.get(run_id)
    except engine_errors.RunNotFound:
        pass
    else:
        await adopt(state, world, body, wfd, existing)
        return

    if spec.cancel:
        await cancelled_before_start(state, body)
        return
    if (wfd.get("metadata") or {}).get("deletionTimestamp"):  # review R7: it drains
        raise NotYet(
            "DeploymentDeleting",
            f"WorkflowDeployment {namespace}/{spec.deployment} is being deleted: no new runs",
        )
    revision = (wfd.get("status") or {}).get("latestRevision")
    if not revision:
        raise NotYet(
            "NoReadyRevision", f"WorkflowDeployment {spec.deployment} has no ready revision yet"
        )
    record = await world.deployments.get(revision)
    served = record.catalogue if record is not None else None
    spec, problem = await judged_input(state, body, spec, wfd)
    problem = problem or refusal(served, spec, revision)
    if problem is not None:
        reason, message = problem
        failed = status.model_copy(
            update={
                "phase": "Failed",
                "reason": reason,
                "revision": revision,
                "error": models.RunError(type=reason, message=message),
                "completed_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "conditions": started(status, False, reason, message),
            }
        )
        await _patch(state, body, failed)
        await state.kube.event(body, reason, message, warning=True)
        return
    chosen = status.model_copy(
        update={
            "run_id": run_id,
            "revision": revision,
            "phase": "Pending",
            "reason": "Starting",
            "error": None,
            "conditions": started(status, True, "RunRecorded", f"run {run_id} on {revision}"),
        }
    )
    version = _spec_version(wfd, world)
    if not await claim(state, body, chosen):
        return  # another operator claimed the object first: it is followed
    chosen = await _record_on_latest(state, world, body, spec, chosen, version)
    metrics.RUNS_STARTED.inc(namespace=namespace)
    await state.kube.event(body, "Started", f"run {run_id} started on revision {chosen.revision}")
    state.sync.track(run_id, world, body, chosen, payloads.active())


def _spec_version(wfd: dict[str, Any], world: contract.World) -> int:
    """The format the run is minted in: the deployment's WORKFLOW_SPEC_VERSION (specmint)."""
    try:
        return specmint.version_for(
            WorkflowDeploymentSpec.model_validate(wfd.get("spec") or {}), world.capabilities
        )
    except specmint.InvalidSpecVersion as exc:
        raise NotYet("InvalidSpecVersion", str(exc)) from None


async def claim(state: State, body: dict[str, Any], chosen: WorkflowRunStatus) -> bool:
    """Write the chosen run id, only onto the object as just read (review R4).

    The status patch carries the object's ``resourceVersion``: of two operators
    claiming at once, one wins; the other gets 409, reads the object again and
    follows the run the winner claimed. ``False`` when the object was claimed
    (or deleted) by someone else.
    """
    meta = body["metadata"]
    for _ in range(3):
        fresh = await state.kube.get(PLURAL, meta["namespace"], meta["name"])
        if fresh is None:
            return False
        if _status(fresh).run_id:
            log.info("WorkflowRun %s claimed meanwhile: following its run", _name(body))
            await follow(state, fresh)
            return False
        shown = runstatus.present(chosen, fresh["metadata"].get("generation"))
        version = fresh["metadata"].get("resourceVersion")
        try:
            done = await state.kube.patch_status(
                PLURAL,
                meta["namespace"],
                meta["name"],
                models.dump(shown),
                resource_version=version,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            continue  # changed since read (kopf's own annotations, or another claim)
        if not done:
            return False
        await label(state, fresh, shown)
        body["metadata"] = fresh["metadata"]
        return True
    raise NotYet("ClaimConflict", f"WorkflowRun {_name(body)} kept changing while being claimed")


async def _record_on_latest(
    state: State,
    world: contract.World,
    body: dict[str, Any],
    spec: WorkflowRunSpec,
    status: WorkflowRunStatus,
    spec_version: int,
) -> WorkflowRunStatus:
    """Record the claimed run; on a revision retired meanwhile, on the new latest (R1).

    The World refuses a new run on a retired revision (``DeploymentRetired``,
    nothing recorded): the WorkflowDeployment is read again and the run, same id,
    goes to its ``latestRevision``, written to the object first.
    """
    assert status.run_id is not None
    assert status.revision is not None
    for _ in range(3):
        try:
            await _record_run(
                state, world, body, spec, status.run_id, status.revision, spec_version
            )
            return status
        except engine_errors.DeploymentRetired:
            meta = body["metadata"]
            wfd = await state.kube.get("workflowdeployments", meta["namespace"], spec.deployment)
            newer = ((wfd or {}).get("status") or {}).get("latestRevision")
            if not newer or newer == status.revision:
                raise NotYet(
                    "RevisionRetired",
                    f"revision {status.revision} retired before run {status.run_id} was "
                    "recorded; waiting for a newer latest revision",
                ) from None
            log.info(
                "run %s: revision %s retired meanwhile; starting on %s",
                status.run_id,
                status.revision,
                newer,
            )
            message = f"run {status.run_id} on {newer} ({status.revision} retired meanwhile)"
            status = status.model_copy(
                update={
                    "revision": newer,
                    "conditions": started(status, True, "RunRecorded", message),
                }
            )
            await _patch(state, body, status)
    raise NotYet("RevisionRetired", f"run {status.run_id}: every latest revision retired")


async def adopt(
    state: State,
    world: contract.World,
    body: dict[str, Any],
    wfd: dict[str, Any],
    run: RunRecord,
) -> None:
    """The object's run exists (it was deleted and applied again): show it, start nothing."""
    problem = binding.refusal(run, body, wfd)
    if problem is not None:
        await refuse(state, body, problem)
        return
    status = _status(body)
    message = f"run {run.run_id} on {run.deployment_id} existed: adopted, nothing started"
    adopted = status.model_copy(
        update={
            "run_id": run.run_id,
            "revision": run.deployment_id,
            "reason": "Adopted",
            "error": None,
            "conditions": started(status, True, "RunAdopted", message),
        }
    )
    await _patch(state, body, adopted)
    await state.kube.event(body, "Adopted", message)
    log.info("run %s adopted by WorkflowRun %s", run.run_id, _name(body))
    state.sync.track(run.run_id, world, body, adopted, payloads.active())


async def cancelled_before_start(state: State, body: dict[str, Any]) -> None:
    """``spec.cancel`` before any run: end the object ``Cancelled``, its ``completedAt`` now
    (its TTL counts from the cancel, review R13), without asking the World."""
    cancelled = _status(body).model_copy(
        update={
            "phase": "Cancelled",
            "reason": "CancelledBeforeStart",
            "completed_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    await _patch(state, body, cancelled)


def _name(body: dict[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def started(
    status: WorkflowRunStatus, ok: bool, reason: str, message: str
) -> list[models.Condition]:
    """The object's conditions with ``Started`` set."""
    return merge_conditions(status.conditions, [condition("Started", ok, reason, message)]) + [
        c for c in status.conditions if c.type != "Started"
    ]


async def refuse(state: State, body: dict[str, Any], problem: str) -> None:
    """End the object ``Failed`` without touching the run it named (review M6)."""
    meta = body["metadata"]
    log.warning("WorkflowRun %s/%s refused: %s", meta["namespace"], meta["name"], problem)
    status = _status(body)
    refused = status.model_copy(
        update={
            "run_id": None,
            "mirrored": False,
            "phase": "Failed",
            "reason": "RunNotOwned",
            "error": models.RunError(type="RunNotOwned", message=problem),
            "completed_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "conditions": started(status, False, "RunNotOwned", problem),
        }
    )
    await _patch(state, body, refused)
    await state.kube.event(body, "RunNotOwned", problem, warning=True)


async def judged_input(
    state: State, body: dict[str, Any], spec: WorkflowRunSpec, wfd: dict[str, Any]
) -> tuple[WorkflowRunSpec, tuple[str, str] | None]:
    """``spec`` with its input read from ``inputFrom``, and why it can never start, if so.

    The admission rules again (``admission.spec_problems``, the inline size limit), for
    objects written while the webhook was off; ``NotYet`` while the input cannot be read.
    """
    raw = spec.model_dump(mode="json", by_alias=True)
    problems = admission.spec_problems(raw)
    size = None if spec.input_from else admission.inline_size_problem(spec.input)
    if size is not None:
        problems.append(size)
    if problems:
        return spec, ("InvalidInput", problems[0])
    world_secret = WorkflowDeploymentSpec.model_validate(wfd.get("spec") or {}).world.secret_name
    try:
        meta = body["metadata"]
        read = await inputs.resolve(state, meta["namespace"], meta["name"], spec, world_secret)
    except inputs.InputNotReady as exc:
        raise NotYet(exc.reason, str(exc)) from exc
    except inputs.InputRefused as exc:
        return spec, (exc.reason, str(exc))
    return read, None


def refusal(served: Any, spec: WorkflowRunSpec, revision: str) -> tuple[str, str] | None:
    """Why this run must not start on ``revision`` (reason, message), or ``None``."""
    if isinstance(served, dict) and spec.workflow not in served:
        known = ", ".join(sorted(served)) or "none"
        return (
            "UnknownWorkflow",
            f"revision {revision} serves no workflow {spec.workflow!r} (it serves: {known})",
        )
    call = arguments(spec.input)
    if isinstance(call, str):
        return "InvalidInput", call
    args, kwargs = call
    entry = served.get(spec.workflow) if isinstance(served, dict) else None
    problem = catalogue.check_arguments(catalogue.signature_of(entry), args, kwargs)
    if problem is not None:
        return "InvalidInput", f"workflow {spec.workflow} cannot take spec.input: {problem}"
    try:  # the engine's limits (depth, size, NUL), before anything is recorded
        data = functions.encode_arguments(tuple(args), kwargs, f"workflow {spec.workflow}")
        limits.check_value(data, f"workflow {spec.workflow} input", envelope=2)
    except engine_errors.SerializationError as exc:
        return "InvalidInput", f"spec.input: {exc}"
    return None


async def _record_run(
    state: State,
    world: contract.World,
    body: dict[str, Any],
    spec: WorkflowRunSpec,
    run_id: str,
    revision: str,
    spec_version: int,
) -> None:
    call = arguments(spec.input)
    assert not isinstance(call, str)
    args, kwargs = call
    meta = body["metadata"]
    await start_run(
        world,
        name=spec.workflow,
        data=functions.encode_arguments(tuple(args), kwargs, f"workflow {spec.workflow}"),
        deployment_id=revision,
        spec_version=spec_version,
        run_id=run_id,
        attributes=binding.attributes(
            meta["namespace"], meta["name"], spec.deployment, spec.run_key
        ),
    )
    log.info(
        "run %s of %s started on %s for %s/%s",
        run_id,
        spec.workflow,
        revision,
        meta["namespace"],
        meta["name"],
    )


async def cancel(
    state: State, body: dict[str, Any], reason: str, *, deleting: bool = False
) -> None:
    """Cancel the run (if it has one and it has not ended).

    ``deleting``: the object is going away. Its WorkflowDeployment gone, the run
    is let go with a Warning Event (nothing can reach its World); the World
    unreachable, ``CancelPending`` is raised so the finalizer stays and the
    handler retries.
    """
    status = _status(body)
    if not status.run_id or status.phase in models.FINISHED_PHASES:
        return
    spec = WorkflowRunSpec.model_validate(body.get("spec") or {})
    try:
        world, wfd = await world_of(state, body["metadata"]["namespace"], spec.deployment)
    except NotYet as exc:
        if deleting and exc.reason == "DeploymentNotFound":
            await state.kube.event(
                body,
                "RunOrphaned",
                f"run {status.run_id} not cancelled: {exc}; it may go on",
                warning=True,
            )
            return
        if deleting:
            raise CancelPending(f"cannot cancel run {status.run_id} yet: {exc}") from exc
        log.warning("cannot cancel run %s: %s", status.run_id, exc)
        return
    try:
        run = await world.runs.get(status.run_id)
    except engine_errors.RunNotFound:
        return  # never recorded: nothing to cancel
    except Exception as exc:
        if deleting:
            raise CancelPending(f"cannot cancel run {status.run_id} yet: {exc}") from exc
        raise
    problem = binding.refusal(run, body, wfd)
    if problem is not None:
        log.warning("not cancelling run %s: %s", status.run_id, problem)
        await state.kube.event(body, "CancelRefused", problem, warning=True)
        return
    try:
        await world.events.create(status.run_id, events.RunCancelled(reason=reason), in_band=False)
    except (engine_errors.RunExpired, engine_errors.RunNotFound, engine_errors.WorldContractError):
        return  # ended (or never recorded) meanwhile: nothing to cancel
    except Exception as exc:
        if deleting:
            raise CancelPending(f"cannot cancel run {status.run_id} yet: {exc}") from exc
        raise
    await state.kube.event(body, "Cancelling", f"run {status.run_id}: {reason}")
    state.sync.poke(status.run_id)


async def follow(state: State, body: dict[str, Any]) -> None:
    """Track an object's run after a restart (kopf lists every object when it starts)."""
    status = _status(body)
    if not status.run_id:
        return
    if state.sync.tracks(status.run_id):
        state.sync.update_body(status.run_id, body)
        return
    if status.phase in models.FINISHED_PHASES:
        return
    spec = WorkflowRunSpec.model_validate(body.get("spec") or {})
    try:
        world, wfd = await world_of(state, body["metadata"]["namespace"], spec.deployment)
        run = await world.runs.get(status.run_id)
    except NotYet:
        return
    except engine_errors.RunNotFound:
        if not status.mirrored and status.revision:
            # Chosen, then the operator stopped before recording it: start records it.
            state.starts.submit(body)
        return
    problem = binding.refusal(run, body, wfd)
    if problem is not None:
        await refuse(state, body, problem)
        return
    state.sync.track(status.run_id, world, body, status, payloads.active())


def expired(body: dict[str, Any], now: datetime) -> bool:
    """A finished run whose ``ttlSecondsAfterFinished`` has passed."""
    spec = WorkflowRunSpec.model_validate(body.get("spec") or {})
    status = _status(body)
    if spec.ttl_seconds_after_finished is None or status.phase not in models.FINISHED_PHASES:
        return False
    stamps = [status.completed_at, (body.get("metadata") or {}).get("creationTimestamp")]
    # An object that adopted a finished run lives its TTL from when it was made, so a
    # GitOps tool re-applying it does not see it vanish at once, again and again.
    times = [
        datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        for stamp in stamps
        if isinstance(stamp, str) and stamp
    ]
    if not times:
        return True
    # No completedAt (an object cancelled before its start by an older operator): the TTL
    # counts from its creation, never "expired at the first check" (review R13).
    return (now - max(times)).total_seconds() >= spec.ttl_seconds_after_finished
