"""The two custom resources, as pydantic models: the one source of their schema.

``treadle crds`` turns these models into the CRD YAML under ``crds/`` and the
Helm chart; the handlers parse objects with them. Field names are camelCase on
the wire (``alias_generator``) and snake_case in Python.

- ``WorkflowDeployment`` (``wfd``): an image and module serving workflows. A
  change of image or module makes a new *revision* (a new deployment id in the
  World, its own orchestrator and step-worker Deployments).
- ``WorkflowRun`` (``wfr``): one run of a workflow, started on the deployment's
  latest ready revision and pinned there; its status mirrors the event log.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.alias_generators import to_camel

GROUP = "treadle.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

RevisionPhase = Literal["Pending", "Active", "Draining", "Retired"]
RunPhase = Literal["Pending", "Running", "Completed", "Failed", "Cancelled"]
OnDelete = Literal["Cancel", "Orphan"]
DeletionPolicy = Literal["Wait", "Cancel", "Orphan"]
ReplicasManagedBy = Literal["Operator", "External"]
FINISHED_PHASES: frozenset[str] = frozenset({"Completed", "Failed", "Cancelled"})

_ModelT = TypeVar("_ModelT", bound=BaseModel)


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )


# -- shared ---------------------------------------------------------------------------


class Condition(_Model):
    """A Kubernetes-style condition: the latest observation of one aspect."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = Field(
        default=None, description="the object's generation this condition was made for"
    )


# -- WorkflowDeployment ---------------------------------------------------------------


class WorldRef(_Model):
    """Where the World is: a Secret in the deployment's namespace holding its URLs."""

    secret_name: str = Field(
        default="treadle-world", min_length=1, description="Secret with the World's URLs"
    )
    database_url_key: str = Field(
        default="database-url", min_length=1, description="key of the PostgreSQL URL"
    )
    nats_url_key: str = Field(default="nats-url", min_length=1, description="key of the NATS URL")
    payload_key_key: str = Field(
        default="payload-key",
        min_length=1,
        description="key of the payload encryption keys (TREADLE_PAYLOAD_KEY), if the Secret "
        "has it: workers get it, and the operator encrypts WorkflowRun inputs with it",
    )


