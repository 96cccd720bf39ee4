"""The custom resources, as pydantic models: the one source of their schema.

``treadle crds`` turns these models into the CRD YAML under ``crds/`` and the
Helm chart; the handlers parse objects with them. Field names are camelCase on
the wire (``alias_generator``) and snake_case in Python.

- ``WorkflowDeployment`` (``wfd``): an image and module serving workflows. A
  change of image or module makes a new *revision* (a new deployment id in the
  World, its own orchestrator and step-worker Deployments).
- ``WorkflowRun`` (``wfr``): one run of a workflow, started on the deployment's
  latest ready revision and pinned there; its status mirrors the event log.
- ``WorkflowSignal`` (``wfs``): one day-2 action on a run (``signals``).
- ``WorkflowSchedule`` (``wfsched``) lives in ``schedulemodels``.
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


class PodTemplateMetadata(_Model):
    labels: dict[str, str] | None = Field(
        default=None, description="more labels on the worker pods (treadle.dev/* is reserved)"
    )
    annotations: dict[str, str] | None = Field(
        default=None,
        description="more annotations on the worker pods (treadle.dev/* is reserved)",
    )


class PodTemplate(_Model):
    """A PodTemplateSpec merged under what the operator owns (``podtemplate``)."""

    metadata: PodTemplateMetadata | None = None
    spec: dict[str, Any] | None = Field(
        default=None,
        description="a pod spec (imagePullSecrets, nodeSelector, tolerations, affinity, "
        "volumes, securityContext, containers...): the container named 'worker' is merged "
        "into the operator's worker container (its image, command, args and TREADLE_* env "
        "are the operator's); docs/operator-templates.md has the rules",
    )


class DrainingRole(_Model):
    replicas: int = Field(ge=0, description="the replicas a draining revision keeps")
    max_replicas: int | None = Field(
        default=None,
        ge=0,
        description="scaled up to this many on the role's backlog (JetStream pending); "
        "default: the role's replicas of a current revision",
    )
    pending_per_replica: int = Field(
        default=100, ge=1, description="backlog messages one replica is expected to absorb"
    )


class DrainingSpec(_Model):
    """What a revision keeps while runs pinned to it drain (``draining``)."""

    orchestrator: DrainingRole = DrainingRole(replicas=1)
    steps: DrainingRole = DrainingRole(replicas=0)


class RevisionAction(_Model):
    """What to do with the runs pinned to one (non-latest) revision (``pinned``)."""

    action: Literal["CancelRuns", "MoveRuns"] = Field(
        description="CancelRuns: cancel every run of the revision that has not ended; "
        "MoveRuns: move each such run whose workflow declares the same compatible tag in "
        "both revisions to the revision named by `to`"
    )
    reason: str | None = Field(
        default=None, max_length=512, description="recorded with each cancel or move"
    )
    to: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="MoveRuns: the revision id to move the runs to (ready, not retired)",
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
    mirror_runs_ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        alias="mirrorRunsTTLSecondsAfterFinished",
        description="seconds a mirrored WorkflowRun is kept after its run finished "
        "(its ttlSecondsAfterFinished); unset: one day (docs/operator-status-sync.md)",
    )
    template: PodTemplate | None = Field(
        default=None,
        description="the worker pods' template, merged under what the operator owns; a "
        "change rolls the current revision's workers in place (image and module make a "
        "new revision)",
    )
    draining: DrainingSpec = Field(
        default=DrainingSpec(),
        description="the replicas of a revision that no longer takes new runs",
    )
    revisions: dict[str, RevisionAction] | None = Field(
        default=None,
        description="actions on the runs pinned to a revision, by revision id (e.g. "
        "{my-rev: {action: CancelRuns}} or {my-rev: {action: MoveRuns, to: other-rev}}); "
        "never on the latest revision",
    )
    retire_after_seconds: int = Field(
        default=60,
        ge=0,
        le=86_400,
        description="a superseded revision with no active runs retires only this long "
        "after it stopped being latest (a start that read it just before still lands)",
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
    template_hash: str = Field(
        default="", description="the hash of the pod template its workers run (podtemplate)"
    )
    superseded_at: str | None = Field(
        default=None, description="when it stopped being latest (retireAfterSeconds counts)"
    )


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


class KeyRef(_Model):
    """One key of a ConfigMap or Secret in the object's namespace (a WorkflowRun's input,
    a WorkflowSignal's hook payload)."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class InputFrom(_Model):
    """Where a large (or secret) input is: exactly one of the refs (docs/operator-admission.md)."""

    config_map_key_ref: KeyRef | None = Field(
        default=None, description="a ConfigMap key holding the input as JSON"
    )
    secret_key_ref: KeyRef | None = Field(
        default=None,
        description="a Secret key holding the input as JSON (only Secrets the chart's "
        "rbac.inputSecretNames lists)",
    )


