"""WorkflowDeployments and WorkflowRuns on a real cluster (DESIGN.md section 6).

A run completes; a rollout to a new image leaves a sleeping run on the revision that
started it while new runs go to the new one; deleting a running WorkflowRun cancels
the run in the World.
"""

from __future__ import annotations

import json
from typing import Any

from .conftest import WORKFLOW_IMAGES, WORLD_SECRET, Kube


def workflow_deployment(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "treadle.dev/v1alpha1",
        "kind": "WorkflowDeployment",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "module": "treadle_e2e",
            "world": {
                "secretName": WORLD_SECRET,
                "databaseUrlKey": "database-url",
                "natsUrlKey": "nats-url",
            },
            "orchestrator": {"replicas": 1},
            "steps": {"replicas": 1, "concurrency": 4},
        },
    }


def workflow_run(name: str, deployment: str, workflow: str, **arguments: Any) -> dict[str, Any]:
    return {
        "apiVersion": "treadle.dev/v1alpha1",
        "kind": "WorkflowRun",
        "metadata": {"name": name},
        "spec": {"deployment": deployment, "workflow": workflow, "input": arguments},
    }


def run_status(kube: Kube, name: str) -> dict[str, Any]:
    status: dict[str, Any] = kube.get("workflowrun", name).get("status") or {}
    return status


def wait_for_phase(kube: Kube, name: str, phase: str, timeout: float = 300) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = run_status(kube, name)
        assert status.get("phase") not in {"Failed", "Cancelled"} - {phase}, status
        return status if status.get("phase") == phase else None

    found: dict[str, Any] = kube.wait_for(f"WorkflowRun {name} {phase}", reached, timeout)
    return found


def latest_revision(kube: Kube, deployment: str) -> str | None:
    status = kube.get("workflowdeployment", deployment).get("status") or {}
    latest: str | None = status.get("latestRevision")
    return latest


def revision_phase(kube: Kube, deployment: str, revision: str) -> str | None:
    status = kube.get("workflowdeployment", deployment).get("status") or {}
    for entry in status.get("revisions") or []:
        if entry.get("id") == revision:
            phase: str = entry.get("phase")
            return phase
    return None


def run_in_world(kube: Kube, job: str, run_id: str) -> dict[str, Any]:
    """The run as the World records it (``treadle runs get RUN --json`` in a Job)."""
    printed = kube.run_treadle(job, "runs", "get", run_id, "--json")
    found: dict[str, Any] = json.JSONDecoder().raw_decode(printed[printed.index("{") :])[0]
    return found


def test_a_workflow_run_completes(treadle: Kube) -> None:
    """A WorkflowRun of a deployed workflow reaches Completed with its output and revision."""
    treadle.apply(workflow_deployment("greeter", WORKFLOW_IMAGES[0]))
    revision = treadle.wait_for(
        "greeter's first revision", lambda: latest_revision(treadle, "greeter")
    )
    treadle.apply(workflow_run("greet-kind", "greeter", "greet", name="kind"))
    status = wait_for_phase(treadle, "greet-kind", "Completed")
    assert status["revision"] == revision
    assert "hello, kind" in json.dumps(status.get("output"))
    recorded = run_in_world(treadle, "greet-kind-in-world", status["runId"])
    assert recorded["status"] == "completed"
    assert recorded["deployment_id"] == revision


def test_rollout_keeps_a_sleeping_run_on_its_revision(treadle: Kube) -> None:
    """A new image makes a new revision; the sleeping run finishes on the old one."""
    treadle.apply(workflow_deployment("sleeper", WORKFLOW_IMAGES[0]))
    first = treadle.wait_for(
        "sleeper's first revision", lambda: latest_revision(treadle, "sleeper")
    )
    treadle.apply(workflow_run("long-nap", "sleeper", "nap", seconds=90))
    assert wait_for_phase(treadle, "long-nap", "Running")["revision"] == first

    treadle.kubectl(
        "patch", "workflowdeployment", "sleeper", "--type=merge",
        "-p", json.dumps({"spec": {"image": WORKFLOW_IMAGES[1]}}),
    )  # fmt: skip
    second = treadle.wait_for(
        "sleeper's second revision",
        lambda: (latest := latest_revision(treadle, "sleeper")) != first and latest,
    )
    assert run_status(treadle, "long-nap")["phase"] == "Running"
    assert revision_phase(treadle, "sleeper", first) == "Draining"

    treadle.apply(workflow_run("after-rollout", "sleeper", "greet", name="rollout"))
    assert wait_for_phase(treadle, "after-rollout", "Completed")["revision"] == second

    finished = wait_for_phase(treadle, "long-nap", "Completed", timeout=400)
    assert finished["revision"] == first
    treadle.wait_for(
        f"revision {first} retired",
        lambda: revision_phase(treadle, "sleeper", first) in ("Retired", None),
    )


def test_deleting_a_running_workflow_run_cancels_it(treadle: Kube) -> None:
    """kubectl delete on a sleeping WorkflowRun cancels the run before the object goes."""
    treadle.apply(workflow_deployment("napper", WORKFLOW_IMAGES[0]))
    treadle.wait_for("napper's first revision", lambda: latest_revision(treadle, "napper"))
    treadle.apply(workflow_run("endless-nap", "napper", "nap", seconds=3600))
    run_id = wait_for_phase(treadle, "endless-nap", "Running")["runId"]
    treadle.kubectl("delete", "workflowrun", "endless-nap", "--wait=true", "--timeout=120s")
    assert run_in_world(treadle, "endless-nap-in-world", run_id)["status"] == "cancelled"
