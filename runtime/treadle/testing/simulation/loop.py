"""The simulation's event loop: virtual time, seeded interleavings, a watchdog.

``SimLoop`` is an asyncio selector event loop whose ``time()`` is virtual: when
no callback is ready it jumps straight to the next scheduled timer, so a 30 s
lease or a day-long sleep costs microseconds (the idea of ``looptime`` on PyPI;
this is our own code). Each iteration the ready callbacks are permuted from the
seeded PRNG, so a seed picks one interleaving and replays it exactly. Executor
work (``asyncio.to_thread``, plain ``def`` steps) runs inline on the loop: no
thread ever spends real time.

``SimClock`` is the ``treadle.clock.Clock`` over it (wall time = a fixed epoch
plus loop time; random bytes from the PRNG); ``Watchdog`` is a thread on the
real clock that interrupts the main thread when one callback holds the loop
for longer than ``limit`` seconds, which the runner reports as an "event loop
held" violation instead of hanging. Used by ``treadle.testing.simulation.runner``.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import contextlib
import contextvars
import heapq
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# 2026-01-01T00:00:00Z: every simulated wall clock starts here.
EPOCH = 1_767_225_600.0
# ``SimClock.monotonic()`` is this plus the loop's virtual time.
MONOTONIC_ORIGIN = 1000.0

_abandoned: list[asyncio.Task[Any]] = []

TaskHook = Callable[[asyncio.Task[Any]], None]


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time whose ready queue is permuted by ``rng``.

    ``interleave=False`` keeps asyncio's FIFO order (still virtual time).
    ``on_task`` is called with every task created on the loop (the runner uses
    it to record which simulated process spawned which task).
    """

    def __init__(
        self,
        rng: random.Random,
        *,
        interleave: bool = True,
        on_task: TaskHook | None = None,
        frozen_limit: int = 400_000,
    ) -> None:
        super().__init__()
        self._vtime = 0.0
        self.rng = rng
        self.interleave = interleave
        self.on_task = on_task
        self.callbacks_run = 0
        # Set while a callback runs: (real monotonic start, handle repr thunk).
        self.running_since: float | None = None
        self.running_handle: asyncio.Handle | None = None
        self.idle_real_seconds = 0.0
        # A livelock: this many callbacks in a row without virtual time moving.
        self.frozen_limit = frozen_limit
        self._frozen_count = 0
        # Set by the watchdog once a callback held the loop past its limit.
        self.tripped: LoopHeld | None = None
        self.set_task_factory(self._task_factory)
        self.set_exception_handler(_quiet)

    # -- time -----------------------------------------------------------------------------

    def time(self) -> float:
        return self._vtime

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (never back)."""
        if seconds > 0:
            self._vtime += seconds

    # -- tasks and executors ----------------------------------------------------------------

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kw)
        if self.on_task is not None:
            self.on_task(task)
        return task

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> Any:  # type: ignore[override]
        """Run ``func`` inline on the loop (no threads under simulation)."""
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    def set_default_executor(self, executor: concurrent.futures.Executor) -> None:
        raise RuntimeError("the simulation runs executor work inline; no executor can be set")

    # -- one iteration --------------------------------------------------------------------

    def _run_once(self) -> None:
        """asyncio's iteration, with the wait replaced by a jump of virtual time and the
        ready callbacks run in an order drawn from the PRNG."""
        if self.tripped is not None:
            raise self.tripped  # a swallowed interrupt: the held loop still fails the run
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            handle = heapq.heappop(scheduled)
            handle._scheduled = False  # type: ignore[attr-defined]
        ready: Any = self._ready  # type: ignore[attr-defined]
        stopping = self._stopping  # type: ignore[attr-defined]
        # Poll real file descriptors (the self-pipe) without waiting, unless there is
        # nothing at all to do: then wait a little real time (call_soon_threadsafe).
        timeout: float | None = 0 if (ready or stopping or scheduled) else 0.05
        t0 = time.monotonic()
        event_list = self._selector.select(timeout)  # type: ignore[attr-defined]
        if timeout:
            self.idle_real_seconds += time.monotonic() - t0
        self._process_events(event_list)  # type: ignore[attr-defined]
        if not ready and not stopping and scheduled and scheduled[0].when() > self._vtime:
            self._vtime = scheduled[0].when()
            self._frozen_count = 0
        end_time = self._vtime + self._clock_resolution  # type: ignore[attr-defined]
        while scheduled:
            handle = scheduled[0]
            if handle.when() >= end_time:
                break
            handle = heapq.heappop(scheduled)
            handle._scheduled = False  # type: ignore[attr-defined]
            ready.append(handle)
        ntodo = len(ready)
        self._frozen_count += ntodo
        if self._frozen_count > self.frozen_limit:
            self._frozen_count = 0
            raise LoopHeld(
                0.0,
                f"{self.frozen_limit} callbacks at virtual time {self._vtime:.3f} "
                "without time moving (a spin that only awaits instant calls)",
            )
        if self.interleave and ntodo > 1:
            batch = [ready.popleft() for _ in range(ntodo)]
            self.rng.shuffle(batch)
            ready.extendleft(reversed(batch))
        for _ in range(ntodo):
            item = ready.popleft()
            if item._cancelled:
                continue
            self.running_handle = item
            self.running_since = time.monotonic()
            try:
                item._run()
            finally:
                self.running_since = None
                self.running_handle = None
            self.callbacks_run += 1


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Unretrieved task errors and destroyed tasks of killed processes: debug only."""
    logging.getLogger("treadle.testing.simulation").debug("loop: %s", context.get("message"))