class WorkflowRunSpec(_Model):
    deployment: str = Field(
        min_length=1,
        # A name (DNS subdomain), checked by the API server only (the schema): an object
        # stored before the pattern still parses here and waits, DeploymentNotFound.
        json_schema_extra={"maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        description="the WorkflowDeployment to run on (its name, in this namespace)",
    )
    workflow: str = Field(min_length=1, description="the workflow's name in the app")
    input: JsonValue = Field(
        default=None,
        description="keyword arguments as an object, or positional ones as an array "
        "(at most 128 KiB as JSON; larger ones through inputFrom)",
    )
    input_from: InputFrom | None = Field(
        default=None,
        description="the input read from a ConfigMap or Secret key when the run starts, "
        "instead of spec.input",
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
    record_output: bool = Field(
        default=True,
        description="copy the run's output (truncated) into status.output; false keeps it out "
        "of the object, which everyone who may get WorkflowRuns here can read",
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


# -- WorkflowSignal (treadle_operator.signals; docs/operator-day2.md) ----------------


SignalAction = Literal["ResumeHook", "Wake", "Rerun", "Cancel"]
SignalPhase = Literal["Pending", "Done", "Failed"]
SIGNAL_HANDLED_PHASES: frozenset[str] = frozenset({"Done", "Failed"})


class PayloadFrom(_Model):
    """Where a hook payload is read from (its value parsed as JSON)."""

    config_map_key_ref: KeyRef | None = None
    secret_key_ref: KeyRef | None = Field(
        default=None,
        description="refused: the operator reads only World Secrets, and a payload lands in "
        "the run's log (docs/operator-day2.md)",
    )


class ResumeHookSpec(_Model):
    token: str | None = Field(
        default=None,
        min_length=1,
        description="the hook's token as the workflow gave it (TREADLE_HOOK_TOKEN_NAMESPACE "
        "of the deployment's env is applied)",
    )
    hook: str | None = Field(
        default=None,
        min_length=1,
        description="or the hook's correlation id in the run's log; with neither, the run's "
        "only open hook",
    )
    payload: JsonValue = Field(default=None, description="the payload, any JSON")
    payload_from: PayloadFrom | None = Field(
        default=None, description="or read the payload (JSON) from a ConfigMap or Secret key"
    )
    signature: str | None = Field(
        default=None,
        description="hook_signature(token, key) for a hook created with "
        "require_signature; without it the operator signs with the World Secret's hook-key",
    )


class WakeSpec(_Model):
    waits: list[str] | None = Field(
        default=None, description="the sleeps' correlation ids to end; default every open one"
    )


class RerunSpec(_Model):
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="the new WorkflowRun's name (default <run>-rerun-<n>)",
    )
    input: JsonValue = Field(
        default=None, description="replaces the run's input when given (default: the same)"
    )


class CancelSpec(_Model):
    reason: str | None = Field(default=None, max_length=1024)


class WorkflowSignalSpec(_Model):
    action: SignalAction = Field(description="what to do to the run, once")
    run: str | None = Field(
        default=None, min_length=1, description="the WorkflowRun (of this namespace) to act on"
    )
    run_id: str | None = Field(
        default=None, min_length=1, description="or a run id, with spec.deployment"
    )
    deployment: str | None = Field(
        default=None,
        min_length=1,
        description="the WorkflowDeployment whose World holds spec.runId (or the hook token)",
    )
    resume_hook: ResumeHookSpec | None = None
    wake: WakeSpec | None = None
    rerun: RerunSpec | None = None
    cancel: CancelSpec | None = None
    ttl_seconds_after_handled: int | None = Field(
        default=None,
        ge=0,
        description="delete this object that long after it was handled "
        "(default TREADLE_OPERATOR_SIGNAL_TTL_SECONDS, one hour)",
    )


class WorkflowSignalStatus(_Model):
    phase: SignalPhase = "Pending"
    reason: str = Field(default="", description="why, in a word")
    message: str = Field(default="", description="what was done, or why not")
    handled_at: str | None = None
    run_id: str | None = Field(default=None, description="the run acted on")
    hook_id: str | None = Field(default=None, description="ResumeHook: the hook resumed")
    hook_token: str | None = Field(default=None, description="ResumeHook: its stored token")
    created_run: str | None = Field(default=None, description="Rerun: the new WorkflowRun")
    observed_generation: int | None = None
    conditions: list[Condition] = []


class WorkflowSignal(_Model):
    """Schema root: ``spec`` and ``status``."""

    spec: WorkflowSignalSpec
    status: WorkflowSignalStatus | None = None


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
