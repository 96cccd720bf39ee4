"""The operator's errors, one tree.

::

    OperatorError                 anything the operator raises on purpose
    ├── WorldUnavailable          the World a WorkflowDeployment names cannot be reached
    │   ├── WorldSecretMissing    its Secret, or a key in it, does not exist (retried)
    │   │   └── WorldSecretUnreadable  a key it reads is not UTF-8 text (or base64)
    │   ├── WorldSecretForbidden  RBAC does not let the operator read that Secret
    │   └── WorldHostRefused      a URL's host is not in TREADLE_OPERATOR_WORLD_HOSTS
    ├── NotConfigured             no cluster: not in a Pod and no usable kubeconfig
    ├── DeploymentRefused         the API server refused a worker Deployment (its template)
    ├── LeadershipLost            the Lease was not renewed in time: the operator stopped
    ├── WebhookUnavailable        the admission webhook's certificate Secret or
    │                             configuration cannot be used (RBAC, conflicts)
    ├── SignalRefused             a WorkflowSignal cannot be done (its status says why)
    ├── SignalNotYet              a WorkflowSignal cannot be done yet (retried)
    └── InvalidSchedule           a WorkflowSchedule's schedule or time zone (names the field)

Engine errors (``treadle.errors``) pass through unchanged; a run the World
refuses to start is a ``treadle.errors.WorldError``.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base of the operator's own errors."""


class WorldUnavailable(OperatorError):
    """The World a WorkflowDeployment names cannot be reached; retried."""


class WorldSecretMissing(WorldUnavailable):
    """The Secret with the World's URLs, or one of its keys, is missing; retried."""


class WorldSecretUnreadable(WorldSecretMissing):
    """A key of the Secret the operator reads is not UTF-8 text; the message names it."""


class WorldSecretForbidden(WorldUnavailable):
    """The operator may not read the Secret (its names are limited by RBAC); retried."""


class WorldHostRefused(WorldUnavailable):
    """A World URL names a host outside the operator's allowlist; nothing was connected."""


class NotConfigured(OperatorError):
    """Not in a Pod, and no usable kubeconfig: there is no cluster to serve."""


class DeploymentRefused(OperatorError):
    """The API server refused a worker Deployment (400/422: a field of ``spec.template``)."""


class LeadershipLost(OperatorError):
    """The leader Lease was not renewed within renewDeadline: handlers stopped (exit 1)."""


class WebhookUnavailable(OperatorError):
    """The admission webhook cannot be served: its Secret or configuration is unusable."""


class SignalRefused(OperatorError):
    """A WorkflowSignal that cannot be done: unknown run, hook not found, bad payload.
    ``reason`` is a word for ``status.reason``; the message is ``status.message``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SignalNotYet(OperatorError):
    """A WorkflowSignal that time may make possible (the World unreachable, the run not
    started yet): retried until the signal deadline."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidSchedule(OperatorError):
    """A WorkflowSchedule's ``spec.schedule`` or ``spec.timeZone`` cannot be used.

    ``field`` is the spec field at fault; the message names it and says why.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
