"""Which run a WorkflowRun may track or cancel: the binding recorded on the run.

Security review M6: a user-written annotation (``treadle.dev/mirrored-run``) or
a forged ``status.runId`` must not let one WorkflowRun adopt, read or cancel
another's run, least of all one in another namespace sharing the World. So the
operator decides from the *run* (what the World recorded when it was created),
never from what a user wrote on the object:

- A run the operator starts for a WorkflowRun carries two run attributes,
  written through ``runs.create`` (the World contract) before anything else:
  ``treadle.dev/binding`` = ``{"namespace", "name", "deployment"}`` and the
  older ``treadle.dev/workflowrun`` = ``"namespace/name"``. Only the object of
  that namespace and name, naming that WorkflowDeployment, may track or cancel
  it. With a ``spec.runKey`` the binding carries it too (``runKey``), and the
  object must name the same key. Re-applying the same object (GitOps)
  therefore adopts its own run and nothing else. The run id itself derives
  from the same identity (``run_id``), so a re-applied object finds its run.
- A run started from code carries no binding. A WorkflowRun may show it only
  as the mirror of its own deployment: the run's deployment id must be one of
  the revisions in that WorkflowDeployment's status (revision ids are digests
  of namespace, name and uid, and status is written by the operator alone), and
  the object must be in that deployment's namespace under the name the mirror
  gives it (``mirror_name``), or, for a run a WorkflowSchedule fired (its
  ``treadle.schedule`` attribute names ``<namespace>.<schedule>``, written by the
  World's firing), the schedule's ``<schedule>-<unix time>`` in that namespace.

``refusal`` is called by ``runs`` before a run is adopted (start), tracked
again after a restart (follow) and cancelled (spec.cancel, deletion).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import JsonValue

from treadle.world import ids
from treadle.world.records import RunRecord
from treadle_operator import schedules

BINDING = "treadle.dev/binding"
STARTED_BY = "treadle.dev/workflowrun"

_NAME_JUNK = re.compile(r"[^a-z0-9-]+")


def mirror_name(workflow: str, run_id: str) -> str:
    """The WorkflowRun name a run started from code is mirrored as (a DNS label)."""
    stem = _NAME_JUNK.sub("-", workflow.lower()).strip("-")[:40] or "run"
    return f"{stem}-{run_id.removeprefix('wrun_').lower()}"


def run_id(namespace: str, name: str, run_key: str | None) -> str:
    """The run id of the WorkflowRun ``namespace/name`` (with its run key): always the same.

    A keyed run id (``treadle.world.ids.keyed_run_id``): deleting the object and
    applying it again names the run that exists; another run key names another run.
    """
    return ids.keyed_run_id("\0".join(("treadle.dev/workflowrun", namespace, name, run_key or "")))


def _bound(namespace: str, name: str, deployment: str, run_key: str | None) -> dict[str, JsonValue]:
    bound: dict[str, JsonValue] = {"namespace": namespace, "name": name, "deployment": deployment}
    if run_key:
        bound["runKey"] = run_key
    return bound


def attributes(
    namespace: str, name: str, deployment: str, run_key: str | None = None
) -> dict[str, JsonValue]:
    """The run attributes binding a run to the WorkflowRun ``namespace/name``."""
    bound = _bound(namespace, name, deployment, run_key)
    return {BINDING: bound, STARTED_BY: f"{namespace}/{name}"}


def is_bound(run: RunRecord) -> bool:
    """The operator started this run for some WorkflowRun (it is not a code-started run)."""
    return BINDING in run.attributes or STARTED_BY in run.attributes


def refusal(run: RunRecord, body: dict[str, Any], wfd: dict[str, Any] | None) -> str | None:
    """Why the WorkflowRun ``body`` must not track or cancel ``run``, or ``None``.

    ``wfd`` is the WorkflowDeployment ``body.spec.deployment`` names (in the
    object's namespace), or ``None`` when it does not exist.
    """
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    spec = body.get("spec") or {}
    deployment = str(spec.get("deployment"))
    run_key = spec.get("runKey") or None
    here = f"WorkflowRun {namespace}/{name}"
    if is_bound(run):
        bound = run.attributes.get(BINDING)
        if isinstance(bound, dict):
            if bound == _bound(namespace, name, deployment, run_key):
                return None
            owner = f"{bound.get('namespace')}/{bound.get('name')}"
            theirs = f"deployment {bound.get('deployment')}" + (
                f", runKey {bound.get('runKey')}" if bound.get("runKey") else ""
            )
            ours = f"deployment {deployment}" + (f", runKey {run_key}" if run_key else "")
            return (
                f"run {run.run_id} was started for WorkflowRun {owner} ({theirs}), "
                f"not for {here} ({ours})"
            )
        # A run started before the binding attribute existed: namespace/name only.
        if run.attributes.get(STARTED_BY) == f"{namespace}/{name}":
            return None
        return (
            f"run {run.run_id} was started for WorkflowRun {run.attributes.get(STARTED_BY)}, "
            f"not for {here}"
        )
    revisions = [str(r.get("id")) for r in ((wfd or {}).get("status") or {}).get("revisions") or []]
    if run.deployment_id not in revisions:
        return (
            f"run {run.run_id} was started from code on {run.deployment_id}, which is not a "
            f"revision of WorkflowDeployment {namespace}/{deployment}"
        )
    expected = mirror_name(run.workflow_name, run.run_id)
    if schedules.mirror_of(run) == (namespace, name):
        return None  # fired by the WorkflowSchedule of this namespace, for this name's time
    if name != expected:
        return (
            f"run {run.run_id} was started from code; only its mirror "
            f"{namespace}/{expected} may show it, not {here}"
        )
    return None
