"""The operator's errors, one tree.

::

    OperatorError                 anything the operator raises on purpose
    ├── WorldUnavailable          the World a WorkflowDeployment names cannot be reached
    │   ├── WorldSecretMissing    its Secret, or a key in it, does not exist (retried)
    │   ├── WorldSecretForbidden  RBAC does not let the operator read that Secret
    │   └── WorldHostRefused      a URL's host is not in TREADLE_OPERATOR_WORLD_HOSTS
    ├── NotConfigured             no cluster: not in a Pod and no usable kubeconfig
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


class WorldSecretForbidden(WorldUnavailable):
    """The operator may not read the Secret (its names are limited by RBAC); retried."""


class WorldHostRefused(WorldUnavailable):
    """A World URL names a host outside the operator's allowlist; nothing was connected."""


class NotConfigured(OperatorError):
    """Not in a Pod, and no usable kubeconfig: there is no cluster to serve."""


class InvalidSchedule(OperatorError):
    """A WorkflowSchedule's ``spec.schedule`` or ``spec.timeZone`` cannot be used.

    ``field`` is the spec field at fault; the message names it and says why.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
