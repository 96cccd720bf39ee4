"""Revisions of a WorkflowDeployment, as pure functions of what was observed.

A revision is one (image, module) pair with its own deployment id in the World
and its own worker Deployments. ``plan`` takes the spec, the recorded status
and what the operator just saw (are a revision's workers ready, how many runs
are still active on it) and says what status to record and which revisions'
workers to keep or remove. It never talks to an API, so every rule is a unit
test: a change makes a new Pending revision; the newest ready one becomes
latest; older ones drain while runs are pinned to them, then retire.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from treadle_operator.models import (
    RevisionStatus,
    WorkflowDeploymentSpec,
    WorkflowDeploymentStatus,
)


@dataclass(frozen=True)
class Observed:
    """What the operator saw of one revision just now."""

    ready: bool = False
    active_runs: int = 0
    message: str = ""
    stalled: str = ""  # why its workers cannot run (a Stalled reason), "" when they can


@dataclass(frozen=True)
class Plan:
    status: WorkflowDeploymentStatus
    keep: tuple[str, ...] = ()  # revisions whose workers must run
    retire: tuple[str, ...] = ()  # revisions to scale down and mark retired in the World
    created: str | None = None  # a revision made by this plan
    changes: list[str] = field(default_factory=list)  # what happened, for Events


def revision_id(namespace: str, name: str, uid: str, number: int, image: str, module: str) -> str:
    """``<name>-<6 hex>``: unique per object and revision, the same on every retry."""
    digest = hashlib.sha256(
        "\0".join((namespace, name, uid, str(number), image, module)).encode()
    ).hexdigest()
    # Deployment names are DNS labels: keep room for "-orchestrator" (63 in all).
    return f"{name[:40]}-{digest[:6]}"


def reusable(
    revisions: list[RevisionStatus], spec: WorkflowDeploymentSpec
) -> RevisionStatus | None:
    """The newest revision not yet retired that runs ``spec``'s image and module: "recent"
    is still live (Draining, or not yet retired), as the World cannot un-retire one."""
    wanted = (spec.image, spec.module)
    return next(
        (r for r in reversed(revisions) if r.phase != "Retired" and (r.image, r.module) == wanted),
        None,
    )


def plan(
    *,
    namespace: str,
    name: str,
    uid: str,
    generation: int | None,
    spec: WorkflowDeploymentSpec,
    status: WorkflowDeploymentStatus,
    observed: dict[str, Observed],
    now: str,
) -> Plan:
    revisions = list(status.revisions)
    changes: list[str] = []
    created: str | None = None
    count = status.revision_count
    newest = next((r for r in reversed(revisions) if r.phase != "Retired"), None)
    reused = reusable(revisions, spec) if newest is not None else None
    if reused is not None and reused is not newest:
        # Rollback: an image (and module) a live revision runs is that revision again: it
        # moves to the end, the newest, with its id, its World record and its pinned runs.
        revisions = [r for r in revisions if r.id != reused.id] + [reused]
        changes.append(f"revision {reused.id} reused for image {spec.image} (rolled back)")
    elif newest is None or (newest.image, newest.module) != (spec.image, spec.module):
        count += 1
        created = revision_id(namespace, name, uid, count, spec.image, spec.module)
        revisions.append(
            RevisionStatus(id=created, image=spec.image, module=spec.module, created_at=now)
        )
        changes.append(f"revision {created} made for image {spec.image}, module {spec.module}")

    seen = [
        r.model_copy(
            update={
                "ready": observed.get(r.id, Observed()).ready,
                "active_runs": observed.get(r.id, Observed()).active_runs,
                "message": observed.get(r.id, Observed()).message,
            }
        )
        if r.phase != "Retired"
        else r
        for r in revisions
    ]
    live = [r for r in seen if r.phase != "Retired"]
    newest_live = live[-1] if live else None
    # The latest is the newest ready revision; until a newer one is ready the old
    # one keeps taking new runs (and stays latest even while its pods restart).
    latest = next((r for r in reversed(live) if r.ready), None)
    if latest is None and status.latest_revision in {r.id for r in live}:
        latest = next(r for r in live if r.id == status.latest_revision)

    result: list[RevisionStatus] = []
    keep: list[str] = []
    retire: list[str] = []
    for r in seen:
        if r.phase == "Retired":
            result.append(r)
            continue
        if latest is not None and r.id == latest.id:
            phase = "Active"
            # Latest again (a rollback reused it): its retire delay starts anew next time.
            r = r.model_copy(update={"superseded_at": None})
        elif r is newest_live:
            phase = "Pending"  # not ready yet: the previous latest keeps serving
        elif r.phase == "Pending" or (latest is not None and live.index(r) > live.index(latest)):
            # Superseded before it was ever ready (never latest): no run is on it.
            phase = "Retired" if r.active_runs == 0 else "Draining"
        else:
            # Superseded: drains while runs remain, and for retireAfterSeconds after it
            # stopped being latest, so a start that read it a moment ago lands (R1).
            r = r.model_copy(update={"superseded_at": r.superseded_at or now})
            waited = _seconds_between(r.superseded_at or now, now)
            done = r.active_runs == 0 and waited >= spec.retire_after_seconds
            phase = "Retired" if done else "Draining"
        if phase != r.phase:
            changes.append(f"revision {r.id} is {phase}")
        if phase == "Retired":
            retire.append(r.id)
        else:
            keep.append(r.id)
        result.append(r.model_copy(update={"phase": phase}))

    newest_kept = next((r for r in reversed(result) if r.phase != "Retired"), None)
    retired = [r for r in result if r.phase == "Retired"]
    dropped = {r.id for r in retired[: max(0, len(retired) - spec.revision_history_limit)]}
    result = [r for r in result if r.id not in dropped]
    return Plan(
        status=status.model_copy(
            update={
                "observed_generation": generation,
                "revision_count": count,
                "latest_revision": None if latest is None else latest.id,
                "latest_created_revision": None if newest_kept is None else newest_kept.id,
                "revisions": result,
            }
        ),
        keep=tuple(keep),
        retire=tuple(retire),
        created=created,
        changes=changes,
    )


def _seconds_between(earlier: str, later: str) -> float:
    """Seconds from one status timestamp (``%Y-%m-%dT%H:%M:%SZ``) to another."""
    try:
        return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()
    except ValueError:
        return 0.0  # an unreadable stamp (hand-edited status): count from now
