"""Day 2 from kubectl alone: WorkflowSignal, and the operator's probes and metrics (issue 11
item 6; review operator.md §1 rows Retry/resubmit, Suspend/resume/signal, Metrics, Health
probes, §2 5(e), R13 "no liveness probe, no metrics").

The user has kubectl 1.20 and no database credentials: a WorkflowSignal applied with
``kubectl apply`` resumes a hook (inline payload, or from a ConfigMap), wakes a sleeping run,
reruns a failed run, cancels one; what cannot be done is ``Failed`` with the reason; a
restarted operator never does a handled signal twice. The operator process serves
``/healthz``, ``/readyz`` and ``/metrics``, scraped here. One shop and one operator serve
the whole module.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import hook_signature
from treadle.worlds.production import PostgresNatsWorld

from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import Clones, pg_clones, pg_server
from ..postgres.pgserver import Server as PgServer
from .conftest import POD_ENV
from .harness import Kube, wait_for
from .kubectl import kubectl, kubectl_120
from .operator_env import FAST, OperatorProcess, Shop
from .pod_node import PodNode
from .processes import free_port
from .test_operator import _database, operator_kubeconfig

__all__ = ["nats_server", "operator_kubeconfig", "pg_clones", "pg_server"]

HOOK_KEY = "day2-hook-key"  # the World Secret's hook-key: the operator signs with it
DEADLINE = 12  # seconds a signal that cannot be done yet is retried


@dataclass
class ProbedOperator(OperatorProcess):
    """The operator process with its probe and metrics server on a port of its own."""

    port: int = 0

    def start(self) -> None:
        env = {
            **os.environ,
            **POD_ENV,
            **FAST,
            "KUBECONFIG": str(self.kubeconfig),
            "TREADLE_OPERATOR_PROBE_PORT": str(self.port),
            "TREADLE_OPERATOR_PROBE_HOST": "127.0.0.1",
            "TREADLE_OPERATOR_SIGNAL_DEADLINE_SECONDS": str(DEADLINE),
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "treadle.cli", "operator", "--namespace", self.namespace],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as got:
                return got.status, got.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)


@pytest.fixture(scope="module")
def day2(
    kube: Kube,
    pod_node: PodNode,
    operator_kubeconfig: Path,
    pg_server: PgServer,
    pg_clones: Clones,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Shop]:
    """One namespace, World Secret, operator (chart RBAC, probes on) and ready deployment."""
    namespace = "day2"
    kube.rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    log = tmp_path_factory.mktemp(namespace) / "operator.log"
    operator = ProbedOperator(kube, namespace, log, operator_kubeconfig, port=free_port())
    shop = Shop(
        kube=kube,
        namespace=namespace,
        database_url=_database(pg_server, pg_clones),
        nats_url=nats_server.url,
        operator=operator,
        pods=pod_node,
    )
    shop.secret(**{"hook-key": HOOK_KEY})
    operator.start()
    try:
        shop.deploy(shop.deployment, "shop:1")
        shop.latest()
        yield shop
    finally:
        operator.stop()
        print(shop.report(8000))
        kube.rest.delete(f"/api/v1/namespaces/{namespace}")


def _probed(shop: Shop) -> ProbedOperator:
    assert isinstance(shop.operator, ProbedOperator)
    return shop.operator


def _apply(shop: Shop, manifest: dict[str, Any]) -> None:
    done = kubectl(
        shop.kube.kubeconfig,
        "-n",
        shop.namespace,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(manifest),
    )
    assert done.returncode == 0, done.stderr


def _run(shop: Shop, name: str, workflow: str, input: Any) -> None:
    _apply(
        shop,
        {
            "apiVersion": "treadle.dev/v1alpha1",
            "kind": "WorkflowRun",
            "metadata": {"name": name},
            "spec": {"deployment": shop.deployment, "workflow": workflow, "input": input},
        },
    )


def _signal(shop: Shop, name: str, action: str, **spec: Any) -> None:
    _apply(
        shop,
        {
            "apiVersion": "treadle.dev/v1alpha1",
            "kind": "WorkflowSignal",
            "metadata": {"name": name},
            "spec": {"action": action, **spec},
        },
    )


def _handled(shop: Shop, name: str, condition: str = "Succeeded") -> dict[str, Any]:
    """The signal's status once ``kubectl wait --for=condition=<condition>`` says so."""
    waited = kubectl(
        shop.kube.kubeconfig,
        "-n",
        shop.namespace,
        "wait",
        f"--for=condition={condition}",
        f"wfs/{name}",
        "--timeout=60s",
        timeout=90,
    )
    signal = shop.kube.rest.find(shop.path("workflowsignals", name)) or {}
    assert waited.returncode == 0, f"{waited.stderr}; status: {signal.get('status')}"
    status: dict[str, Any] = signal["status"]
    return status


