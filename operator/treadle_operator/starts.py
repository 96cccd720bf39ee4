"""Starting WorkflowRuns, with exponential backoff while they cannot start yet.

A WorkflowRun that cannot start (a typo in ``spec.deployment``, a deployment with
no ready revision yet, its World unreachable) used to be a kopf ``TemporaryError``
every ``TREADLE_OPERATOR_RETRY_SECONDS``: an ERROR log line, an annotation write
and a Kubernetes Event per try, for ever (review operator.md R5 (b)). Here each
such object gets one task that tries, and while ``runs.NotYet`` says why not:

- says so **once**: ``Started=False`` with the reason and message (patched only
  when they change) and one Warning Event ``StartBlocked`` per distinct reason;
- waits ``TREADLE_OPERATOR_RETRY_SECONDS`` doubled per try, at most
  ``TREADLE_OPERATOR_RETRY_MAX_SECONDS`` (5 minutes by default);
- is woken at once, skipping the rest of its delay, when what blocked it may be
  fixed: its WorkflowDeployment shows a ready revision on a reachable World
  (``wake_deployment``, from the deployment's watch events), or the object
  itself changed (a new generation, ``spec.cancel``).

The handlers (``handlers``) submit every WorkflowRun that has no run yet: from
``on.create`` and from every watch event (so after an operator restart, kopf's
initial listing picks up the ones still pending). One task per object uid, so
two submissions never start twice; ``forget`` ends it when the object goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("treadle.operator.starts")

# One try: ``None`` when there is nothing more to do (started, ended, gone), else the
# reason it is still blocked.
Attempt = Callable[[str, str], Awaitable[str | None]]


def backoff(tries: int, base: float, cap: float) -> float:
    """The delay after the ``tries``-th failed try: ``base`` doubled per try, at most ``cap``."""
    if tries < 1:
        return 0.0
    return float(min(cap, base * 2.0 ** min(tries - 1, 60)))


@dataclass
class Pending:
    """One WorkflowRun waiting to start."""

    namespace: str
    name: str
    deployment: str
    generation: int | None
    tries: int = 0
    reason: str = ""  # why the last try could not start it
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Starts:
    """The WorkflowRuns being started, one task each (see the module docstring)."""

    def __init__(self, base_seconds: float, max_seconds: float) -> None:
        self.base_seconds = base_seconds
        self.max_seconds = max(max_seconds, base_seconds)
        self.attempt: Attempt | None = None  # set by the handlers (it needs ``State``)
        self._pending: dict[str, Pending] = {}
        self._closed = False

    # -- submitting and waking --------------------------------------------------------------

    def submit(self, body: dict[str, Any]) -> None:
        """Start this object's run (soon), unless a task for it runs already."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid or self._closed:
            return
        known = self._pending.get(uid)
        generation = meta.get("generation")
        if known is not None:
            if generation != known.generation:  # the object changed: try again now
                known.generation = generation
                known.deployment = str((body.get("spec") or {}).get("deployment") or "")
                known.woken.set()
            return
        entry = Pending(
            namespace=str(meta.get("namespace")),
            name=str(meta.get("name")),
            deployment=str((body.get("spec") or {}).get("deployment") or ""),
            generation=generation,
        )
        self._pending[uid] = entry
        entry.task = asyncio.get_running_loop().create_task(
            self._drive(uid, entry), name=f"treadle-operator-start {entry.namespace}/{entry.name}"
        )

    def wake(self, uid: str) -> None:
        """Try this object again now (its spec changed)."""
        entry = self._pending.get(uid)
        if entry is not None:
            entry.woken.set()

    def wake_deployment(self, namespace: str, deployment: str) -> int:
        """Try now every object waiting on this WorkflowDeployment; how many were woken."""
        woken = 0
        for entry in self._pending.values():
            if entry.namespace == namespace and entry.deployment == deployment and entry.tries:
                if not entry.woken.is_set():
                    log.info(
                        "WorkflowRun %s/%s: WorkflowDeployment %s serves now; trying at once",
                        entry.namespace,
                        entry.name,
                        deployment,
                    )
                entry.woken.set()
                woken += 1
        return woken

    def forget(self, uid: str) -> None:
        """The object is gone: stop trying."""
        entry = self._pending.pop(uid, None)
        if entry is not None and entry.task is not None:
            entry.task.cancel()

    def waiting(self) -> dict[str, Pending]:
        """The objects not started yet, by uid (a copy)."""
        return dict(self._pending)

    async def close(self) -> None:
        self._closed = True
        entries, self._pending = list(self._pending.values()), {}
        for entry in entries:
            if entry.task is not None:
                entry.task.cancel()
        for entry in entries:
            if entry.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await entry.task

    # -- trying -----------------------------------------------------------------------------

    async def _drive(self, uid: str, entry: Pending) -> None:
        try:
            while not self._closed:
                entry.woken.clear()  # a wake during the try below skips the next delay
                blocked = await self._try(entry)
                if blocked is None:
                    return
                entry.tries += 1
                if blocked != entry.reason:
                    log.info(
                        "WorkflowRun %s/%s cannot start yet (%s); trying again with backoff",
                        entry.namespace,
                        entry.name,
                        blocked,
                    )
                entry.reason = blocked
                delay = backoff(entry.tries, self.base_seconds, self.max_seconds)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.woken.wait(), delay)
        finally:
            if self._pending.get(uid) is entry:
                del self._pending[uid]

    async def _try(self, entry: Pending) -> str | None:
        assert self.attempt is not None, "Starts.attempt is set when the handlers are built"
        try:
            return await self.attempt(entry.namespace, entry.name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a tight loop, never a lost object: back off, retry
            reason = f"StartError: {type(exc).__name__}"
            if reason != entry.reason:
                log.warning(
                    "WorkflowRun %s/%s: starting failed, retrying with backoff: %s",
                    entry.namespace,
                    entry.name,
                    exc,
                    exc_info=exc,
                )
            return reason
