"""Step and workflow functions, as the decorators make them.

Called inside a workflow, a step does not run: it takes the next position and
returns a future the log resolves (``Replay.call_step``). Called anywhere
else it simply runs, so steps stay testable as plain functions. A workflow
called inside another workflow starts a child run of it (``sdk.children``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from pydantic import JsonValue

from treadle import errors, limits, serde, serde_registry
from treadle.sdk import catalogue, children, context, limiting
from treadle.sdk.durations import Duration, positive_seconds

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_MAX_RETRIES = 3
MAX_MAX_RETRIES = 100


def encode_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    where: str,
    *,
    limits_: limits.Limits | None = None,
) -> JsonValue:
    """``{"args": [...], "kwargs": {...}}`` as log JSON; names the argument that fails.

    Each argument, and all of them together, within ``treadle.limits``.
    """
    data: JsonValue = {
        "args": [
            serde.encode(a, f"{where} argument {i}", limits=limits_, sized=False)
            for i, a in enumerate(args)
        ],
        "kwargs": {
            k: serde.encode(v, f"{where} argument {k!r}", limits=limits_, sized=False)
            for k, v in kwargs.items()
        },
    }
    limits.check_size(data, f"{where} arguments", limits_)
    return data


def decode_arguments(data: JsonValue, where: str = "input") -> tuple[list[Any], dict[str, Any]]:
    """The ``encode_arguments`` form back as Python values; ``SerializationError``
    (naming the argument) for a class the app does not declare or a malformed value."""
    if data is None:
        return [], {}
    if not isinstance(data, dict):
        raise errors.SerializationError(where, "stored arguments are not an args/kwargs object")
    raw_args = data.get("args", [])
    raw_kwargs = data.get("kwargs", {})
    if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict):
        raise errors.SerializationError(where, "stored arguments are not an args/kwargs object")
    args = [serde.decode(a, f"{where} argument {i}") for i, a in enumerate(raw_args)]
    kwargs = {k: serde.decode(v, f"{where} argument {k!r}") for k, v in raw_kwargs.items()}
    return args, kwargs


def refusing(exc: Exception) -> Callable[..., Awaitable[Any]]:
    """A workflow body that raises ``exc`` (a run whose stored input cannot be decoded
    fails with that error, the same on every replay)."""

    async def body(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return body


class StepFunction(Generic[P, R]):
    """A function decorated with ``@app.step``."""

    def __init__(
        self,
        fn: Callable[P, Any],
        *,
        name: str,
        max_retries: int,
        limits: limiting.Limits | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
    ) -> None:
        # Start-to-close and heartbeat timeouts (docs/timeouts.md); bad ones fail here.
        self.timeout = _timeout(timeout, f"step {name}: timeout")
        self.heartbeat_timeout = _timeout(heartbeat_timeout, f"step {name}: heartbeat_timeout")
        if not 0 <= max_retries <= MAX_MAX_RETRIES:
            raise ValueError(
                f"step {name}: max_retries must be between 0 and {MAX_MAX_RETRIES}, "
                f"got {max_retries}"
            )
        self.fn = fn
        self.name = name
        self.max_retries = max_retries
        # Concurrency and rate limits (``limiting``): such a step runs from its own message.
        self.limits = limits or limiting.Limits()
        self.is_async = inspect.iscoroutinefunction(fn)
        serde_registry.register_annotations(fn)  # the classes its values may be
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        replay = context.current_replay()
        if replay is None:
            return self.run_body(list(args), dict(kwargs))
        if self.limits.any:
            self._check_keys(args, kwargs)  # a bad key: raised here, nothing recorded
        input_error = None
        try:
            data = encode_arguments(args, kwargs, f"step {self.name}")
        except errors.SerializationError as exc:
            data, input_error = None, str(exc)
        return replay.call_step(
            self.name,
            data,
            max_retries=self.max_retries,
            input_error=input_error,
            background=self.limits.any,
        )

    def _check_keys(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        where = f"step {self.name}"
        if self.limits.concurrency is not None:
            limiting.compute_key(
                self.limits.concurrency.key, args, kwargs, where=where, limit="concurrency"
            )
        if self.limits.rate is not None:
            limiting.compute_key(self.limits.rate.key, args, kwargs, where=where, limit="rate")

    async def run_body(self, args: list[Any], kwargs: dict[str, Any]) -> R:
        """Run the function itself (a sync one in a worker thread)."""
        if self.is_async:
            result: R = await self.fn(*args, **kwargs)
            return result
        ctx = contextvars.copy_context()
        return await asyncio.to_thread(ctx.run, self.fn, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<step {self.name}>"


class WorkflowFunction(Generic[P, R]):
    """A function decorated with ``@app.workflow``."""

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]],
        *,
        name: str,
        start_on_latest: bool = False,
        compatible: str | None = None,
        limits: limiting.Limits | None = None,
        priority: int = 0,
        timeout: Duration | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"workflow {name} must be an async def function")
        # The run timeout a start records unless it passes its own (docs/timeouts.md).
        self.timeout = _timeout(timeout, f"workflow {name}: timeout")
        self.fn = fn
        self.name = name
        # New runs go to the World's latest deployment, not the starter's (chains move on).
        self.start_on_latest = start_on_latest
        # The app's promise that this code replays logs of other code with the same tag:
        # runs may be moved between revisions that both declare it (``treadle.moves``).
        self.compatible = catalogue.check_compatible_tag(name, compatible)
        # Concurrency and rate limits (``limiting``), and its runs' default priority.
        self.limits = limits or limiting.Limits()
        self.priority = limiting.check_priority(f"workflow {name}", priority)
        serde_registry.register_annotations(fn)  # the classes its values may be
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        # Inside a workflow: a child run, awaited durably (``sdk.children``).
        replay = context.current_replay()
        if replay is not None:
            return children.start(replay, children.ChildOptions(self), args, kwargs).result()
        return self.fn(*args, **kwargs)

    def options(
        self,
        *,
        on_parent_close: str = "cancel",
        start_on_latest: bool | None = None,
        attributes: Mapping[str, Any] | None = None,
        priority: int | None = None,
        timeout: Duration | None = None,
    ) -> children.ChildOptions:
        """This workflow with the options of one call or start bound.

        A child call's (``await wf.options(...)(x)`` or ``app.start(wf.options(...), x)``
        in a workflow): ``on_parent_close`` ("cancel", the default: the child is
        cancelled when the parent ends first; "abandon": it runs on),
        ``start_on_latest`` (None: the workflow's own setting).

        A top-level start's (``app.start(wf.options(...), *args, **kwargs)``):
        ``attributes``, ``priority``, ``timeout`` and ``start_on_latest``, the options
        ``app.start`` otherwise reads from its own keywords; with them bound here, every
        keyword of that ``app.start`` call is the workflow's, so a workflow whose own
        parameter is named ``attributes``, ``priority`` or ``timeout`` gets it
        (docs/timeouts.md "Start options"). A bad ``priority`` or ``timeout`` is a
        ``ValueError`` here; ``attributes`` are checked at the start.
        """
        where = f"workflow {self.name}.options()"
        if priority is not None:
            limiting.check_priority(where, priority)
        return children.ChildOptions(
            self,
            children.check_policy(on_parent_close),
            start_on_latest,
            attributes=None if attributes is None else dict(attributes),
            priority=priority,
            timeout=_timeout(timeout, f"{where}: timeout"),
        )

    def __repr__(self) -> str:
        return f"<workflow {self.name}>"


def _timeout(value: Duration | None, what: str) -> float | None:
    return None if value is None else positive_seconds(value, what=what)