def _waiting(shop: Shop, name: str) -> list[str]:
    found: list[str] = wait_for(
        lambda: shop.status(name).get("waitingOn"), 60, what=f"{name} waiting"
    )
    return found


def _event_types(shop: Shop, run_id: str) -> list[str]:
    """The types of the run's events, read from its World (on a loop of its own)."""

    async def read() -> list[str]:
        world = await PostgresNatsWorld.connect(
            shop.database_url, shop.nats_url, deployment_id="test-reader"
        )
        try:
            page = await world.events.list(run_id)
            assert not page.has_more
            return [logged.type for logged in page.events]
        finally:
            await world.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, read()).result()


def test_a_signal_resumes_a_waiting_runs_hook_and_the_run_completes_with_the_payload(
    day2: Shop,
) -> None:
    """ResumeHook by token with an inline payload, and by the run's only open hook with the
    payload from a ConfigMap key: both runs complete with what was sent; `kubectl get wfs`
    shows the action, the run and the outcome."""
    shop = day2
    _run(shop, "order-1", "approval", {"order_id": "o-1"})
    _run(shop, "order-2", "approval", {"order_id": "o-2"})
    assert _waiting(shop, "order-1") == ["hook approve:o-1"]
    assert _waiting(shop, "order-2") == ["hook approve:o-2"]

    _signal(
        shop,
        "approve-order-1",
        "ResumeHook",
        run="order-1",
        resumeHook={"token": "approve:o-1", "payload": {"approved": True}},
    )
    status = _handled(shop, "approve-order-1")
    assert (status["phase"], status["reason"]) == ("Done", "HookResumed")
    assert status["runId"] == shop.status("order-1")["runId"] and status["handledAt"]
    done = shop.phase("order-1", "Completed")
    assert json.loads(done["output"])["approved"] is True

    shop.kube.rest.create(
        f"/api/v1/namespaces/{shop.namespace}/configmaps",
        {"metadata": {"name": "answers"}, "data": {"order-2": '{"approved": true}'}},
    )
    _signal(
        shop,
        "approve-order-2",
        "ResumeHook",
        run="order-2",
        resumeHook={"payloadFrom": {"configMapKeyRef": {"name": "answers", "key": "order-2"}}},
    )
    assert _handled(shop, "approve-order-2")["hookToken"] == "approve:o-2"
    assert json.loads(shop.phase("order-2", "Completed")["output"])["approved"] is True

    listed = kubectl(shop.kube.kubeconfig, "-n", shop.namespace, "get", "wfs")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:5] == ["NAME", "ACTION", "RUN", "PHASE", "MESSAGE"]
    assert any(r.split()[:4] == ["approve-order-1", "ResumeHook", "order-1", "Done"] for r in rows)


def test_a_wake_signal_cuts_a_long_sleep_short(day2: Shop) -> None:
    """A run sleeping an hour completes within seconds of a Wake signal."""
    shop = day2
    _run(shop, "nap-1", "snooze", {"seconds": 3600})
    assert _waiting(shop, "nap-1")[0].startswith("sleep until ")
    _signal(shop, "wake-nap-1", "Wake", run="nap-1")
    status = _handled(shop, "wake-nap-1")
    assert status["reason"] == "Woken" and "asked 1 sleep" in status["message"]
    assert json.loads(shop.phase("nap-1", "Completed", timeout=30)["output"]) == "awake"


