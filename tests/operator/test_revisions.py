"""Revision rules: made on change, latest when ready, draining while runs remain, retired."""

from __future__ import annotations

from treadle_operator import deployments, revisions
from treadle_operator.models import WorkflowDeploymentSpec, WorkflowDeploymentStatus
from treadle_operator.revisions import Observed


def _plan(
    spec: WorkflowDeploymentSpec,
    status: WorkflowDeploymentStatus,
    observed: dict[str, Observed] | None = None,
) -> revisions.Plan:
    return revisions.plan(
        namespace="ns", name="orders", uid="u-1", generation=1, spec=spec, status=status,
        observed=observed or {}, now="2026-11-30T00:00:00Z",
    )  # fmt: skip


def _spec(image: str, module: str = "orders.app") -> WorkflowDeploymentSpec:
    return WorkflowDeploymentSpec(image=image, module=module, retire_after_seconds=0)


def test_a_new_deployment_gets_one_pending_revision_and_no_latest() -> None:
    plan = _plan(_spec("img:1"), WorkflowDeploymentStatus())
    assert plan.created is not None and plan.created.startswith("orders-")
    assert [r.phase for r in plan.status.revisions] == ["Pending"]
    assert plan.status.latest_revision is None
    assert plan.keep == (plan.created,)


def test_revision_ids_are_stable_and_unique() -> None:
    first = revisions.revision_id("ns", "orders", "u-1", 1, "img:1", "m")
    assert first == revisions.revision_id("ns", "orders", "u-1", 1, "img:1", "m")
    assert first != revisions.revision_id("ns", "orders", "u-1", 2, "img:1", "m")
    assert first != revisions.revision_id("other", "orders", "u-1", 1, "img:1", "m")
    assert len(revisions.revision_id("ns", "x" * 80, "u", 1, "i", "m")) <= 50


def test_ready_makes_it_latest_and_nothing_changes_without_a_spec_change() -> None:
    first = _plan(_spec("img:1"), WorkflowDeploymentStatus())
    rev = first.created
    assert rev is not None
    ready = _plan(_spec("img:1"), first.status, {rev: Observed(ready=True)})
    assert ready.created is None
    assert ready.status.latest_revision == rev
    assert [r.phase for r in ready.status.revisions] == ["Active"]
    assert ready.changes == [f"revision {rev} is Active"]


def test_a_rollout_drains_the_old_revision_then_retires_it() -> None:
    one = _plan(_spec("img:1"), WorkflowDeploymentStatus())
    old = one.created
    assert old is not None
    active = _plan(_spec("img:1"), one.status, {old: Observed(ready=True, active_runs=1)})
    rolled = _plan(_spec("img:2"), active.status, {old: Observed(ready=True, active_runs=1)})
    new = rolled.created
    assert new is not None and new != old
    # The new one is not ready yet: the old one still takes new runs.
    assert rolled.status.latest_revision == old
    assert [r.phase for r in rolled.status.revisions] == ["Active", "Pending"]
    both = {old: Observed(ready=True, active_runs=1), new: Observed(ready=True)}
    switched = _plan(_spec("img:2"), rolled.status, both)
    assert switched.status.latest_revision == new
    assert [r.phase for r in switched.status.revisions] == ["Draining", "Active"]
    assert set(switched.keep) == {old, new} and switched.retire == ()
    drained = {old: Observed(ready=True, active_runs=0), new: Observed(ready=True)}
    done = _plan(_spec("img:2"), switched.status, drained)
    assert [r.phase for r in done.status.revisions] == ["Retired", "Active"]
    assert done.retire == (old,) and done.keep == (new,)
    # Retired is final: later plans neither keep nor retire it again.
    after = _plan(_spec("img:2"), done.status, {new: Observed(ready=True)})
    assert after.retire == () and after.keep == (new,)


def test_a_revision_superseded_before_it_was_ready_retires_at_once() -> None:
    one = _plan(_spec("img:1"), WorkflowDeploymentStatus())
    old = one.created
    assert old is not None
    active = _plan(_spec("img:1"), one.status, {old: Observed(ready=True)})
    broken = _plan(_spec("img:bad"), active.status, {old: Observed(ready=True)})
    bad = broken.created
    fixed = _plan(_spec("img:3"), broken.status, {old: Observed(ready=True), bad or "": Observed()})
    good = fixed.created
    assert good is not None
    ready = {old: Observed(ready=True), bad or "": Observed(), good: Observed(ready=True)}
    final = _plan(_spec("img:3"), fixed.status, ready)
    assert final.status.latest_revision == good
    assert [r.phase for r in final.status.revisions] == ["Retired", "Retired", "Active"]


def test_the_latest_keeps_serving_while_its_pods_restart() -> None:
    one = _plan(_spec("img:1"), WorkflowDeploymentStatus())
    rev = one.created or ""
    active = _plan(_spec("img:1"), one.status, {rev: Observed(ready=True)})
    restarting = _plan(_spec("img:1"), active.status, {rev: Observed(ready=False, message="x")})
    assert restarting.status.latest_revision == rev
    assert restarting.status.revisions[0].message == "x"