class SimClock:
    """``treadle.clock.Clock`` on a ``SimLoop``: virtual wall and monotonic time, seeded bytes."""

    def __init__(self, loop: SimLoop, rng: random.Random, *, epoch: float = EPOCH) -> None:
        self.loop = loop
        self.rng = rng
        self.epoch = epoch

    def time(self) -> float:
        return self.epoch + self.loop.time()

    def monotonic(self) -> float:
        return MONOTONIC_ORIGIN + self.loop.time()

    def random_bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)


class LoopHeld(Exception):
    """One callback held the simulation's loop past the watchdog's limit."""

    def __init__(self, seconds: float, handle: str) -> None:
        super().__init__(f"the event loop was held {seconds:.1f} s by {handle}")
        self.seconds = seconds
        self.handle = handle


class Watchdog:
    """A thread on the real clock: interrupts the main thread when a callback holds the loop.

    The interrupt arrives as ``KeyboardInterrupt`` in the main thread; the runner
    calls ``tripped()`` to tell it from a real Ctrl-C and reports ``LoopHeld``.
    """

    def __init__(self, loop: SimLoop, *, limit: float = 5.0) -> None:
        self.loop = loop
        self.limit = limit
        self.held: LoopHeld | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="treadle-sim-watchdog", daemon=True
        )

    def __enter__(self) -> Watchdog:
        if threading.current_thread() is threading.main_thread():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        last_interrupt = 0.0
        while not self._stop.wait(min(0.25, self.limit / 4)):
            since, handle = self.loop.running_since, self.loop.running_handle
            if since is None:
                continue
            now = time.monotonic()
            held = now - since
            if held > self.limit and self.loop.running_handle is handle:
                if self.held is None:
                    self.held = LoopHeld(held, repr(handle)[:300])
                    self.loop.tripped = self.held  # its next iteration raises it
                # Again while it is still held: code under the spin may swallow one
                # interrupt (an ``except BaseException`` that carries on), so the run
                # would hang here instead of failing.
                if now - last_interrupt > self.limit:
                    last_interrupt = now
                    _thread.interrupt_main()

    def tripped(self) -> LoopHeld | None:
        return self.held


def run(
    main: Callable[[], Any],
    *,
    rng: random.Random,
    interleave: bool = True,
    on_task: TaskHook | None = None,
    watchdog_seconds: float = 5.0,
) -> Any:
    """Run ``main()`` (a coroutine function) to completion on a fresh ``SimLoop``.

    Raises ``LoopHeld`` when the watchdog tripped. The loop is closed afterwards;
    pending tasks are cancelled first.
    """
    loop = SimLoop(rng, interleave=interleave, on_task=on_task)
    ctx = contextvars.copy_context()
    try:
        with Watchdog(loop, limit=watchdog_seconds) as dog:
            try:
                result = ctx.run(loop.run_until_complete, main())
            except KeyboardInterrupt:
                held = dog.tripped()
                if held is None:
                    raise
                raise held from None
            held = dog.tripped()  # the interrupt may have landed in a task that logged it
            if held is not None:
                raise held
            _cancel_all(loop, drain=True)  # still under the watchdog: a spin cannot hang here
            return result
    except BaseException:
        _cancel_all(loop, drain=False)  # a held loop is never run again
        raise
    finally:
        loop.close()


def _cancel_all(loop: SimLoop, *, drain: bool) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if not drain:
        # Kept, not collected: closing their coroutines outside their tasks would run
        # their cleanup in a foreign context (noise, and code run after the verdict).
        _abandoned.extend(tasks)
    if drain and tasks and not loop.is_closed():
        with contextlib.suppress(Exception, KeyboardInterrupt):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