def test_a_rerun_signal_makes_a_new_run_of_a_failed_one_that_can_succeed(
    day2: Shop, tmp_path: Path
) -> None:
    """The run fails (no marker file); the cause is fixed (the file is made); a Rerun signal
    makes WorkflowRun <name>-rerun-1 with the same input, which succeeds. The failed run
    stays as it was; a Rerun of a run that completed is refused."""
    shop = day2
    marker = shop.pods.shared_file(f"marker-{tmp_path.name}")  # the workers look for it
    _run(shop, "fragile", "needs_marker", {"path": marker.pod})
    failed = shop.phase("fragile", "Failed")
    assert "no marker file" in failed["error"]["message"]

    marker.host.write_text("here")
    _signal(shop, "rerun-fragile", "Rerun", run="fragile")
    status = _handled(shop, "rerun-fragile")
    assert (status["reason"], status["createdRun"]) == ("Rerun", "fragile-rerun-1")
    rerun = shop.phase("fragile-rerun-1", "Completed")
    assert json.loads(rerun["output"]) == "found"
    assert rerun["runId"] != failed["runId"]
    made = shop.run("fragile-rerun-1") or {}
    assert made["spec"]["input"] == {"path": marker.pod}
    assert made["metadata"]["labels"]["treadle.dev/rerun-of"] == "fragile"
    assert shop.status("fragile")["phase"] == "Failed"

    _signal(shop, "rerun-done", "Rerun", run="fragile-rerun-1")
    refused = _handled(shop, "rerun-done", "Failed")
    assert refused["reason"] == "RunNotRerunnable" and "Completed" in refused["message"]


def test_a_signed_hook_is_resumed_with_the_world_secrets_hook_key_or_a_right_signature(
    day2: Shop,
) -> None:
    """A hook created with require_signature: a signal without a signature is signed by the
    operator (the World Secret holds hook-key); a wrong signature is refused, nothing
    written; the right one (treadle.hook_signature) is accepted."""
    shop = day2
    _run(shop, "signed-1", "signed_approval", {"order_id": "s1"})
    _run(shop, "signed-2", "signed_approval", {"order_id": "s2"})
    _waiting(shop, "signed-1")
    _waiting(shop, "signed-2")
    _signal(
        shop,
        "forged",
        "ResumeHook",
        run="signed-2",
        resumeHook={"token": "signed:s2", "payload": {"approved": True}, "signature": "00" * 32},
    )
    forged = _handled(shop, "forged", "Failed")
    assert forged["reason"] == "SignatureInvalid" and "does not match" in forged["message"]
    assert shop.status("signed-2")["waitingOn"] == ["hook signed:s2"]

    _signal(
        shop, "vouched", "ResumeHook", run="signed-1", resumeHook={"payload": {"approved": True}}
    )
    _signal(
        shop,
        "signed",
        "ResumeHook",
        run="signed-2",
        resumeHook={
            "token": "signed:s2",
            "payload": {"approved": True},
            "signature": hook_signature("signed:s2", HOOK_KEY),
        },
    )
    assert _handled(shop, "vouched")["reason"] == "HookResumed"
    assert _handled(shop, "signed")["reason"] == "HookResumed"
    assert shop.phase("signed-1", "Completed")["output"] == "true"
    assert shop.phase("signed-2", "Completed")["output"] == "true"


def test_a_cancel_signal_cancels_a_waiting_run_named_by_its_run_id(day2: Shop) -> None:
    """spec.runId with spec.deployment (a run started from code has no WorkflowRun of its
    own); the run is cancelled and its WorkflowRun follows."""
    shop = day2
    _run(shop, "doomed", "approval", {"order_id": "doomed"})
    _waiting(shop, "doomed")
    run_id = shop.status("doomed")["runId"]
    _signal(
        shop,
        "cancel-doomed",
        "Cancel",
        runId=run_id,
        deployment=shop.deployment,
        cancel={"reason": "no longer wanted"},
    )
    assert _handled(shop, "cancel-doomed")["reason"] == "Cancelled"
    cancelled = shop.phase("doomed", "Cancelled")
    assert shop.world_run(cancelled["runId"])["status"] == "cancelled"


