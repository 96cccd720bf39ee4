"""WorkflowSchedule on the World's schedules, against the real API server, with kubectl
(issue 17 items 2 and 3; docs/operator-schedules.md).

One shop for the module: an operator holding only the chart's namespaced Role, and a ready
WorkflowDeployment whose orchestrator worker runs the World's firing loop (its rescan at
1 s, so a change made by the operator is seen within a second). The operator runs no
scheduler: it puts each WorkflowSchedule in the World (read back here from Postgres), and
mirrors the runs the worker fires. Schedules with a seconds field (``*/2 * * * * *``) fire
every two seconds. Every wait is on API or World state; absence ("suspended fires
nothing") is judged against another schedule that keeps firing meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from treadle import errors
from treadle.world.records import ScheduleRecord
from treadle.worlds.production import PostgresNatsWorld

from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import Clones, pg_clones, pg_server
from ..postgres.pgserver import Server as PgServer
from .harness import Kube, wait_for
from .kubectl import kubectl
from .operator_env import WORKFLOWS, OperatorProcess, Shop, chart_identity
from .pod_node import PodNode

__all__ = ["nats_server", "pg_clones", "pg_server"]

_count = itertools.count(1)
EVERY_2S = "*/2 * * * * *"
FINISHED = ("Completed", "Failed", "Cancelled")


@pytest.fixture(scope="module")
def shop(
    kube: Kube,
    pod_node: PodNode,
    pg_server: PgServer,
    pg_clones: Clones,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Shop]:
    """A namespace whose operator runs with the chart's namespaced Role, and a ready
    WorkflowDeployment ``shop`` whose workers look at the World's schedules every second."""
    namespace = f"sched-{next(_count)}"
    kube.rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    root = tmp_path_factory.mktemp(namespace)
    values = {"rbac": {"scope": "namespace", "namespaces": [namespace]}}
    identity = chart_identity(kube, root, values, release_ns=f"treadle-{namespace}")
    with ThreadPoolExecutor(max_workers=1) as pool:
        database = pg_server.dsn(pool.submit(asyncio.run, pg_clones.take()).result())
    fast = {"TREADLE_OPERATOR_SCHEDULE_SYNC_SECONDS": "1"}
    operator = OperatorProcess(kube, namespace, root / "operator.log", identity, extra_env=fast)
    made = Shop(kube=kube, namespace=namespace, database_url=database,
                nats_url=nats_server.url, operator=operator, pods=pod_node)  # fmt: skip
    made.secret()
    made.operator.start()
    made.deploy(made.deployment, "shop:1", mirrorRuns=True,
                env=[{"name": "TREADLE_SCHEDULES_RESCAN_SECONDS", "value": "1"}])  # fmt: skip
    made.latest()
    yield made
    made.operator.kill()
    print(made.report(8000))
    kube.rest.delete(f"/api/v1/namespaces/{namespace}")


@pytest.fixture(autouse=True)
def _no_schedule_left(shop: Shop) -> Iterator[None]:
    """A failed test's schedules must not keep firing into the next ones."""
    yield
    shop.kube.rest.delete(shop.path("workflowschedules"))


def _k(shop: Shop, *args: str, stdin: str | None = None) -> Any:
    return kubectl(shop.kube.kubeconfig, "-n", shop.namespace, *args, stdin=stdin)


def _manifest(shop: Shop, name: str, schedule: str, workflow: str, input: Any, **spec: Any) -> Any:
    return {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowSchedule",
        "metadata": {"name": name},
        "spec": {"schedule": schedule, **spec, "runTemplate": {
            "deployment": shop.deployment, "workflow": workflow, "input": input}},
    }  # fmt: skip


def _create(shop: Shop, name: str, schedule: str, workflow: str, input: Any, **spec: Any) -> None:
    body = _manifest(shop, name, schedule, workflow, input, **spec)
    shop.kube.rest.create(shop.path("workflowschedules"), body)


