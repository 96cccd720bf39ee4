"""The errors of the issue 17 features, a section per feature: child workflows,
timeouts (and ``FeatureNeedsSpec9``, a spec 9 feature asked of a spec 8 run), run
attributes, the determinism linter (and ``StartOptionClash``), schedules,
concurrency and rate limits, streams and sagas. Hook force-claims (item 8) are in
``errors.hooks``.
"""

from __future__ import annotations

from typing import Literal

from treadle.errors.base import SerializationError, TreadleError, WorkflowError
from treadle.errors.workflow import FatalError
from treadle.errors.world import WorldError

# -- child workflows (issue 17 item 1; docs/children.md) ---------------------------------


class ChildWorkflowFailed(WorkflowError):
    """A child run failed or was cancelled; awaiting it (or its handle's ``result()``) in
    the parent raises this, with the child's run id and error."""

    def __init__(
        self,
        child_run_id: str,
        workflow_name: str,
        message: str,
        *,
        error_type: str = "Error",
        code: str | None = None,
        cancelled: bool = False,
    ) -> None:
        what = "was cancelled" if cancelled else f"failed: {error_type}: {message}"
        super().__init__(f"child workflow {workflow_name} (run {child_run_id}) {what}")
        self.child_run_id = child_run_id
        self.workflow_name = workflow_name
        self.error_message = message
        self.error_type = error_type
        self.code = code
        self.cancelled = cancelled


class ChildWorkflowsNotSupported(WorkflowError):
    """A child workflow started where children cannot run (a spec 8 run); nothing recorded."""


# -- timeouts (issue 17 item 5, docs/timeouts.md) ----------------------------------


class StepTimedOut(WorkflowError):
    """A step attempt passed its ``timeout`` (start-to-close) or ``heartbeat_timeout``;
    the attempt counts as a failure and is retried per the step's ``max_retries``."""

    def __init__(self, step_name: str, *, seconds: float, heartbeat: bool = False) -> None:
        what = "heartbeat_timeout" if heartbeat else "timeout"
        super().__init__(f"step {step_name} passed its {what} of {seconds:g} s")
        self.step_name = step_name
        self.seconds = seconds
        self.heartbeat = heartbeat


class RunTimedOut(WorkflowError):
    """The run passed its run timeout; it fails with this (steps running are not
    cancelled: their late outcomes are refused, the run having ended)."""

    def __init__(self, run_id: str, *, seconds: float) -> None:
        super().__init__(f"run {run_id} passed its run timeout of {seconds:g} s")
        self.run_id = run_id
        self.seconds = seconds


class FeatureNeedsSpec9(WorkflowError):
    """A spec 9 feature (timeouts, force-claims, sagas...) was asked of a spec 8 run;
    nothing was recorded for it. Names the feature (and the run, when known)."""

    def __init__(
        self, feature: str, *, run_id: str | None = None, spec_version: int | None = None
    ) -> None:
        where = f"run {run_id}: " if run_id else ""
        spec = spec_version if spec_version is not None else 8
        super().__init__(
            f"{where}{feature} needs a spec 9 run; this run is spec {spec} "
            "(set WORKFLOW_SPEC_VERSION=9, or leave it unset, on a World with the in-band "
            "fence)"
        )
        self.feature = feature
        self.run_id = run_id
        self.spec_version = spec_version


# -- attributes (issue 17 item 2: treadle.world.attributes, treadle.sdk.attributes) --------


class AttributeInvalid(SerializationError):
    """A run attribute refused at the call, before anything is recorded: a key outside
    ``treadle.world.attributes.KEY_PATTERN``, or a value that is not JSON; ``path``
    names the key (``attribute 'tier'``)."""


class AttributesNeedSpec9(WorkflowError):
    """``set_attributes()`` in workflow code needs a spec 9 run (an in-band ``attr_set``
    the run's one orchestrator writes); a spec 8 run raises this where the code calls
    it. Step code and ``run.set_attributes()`` work on both formats."""

    def __init__(self, run_id: str, spec_version: int) -> None:
        super().__init__(
            f"run {run_id}: set_attributes() in workflow code needs a spec 9 run, and this "
            f"run is spec {spec_version} (started with WORKFLOW_SPEC_VERSION="
            f"{spec_version}); set attributes from a step or with run.set_attributes(), "
            "or start the workflow's runs at WORKFLOW_SPEC_VERSION=9"
        )
        self.run_id = run_id
        self.spec_version = spec_version