class Autoscale(_Model):
    """Scale step workers from the JetStream consumer's pending count."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=10, ge=1)
    pending_per_replica: int = Field(
        default=100, ge=1, description="pending step messages one replica is expected to absorb"
    )


class OrchestratorSpec(_Model):
    replicas: int = Field(default=1, ge=0)
    concurrency: int = Field(default=32, ge=1, le=10_000)
    resources: dict[str, Any] | None = Field(
        default=None, description="a container's resources (requests, limits)"
    )


class StepsSpec(_Model):
    replicas: int = Field(default=2, ge=0)
    concurrency: int = Field(default=16, ge=1, le=10_000)
    resources: dict[str, Any] | None = Field(
        default=None, description="a container's resources (requests, limits)"
    )
    autoscale: Autoscale | None = None
    replicas_managed_by: ReplicasManagedBy = Field(
        default="Operator",
        description="Operator: the operator sets the step workers' replicas (replicas, or "
        "autoscale); External: an HPA or KEDA scaler owns them, the operator sets replicas "
        "only when it creates the Deployment and never overwrites them",
    )


class WorkflowDeploymentSpec(_Model):
    image: str = Field(min_length=1, description="the image with the workflow code")
    module: str = Field(
        min_length=1, description="where the Workflows app lives: package.module or module:APP"
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    world: WorldRef = WorldRef()
    orchestrator: OrchestratorSpec = OrchestratorSpec()
    steps: StepsSpec = StepsSpec()
    env: list[dict[str, Any]] | None = Field(
        default=None,
        description="extra environment for every worker container; the TREADLE_* variables "
        "the operator sets (and their _FILE forms) are refused",
    )
    service_account_name: str | None = Field(
        default=None,
        description="the workers' ServiceAccount (of this namespace); without one no "
        "service account token is mounted",
    )
    pod_security_context: dict[str, Any] | None = Field(
        default=None,
        description="replaces the workers' default pod securityContext (runAsNonRoot, "
        "seccomp RuntimeDefault) as a whole",
    )
    container_security_context: dict[str, Any] | None = Field(
        default=None,
        description="replaces the workers' default container securityContext (runAsNonRoot, "
        "readOnlyRootFilesystem, no privilege escalation, drop ALL, seccomp RuntimeDefault) "
        "as a whole",
    )
    revision_history_limit: int = Field(
        default=5, ge=0, le=100, description="how many retired revisions status keeps"
    )
    mirror_runs: bool = Field(
        default=False, description="show runs started from code as WorkflowRun objects"
    )
    deletion_policy: DeletionPolicy = Field(
        default="Wait",
        description="deleting this object while runs are active: Wait (keep the workers until "
        "the runs end, then go), Cancel (cancel every active run, then go), or Orphan (go at "
        "once; the runs stall with no workers)",
    )


class RevisionStatus(_Model):
    id: str = Field(description="the revision's deployment id in the World")
    image: str
    module: str
    created_at: str
    phase: RevisionPhase = "Pending"
    active_runs: int = 0
    ready: bool = False
    message: str = ""


class WorkflowDeploymentStatus(_Model):
    observed_generation: int | None = None
    revision_count: int = Field(default=0, description="revisions made so far")
    latest_revision: str | None = Field(
        default=None, description="the newest ready revision: new runs start there"
    )
    latest_created_revision: str | None = Field(
        default=None,
        description="the revision of the current spec (image, module), ready or not; the "
        "rollout is done when it equals latestRevision and Ready is True",
    )
    revisions: list[RevisionStatus] = []
    conditions: list[Condition] = []


class WorkflowDeployment(_Model):
    """Schema root: ``spec`` and ``status`` (metadata is the API server's)."""

    spec: WorkflowDeploymentSpec
    status: WorkflowDeploymentStatus | None = None


# -- WorkflowRun ----------------------------------------------------------------------


class WorkflowRunSpec(_Model):
    deployment: str = Field(min_length=1, description="the WorkflowDeployment to run on")
    workflow: str = Field(min_length=1, description="the workflow's name in the app")
    input: JsonValue = Field(
        default=None,
        description="keyword arguments as an object, or positional ones as an array",
    )
    cancel: bool = Field(default=False, description="cancel the run and keep this object")
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="delete this object that long after the run finished (or after the "
        "object was made, for an object that adopted a finished run)",
    )
    run_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="part of the run's identity with namespace and name: the same object "
        "applied again finds the same run; a new key starts a new run",
    )
    on_delete: OnDelete = Field(
        default="Cancel",
        description="what deleting this object does to a run that has not ended: Cancel it, "
        "or Orphan it (the run goes on)",
    )


class StepCounts(_Model):
    total: int = 0
    completed: int = 0
    failed: int = 0
    running: int = 0


class RunError(_Model):
    type: str = "Error"
    message: str


class WorkflowRunStatus(_Model):
    run_id: str | None = None
    revision: str | None = None
    phase: RunPhase = "Pending"
    reason: str = Field(default="", description="why the phase is what it is, in a word")
    started_at: str | None = None
    completed_at: str | None = None
    steps: StepCounts = StepCounts()
    steps_summary: str = Field(default="", description="completed/total, for kubectl")
    waiting_on: list[str] = Field(
        default=[], description="the first WAITING_ON_LIMIT open sleeps and hooks"
    )
    waiting_on_count: int = Field(default=0, description="how many sleeps and hooks are open")
    duration: str | None = Field(default=None, description="how long the run took, once ended")
    message: str = Field(default="", description="one short line on the run, for kubectl")
    output: str | None = Field(default=None, description="the result as JSON, truncated")
    error: RunError | None = None
    mirrored: bool = Field(default=False, description="started from code, shown here")
    observed_generation: int | None = None
    conditions: list[Condition] = []


class WorkflowRun(_Model):
    """Schema root: ``spec`` and ``status``."""

    spec: WorkflowRunSpec
    status: WorkflowRunStatus | None = None


def parse_status(model: type[_ModelT], raw: Any) -> _ModelT:
    """A status from an object's ``status`` (absent or partial is the defaults)."""
    return model.model_validate(raw or {})


def dump(model: BaseModel) -> dict[str, Any]:
    """The wire form for a merge patch: camelCase keys, JSON values.

    Empty strings are left out (the models' defaults read them back as ""): the
    API server stores a "" inside a list as null and then refuses it as not a
    string. A top-level ``None`` stays, so the patch removes that field.
    """
    wire: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
    return {k: _drop_empty(v) for k, v in wire.items() if v != ""}


def _drop_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_empty(v) for k, v in value.items() if v not in ("", None)}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value
