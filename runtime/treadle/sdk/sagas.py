"""Sagas: compensations registered step by step, run in reverse when the work fails
(issue 17 item 7; docs/sagas.md).

In a workflow::

    saga = Saga()
    async with saga:
        flight = await book_flight(trip)
        saga.add(cancel_flight, flight)      # after the step succeeded
        hotel = await book_hotel(trip)
        saga.add(cancel_hotel, hotel)
        await book_car(trip)                 # raises: hotel, then flight, are cancelled

When the body raises (an ``Exception``), the compensations run in the reverse order
of ``add``, each a durable step call: recorded in the log, retried per its step's
``max_retries``, replayed from the log and run to completion after a crash. A
compensation that still fails is recorded and the next one runs (``continue_on_error``,
on by default). Then ``SagaCompensated`` is raised with the original error as
``error`` (and ``__cause__``) and the failed compensations as ``compensation_errors``;
``Saga(reraise=True)`` re-raises the original error itself instead (a note lists the
failed compensations). ``Saga(parallel=True)`` starts every compensation at once.
``await saga.compensate()`` runs them outside the ``async with`` (once: they are
cleared). A body that returns runs none.

Anchors: Temporal's saga sample (compensations appended after each activity, run in
reverse on failure, the error re-raised) and DBOS's (each undo a durable step).

Bad input is refused at the call, before anything is recorded: ``add`` takes a step
(``@app.step``) and arguments the log can hold; ``Saga`` lives in workflow code.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from treadle import errors
from treadle.sdk import context, functions

log = logging.getLogger("treadle.sdk.sagas")


@dataclass(frozen=True)
class _Compensation:
    step: functions.StepFunction[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Saga:
    """An ordered list of compensations, run in reverse when the saga's body fails."""

    def __init__(
        self, *, parallel: bool = False, continue_on_error: bool = True, reraise: bool = False
    ) -> None:
        for name, value in (
            ("parallel", parallel),
            ("continue_on_error", continue_on_error),
            ("reraise", reraise),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"Saga({name}=...) must be a bool, not {type(value).__name__}")
        self.parallel = parallel
        self.continue_on_error = continue_on_error
        self.reraise = reraise
        self._compensations: list[_Compensation] = []
        self._misuse: BaseException | None = None

    def add(self, compensation: Any, /, *args: Any, **kwargs: Any) -> None:
        """Register ``compensation(*args, **kwargs)`` (a step) to undo what just succeeded."""
        context.require_replay("Saga.add()")
        try:
            if not isinstance(compensation, functions.StepFunction):
                what = getattr(compensation, "__qualname__", None) or type(compensation).__name__
                raise TypeError(
                    f"Saga.add(): a compensation must be a step (a function decorated with "
                    f"@app.step), got {what!r}; wrap the undo in a step so it is durable"
                )
            # Refused now, not when the compensation would run after a failure.
            functions.encode_arguments(args, kwargs, f"Saga.add({compensation.name}) arguments")
        except (TypeError, errors.SerializationError) as exc:
            self._misuse = exc  # the saga's own bad input: raised as is, nothing undone
            raise
        self._compensations.append(_Compensation(compensation, args, dict(kwargs)))

    @property
    def compensations(self) -> list[str]:
        """The registered compensations' step names, in the order they were added."""
        return [c.step.name for c in self._compensations]

    async def compensate(self) -> list[tuple[str, BaseException]]:
        """Run the compensations (in reverse, or all at once with ``parallel``); the
        ones that failed, as ``(step name, error)``. They are cleared: a second call
        runs nothing."""
        context.require_replay("Saga.compensate()")
        todo = list(reversed(self._compensations))
        self._compensations.clear()
        failed: list[tuple[str, BaseException]] = []
        if self.parallel:
            results = await asyncio.gather(
                *(c.step(*c.args, **c.kwargs) for c in todo), return_exceptions=True
            )
            for comp, result in zip(todo, results, strict=True):
                if isinstance(result, Exception):
                    failed.append((comp.step.name, result))
                elif isinstance(result, BaseException):
                    raise result  # cancellation or the replay closing: not a failure
            return failed
        for comp in todo:
            try:
                await comp.step(*comp.args, **comp.kwargs)
            except Exception as exc:
                failed.append((comp.step.name, exc))
                if not self.continue_on_error:
                    break
        return failed

    async def __aenter__(self) -> Saga:
        context.require_replay("async with Saga()")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None or not isinstance(exc, Exception) or exc is self._misuse:
            # Success, cancellation or the replay closing, or a bad add(): nothing undone.
            return False
        failed = await self.compensate()
        if self.reraise:
            if failed:
                exc.add_note(
                    "saga compensations that failed: "
                    + ", ".join(f"{name} ({error})" for name, error in failed)
                )
            return False
        raise errors.SagaCompensated(exc, failed) from exc
