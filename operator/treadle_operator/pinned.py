"""Pinning you can afford (issue 11 item 5): what a draining revision runs, and what a
WorkflowDeployment may do to the runs pinned to one.

``deployments.reconcile`` calls these after ``revisions.plan``:

- ``rolls``: which revisions take the current spec's pod template (Active and
  Pending ones: they take, or are about to take, new runs); a Draining revision
  keeps the pod template it had (its Deployments are only scaled,
  ``kube.scale_deployment``), so a Git change to env or resources never
  restarts the workers of runs pinned to an older revision.
- ``draining_replicas``: a Draining revision runs ``spec.draining.<role>.replicas``
  (default 1 orchestrator, 0 step workers), scaled up to ``maxReplicas`` on the
  role's backlog (JetStream pending + in flight of that revision's consumer),
  instead of the full replica sets, while runs sleep for weeks.
- ``act``: ``spec.revisions.<id>: {action: CancelRuns}`` cancels every run of a
  Draining revision that has not ended (each reconcile, so a run that comes
  back to life is cancelled too); the revision then drains and retires. Never
  on a revision that takes new runs (a Warning Event says so, once).
- ``act``: ``spec.revisions.<id>: {action: MoveRuns, to: <revision>}`` moves each
  run of a Draining revision that has not ended, and whose workflow declares the
  same non-empty ``compatible`` tag in both revisions' catalogues, to ``to``
  (``treadle.moves.move_runs``: repin + recovery wake); never to a retired, unknown
  or not-ready revision. Runs left behind are named in a Warning Event (once per
  distinct text), the moved count in a Normal one.
- ``with_hashes``: the pod-template hash each revision's workers run, in status.

See docs/operator-templates.md, "Moving pinned runs".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from treadle import errors as engine_errors
from treadle import moves
from treadle.world import contract, events
from treadle.world.messages import MessageKind
from treadle.world.records import RunStatus
from treadle_operator import podtemplate
from treadle_operator.manifests import Role
from treadle_operator.models import (
    RevisionStatus,
    WorkflowDeploymentSpec,
    WorkflowDeploymentStatus,
)

log = logging.getLogger("treadle.operator.pinned")

ROLLING_PHASES = frozenset({"Active", "Pending"})
ACTIVE_STATUSES: tuple[RunStatus, ...] = ("pending", "running")
PAGE = 1000

# (namespace, name) -> the refusals already posted as Events, so each is posted once.
_posted: dict[tuple[str, str], frozenset[str]] = {}


def rolls(revision: RevisionStatus) -> bool:
    """Whether a revision's workers follow the current spec (else only their replicas do)."""
    return revision.phase in ROLLING_PHASES


def draining_bounds(spec: WorkflowDeploymentSpec, role: Role) -> tuple[int, int, int]:
    """(floor, ceiling, pending per replica) of a Draining revision's ``role``."""
    drain = spec.draining.orchestrator if role == "orchestrator" else spec.draining.steps
    if drain.max_replicas is not None:
        ceiling = drain.max_replicas
    elif role == "orchestrator":
        ceiling = spec.orchestrator.replicas
    elif spec.steps.autoscale is not None:
        ceiling = spec.steps.autoscale.max_replicas
    else:
        ceiling = spec.steps.replicas
    return drain.replicas, max(drain.replicas, ceiling), drain.pending_per_replica


def scaled(backlog: int, floor: int, ceiling: int, per_replica: int) -> int:
    """Replicas for ``backlog`` messages: at least ``floor``, one per ``per_replica``, at most
    ``ceiling``; any backlog at all wants one replica."""
    return max(floor, min(ceiling, math.ceil(backlog / per_replica)))


async def draining_replicas(world: contract.World, spec: WorkflowDeploymentSpec, revision: str,
                            role: Role) -> int:  # fmt: skip
    floor, ceiling, per_replica = draining_bounds(spec, role)
    if ceiling == floor:
        return floor
    kind: MessageKind = "orchestrator" if role == "orchestrator" else "step"
    return scaled(await world.queue.backlog(kind, revision), floor, ceiling, per_replica)


def followed(manifest: dict[str, Any]) -> dict[str, str]:
    """The operator's own pod annotations a Draining revision still follows: every
    ``treadle.dev/`` one but the template hash (e.g. a World Secret checksum, so a rotated
    Secret rolls pinned runs' workers too); the template it keeps."""
    annotations = manifest["spec"]["template"]["metadata"].get("annotations") or {}
    return {
        k: v
        for k, v in annotations.items()
        if k.startswith(podtemplate.RESERVED_PREFIX) and k != podtemplate.HASH_ANNOTATION
    }