def _schedule(shop: Shop, name: str) -> dict[str, Any]:
    found: dict[str, Any] = shop.kube.rest.get(shop.path("workflowschedules", name))
    return found


def _runs(shop: Shop, schedule: str) -> list[dict[str, Any]]:
    """The schedule's WorkflowRuns, oldest firing first."""
    listed = shop.kube.rest.get(
        shop.path("workflowruns") + f"?labelSelector=treadle.dev/schedule%3D{schedule}"
    )
    items: list[dict[str, Any]] = listed["items"]
    return sorted(items, key=_at)


def _at(run: dict[str, Any]) -> int:
    return int(run["metadata"]["name"].rsplit("-", 1)[1])


def _phase(run: dict[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _iso(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _delete(shop: Shop, name: str) -> None:
    shop.kube.rest.delete(shop.path("workflowschedules", name))


def _world_schedule(shop: Shop, name: str) -> ScheduleRecord | None:
    """The World schedule of the WorkflowSchedule ``name`` (read on a loop of its own)."""

    async def read() -> ScheduleRecord | None:
        world = await PostgresNatsWorld.connect(
            shop.database_url, shop.nats_url, deployment_id="test-reader"
        )
        try:
            return await world.schedules.get(f"{shop.namespace}.{name}")
        except errors.ScheduleNotFound:
            return None
        finally:
            await world.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, read()).result()


def test_a_kubectl_applied_schedule_is_a_world_schedule_whose_runs_are_mirrored_and_pruned(
    shop: Shop,
) -> None:
    """The operator puts the object in the World (allow, catchup latest, pinned to the
    latest revision); the worker fires it; each run shows as WorkflowRun <name>-<unix time>,
    labelled (schedule, attributes) and owned; only successfulRunsHistoryLimit Completed ones
    stay, and a pruned one is not shown again; status comes from the World. Then suspend
    pauses it (nothing fires while another schedule fires twice) and resuming fires the
    latest time passed over, once (CronJob's rule), the rest counted as missed."""
    revision = shop.latest()
    applied = _k(shop, "apply", "-f", "-", stdin=yaml.safe_dump(_manifest(
        shop, "every", EVERY_2S, "greet", {"name": "cron"}, successfulRunsHistoryLimit=2,
        timeZone="Europe/Paris")))  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    uid = _schedule(shop, "every")["metadata"]["uid"]
    record = wait_for(lambda: _world_schedule(shop, "every"), 30, what="the World schedule")
    spec = record.spec
    assert (spec.workflow_name, spec.cron, spec.timezone) == ("greet", EVERY_2S, "Europe/Paris")
    assert (spec.overlap, spec.catchup, spec.deployment_id) == ("allow", "latest", revision)
    assert spec.input == {"args": [], "kwargs": {"name": "cron"}}
    seen: dict[str, dict[str, Any]] = {}

    def history() -> list[dict[str, Any]] | None:
        runs = _runs(shop, "every")
        seen.update({r["metadata"]["name"]: r for r in runs})
        done = [r for r in runs if _phase(r) == "Completed"]
        return runs if len(seen) >= 5 and len(done) == 2 else None

    runs = wait_for(history, 90, what="five firings of 'every', two Completed runs kept")
    for name, run in seen.items():
        at = _at(run)
        assert name == f"every-{at}" and at % 2 == 0
        assert run["metadata"]["annotations"]["treadle.dev/scheduled-time"] == _iso(at)
        assert run["spec"]["workflow"] == "greet" and run["spec"]["input"] == {"name": "cron"}
        labels = run["metadata"]["labels"]
        assert labels["treadle.dev/schedule"] == "every"
        assert labels["attr.treadle.dev/treadle.schedule"] == f"{shop.namespace}.every"
        (owner,) = run["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("WorkflowSchedule", "every", uid)
    completed = next(r for r in runs if _phase(r) == "Completed")
    assert json.loads(completed["status"]["output"])["hello"] == "cron"
    world_run = shop.world_run(completed["status"]["runId"])
    assert world_run["deployment_id"] == revision, "the run started on the pinned revision"
    assert world_run["attributes"]["treadle.schedule"] == f"{shop.namespace}.every"
    # One run per firing time in the World, mirrored once each.
    listed = shop.cli("runs", "list", "--attr", f"treadle.schedule={shop.namespace}.every",
                      "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    times = [r["attributes"]["treadle.scheduled_at"] for r in json.loads(listed.stdout)]
    assert len(times) == len(set(times))

    # Pruned mirrors stay pruned while more firings come.
    pruned = {n for n, r in seen.items() if _phase(r) == "Completed"} - {
        r["metadata"]["name"] for r in runs
    }
    newest = max(_at(r) for r in runs)
    wait_for(lambda: max(_at(r) for r in _runs(shop, "every")) >= newest + 4, 30,
             what="two more firings")  # fmt: skip
    now_shown = {r["metadata"]["name"] for r in _runs(shop, "every")}
    assert not pruned & now_shown, f"pruned mirrors shown again: {pruned & now_shown}"

    status = wait_for(
        lambda: (got := _schedule(shop, "every")["status"]).get("lastSuccessfulTime") and got,
        20, what="lastSuccessfulTime of 'every'",
    )  # fmt: skip
    assert status["worldSchedule"] == f"{shop.namespace}.every"
    assert status["revision"] == revision
    assert status["lastScheduleTime"] and status["lastRunId"]
    assert status["nextScheduleTime"] > status["lastScheduleTime"]
    assert _conditions(_schedule(shop, "every"))["Ready"]["status"] == "True"
    table = _k(shop, "get", "wfsched", "every")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0].split()
    assert header == ["NAME", "SCHEDULE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]
    selector = f"attr.treadle.dev/treadle.schedule={shop.namespace}.every"
    selected = _k(shop, "get", "wfr", "-l", selector, "-o", "name")
    assert selected.returncode == 0, selected.stderr
    assert len(selected.stdout.split()) >= 2

    # suspend: the World schedule is paused; nothing fires while "ticker" fires twice
    shop.kube.rest.patch(shop.path("workflowschedules", "every"), {"spec": {"suspend": True}})
    generation = _schedule(shop, "every")["metadata"]["generation"]

    def suspended() -> dict[str, Any] | None:
        obj = _schedule(shop, "every")
        ready = _conditions(obj).get("Ready", {})
        ok = ready.get("reason") == "Suspended" and ready.get("observedGeneration") == generation
        return obj if ok else None

    held = wait_for(suspended, 20, what="'every' reads Suspended")
    assert "nextScheduleTime" not in held["status"]
    paused = _world_schedule(shop, "every")
    assert paused is not None and paused.state.paused
    last = paused.state.last_fired_at
    _create(shop, "ticker", EVERY_2S, "greet", {"name": "tick"})
    wait_for(lambda: len(_runs(shop, "ticker")) >= 3, 30, what="three firings of 'ticker'")
    still = _world_schedule(shop, "every")
    assert still is not None and still.state.last_fired_at == last, "a paused schedule fired"
    _delete(shop, "ticker")

    # resume: the latest time passed over fires once, the others are counted as missed
    assert last is not None
    missed_before = still.state.missed
    shop.kube.rest.patch(shop.path("workflowschedules", "every"), {"spec": {"suspend": False}})
    resumed = wait_for(
        lambda: [r for r in _runs(shop, "every") if _at(r) > last.timestamp()], 20,
        what="a firing on resume",
    )  # fmt: skip
    assert len(resumed) <= 2  # the latest time passed over, and perhaps the next regular one
    back = _world_schedule(shop, "every")
    assert back is not None and back.state.missed > missed_before
    wait_for(lambda: _schedule(shop, "every")["status"].get("missedSchedules", 0) > 0, 10,
             what="missedSchedules written")  # fmt: skip
    assert "Missed" in shop.events("every")
    _delete(shop, "every")


def test_forbid_is_skip_never_two_runs_at_once_and_the_skips_are_counted(shop: Shop) -> None:
    """concurrencyPolicy Forbid → the World's ``skip``: never two runs of the schedule at
    once; the firings skipped are counted (skippedSchedules) and said (AlreadyActive)."""
    _create(shop, "forbid", EVERY_2S, "naps", {"count": 1, "seconds": 5},
            concurrencyPolicy="Forbid")  # fmt: skip
    counted: list[int] = []

    def two_done() -> list[dict[str, Any]] | None:
        runs = _runs(shop, "forbid")
        counted.append(
            int((_schedule(shop, "forbid").get("status") or {}).get("skippedSchedules", 0))
        )
        active = [r for r in runs if _phase(r) not in FINISHED]
        assert len(active) <= 1, f"two runs active under Forbid: {[_at(r) for r in active]}"
        finished = [r for r in runs if _phase(r) == "Completed"]
        return runs if len(finished) >= 2 else None

    runs = wait_for(two_done, 90, what="two runs of 'forbid' completed one after the other")
    _delete(shop, "forbid")
    first, second = runs[0], runs[1]
    assert second["metadata"]["creationTimestamp"] >= first["status"]["completedAt"]
    assert _at(second) - _at(first) > 2, "firings in between were skipped"
    assert max(counted) >= 1
    assert "AlreadyActive" in shop.events("forbid")


def test_replace_is_cancel_other_the_next_firing_cancels_the_active_run(shop: Shop) -> None:
    """concurrencyPolicy Replace → the World's ``cancel_other``: the next firing cancels the
    running run (its mirror ends Cancelled and stays, for history) and starts its own."""
    _create(shop, "swap", EVERY_2S, "approval", {"order_id": "never"},
            concurrencyPolicy="Replace", failedRunsHistoryLimit=5)  # fmt: skip
    record = wait_for(lambda: _world_schedule(shop, "swap"), 30, what="the World schedule")
    assert record.spec.overlap == "cancel_other"

    def replaced() -> list[dict[str, Any]] | None:
        runs = _runs(shop, "swap")
        return runs if len(runs) >= 2 and _phase(runs[0]) == "Cancelled" else None

    runs = wait_for(replaced, 60, what="the first run of 'swap' Cancelled by the next firing")
    _delete(shop, "swap")
    assert shop.world_run(runs[0]["status"]["runId"])["status"] == "cancelled"
    assert runs[1]["metadata"]["name"] != runs[0]["metadata"]["name"]


def test_an_invalid_schedule_zone_or_workflow_is_a_condition_naming_the_field(
    shop: Shop,
) -> None:
    """Refused by the schema where its pattern can see it (field count), else a condition
    ScheduleValid False naming the field; nothing is put in the World; no traceback."""
    refused = _k(shop, "apply", "-f", "-", stdin=yaml.safe_dump(
        _manifest(shop, "short", "* * *", "greet", {"name": "x"})))  # fmt: skip
    assert refused.returncode != 0 and "spec.schedule" in refused.stderr, refused.stderr
    _create(shop, "bad-minute", "61 * * * *", "greet", {"name": "x"})
    _create(shop, "bad-zone", "@hourly", "greet", {"name": "x"}, timeZone="Mars/Olympus_Mons")
    _create(shop, "bad-flow", "@hourly", "nowhere", {"name": "x"})

    def invalid(name: str) -> dict[str, Any] | None:
        found = _conditions(_schedule(shop, name)).get("ScheduleValid", {})
        return found if found.get("status") == "False" else None

    minute = wait_for(lambda: invalid("bad-minute"), 20, what="bad-minute ScheduleValid False")
    assert minute["reason"] == "InvalidSchedule"
    assert minute["message"].startswith("spec.schedule: ") and "61" in minute["message"]
    zone = wait_for(lambda: invalid("bad-zone"), 20, what="bad-zone ScheduleValid False")
    assert zone["reason"] == "UnknownTimeZone" and zone["message"].startswith("spec.timeZone: ")
    ready = _conditions(_schedule(shop, "bad-zone"))["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "UnknownTimeZone")
    flow = wait_for(lambda: invalid("bad-flow"), 20, what="bad-flow ScheduleValid False")
    assert flow["reason"] == "UnknownWorkflow"
    assert flow["message"].startswith("spec.runTemplate.workflow: no workflow named 'nowhere'")
    for name in ("bad-minute", "bad-zone", "bad-flow"):
        assert _world_schedule(shop, name) is None, f"{name} was put in the World"
    assert "Traceback" not in shop.operator.log()
    for name in ("bad-minute", "bad-zone", "bad-flow"):
        _delete(shop, name)

    # A spec made invalid after it was put pauses its World schedule; fixed, it fires again.
    _create(shop, "fixable", EVERY_2S, "greet", {"name": "fix"})
    wait_for(lambda: _runs(shop, "fixable"), 30, what="a firing of 'fixable'")
    path = shop.path("workflowschedules", "fixable")
    shop.kube.rest.patch(path, {"spec": {"schedule": "61 * * * * *"}})
    wait_for(lambda: invalid("fixable"), 20, what="fixable ScheduleValid False")
    held = wait_for(lambda: (got := _world_schedule(shop, "fixable")) and got.state.paused
                    and got, 20, what="the World schedule paused")  # fmt: skip
    assert held.spec.cron == EVERY_2S, "the invalid spec was not put"
    shop.kube.rest.patch(path, {"spec": {"schedule": EVERY_2S}})
    assert held.state.last_fired_at is not None
    last = held.state.last_fired_at.timestamp()
    wait_for(lambda: [r for r in _runs(shop, "fixable") if _at(r) > last], 30,
             what="a firing once fixed")  # fmt: skip
    _delete(shop, "fixable")


def test_deleting_the_object_deletes_its_world_schedule_and_its_mirrors(shop: Shop) -> None:
    """kubectl delete: the finalizer deletes the World schedule (nothing fires any more);
    the mirrors go with the object (owner references, the garbage collector)."""
    _create(shop, "doomed", EVERY_2S, "greet", {"name": "doomed"})
    wait_for(lambda: _runs(shop, "doomed"), 30, what="a firing of 'doomed'")
    deleted = _k(shop, "delete", "wfsched", "doomed", "--wait=true", "--timeout=30s")
    assert deleted.returncode == 0, deleted.stderr
    assert _world_schedule(shop, "doomed") is None, "the World schedule outlived its object"
    wait_for(lambda: _runs(shop, "doomed") == [], 30, what="the mirrors garbage-collected")


def test_the_world_fires_while_the_operator_is_down_and_the_runs_are_shown_on_its_return(
    shop: Shop,
) -> None:
    """The operator fires nothing: killed -9, the workers go on firing the World schedule;
    restarted, it shows each run fired meanwhile as its WorkflowRun, once."""
    _create(shop, "steady", EVERY_2S, "greet", {"name": "steady"}, successfulRunsHistoryLimit=50)
    wait_for(lambda: _runs(shop, "steady"), 30, what="a first firing of 'steady'")
    shop.operator.kill()
    shown = {r["metadata"]["name"] for r in _runs(shop, "steady")}

    def fired_in_world() -> list[dict[str, Any]]:
        listed = shop.cli("runs", "list", "--attr", f"treadle.schedule={shop.namespace}.steady",
                          "--json")  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        runs: list[dict[str, Any]] = json.loads(listed.stdout)
        return runs

    meanwhile = wait_for(lambda: len(fired_in_world()) >= len(shown) + 3 and fired_in_world(),
                         30, what="three firings with the operator down")  # fmt: skip
    assert {r["metadata"]["name"] for r in _runs(shop, "steady")} == shown, "mirrored while down"
    shop.operator.start()

    def all_shown() -> list[dict[str, Any]] | None:
        names = {r["metadata"]["name"] for r in _runs(shop, "steady")}
        wanted = {
            f"steady-{int(datetime.fromisoformat(r['attributes']['treadle.scheduled_at']).timestamp())}"
            for r in meanwhile
        }
        return _runs(shop, "steady") if wanted <= names else None

    runs = wait_for(all_shown, 40, what="the runs fired while the operator was down, shown")
    by_run = [r["metadata"]["annotations"]["treadle.dev/mirrored-run"] for r in runs]
    assert len(by_run) == len(set(by_run)), "one run shown twice"
    _delete(shop, "steady")


def test_run_attributes_that_fit_are_labels_kubectl_selects_by(shop: Shop) -> None:
    """Issue 17 item 2: a run started from code with attributes, mirrored (mirrorRuns), is a
    WorkflowRun labelled attr.treadle.dev/<key>=<value> for each attribute that fits a label;
    the others are skipped; ``kubectl get wfr -l`` selects by them."""
    revision = shop.latest()

    def start(name: str, *attrs: str) -> str:
        flags = [arg for a in attrs for arg in ("--attr", a)]
        started = shop.cli("start", f"{WORKFLOWS}:greet", "--input", json.dumps({"name": name}),
                           *flags, "--json", revision=revision)  # fmt: skip
        assert started.returncode == 0, started.stderr
        return str(json.loads(started.stdout)["run_id"])

    acme = start("acme", "customer=acme", "tier=2", "vip=true", "note=has spaces: no",
                 "nested={\"a\": 1}")  # fmt: skip
    other = start("other", "customer=globex")

    def mirrored(run_id: str) -> dict[str, Any] | None:
        items = shop.kube.rest.get(shop.path("workflowruns"))["items"]
        found = [i for i in items if (i.get("status") or {}).get("runId") == run_id]
        return found[0] if found else None

    obj = wait_for(lambda: mirrored(acme), 60, what="the mirror of the attributed run")
    wait_for(lambda: mirrored(other), 60, what="the mirror of the other run")
    labels = obj["metadata"]["labels"]
    shown = {k: v for k, v in labels.items() if k.startswith("attr.treadle.dev/")}
    assert shown == {"attr.treadle.dev/customer": "acme", "attr.treadle.dev/tier": "2",
                     "attr.treadle.dev/vip": "true"}  # fmt: skip
    selected = _k(shop, "get", "wfr", "-l", "attr.treadle.dev/customer=acme", "-o", "name")
    assert selected.returncode == 0, selected.stderr
    assert selected.stdout.split() == [f"workflowrun.treadle.dev/{obj['metadata']['name']}"]
    both = _k(shop, "get", "wfr", "-l", "attr.treadle.dev/customer", "-o", "name")
    assert len(both.stdout.split()) == 2


def test_a_rollout_moves_the_schedule_to_the_new_revision(shop: Shop) -> None:
    """The schedule is pinned to the latest ready revision: after a rollout the World
    schedule names the new one and its firings run there (last: it rolls the shop)."""
    old = shop.latest()
    _create(shop, "rolling", EVERY_2S, "greet", {"name": "roll"})
    first = wait_for(lambda: [r for r in _runs(shop, "rolling") if _phase(r) == "Completed"],
                     60, what="a completed firing on the first revision")[0]  # fmt: skip
    assert first["status"]["revision"] == old
    shop.patch({"image": "shop:2"}, "shop")
    new = wait_for(lambda: (shop.latest() != old) and shop.latest(), 90, what="a new revision")
    moved = wait_for(
        lambda: (got := _world_schedule(shop, "rolling")) and got.spec.deployment_id == new
        and got, 30, what="the World schedule pinned to the new revision",
    )  # fmt: skip
    assert moved.spec.catchup == "latest"

    def on_new() -> dict[str, Any] | None:
        done = [r for r in _runs(shop, "rolling") if _phase(r) == "Completed"
                and r["status"].get("revision") == new]  # fmt: skip
        return done[0] if done else None

    fresh = wait_for(on_new, 90, what="a firing completed on the new revision")
    assert json.loads(fresh["status"]["output"])["image"] == "shop:2"
    assert _schedule(shop, "rolling")["status"]["revision"] == new
    _delete(shop, "rolling")