def test_what_cannot_be_done_fails_with_the_reason_and_a_handled_signal_expires(
    day2: Shop,
) -> None:
    """Unknown run, a token no hook holds, a payload that is not JSON, a run that ended:
    each signal ends Failed with a one-line reason (and `kubectl wait --for=condition=Failed`
    sees it); nothing is written to the run. A signal for a run not started yet stays Pending
    with the reason until its deadline, then fails saying so. A handled signal goes after its
    TTL."""
    shop = day2
    # A run that cannot start (its deployment does not exist): the signal waits, Pending
    # with the reason, retried until its deadline, then Failed saying so.
    shop.start("stuck", "greet", {"name": "x"}, deployment="no-such-deployment")
    _signal(shop, "wait-for-stuck", "Cancel", run="stuck")
    pending = wait_for(
        lambda: (
            (
                s := shop.kube.rest.get(shop.path("workflowsignals", "wait-for-stuck")).get(
                    "status"
                )
                or {}
            ).get("reason")
            == "RunNotStarted"
            and s
        ),
        30,
        what="the signal Pending, waiting for its run",
    )
    assert pending["phase"] == "Pending"
    assert pending["message"] == "WorkflowRun stuck has no run yet"

    _signal(shop, "ghost", "Wake", run="no-such-run")
    ghost = _handled(shop, "ghost", "Failed")
    assert ghost["reason"] == "RunNotFound"
    assert ghost["message"] == f"WorkflowRun {shop.namespace}/no-such-run not found"

    _run(shop, "picky", "approval", {"order_id": "picky"})
    _waiting(shop, "picky")
    _signal(
        shop,
        "wrong-token",
        "ResumeHook",
        run="picky",
        resumeHook={"token": "approve:nope", "payload": {"approved": True}},
    )
    wrong = _handled(shop, "wrong-token", "Failed")
    assert (wrong["reason"], wrong["message"]) == (
        "HookNotFound",
        "no open hook holds token 'approve:nope'",
    )
    shop.kube.rest.create(
        f"/api/v1/namespaces/{shop.namespace}/configmaps",
        {"metadata": {"name": "garbled"}, "data": {"p": "{not json"}},
    )
    _signal(
        shop,
        "garbled",
        "ResumeHook",
        run="picky",
        resumeHook={"payloadFrom": {"configMapKeyRef": {"name": "garbled", "key": "p"}}},
    )
    garbled = _handled(shop, "garbled", "Failed")
    assert garbled["reason"] == "PayloadInvalid"
    assert garbled["message"].startswith(f"ConfigMap {shop.namespace}/garbled key p is not JSON")
    # The World Secret is readable by the operator, never through a signal's payload.
    ref = {"secretKeyRef": {"name": "treadle-world", "key": "database-url"}}
    _signal(shop, "exfiltrate", "ResumeHook", run="picky", resumeHook={"payloadFrom": ref})
    exfiltrate = _handled(shop, "exfiltrate", "Failed")
    assert exfiltrate["reason"] == "PayloadForbidden"
    assert "payloadFrom.secretKeyRef is refused" in exfiltrate["message"]
    assert shop.status("picky")["waitingOn"] == ["hook approve:picky"], "nothing was delivered"

    _run(shop, "quick", "greet", {"name": "q"})
    shop.phase("quick", "Completed")
    _signal(shop, "late-wake", "Wake", run="quick", ttlSecondsAfterHandled=4)
    late = _handled(shop, "late-wake", "Failed")  # handledAt is to the second: 3 to 4 s left
    assert late["reason"] == "RunEnded" and "(completed)" in late["message"]
    wait_for(
        lambda: shop.kube.rest.find(shop.path("workflowsignals", "late-wake")) is None,
        30,
        what="the handled signal deleted after its TTL",
    )
    assert shop.kube.rest.find(shop.path("workflowsignals", "ghost")) is not None

    gave_up = _handled(shop, "wait-for-stuck", "Failed")
    assert gave_up["reason"] == "RunNotStarted"
    assert gave_up["message"] == f"WorkflowRun stuck has no run yet (gave up after {DEADLINE} s)"
    shop.kube.rest.delete(shop.path("workflowruns", "stuck"))  # it would retry for ever