def with_hashes(
    status: WorkflowDeploymentStatus, hashes: dict[str, str]
) -> WorkflowDeploymentStatus:
    """``status`` with each rendered revision's ``templateHash`` (others keep theirs)."""
    if not hashes:
        return status
    return status.model_copy(
        update={
            "revisions": [
                r.model_copy(update={"template_hash": hashes[r.id]}) if r.id in hashes else r
                for r in status.revisions
            ]
        }
    )


def role_hashes(hashes: Iterable[str]) -> str:
    """One revision's template hash: its roles' hashes joined (orchestrator/steps)."""
    return "/".join(hashes)


async def act(
    world: contract.World,
    spec: WorkflowDeploymentSpec,
    status: WorkflowDeploymentStatus,
    *,
    namespace: str,
    name: str,
) -> list[tuple[str, bool]]:
    """Carry out ``spec.revisions``: (Event message, is a warning) for what happened."""
    notes: list[tuple[str, bool]] = []
    refused: set[str] = set()
    live = {r.id: r for r in status.revisions if r.phase != "Retired"}
    for revision_id, action in sorted((spec.revisions or {}).items()):
        revision = live.get(revision_id)
        if revision is None:
            continue  # retired (or never this object's): nothing is pinned there
        if revision.phase != "Draining":
            refused.add(
                f"spec.revisions[{revision_id}]: {action.action} refused: revision "
                f"{revision_id} is {revision.phase} and takes new runs; roll out another "
                "image (or roll back) first"
            )
            continue
        reason = action.reason or f"revision {revision_id}: spec.revisions {action.action}"
        if action.action == "MoveRuns":
            moved, held = await _move(world, revision_id, action.to, live, reason)
            refused |= held
            if moved:
                notes.append((f"revision {revision_id}: {moved}", False))
            continue
        cancelled = await cancel_runs(world, revision_id, reason)
        if cancelled:
            notes.append(
                (f"revision {revision_id}: {cancelled} pinned run(s) cancelled ({reason})", False)
            )
    key = (namespace, name)
    fresh = refused - _posted.get(key, frozenset())
    _posted[key] = frozenset(refused)
    notes.extend((text, True) for text in sorted(fresh))
    return notes


async def _move(
    world: contract.World,
    revision_id: str,
    to: str | None,
    live: dict[str, RevisionStatus],
    reason: str,
) -> tuple[str | None, set[str]]:
    """``MoveRuns``: (the note of what moved, or None; the warnings to post once)."""
    where = f"spec.revisions[{revision_id}]: MoveRuns"
    target = live.get(to) if to is not None else None
    if to is None or to == revision_id:
        return None, {f"{where} refused: `to` must name another revision of this object"}
    if target is None:
        return None, {f"{where} refused: revision {to} is not a live revision of this object"}
    if not target.ready:
        return None, {f"{where} refused: revision {to} is not ready (its workers are not up)"}
    try:
        tally = await moves.move_runs(
            world, await active_run_ids(world, revision_id), from_deployment=revision_id,
            to_deployment=to, reason=reason,
        )  # fmt: skip
    except engine_errors.RunNotRepinned as exc:
        return None, {f"{where} refused: {exc.detail}"}
    held = {
        f"{where}: {count} run(s) stay on revision {revision_id}: {why}"
        for why, count in sorted(tally.skipped.items())
    }
    if not tally.moved:
        return None, held
    log.warning("revision %s: %d run(s) moved to %s (%s)", revision_id, tally.moved, to, reason)
    return f"{tally.moved} pinned run(s) moved to revision {to} ({reason})", held


async def cancel_runs(world: contract.World, revision: str, reason: str) -> int:
    """Cancel every run on ``revision`` that has not ended; how many were cancelled."""
    cancelled = 0
    for run_id in await active_run_ids(world, revision):
        try:
            await world.events.create(run_id, events.RunCancelled(reason=reason), in_band=False)
        except (
            engine_errors.RunExpired,
            engine_errors.RunNotFound,
            engine_errors.WorldContractError,
        ):
            continue  # ended meanwhile
        log.warning("run %s on revision %s cancelled: %s", run_id, revision, reason)
        cancelled += 1
    return cancelled


async def active_run_ids(world: contract.World, revision: str) -> list[str]:
    found: list[str] = []
    for status in ACTIVE_STATUSES:
        cursor: str | None = None
        while True:
            page = await world.runs.list(
                status=status, deployment_id=revision, limit=PAGE, cursor=cursor
            )
            found.extend(r.run_id for r in page.runs)
            cursor = page.next_cursor
            if cursor is None:
                break
    return found


def forget(namespace: str, name: str) -> None:
    """Drop what was posted for a deleted WorkflowDeployment."""
    _posted.pop((namespace, name), None)
