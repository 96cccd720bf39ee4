"""The errors of ``treadle serve`` (issue 13): its webhooks (``treadle.serve.webhooks``,
``treadle.webhooksig``) and ``RequestRefused``, the 4xx JSON answer of its routes.
"""

from __future__ import annotations

from treadle.errors.base import SettingsError, TreadleError, ValueLimitExceeded
from treadle.errors.hooks import HookSignatureInvalid
from treadle.errors.world import HookNotFound

# -- webhooks (issue 13 item 1: treadle.serve.webhooks, treadle.webhooksig) ---------------
# Their messages name the run and the token's first characters only: a webhook's token
# is the secret part of its URL, and log lines travel further than the URL should.


def shown_token(token: str) -> str:
    """A webhook token as log lines and messages show it: its first characters."""
    return token[:7] + "..." if len(token) > 7 else token


class WebhookSecretMissing(SettingsError):
    """A webhook asks for a signature whose secret ``treadle serve`` does not hold: the
    environment variable ``secret_env`` is unset or empty where serve runs."""

    def __init__(self, secret_env: str, *, run_id: str) -> None:
        super().__init__(
            f"run {run_id}: the webhook's signature secret is read from {secret_env}, "
            "which is not set where treadle serve runs; nothing was recorded"
        )
        self.secret_env = secret_env
        self.run_id = run_id


class WebhookBodyTooLarge(ValueLimitExceeded):
    """A webhook call's body over ``TREADLE_WEBHOOK_MAX_BODY_BYTES``; refused (413)
    before anything is recorded, from Content-Length or while the body streams in."""

    def __init__(self, *, run_id: str, limit: int, size: int | None = None) -> None:
        seen = f"{size} bytes" if size is not None else "more"
        super().__init__(
            f"webhook of run {run_id}",
            f"the body is {seen}, over the limit of {limit} bytes "
            "(TREADLE_WEBHOOK_MAX_BODY_BYTES); nothing was recorded",
            setting="TREADLE_WEBHOOK_MAX_BODY_BYTES",
            limit=limit,
        )
        self.run_id = run_id
        self.size = size


class WebhookSignatureInvalid(HookSignatureInvalid):
    """A webhook call whose HMAC signature (``HmacSignature``/``StripeSignature``) is
    missing, malformed, wrong, or (Stripe style) outside its timestamp tolerance.
    Refused (401) before anything is recorded; ``reason`` names the problem."""

    def __init__(self, token: str, reason: str, *, run_id: str, header: str) -> None:
        super().__init__(token, reason)
        self.args = (
            f"webhook of run {run_id} ({shown_token(token)}) refused: {reason}; "
            "nothing was recorded",
        )
        self.run_id = run_id
        self.header = header


class WebhookRequestInvalid(TreadleError):
    """A webhook call whose body cannot become a ``WebhookRequest`` (JSON that does not
    parse, a form that is not UTF-8, a media type serve cannot read); ``status`` is
    the HTTP answer (400 or 415). Nothing was recorded."""

    def __init__(self, reason: str, *, run_id: str, status: int = 400) -> None:
        super().__init__(f"webhook of run {run_id}: {reason}; nothing was recorded")
        self.reason = reason
        self.run_id = run_id
        self.status = status


class WebhookSpecUnreadable(TreadleError):
    """A webhook's stored options (response, signature scheme) do not read here: made
    by a newer treadle (an unknown signature scheme), or damaged. serve refuses the
    call (500) rather than accept it unverified; nothing is recorded."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the webhook's stored options cannot be read by this treadle ({reason}); "
            "upgrade treadle serve; nothing was recorded"
        )
        self.reason = reason


class WebhookAlreadyReceived(HookNotFound):
    """The webhook's hook took a payload already (its run's log holds ``hook_received``
    for it): a second call is a conflict (409), never a second payload."""

    def __init__(self, token: str, *, run_id: str) -> None:
        super().__init__(token, run_id=run_id)
        self.args = (
            f"the webhook ({shown_token(token)}) of run {run_id} took its payload already; "
            "nothing was recorded",
        )


class RequestRefused(TreadleError):
    """``treadle serve`` refuses an HTTP request: ``status`` (a 4xx), a stable ``code``
    (``"unauthorized"``, ``"run_not_found"``...) and the message naming the problem.

    Answered as ``{"error": {"code": ..., "message": ...}}`` by ``treadle.serve.app``;
    raised by the serve routes and its auth (issue 13, "Bad input").
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
