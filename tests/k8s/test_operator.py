"""The treadle operator against a real kube-apiserver, with worker pods that really run.

One namespace ("the shop") holds the World's Secret and a WorkflowDeployment
whose orchestrator and step-worker pods run ``treadle worker`` on a real
PostgreSQL and nats-server: on the real node (containerd + kubelet, pods from
real images, loopback only) when it starts, else as host processes of the
process kubelet (``pod_node.py`` decides, once a session, and says which); a
real ``treadle operator`` process reconciles. Each scenario is named after what a
platform team does: apply, run, resume a hook from outside, cancel by
deleting, roll out a new image under a sleeping run, restart the operator.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import Clones, pg_clones, pg_server
from ..postgres.pgserver import Server as PgServer
from .harness import Kube, wait_for
from .operator_env import WORKFLOWS, OperatorProcess, Shop, chart_identity
from .pod_node import PodNode
from .rest import ApiError

__all__ = ["nats_server", "pg_clones", "pg_server"]

_shops = itertools.count(1)


def _database(pg_server: PgServer, pg_clones: Clones) -> str:
    with ThreadPoolExecutor(max_workers=1) as pool:
        name = pool.submit(asyncio.run, pg_clones.take()).result()
    return pg_server.dsn(name)


@pytest.fixture(scope="session")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator runs as the chart's service account, with the chart's RBAC only."""
    return chart_identity(kube, tmp_path_factory.mktemp("identity"))


@pytest.fixture
def shop_factory(
    kube: Kube,
    pod_node: PodNode,
    operator_kubeconfig: Path,
    pg_server: PgServer,
    pg_clones: Clones,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[], Shop]]:
    made: list[Shop] = []

    def make() -> Shop:
        namespace = f"shop-{next(_shops)}"
        kube.rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        log = tmp_path_factory.mktemp(namespace) / "operator.log"
        shop = Shop(
            kube=kube,
            namespace=namespace,
            database_url=_database(pg_server, pg_clones),
            nats_url=nats_server.url,
            operator=OperatorProcess(kube, namespace, log, operator_kubeconfig),
            pods=pod_node,
        )
        made.append(shop)
        return shop

    yield make
    for shop in made:
        shop.operator.stop()
        print(shop.report())
        # Worker Deployments go with their owner; the namespace takes the rest.
        kube.rest.delete(f"/api/v1/namespaces/{shop.namespace}")


@pytest.fixture
def shop(shop_factory: Callable[[], Shop]) -> Shop:
    """A namespace with the World's Secret, a running operator and a ready deployment."""
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    shop.deploy(shop.deployment, "shop:1")
    shop.latest()
    return shop


def _worker_pods(shop: Shop, revision: str) -> list[dict[str, object]]:
    return shop.kube.pods(shop.namespace, f"treadle.dev/revision={revision}")


