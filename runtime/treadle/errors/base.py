"""The roots of the hierarchy: ``TreadleError``, ``SettingsError``, ``WorkflowError``, and
``SerializationError`` with the errors of a value crossing the event log (payload keys,
decryption, ``treadle.limits``).

Every other module of ``treadle.errors`` derives from these.
"""

from __future__ import annotations


class TreadleError(Exception):
    """Base of every error treadle raises on purpose."""


class SettingsError(TreadleError):
    """A setting has a value treadle cannot use."""


class SerializationError(TreadleError):
    """A value cannot cross the log; ``path`` says which one."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class PayloadKeyMissing(SerializationError):
    """An encrypted value names a key id this process does not hold (TREADLE_PAYLOAD_KEY)."""

    def __init__(self, path: str, kid: str) -> None:
        super().__init__(
            path,
            f"the value is encrypted under key {kid!r}, which TREADLE_PAYLOAD_KEY does not "
            "hold here (add that key, after the one that encrypts)",
        )
        self.kid = kid


class PayloadDecryptionFailed(SerializationError):
    """An encrypted value does not open: tampered, truncated, or relabelled."""


class ValueLimitExceeded(SerializationError):
    """A value, or a hook token, over one of ``treadle.limits``; ``setting`` tunes it."""

    def __init__(self, path: str, reason: str, *, setting: str, limit: int) -> None:
        super().__init__(path, reason)
        self.setting = setting
        self.limit = limit


class WorkflowError(TreadleError):
    """About workflow or step code and the runs it makes."""
