"""Hook errors: what a hook's wait raises in the workflow (``HookConflictError``,
``HookForceClaimedError``), what ``resume_hook`` answers (``HookWakeFailed``,
``HookSignatureInvalid``), and a token retained by an ended run (``HookRunEnded``, a
``HookNotFound``). The World's own hook refusals (``HookNotFound``,
``HookPayloadNotRecorded``) are in ``errors.world``; webhooks' in ``errors.serve``.
"""

from __future__ import annotations

from treadle.errors.base import TreadleError, WorkflowError
from treadle.errors.world import HookNotFound


class HookConflictError(WorkflowError):
    """Another run holds this hook's token."""

    def __init__(self, token: str, *, holder_run_id: str | None) -> None:
        super().__init__(f"hook token {token!r} is held by run {holder_run_id}")
        self.token = token
        self.holder_run_id = holder_run_id


class HookWakeFailed(TreadleError):
    """``resume_hook`` recorded the payload, but the wake to the run could not be sent.

    The payload IS durable in the run's log: the run sees it on its next
    orchestrator delivery (any wake, timer, step completion or recovery), so do
    not resume the hook again (a second payload is refused). ``__cause__`` is the
    queue's last failure; ``attempts`` the sends tried.
    """

    def __init__(self, token: str, *, run_id: str, attempts: int, reason: str) -> None:
        super().__init__(
            f"resume_hook({token!r}): the payload is recorded in run {run_id}, but its wake "
            f"could not be sent ({attempts} attempts; last: {reason}); the run will see the "
            "payload on its next delivery; do not resume again"
        )
        self.token = token
        self.run_id = run_id
        self.attempts = attempts
        self.reason = reason


class HookSignatureInvalid(TreadleError):
    """``resume_hook`` of a hook created with ``require_signature=True`` carried no
    signature or a wrong one (``treadle.hook_signature``); nothing was written."""

    def __init__(self, token: str, reason: str) -> None:
        super().__init__(f"resume_hook({token!r}) refused: {reason}; nothing was recorded")
        self.token = token
        self.reason = reason


# -- Hook force-claim and token retention (issue 17 item 8) ----------------------------


class HookForceClaimedError(WorkflowError):
    """Another run took this hook's token (``create_hook(token, force=True)``)."""

    def __init__(self, token: str, *, claimed_by: str) -> None:
        super().__init__(f"hook token {token!r} was force-claimed by run {claimed_by}")
        self.token = token
        self.claimed_by = claimed_by


class HookRunEnded(HookNotFound):
    """The token is still reserved (``retain_token_for``) by a run that has ended."""

    def __init__(self, token: str, *, run_id: str, status: str) -> None:
        super().__init__(token, run_id=run_id)
        self.args = (
            f"hook token {token!r} belongs to run {run_id}, which has ended ({status}); "
            "its token is retained, so nothing was recorded",
        )
        self.status = status
