"""The deterministic event loop workflow code runs on.

``WorkflowLoop`` is an ``asyncio.AbstractEventLoop`` that only the runtime
drives: ``run_until_idle`` runs ready callbacks until none is left, with the
loop installed as the running loop for that span, so ``asyncio.gather``,
``wait``, ``create_task``, ``Event`` and ``Queue`` work unchanged inside a
workflow. Its clock is the log's clock (``set_time``), and ``call_later`` /
``call_at`` are durable timers: the loop hands them to its ``TimerFactory``
(the replay engine), which records a wait and fires the callback only when the
walk reaches that wait's ``wait_completed``. Anything that needs real I/O
raises ``errors.NonDeterministicCall`` at the call site.

Called by ``replay.engine``; never by user code directly.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol, TypeVar

from treadle import errors

log = logging.getLogger("treadle.replay.loop")

T = TypeVar("T")


class TimerFactory(Protocol):
    def __call__(self, when: float, handle: DurableTimer) -> None:
        """Record a durable timer due at ``when`` (loop time)."""
        ...


class DurableTimer(asyncio.TimerHandle):
    """A timer whose firing is decided by the log, not by the clock."""

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: WorkflowLoop,
        context: contextvars.Context | None,
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self.workflow_loop = loop
        self.fired = False
        self.on_cancel: Callable[[], None] | None = None

    def cancel(self) -> None:
        if self.cancelled() or self.fired:
            return
        super().cancel()
        if self.on_cancel is not None:
            self.on_cancel()

    def fire(self) -> None:
        """Called by the engine when the walk reaches this timer's completion."""
        if self.cancelled() or self.fired:
            return
        self.fired = True
        self.workflow_loop.schedule(self)


class WorkflowLoop(asyncio.AbstractEventLoop):
    def __init__(self, timer_factory: TimerFactory, now: float) -> None:
        self._ready: collections.deque[asyncio.Handle] = collections.deque()
        self._timer_factory = timer_factory
        self._now = now
        self._running = False
        self._closed = False
        self._exceptions: list[dict[str, Any]] = []
        # Its own tasks: ``asyncio.all_tasks(loop)`` scans every task of every loop.
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    # -- driving ---------------------------------------------------------------

    def set_time(self, now: float) -> None:
        """Move the workflow clock (never backwards)."""
        if now > self._now:
            self._now = now

    def schedule(self, handle: asyncio.Handle) -> None:
        self._ready.append(handle)

    def run_until_idle(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Run ready callbacks until none is left (or ``stop()`` says so)."""
        outer = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self)
        self._running = True
        try:
            while self._ready and not stop():
                handle = self._ready.popleft()
                if not handle.cancelled():
                    handle._run()
        finally:
            self._running = False
            asyncio.events._set_running_loop(outer)

    @property
    def idle(self) -> bool:
        return not any(not h.cancelled() for h in self._ready)

    # -- what asyncio needs ------------------------------------------------------

    def time(self) -> float:
        return self._now

    def call_soon(  # type: ignore[override]
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        handle = DurableTimer(when, callback, args, self, context)
        if when <= self._now:
            handle.fired = True
            self._ready.append(handle)
        else:
            self._timer_factory(when, handle)
        return handle

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        pass  # a durable timer's cancellation is handled by its own cancel()

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(
        self,
        coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[T]:
        task = asyncio.Task(coro, loop=self, name=name, context=context)
        self.tasks.add(task)
        return task

    def get_debug(self) -> bool:
        return False

    def set_debug(self, enabled: bool) -> None:
        pass

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._ready.clear()

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self._exceptions.append(context)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        # Unretrieved task exceptions in workflow code are noted, not printed on every replay.
        self._exceptions.append(context)

    def get_exception_handler(self) -> None:
        return None

    def get_task_factory(self) -> None:
        return None

    # -- what workflow code must not do -----------------------------------------

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        raise errors.NonDeterministicCall("run_in_executor()")


def _refused(name: str) -> Callable[..., Any]:
    def refused(self: WorkflowLoop, *args: Any, **kwargs: Any) -> Any:
        raise errors.NonDeterministicCall(f"asyncio loop.{name}()")

    refused.__name__ = name
    return refused


_REFUSED = frozenset(
    {
        "create_connection",
        "create_server",
        "create_unix_connection",
        "create_unix_server",
        "create_datagram_endpoint",
        "getaddrinfo",
        "getnameinfo",
        "sock_recv",
        "sock_sendall",
        "sock_connect",
        "sock_accept",
        "subprocess_exec",
        "subprocess_shell",
        "add_reader",
        "add_writer",
        "connect_read_pipe",
        "connect_write_pipe",
        "sendfile",
        "start_tls",
        "add_signal_handler",
        "connect_accepted_socket",
        "sock_recv_into",
        "sock_sendfile",
        "run_forever",
        "run_until_complete",
        "shutdown_asyncgens",
        "shutdown_default_executor",
    }
)

for _name in _REFUSED:
    setattr(WorkflowLoop, _name, _refused(_name))
