"""When a WorkflowRun's status may be patched again (review R5 (a), issue 11 item 3).

A run of many fast steps changes its step counts every few milliseconds; each
patch is an etcd write and a watch fan-out to every client. So a change of
phase goes out at once (what ``kubectl wait`` and GitOps tools wait on), and
any other change at most once per ``interval`` seconds per object
(``TREADLE_OPERATOR_STATUS_INTERVAL_SECONDS``, default 1): the pending change
is patched when the interval is up, with whatever the log says then, so the
last status written is always exact. Argo paces its progress the same way
(``ARGO_PROGRESS_PATCH_TICK_DURATION``).

Pure bookkeeping on the caller's clock (the event loop's); used by
``sync.StatusSync``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_INTERVAL_SECONDS = 1.0


@dataclass
class Pacer:
    """The time of each object's last patch, and how long the next must wait."""

    interval: float = DEFAULT_INTERVAL_SECONDS
    _last: dict[str, float] = field(default_factory=dict)

    def delay(self, key: str, now: float, *, phase_changed: bool) -> float:
        """Seconds until ``key`` may be patched (0: now). A phase change never waits."""
        last = self._last.get(key)
        if phase_changed or last is None:
            return 0.0
        return max(0.0, last + self.interval - now)

    def patched(self, key: str, now: float) -> None:
        self._last[key] = now

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