def _running(pod: dict[str, object]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"  # type: ignore[union-attr]


def test_a_deployment_starts_its_workers_and_a_run_completes_with_status_synced(
    shop: Shop,
) -> None:
    """apply -> worker pods run -> WorkflowRun completes; status and Events come from the log."""
    revision = shop.latest()
    wfd = shop.wfd()
    assert [r["phase"] for r in wfd["status"]["revisions"]] == ["Active"]
    conditions = {c["type"]: c["status"] for c in wfd["status"]["conditions"]}
    assert conditions == {
        "SpecAccepted": "True", "WorldReachable": "True", "Ready": "True", "WorkersHealthy": "True",
        "Progressing": "False", "Reconciling": "False", "Stalled": "False",
    }  # fmt: skip
    pods = _worker_pods(shop, revision)
    assert {p["metadata"]["labels"]["treadle.dev/role"] for p in pods} == {  # type: ignore[index]
        "orchestrator",
        "steps",
    }
    assert all(_running(p) for p in pods)

    shop.start("hello", "greet", {"name": "k8s"})
    status = shop.phase("hello", "Completed")
    assert status["revision"] == revision
    assert json.loads(status["output"]) == {"hello": "k8s", "image": "shop:1"}
    assert status["steps"] == {"total": 1, "completed": 1, "failed": 0, "running": 0}
    assert status["stepsSummary"] == "1/1"
    started = {c["type"]: c for c in status["conditions"]}["Started"]
    assert (started["status"], started["reason"]) == ("True", "RunRecorded")
    assert status["startedAt"] and status["completedAt"]
    assert shop.world_run(status["runId"])["status"] == "completed"
    reasons = wait_for(lambda: {"Started", "Completed"} <= set(shop.events("hello")) or None)
    assert reasons


def test_a_hook_resumed_from_outside_and_cancel_by_deleting_or_by_spec(shop: Shop) -> None:
    """waitingOn names the hook; `treadle hooks resume` ends it; delete or spec.cancel cancel."""
    shop.start("approve-1", "approval", {"order_id": "o-1"})
    shop.start("approve-2", "approval", {"order_id": "o-2"})
    shop.start("approve-3", "approval", {"order_id": "o-3"})
    for name, order in (("approve-1", "o-1"), ("approve-2", "o-2"), ("approve-3", "o-3")):
        waiting = wait_for(
            lambda name=name: shop.status(name).get("waitingOn"),  # type: ignore[misc]
            60,
            what=f"{name} waiting",
        )
        assert waiting == [f"hook approve:{order}"]
        assert shop.status(name)["phase"] == "Running"

    resumed = shop.cli("hooks", "resume", "approve:o-1", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    done = shop.phase("approve-1", "Completed")
    assert json.loads(done["output"]) == {"approved": True, "before": "shop:1", "after": "shop:1"}
    assert done["waitingOn"] == []

    # Deleting a running WorkflowRun cancels its run; the finalizer then lets it go.
    run_2 = shop.status("approve-2")["runId"]
    shop.kube.rest.delete(shop.path("workflowruns", "approve-2"))
    wait_for(lambda: shop.run("approve-2") is None, 30, what="approve-2 deleted")
    assert shop.world_run(run_2)["status"] == "cancelled"

    # spec.cancel cancels and keeps the object.
    shop.kube.rest.patch(shop.path("workflowruns", "approve-3"), {"spec": {"cancel": True}})
    cancelled = shop.phase("approve-3", "Cancelled")
    assert shop.world_run(cancelled["runId"])["status"] == "cancelled"
    assert shop.run("approve-3") is not None


def test_a_rollout_leaves_a_sleeping_run_on_its_revision_until_it_drains(shop: Shop) -> None:
    """New image: new revision takes new runs; the waiting run finishes on the old one, which
    then drains, scales away and retires."""
    old = shop.latest()
    shop.start("long", "approval", {"order_id": "long"})
    wait_for(lambda: shop.status("long").get("waitingOn"), 60, what="the long run waiting")

    shop.patch({"image": "shop:2"}, "shop")
    new = wait_for(lambda: (shop.latest() != old) and shop.latest(), 90, what="a new revision")
    revisions = {r["id"]: r for r in shop.wfd()["status"]["revisions"]}
    assert revisions[new]["image"] == "shop:2"
    drained = wait_for(
        lambda: (
            {r["id"]: r for r in shop.wfd()["status"]["revisions"]}[old]["phase"] == "Draining"
            or None
        ),
        30,
        what="the old revision draining",
    )
    assert drained
    assert {r["id"]: r for r in shop.wfd()["status"]["revisions"]}[old]["activeRuns"] == 1
    assert _worker_pods(shop, old), "the old revision keeps its pods while a run is on it"

    shop.start("fresh", "greet", {"name": "new"})
    fresh = shop.phase("fresh", "Completed")
    assert fresh["revision"] == new
    assert json.loads(fresh["output"])["image"] == "shop:2"

    resumed = shop.cli("hooks", "resume", "approve:long", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    long = shop.phase("long", "Completed")
    assert long["revision"] == old
    assert json.loads(long["output"]) == {"approved": True, "before": "shop:1", "after": "shop:1"}

    def retired() -> bool:
        phases = {r["id"]: r["phase"] for r in shop.wfd()["status"]["revisions"]}
        return phases[old] == "Retired" and phases[new] == "Active"

    wait_for(retired, 60, what="the old revision retired")
    deployments = shop.kube.rest.get(f"/apis/apps/v1/namespaces/{shop.namespace}/deployments")
    names = {d["metadata"]["name"] for d in deployments["items"]}
    assert names == {f"{new}-orchestrator", f"{new}-steps"}
    wait_for(lambda: not _worker_pods(shop, old), 60, what="the old revision's pods gone")


def test_the_operator_restarted_mid_run_loses_nothing(shop: Shop) -> None:
    """kill -9 the operator while a run waits; the hook is resumed while it is down; a new
    operator brings the object up to date. A WorkflowRun created while it was down starts."""
    shop.start("across", "approval", {"order_id": "across"})
    wait_for(lambda: shop.status("across").get("waitingOn"), 60, what="the run waiting")
    shop.operator.kill()

    resumed = shop.cli("hooks", "resume", "approve:across", "--payload", '{"approved": false}')
    assert resumed.returncode == 0, resumed.stderr
    shop.start("while-down", "greet", {"name": "later"})
    run_id = shop.status("across")["runId"]
    wait_for(lambda: shop.world_run(run_id)["status"] == "completed", 60, what="run completed")
    assert shop.status("across")["phase"] == "Running", "nobody updates the object meanwhile"

    shop.operator.start()
    done = shop.phase("across", "Completed")
    assert done["runId"] == run_id
    assert json.loads(done["output"])["approved"] is False
    assert shop.phase("while-down", "Completed")["runId"]


def test_a_start_cut_off_after_choosing_its_run_id_starts_that_run_once(shop: Shop) -> None:
    """The handler writes status.runId before recording the run; if it dies in between, the
    retried handler records the run under that id: one run, the object's id, never two."""
    revision = shop.latest()
    shop.operator.stop()
    shop.start("cut", "greet", {"name": "once"})
    chosen = "wrun_01JCVT0FFAFTERCH00S1NGRVNA"
    shop.kube.rest.patch(
        shop.path("workflowruns", "cut") + "/status",
        {"status": {"runId": chosen, "revision": revision, "phase": "Pending"}},
    )
    shop.operator.start()
    done = shop.phase("cut", "Completed")
    assert done["runId"] == chosen
    listed = shop.cli("runs", "list", "--workflow", "greet", "--json")
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [chosen]


def test_bad_runs_fail_with_the_reason_and_record_nothing(shop: Shop) -> None:
    """Unknown workflow, input of the wrong shape, arguments the signature refuses: Failed."""
    shop.start("unknown", "refund", {"order_id": "x"})
    shop.start("shape", "greet", "just a string")
    shop.start("args", "greet", {"nom": "typo"})
    unknown = shop.phase("unknown", "Failed")
    assert unknown["reason"] == "UnknownWorkflow"
    started = {c["type"]: c for c in unknown["conditions"]}["Started"]
    assert (started["status"], started["reason"]) == ("False", "UnknownWorkflow")
    message = unknown["error"]["message"]
    assert "serves no workflow 'refund' (it serves: " in message
    # k8s_workflows.py grows (append-only): the names it had are served, in order.
    served = message.rpartition("(it serves: ")[2].rstrip(")").split(", ")
    assert served == sorted(served) and {"approval", "fanout", "greet", "naps"} <= set(served)
    shape = shop.phase("shape", "Failed")
    assert shape["reason"] == "InvalidInput"
    assert "spec.input must be an object" in shape["error"]["message"]
    args = shop.phase("args", "Failed")
    assert args["error"]["message"] == (
        "workflow greet cannot take spec.input: missing a required argument: 'name'"
    )
    for status in (unknown, shape, args):
        assert not status.get("runId")
    listed = shop.cli("runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


def test_deleting_a_deployment_removes_its_workers_and_retires_it(shop: Shop) -> None:
    revision = shop.latest()
    record = shop.deployment_record(revision)
    assert record is not None and not record.retired and record.catalogue
    shop.kube.rest.delete(shop.path("workflowdeployments", "shop"))
    wait_for(lambda: shop.kube.rest.find(shop.path("workflowdeployments", "shop")) is None, 30)
    retired = shop.deployment_record(revision)
    assert retired is not None and retired.retired
    deployments = f"/apis/apps/v1/namespaces/{shop.namespace}/deployments"
    wait_for(lambda: not shop.kube.rest.get(deployments)["items"], 60, what="workers collected")


def test_invalid_objects_are_rejected_by_the_schema(shop: Shop) -> None:
    """422 with the field named: the CRDs' generated schemas are enforced by the API server."""
    with pytest.raises(ApiError) as missing:
        shop.kube.rest.create(
            shop.path("workflowruns"),
            {"apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun",
             "metadata": {"name": "nope"}, "spec": {"deployment": "shop"}},
        )  # fmt: skip
    assert missing.value.status == 422
    assert "spec.workflow: Required value" in missing.value.body
    with pytest.raises(ApiError) as negative:
        shop.deploy("broken", "img:1", steps={"replicas": -1})
    assert negative.value.status == 422
    assert "spec.steps.replicas" in negative.value.body


def test_finished_runs_expire_after_their_ttl(shop: Shop) -> None:
    shop.start("brief", "greet", {"name": "ttl"}, ttlSecondsAfterFinished=0)
    wait_for(lambda: shop.run("brief") is None, 60, what="the finished run removed")


def _start_from_code(shop: Shop, revision: str, name: str) -> str:
    """`treadle start` on the revision's deployment id, as application code would; the run id."""
    started = shop.cli(
        "start", f"{WORKFLOWS}:greet", "--input", json.dumps({"name": name}), "--json",
        revision=revision,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return str(json.loads(started.stdout)["run_id"])


def test_runs_started_from_code_are_mirrored_when_asked(shop: Shop) -> None:
    """mirrorRuns: a run started with the client shows up as a WorkflowRun; off by default."""
    revision = shop.latest()
    unmirrored = _start_from_code(shop, revision, "code")
    wait_for(lambda: shop.world_run(unmirrored)["status"] == "completed", 60)
    assert shop.kube.rest.get(shop.path("workflowruns"))["items"] == []

    shop.kube.rest.patch(shop.path("workflowdeployments", "shop"), {"spec": {"mirrorRuns": True}})
    wait_for(lambda: shop.wfd()["metadata"]["generation"] == shop.wfd()["status"].get(
        "observedGeneration"), 30, what="the change seen")  # fmt: skip
    run_id = _start_from_code(shop, revision, "mirror")

    def mirrored() -> dict[str, object] | None:
        items = shop.kube.rest.get(shop.path("workflowruns"))["items"]
        done = [i for i in items if (i.get("status") or {}).get("phase") == "Completed"]
        return done[0] if done else None

    obj = wait_for(mirrored, 60, what="the mirrored run")
    assert obj["status"]["runId"] == run_id  # type: ignore[index]
    assert obj["status"]["mirrored"] is True  # type: ignore[index]
    assert obj["spec"] == {"deployment": "shop", "workflow": "greet",  # type: ignore[index]
                           "input": {"name": "mirror"}, "cancel": False,
                           "onDelete": "Cancel", "recordOutput": True,
                           "ttlSecondsAfterFinished": 86400}  # fmt: skip


def test_step_workers_scale_with_the_step_backlog(shop_factory: Callable[[], Shop]) -> None:
    """autoscale: replicas follow the JetStream backlog between the bounds, back to the floor."""
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    autoscale = {"minReplicas": 1, "maxReplicas": 3, "pendingPerReplica": 1}
    shop.deploy("shop", "shop:1", steps={"concurrency": 1, "autoscale": autoscale})
    revision = shop.latest()
    steps = f"/apis/apps/v1/namespaces/{shop.namespace}/deployments/{revision}-steps"
    assert shop.kube.rest.get(steps)["spec"]["replicas"] == 1
    shop.start("busy", "naps", {"count": 6, "seconds": 8})
    wait_for(lambda: shop.kube.rest.get(steps)["spec"]["replicas"] == 3, 60, what="scaled up")
    done = shop.phase("busy", "Completed", timeout=120)
    served = set(json.loads(done["output"]))
    assert len(served) >= 2, f"the backlog was shared by more than one pod: {served}"
    wait_for(lambda: shop.kube.rest.get(steps)["spec"]["replicas"] == 1, 60, what="back to 1")


def test_missing_secret_and_crash_looping_workers_become_conditions(
    shop_factory: Callable[[], Shop],
) -> None:
    """No Secret: WorldReachable False, retried until it appears. A module that does not
    exist: the workers crash-loop and WorkersHealthy says why."""
    shop = shop_factory()
    shop.operator.start()
    shop.deploy("shop", "shop:1")

    world = wait_for(
        lambda: condition_of(shop, "shop", "WorldReachable"), 30, what="a WorldReachable condition"
    )
    assert world["status"] == "False" and world["reason"] == "SecretMissing"
    assert "treadle-world does not exist" in world["message"]
    shop.secret()
    shop.latest()

    shop.deploy("broken", "shop:1", module="no_such_module_here")
    broken = wait_for(
        lambda: (
            (c := condition_of(shop, "broken", "WorkersHealthy")) and c["status"] == "False" and c
        ),
        90,
        what="a crash-loop condition",
    )
    assert "CrashLoopBackOff" in broken["message"]
    assert "no_such_module_here" in broken["message"]
    assert (shop.wfd("broken").get("status") or {}).get("latestRevision") is None


def condition_of(shop: Shop, name: str, kind: str) -> dict[str, str] | None:
    found = [c for c in (shop.wfd(name).get("status") or {}).get("conditions", [])
             if c["type"] == kind]  # fmt: skip
    return found[0] if found else None


def test_a_world_secret_with_payload_keys_encrypts_runs_started_from_kubectl(
    shop_factory: Callable[[], Shop],
) -> None:
    """Issue 16 item 4: the Secret's ``payload-key`` reaches the workers and the operator.
    The WorkflowRun's input is sealed before it is stored (a CLI without the key sees
    ``<encrypted>``), the run completes on the workers, and the operator, holding the
    deployment's key, shows the output in the status."""
    shop = shop_factory()
    key = "ops1:" + base64.b64encode(bytes(range(7, 39))).decode()
    shop.secret(**{"payload-key": key})
    shop.operator.start()
    shop.deploy(shop.deployment, "shop:1")
    shop.latest()
    shop.start("sealed", "greet", {"name": "Kerguelen"})
    status = shop.phase("sealed", "Completed")
    assert json.loads(status["output"]) == {"hello": "Kerguelen", "image": "shop:1"}
    stored = shop.world_run(status["runId"])  # read by a CLI without the key
    assert stored["input"] == {"args": [], "kwargs": {"name": "<encrypted>"}}
    assert stored["output"] == "<encrypted>"