def test_history_keeps_at_most_the_limit_of_retired_revisions() -> None:
    spec = _spec("img:0").model_copy(update={"revision_history_limit": 1})
    status = WorkflowDeploymentStatus()
    for n in range(4):
        spec = spec.model_copy(update={"image": f"img:{n}"})
        made = _plan(spec, status)
        status = _plan(spec, made.status, {made.created or "": Observed(ready=True)}).status
    assert [r.phase for r in status.revisions] == ["Retired", "Active"]
    assert status.revision_count == 4


def _gitops(latest: str | None, ready_created: str | None, stall: str = "") -> dict[str, str]:
    made = deployments._rollout(
        latest, ready_created, stall, f"revision x: {stall}" if stall else "", coming="x"
    )
    return {c.type: f"{c.status}/{c.reason}" for c in made}


def test_a_broken_image_after_a_good_one_reads_stalled_and_never_rolled_out() -> None:
    """Issue 11 item 1 (kstatus): latestCreatedRevision names the new revision; while it is
    not ready the old one stays latest, but Ready is False; a crash loop is Stalled."""
    one = _plan(_spec("img:1"), WorkflowDeploymentStatus())
    old = one.created
    assert old is not None
    good = _plan(_spec("img:1"), one.status, {old: Observed(ready=True)})
    assert good.status.latest_created_revision == good.status.latest_revision == old
    assert _gitops(old, old) == {
        "Ready": "True/RevisionReady", "Progressing": "False/RolledOut",
        "Reconciling": "False/RolledOut", "Stalled": "False/NotStalled",
    }  # fmt: skip
    broken = _plan(_spec("img:broken"), good.status, {old: Observed(ready=True)})
    new = broken.created
    assert new is not None
    crashing = Observed(ready=False, message="CrashLoopBackOff", stalled="CrashLoop")
    stalled = _plan(_spec("img:broken"), broken.status, {old: Observed(ready=True), new: crashing})
    assert stalled.status.latest_revision == old
    assert stalled.status.latest_created_revision == new
    assert _gitops(old, None) == {
        "Ready": "False/RevisionNotReady", "Progressing": "True/RevisionProgressing",
        "Reconciling": "True/RevisionProgressing", "Stalled": "False/NotStalled",
    }  # fmt: skip
    assert _gitops(old, None, "CrashLoop") == {
        "Ready": "False/CrashLoop", "Progressing": "False/CrashLoop",
        "Reconciling": "False/CrashLoop", "Stalled": "True/CrashLoop",
    }  # fmt: skip


def _at(
    spec: WorkflowDeploymentSpec,
    status: WorkflowDeploymentStatus,
    observed: dict[str, Observed],
    now: str,
) -> revisions.Plan:
    return revisions.plan(
        namespace="ns", name="orders", uid="u-1", generation=1, spec=spec, status=status,
        observed=observed, now=now,
    )  # fmt: skip


def test_a_superseded_revision_retires_only_after_retire_after_seconds() -> None:
    """Review R1: drained is not enough; it stays Draining (workers kept, not retired in the
    World) until retireAfterSeconds passed since it stopped being latest."""
    spec = _spec("img:1").model_copy(update={"retire_after_seconds": 60})
    one = _at(spec, WorkflowDeploymentStatus(), {}, "2026-11-30T00:00:00Z")
    old = one.created or ""
    active = _at(spec, one.status, {old: Observed(ready=True)}, "2026-11-30T00:00:01Z")
    spec2 = spec.model_copy(update={"image": "img:2"})
    rolled = _at(spec2, active.status, {old: Observed(ready=True)}, "2026-11-30T00:00:02Z")
    new = rolled.created or ""
    both = {old: Observed(ready=True), new: Observed(ready=True)}
    switched = _at(spec2, rolled.status, both, "2026-11-30T00:00:10Z")
    assert switched.status.latest_revision == new
    assert [r.phase for r in switched.status.revisions] == ["Draining", "Active"]
    assert switched.status.revisions[0].superseded_at == "2026-11-30T00:00:10Z"
    assert switched.retire == () and old in switched.keep
    soon = _at(spec2, switched.status, both, "2026-11-30T00:01:09Z")  # 59 s later
    assert soon.retire == () and soon.status.revisions[0].phase == "Draining"
    due = _at(spec2, soon.status, both, "2026-11-30T00:01:10Z")  # 60 s later
    assert due.retire == (old,)
    assert [r.phase for r in due.status.revisions] == ["Retired", "Active"]
    # Runs still on it keep it Draining past the delay.
    busy = {old: Observed(ready=True, active_runs=1), new: Observed(ready=True)}
    held = _at(spec2, soon.status, busy, "2026-11-30T01:00:00Z")
    assert held.retire == () and held.status.revisions[0].phase == "Draining"