def test_probes_and_metrics_and_a_restarted_operator_never_redoes_a_signal(day2: Shop) -> None:
    """/healthz and /readyz answer 200; /metrics counts runs started and finished, signals,
    reconciles, and says the shop's World is reachable. Then the operator is killed and
    started again: /readyz is 503 until it has reconciled the deployment, and the signals it
    had handled (a wake, a rerun) are not done again: one wake_requested in the log, no
    second rerun object, the same handledAt."""
    shop = day2
    operator = _probed(shop)
    assert operator.get("/healthz") == (200, "ok\n")
    assert wait_for(lambda: operator.get("/readyz")[0] == 200 or None, 30, what="ready")

    def scrape() -> dict[str, float]:
        code, text = operator.get("/metrics")
        assert code == 200, text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    before = scrape()
    started = f'treadle_operator_runs_started_total{{namespace="{shop.namespace}"}}'
    completed = (
        f'treadle_operator_runs_finished_total{{namespace="{shop.namespace}",phase="Completed"}}'
    )
    _run(shop, "counted", "greet", {"name": "m"})
    _run(shop, "slept", "snooze", {"seconds": 3600})
    shop.phase("counted", "Completed")
    _waiting(shop, "slept")
    _signal(shop, "wake-slept", "Wake", run="slept")
    first = _handled(shop, "wake-slept")
    shop.phase("slept", "Completed", timeout=30)
    _run(shop, "broken", "needs_marker", {"path": "/nonexistent/marker"})
    shop.phase("broken", "Failed")
    _signal(shop, "rerun-broken", "Rerun", run="broken")
    assert _handled(shop, "rerun-broken")["createdRun"] == "broken-rerun-1"
    shop.phase("broken-rerun-1", "Failed")

    after = wait_for(
        lambda: (s := scrape()).get(completed, 0) >= before.get(completed, 0) + 2 and s,
        15,
        what="the finished runs counted",
    )
    assert after[started] == before.get(started, 0) + 4
    assert after['treadle_operator_signals_total{action="Wake",phase="Done"}'] >= 1
    assert after['treadle_operator_signals_total{action="Rerun",phase="Done"}'] >= 1
    reachable = (
        f'treadle_operator_world_reachable{{deployment="shop",namespace="{shop.namespace}"}}'
    )
    assert after[reachable] == 1
    assert after['treadle_operator_reconcile_duration_seconds_count{kind="WorkflowDeployment"}'] > 0
    assert 'treadle_operator_reconcile_errors_total{kind="WorkflowDeployment"}' not in after
    assert after["treadle_operator_tracked_runs"] >= 0

    slept_run = shop.status("slept")["runId"]
    assert _event_types(shop, slept_run).count("wake_requested") == 1
    listed = shop.kube.rest.get(shop.path("workflowsignals"))["items"]
    handled = [s for s in listed if (s.get("status") or {}).get("phase") in ("Done", "Failed")]
    assert len(handled) == len(listed) >= 2  # this test's, and any earlier test's
    operator.kill()
    operator.start()
    readiness = []
    wait_for(
        lambda: readiness.append(operator.get("/readyz")) or readiness[-1][0] == 200 or None,
        60,
        what="ready again",
    )

    # The restarted operator lists every signal (kopf's resume): each handled one is seen,
    # and let be.
    skipped = "treadle_operator_signals_already_handled_total"
    wait_for(lambda: scrape().get(skipped) == len(handled), 30, what="every signal seen again")
    _signal(shop, "after-restart", "Wake", run="no-such-run")  # handled: the operator is up
    _handled(shop, "after-restart", "Failed")
    again = shop.kube.rest.find(shop.path("workflowsignals", "wake-slept")) or {}
    assert again["status"]["handledAt"] == first["handledAt"]
    assert _event_types(shop, slept_run).count("wake_requested") == 1
    assert shop.run("broken-rerun-2") is None
    assert scrape().get('treadle_operator_signals_total{action="Wake",phase="Done"}') is None


def test_the_kubectl_treadle_plugin_signals_and_reports_the_outcome(
    day2: Shop, tmp_path: Path
) -> None:
    """`kubectl treadle resume|wake ...` (kubectl 1.20 finds kubectl-treadle on PATH):
    it creates the signal, waits, prints the outcome; exit 0 when Done, 1 when Failed (the
    reason on stderr), 2 for an argument it cannot use (nothing created)."""
    shop = day2
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "kubectl").symlink_to(kubectl_120())
    plugin = shim / "kubectl-treadle"
    plugin.write_text(f'#!/bin/sh\nexec {sys.executable} -m treadle_operator.plugin "$@"\n')
    plugin.chmod(0o755)
    env = {
        **os.environ,
        **POD_ENV,
        "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
        "KUBECONFIG": str(shop.kube.kubeconfig),
    }

    def treadle(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "treadle", *argv, "-n", shop.namespace],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )

    _run(shop, "order-3", "approval", {"order_id": "o-3"})
    _waiting(shop, "order-3")
    resumed = treadle("resume", "order-3", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    made, outcome = resumed.stdout.splitlines()
    assert made.startswith("workflowsignal.treadle.dev/order-3-resume-")
    assert outcome.startswith("Done: HookResumed: hook 'approve:o-3' of run ")
    assert json.loads(shop.phase("order-3", "Completed")["output"])["approved"] is True

    missing = treadle("wake", "no-such-run")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"Failed: RunNotFound: WorkflowRun {shop.namespace}/no-such-run not found"
    )
    bad = treadle("resume", "order-3", "--payload", "{nope")
    assert bad.returncode == 2 and bad.stderr.startswith("kubectl treadle: --payload: not JSON")
