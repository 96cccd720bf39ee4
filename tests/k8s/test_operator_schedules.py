"""WorkflowSchedule against the real API server, with the real kubectl 1.20 (issue 11 item 7;
review operator.md §1 row "Schedules / cron" and §2 (d)).

One shop for the module (an operator holding only the chart's namespaced Role, a ready
WorkflowDeployment), schedules with a seconds field (``*/2 * * * * *``) so firings come
every two seconds. Every wait is on API state: WorkflowRun objects appearing, phases,
status fields; absence ("suspended fires nothing") is judged against another schedule
that keeps firing meanwhile, never against a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from treadle_operator import binding

from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import Clones, pg_clones, pg_server
from ..postgres.pgserver import Server as PgServer
from .harness import Kube, wait_for
from .kubectl import kubectl
from .operator_env import OperatorProcess, Shop, chart_identity

__all__ = ["nats_server", "pg_clones", "pg_server"]

_count = itertools.count(1)
EVERY_2S = "*/2 * * * * *"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture(scope="module")
def shop(
    kube: Kube,
    pg_server: PgServer,
    pg_clones: Clones,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Shop]:
    """A namespace whose operator runs with the chart's namespaced Role (so a test can take
    one right away from it), and a ready WorkflowDeployment ``shop``."""
    namespace = f"sched-{next(_count)}"
    kube.rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    root = tmp_path_factory.mktemp(namespace)
    values = {"rbac": {"scope": "namespace", "namespaces": [namespace]}}
    identity = chart_identity(kube, root, values, release_ns=f"treadle-{namespace}")
    with ThreadPoolExecutor(max_workers=1) as pool:
        database = pg_server.dsn(pool.submit(asyncio.run, pg_clones.take()).result())
    made = Shop(
        kube=kube, namespace=namespace, database_url=database, nats_url=nats_server.url,
        operator=OperatorProcess(kube, namespace, root / "operator.log", identity),
    )  # fmt: skip
    made.secret()
    made.operator.start()
    made.deploy(made.deployment, "shop:1")
    made.latest()
    yield made
    made.operator.kill()  # a SIGTERM'd operator takes its 15 s to go; the test is over
    print(f"--- operator log of {namespace} (tail) ---")
    print(made.operator.log()[-8000:])
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
    return sorted(items, key=lambda r: r["metadata"]["name"])


def _at(run: dict[str, Any]) -> int:
    return int(run["metadata"]["name"].rsplit("-", 1)[1])


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _iso(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _delete(shop: Shop, name: str) -> None:
    shop.kube.rest.delete(shop.path("workflowschedules", name))


def test_kubectl_applied_schedule_fires_keyed_owned_runs_that_complete_and_prunes_history(
    shop: Shop,
) -> None:
    """Each firing is a WorkflowRun <schedule>-<unix time> with runKey the time, owned and
    labelled; runs complete; only successfulRunsHistoryLimit Completed runs stay; kubectl
    shows CronJob's columns. Then suspend fires nothing while another schedule fires twice,
    and resuming fires the latest missed time once (CronJob's rule)."""
    applied = _k(
        shop,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(
            _manifest(
                shop, "every", EVERY_2S, "greet", {"name": "cron"}, successfulRunsHistoryLimit=2
            )
        ),
    )
    assert applied.returncode == 0, applied.stderr
    uid = _schedule(shop, "every")["metadata"]["uid"]
    seen: dict[str, dict[str, Any]] = {}

    def history() -> list[dict[str, Any]] | None:
        runs = _runs(shop, "every")
        seen.update({r["metadata"]["name"]: r for r in runs})
        done = [r for r in runs if (r.get("status") or {}).get("phase") == "Completed"]
        return runs if len(seen) >= 5 and len(done) == 2 else None

    runs = wait_for(history, 60, what="five firings of 'every', two Completed runs kept")
    for name, run in seen.items():
        at = _at(run)
        assert name == f"every-{at}" and at % 2 == 0
        assert run["spec"]["runKey"] == _iso(at)
        assert run["spec"]["workflow"] == "greet" and run["spec"]["input"] == {"name": "cron"}
        assert run["metadata"]["labels"]["treadle.dev/schedule"] == "every"
        (owner,) = run["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("WorkflowSchedule", "every", uid)
    completed = next(r for r in runs if (r.get("status") or {}).get("phase") == "Completed")
    assert json.loads(completed["status"]["output"])["hello"] == "cron"
    assert completed["status"]["runId"] == binding.run_id(
        shop.namespace, completed["metadata"]["name"], completed["spec"]["runKey"]
    )
    status = wait_for(
        lambda: (got := _schedule(shop, "every")["status"]).get("lastSuccessfulTime") and got,
        20, what="lastSuccessfulTime of 'every'",
    )  # fmt: skip
    assert status["lastScheduleTime"]
    assert status["nextScheduleTime"] > status["lastScheduleTime"]
    assert _conditions(_schedule(shop, "every"))["Ready"]["status"] == "True"
    table = _k(shop, "get", "wfsched", "every")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0].split()
    assert header == ["NAME", "SCHEDULE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]
    assert table.stdout.splitlines()[1].split()[1:7] == ["*/2", "*", "*", "*", "*", "*"]

    # suspend: the operator says so, and nothing fires while "ticker" fires twice
    shop.kube.rest.patch(shop.path("workflowschedules", "every"), {"spec": {"suspend": True}})
    generation = _schedule(shop, "every")["metadata"]["generation"]

    def suspended() -> dict[str, Any] | None:
        obj = _schedule(shop, "every")
        ready = _conditions(obj).get("Ready", {})
        ok = ready.get("reason") == "Suspended" and ready.get("observedGeneration") == generation
        return obj if ok else None

    held = wait_for(suspended, 20, what="'every' reads Suspended")
    assert "nextScheduleTime" not in held["status"]
    last = max(_at(r) for r in _runs(shop, "every"))
    _create(shop, "ticker", EVERY_2S, "greet", {"name": "tick"})
    wait_for(lambda: len(_runs(shop, "ticker")) >= 2, 30, what="two firings of 'ticker'")
    assert max(_at(r) for r in _runs(shop, "every")) == last, "a suspended schedule fired"
    assert _schedule(shop, "every")["status"]["lastScheduleTime"] == _iso(last)
    _delete(shop, "ticker")

    # resume: the latest missed time fires once, the others are counted
    shop.kube.rest.patch(shop.path("workflowschedules", "every"), {"spec": {"suspend": False}})
    resumed = wait_for(
        lambda: [r for r in _runs(shop, "every") if _at(r) > last], 20, what="a firing on resume"
    )
    assert len(resumed) <= 2  # the latest missed time, and perhaps the next regular one
    missed = _schedule(shop, "every")["status"]
    assert missed["lastScheduleTime"] >= _iso(_at(resumed[0]))
    _delete(shop, "every")


def test_forbid_skips_firings_while_a_run_is_active(shop: Shop) -> None:
    """concurrencyPolicy Forbid: never two runs of the schedule at once; the skipped firings
    are counted (missedSchedules) and said once as an Event (AlreadyActive)."""
    _create(shop, "forbid", EVERY_2S, "naps", {"count": 1, "seconds": 5},
            concurrencyPolicy="Forbid", startingDeadlineSeconds=1)  # fmt: skip
    counted: list[int] = []

    def two_done() -> list[dict[str, Any]] | None:
        runs = _runs(shop, "forbid")
        counted.append(
            int((_schedule(shop, "forbid").get("status") or {}).get("missedSchedules", 0))
        )
        active = [r for r in runs if (r.get("status") or {}).get("phase") not in
                  ("Completed", "Failed", "Cancelled")]  # fmt: skip
        assert len(active) <= 1, (
            f"two runs active under Forbid: {[r['metadata']['name'] for r in active]}"
        )
        finished = [r for r in runs if (r.get("status") or {}).get("phase") == "Completed"]
        return runs if len(finished) >= 2 else None

    runs = wait_for(two_done, 60, what="two runs of 'forbid' completed one after the other")
    _delete(shop, "forbid")
    first, second = runs[0], runs[1]
    assert second["metadata"]["creationTimestamp"] >= first["status"]["completedAt"]
    assert _at(second) - _at(first) > 2, "firings in between were skipped"
    assert max(counted) >= 1
    assert "AlreadyActive" in shop.events("forbid")


def test_replace_cancels_the_active_run_through_its_spec_cancel(shop: Shop) -> None:
    """concurrencyPolicy Replace: the next firing cancels the active run (spec.cancel, so the
    run ends Cancelled and its object stays for history) and starts its own."""
    _create(shop, "swap", EVERY_2S, "approval", {"order_id": "never"},
            concurrencyPolicy="Replace", failedRunsHistoryLimit=5)  # fmt: skip

    def replaced() -> list[dict[str, Any]] | None:
        runs = _runs(shop, "swap")
        phases = [(r.get("status") or {}).get("phase") for r in runs]
        return runs if len(runs) >= 2 and phases[0] == "Cancelled" else None

    runs = wait_for(replaced, 60, what="the first run of 'swap' Cancelled by the next firing")
    _delete(shop, "swap")
    assert runs[0]["spec"]["cancel"] is True
    assert shop.world_run(runs[0]["status"]["runId"])["status"] == "cancelled"
    assert runs[1]["metadata"]["name"] != runs[0]["metadata"]["name"]
    assert "Replaced" in shop.events("swap")


def test_an_invalid_schedule_or_time_zone_is_a_condition_naming_the_field(shop: Shop) -> None:
    """Refused by the schema where its pattern can see it (field count), else a condition
    ScheduleValid False naming spec.schedule / spec.timeZone; nothing fires; no traceback."""
    refused = _k(shop, "apply", "-f", "-", stdin=yaml.safe_dump(
        _manifest(shop, "short", "* * *", "greet", {"name": "x"})))  # fmt: skip
    assert refused.returncode != 0 and "spec.schedule" in refused.stderr, refused.stderr
    _create(shop, "bad-minute", "61 * * * *", "greet", {"name": "x"})
    _create(shop, "bad-zone", "@hourly", "greet", {"name": "x"}, timeZone="Mars/Olympus_Mons")

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
    assert _runs(shop, "bad-minute") == [] and _runs(shop, "bad-zone") == []
    assert "Traceback" not in shop.operator.log()
    _delete(shop, "bad-minute")
    _delete(shop, "bad-zone")


def test_an_operator_killed_between_firing_and_status_fires_that_time_once(shop: Shop) -> None:
    """The run is created before status records the firing. The operator may not write the
    schedule's status (its Role loses that rule), fires, and is killed -9; restarted with
    the rule back, it fires the same time again: the same name (409), adopted; one
    WorkflowRun object, one run in the World, one RunCreated Event. A schedule made while
    the operator was down fires once on its return: the latest missed time (within
    startingDeadlineSeconds), the others counted in a Missed Event."""
    role_path = f"{RBAC}/namespaces/{shop.namespace}/roles/treadle-operator"
    role = shop.kube.rest.get(role_path)
    rules = role["rules"]
    kept = [r for r in rules if r["resources"] != ["workflowschedules/status"]]
    assert len(kept) == len(rules) - 1
    shop.kube.rest.patch(role_path, {"rules": kept})
    at = int(datetime.now(UTC).timestamp()) + 6  # after the object is made, even under load
    when = datetime.fromtimestamp(at, UTC)
    once = f"{when.second} {when.minute} {when.hour} {when.day} {when.month} *"
    _create(shop, "once", once, "greet", {"name": "once"}, startingDeadlineSeconds=60)
    name = f"once-{at}"
    fired = wait_for(lambda: shop.run(name), 30, what=f"the firing's WorkflowRun {name}")
    wait_for(lambda: "reconcile failed" in shop.operator.log(), 20,
             what="the operator failing to write the schedule's status")  # fmt: skip
    assert "lastScheduleTime" not in (_schedule(shop, "once").get("status") or {})
    shop.operator.kill()
    # While it is down, another schedule is made and three of its times pass.
    _create(shop, "often", EVERY_2S, "greet", {"name": "often"}, startingDeadlineSeconds=30)
    made = _schedule(shop, "often")["metadata"]["creationTimestamp"]
    origin = int(datetime.strptime(made, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())
    wait_for(lambda: time.time() >= origin + 7, 15, what="three times of 'often' passing")
    shop.kube.rest.patch(role_path, {"rules": rules})
    shop.operator.start()

    def recorded() -> dict[str, Any] | None:
        status = _schedule(shop, "once").get("status") or {}
        return status if status.get("lastScheduleTime") == _iso(at) else None

    status = wait_for(recorded, 40, what="lastScheduleTime written after the restart")
    assert status["missedSchedules"] == 0
    (only,) = _runs(shop, "once")
    assert only["metadata"]["uid"] == fired["metadata"]["uid"], "the run object was made again"
    done = shop.phase(name, "Completed")
    run_id = binding.run_id(shop.namespace, name, _iso(at))
    assert done["runId"] == run_id
    listed = shop.cli("runs", "list", "--workflow", "greet", "--json")
    assert listed.returncode == 0, listed.stderr
    ids = [r["run_id"] for r in json.loads(listed.stdout)]
    assert ids.count(run_id) == 1
    assert shop.events("once").count("RunCreated") == 1
    assert "made already: adopted" in shop.operator.log()
    _delete(shop, "once")

    # The times 'often' missed while the operator was down fire once: the latest of them.
    first = wait_for(lambda: _runs(shop, "often"), 30, what="the first firing of 'often'")[0]
    assert _at(first) >= origin + 6, "a time older than the latest missed one fired"

    def said() -> list[str]:
        listed = shop.kube.rest.get(
            f"/api/v1/namespaces/{shop.namespace}/events?fieldSelector=involvedObject.name=often"
        )
        return [e["message"] for e in listed["items"] if e["reason"] == "Missed"]

    def said_first() -> list[str]:  # (a later firing slowed by load may be said too)
        return [m for m in said() if _iso(_at(first)) in m]

    (missed,) = wait_for(said_first, 10, what="a Missed Event on 'often' for its first firing")
    assert int(missed.split()[0]) >= 2, missed
    _delete(shop, "often")