# -- the determinism linter (issue 17 item 9: treadle.lint) ------------------------------


class LintInputInvalid(TreadleError):
    """``treadle lint`` cannot read its input: a path that does not exist, a file that is
    not UTF-8 or does not parse. The message is one line naming the file (and line)."""

    def __init__(self, path: str, reason: str, *, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class StartOptionClash(TreadleError, TypeError):
    """``app.start(workflow, ..., option=...)`` where ``option`` (``attributes``,
    ``priority``, ``timeout``: the start's own keywords) is also a parameter of the
    workflow that the call's positional arguments leave unfilled: which one is meant
    cannot be told. Raised at the call, nothing recorded; the message names the way
    out (``workflow.options(...)`` binds the start's options, and then every keyword
    of the call is the workflow's)."""

    def __init__(self, workflow: str, option: str, meaning: str) -> None:
        super().__init__(
            f"app.start({workflow}, {option}=...): workflow {workflow} has a parameter "
            f"named {option!r}, and app.start reads {option}= as the run's {meaning}. "
            f"Bind the run's options with .options() and every keyword goes to the "
            f"workflow: app.start({workflow}.options({option}=...), ..., {option}=...) "
            f"(or pass the workflow's {option!r} by position). Nothing was recorded"
        )
        self.workflow = workflow
        self.option = option


# -- schedules (issue 17 item 3) -----------------------------------------------------------


class ScheduleInvalid(TreadleError, ValueError):
    """A schedule's ``field`` (cron, timezone, overlap, workflow...) cannot be used;
    raised at the call, before anything is recorded. The message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ScheduleNotFound(WorldError):
    """No schedule of that name in the World."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


# -- concurrency and rate limits (issue 17 item 4) ------------------------------------------


class LimitKeyError(WorkflowError):
    """A limit's key function raised, or returned no string, for the given input: nothing
    was recorded (``app.start`` refused, or the step call refused before its creation)."""

    def __init__(self, where: str, limit: str, problem: str) -> None:
        self.where = where
        self.limit = limit
        self.problem = problem
        super().__init__(f"{where}: the {limit} key cannot be computed from its input: {problem}")


# -- streams (issue 17 item 6, docs/streams.md) ------------------------------------------

StreamRefusal = Literal["run_ended", "stale_attempt", "not_started", "start_refused"]


class StreamError(FatalError):
    """A stream misused at the call (nothing recorded), or its chunks refused. A
    ``FatalError``: raised in a step it fails the step at once (a retry would fail alike)."""


class StreamNameInvalid(StreamError, ValueError):
    """A stream name that is not 1 to 128 characters of letters, digits, ``_.:-``."""

    def __init__(self, name: object, reason: str) -> None:
        super().__init__(f"stream name {name!r} is invalid: {reason}; nothing was recorded")
        self.name = name


class StreamClosedError(StreamError):
    """A write to a writer that was closed, or to a stream a writer closed (closing is
    final: a retried step cannot reopen it). Nothing was recorded."""

    def __init__(self, run_id: str, name: str, detail: str = "it was closed") -> None:
        super().__init__(
            f"run {run_id}: stream {name!r} refuses the write: {detail}; nothing was recorded"
        )
        self.run_id = run_id
        self.name = name


class StreamWriteRefused(StreamError):
    """The World (or the run-ready barrier) refused a step attempt's chunks, none
    written: the run ended, a later attempt of the step started, the attempt's start
    is not in the log, or its optimistic start was refused (``reason``)."""

    def __init__(self, run_id: str, name: str, reason: StreamRefusal, detail: str) -> None:
        super().__init__(f"run {run_id}: chunks for stream {name!r} refused: {detail}")
        self.run_id = run_id
        self.name = name
        self.reason = reason


# -- sagas (issue 17 item 7) ------------------------------------------------------------


class SagaCompensated(WorkflowError):
    """A saga's body failed and its compensations ran (in reverse order).

    ``error`` is the body's original failure (also ``__cause__``);
    ``compensation_errors`` the compensations that failed after their retries,
    as ``(name, error)`` pairs, in the order they ran.
    """

    def __init__(
        self, error: BaseException, compensation_errors: list[tuple[str, BaseException]]
    ) -> None:
        failed = ", ".join(name for name, _ in compensation_errors)
        tail = f"; compensations that failed: {failed}" if failed else ""
        super().__init__(f"saga failed ({type(error).__name__}: {error}); compensated{tail}")
        self.error = error
        self.compensation_errors = compensation_errors
