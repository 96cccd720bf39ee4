"""``Workflows``: the registry users decorate, and the client that starts and drives runs.

It opens its World lazily (``TREADLE_WORLD``, default ``local:.treadle``, or
``Workflows(world=...)``). On the local World it also runs an in-process
worker, so ``await app.start(...)`` followed by ``await run.result()`` just
works in one process; ``worker=False`` turns that off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from pydantic import BaseModel, JsonValue

import treadle.telemetry.hooks as telemetry_hooks
from treadle import (
    errors,
    hookresume,
    hooktokens,
    limits,
    payloads,
    resultwait,
    serde,
    settings,
)
from treadle import runwrites as out_of_band
from treadle.orchestrator import compat
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.worker import Role, Worker
from treadle.sdk import functions
from treadle.world import constants, contract, events, ids, messages, records, specversions
from treadle.worlds import open_world

log = logging.getLogger("treadle.client")

# A start_on_latest start refused because its latest retired meanwhile reads again.
LATEST_START_ATTEMPTS = 3

P = ParamSpec("P")
R = TypeVar("R")


class Run:
    """A handle on one run."""

    def __init__(self, app: Workflows, run_id: str) -> None:
        self.app = app
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"<Run {self.run_id}>"

    async def get(self) -> records.RunRecord:
        world = await self.app.world()
        return await world.runs.get(self.run_id)

    async def status(self) -> str:
        return (await self.get()).status

    async def events(self) -> list[events.LoggedEvent]:
        world = await self.app.world()
        out: list[events.LoggedEvent] = []
        after = 0
        while True:
            page = await world.events.list(self.run_id, after_slot=after)
            out.extend(page.events)
            if not page.has_more:
                return out
            after = page.cursor

    async def result(self, timeout: float | None = None) -> Any:
        """The run's output; raises ``RunFailedError``, ``RunCancelledError`` or TimeoutError."""
        world = await self.app.world()
        poll = self.app.settings.TREADLE_RESULT_POLL_SECONDS
        run = await resultwait.RunEnd(world, self.run_id, poll).wait(timeout)
        self.app.use_payload_keys()
        return _outcome(run)

    async def cancel(self, reason: str | None = None) -> None:
        """Cancel the run (out-of-band ``run_cancelled``); pending timers find it ended."""
        if reason is not None:
            limits.check_string(reason, "cancel reason")
        world = await self.app.world()
        compat.require_known_format(await world.runs.get(self.run_id))
        await world.events.create(self.run_id, events.RunCancelled(reason=reason), in_band=False)

    async def wake_up(self, waits: list[str] | None = None) -> int:
        """Ask the orchestrator to end the run's sleeps now; returns how many were asked.

        On a spec 9 run the request is recorded in the log (``wake_requested``) before
        the wake is sent, so it is not lost when the wake is coalesced into a running
        delivery. On a spec 8 run each asked sleep is completed here (out-of-band
        ``wait_completed``), then one wake is sent; the count is of the sleeps this call
        completed (one another writer completed first is not counted). On a run that
        has ended it records and sends nothing and returns 0 (no error): the World
        refuses writes to a terminal run (``RunExpired``), also when the run ends
        between the read here and the write. The wake carries the run's own version.
        """
        world = await self.app.world()
        run = compat.require_known_format(await world.runs.get(self.run_id))
        if run.is_terminal:
            return 0
        return await out_of_band.wake_up(world, run, await self.events(), waits)


@telemetry_hooks.run_start
async def start_run(
    world: contract.World,
    *,
    name: str,
    data: JsonValue,
    deployment_id: str,
    spec_version: int,
    run_id: str,
    attributes: dict[str, JsonValue] | None = None,
    limits_: limits.Limits | None = None,
) -> records.RunRecord:
    """Record a run and send its first orchestrator message.

    The input is checked against ``treadle.limits`` first: a refused input
    records nothing. An input too large for a queue message is left out of the
    start message (the orchestrator reads it from the log: no turbo start), so
    a start is never refused by the queue after its run is recorded.

    Safe to retry with the same ``run_id``: the World returns the run already
    recorded, and a second start message is only a wake for a run that exists.
    ``FenceNotSupported`` (nothing recorded) for a spec 9 run on a World without the
    in-band fence (``Workflows.start`` never asks for one there: it mints 8).
    """
    limits.check_value(data, f"workflow {name} input", limits_, envelope=2)
    if attributes:
        limits.check_value(attributes, f"workflow {name} attributes", limits_)
    compat.require_fence(world, spec_version)
    run = await world.runs.create(
        workflow_name=name,
        input=data,
        deployment_id=deployment_id,
        spec_version=spec_version,
        run_id=run_id,
        attributes=attributes,
    )
    await world.queue.send(_start_message(run, data))
    return run


_mint_warned: set[str] = set()


def minted_spec_version(current: settings.Settings, world: contract.World) -> int:
    """The format a new run gets (seed 003 "How new runs get their version"): minting is
    the only reader of ``WORKFLOW_SPEC_VERSION``; its warning is logged once per process."""
    minted = specversions.mint(
        current.WORKFLOW_SPEC_VERSION, in_band_fence=world.capabilities.in_band_fence
    )
    if minted.warning is not None and minted.warning not in _mint_warned:
        _mint_warned.add(minted.warning)
        log.warning("%s (%s)", minted.warning, compat.world_name(world))
    return minted.version


def _start_message(run: records.RunRecord, data: JsonValue) -> messages.OrchestratorMessage:
    """The run's start message; carrying its input (turbo) only if it fits a message."""
    message = messages.OrchestratorMessage(
        run_id=run.run_id,
        deployment_id=run.deployment_id,
        run_input=messages.RunInput(
            workflow_name=run.workflow_name,
            input=data,
            spec_version=run.spec_version,
            deployment_id=run.deployment_id,
            created_at=run.created_at,
        ),
    )
    if len(message.model_dump_json().encode()) > constants.MAX_MESSAGE_BYTES - 1024:
        return _wake(run)
    return message


def _wake(run: records.RunRecord) -> messages.OrchestratorMessage:
    return out_of_band.wake_message(run)


def _outcome(run: records.RunRecord) -> Any:
    if run.status == "completed":
        return serde.decode(run.output, f"run {run.run_id} output")
    if run.status == "cancelled":
        raise errors.RunCancelledError(run.run_id)
    error = run.error or events.ErrorInfo(message="unknown error")
    raise errors.RunFailedError(run.run_id, error.message, error_type=error.type)


class _Unread:
    """Not read from the settings yet."""


_UNREAD = _Unread()


class Workflows:
    """A registry of workflows and steps, and the client of one World."""

    def __init__(
        self,
        *,
        world: contract.World | str | None = None,
        worker: bool | None = None,
        settings_: settings.Settings | None = None,
    ) -> None:
        self._workflows: dict[str, functions.WorkflowFunction[Any, Any]] = {}
        self._steps: dict[str, functions.StepFunction[Any, Any]] = {}
        self._world_arg = world
        self._world: contract.World | None = None
        self._want_worker = worker
        self._settings = settings_
        self._payload_keys: payloads.KeyRing | _Unread | None = _UNREAD
        self._worker: Worker | None = None
        self._open_lock = asyncio.Lock()
        self._hook_key_read: tuple[str | None] | None = None

    # -- registry ---------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[P, Awaitable[R]], /) -> functions.WorkflowFunction[P, R]: ...
    @overload
    def workflow(
        self,
        /,
        *,
        name: str | None = None,
        start_on_latest: bool = False,
        compatible: str | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], functions.WorkflowFunction[P, R]]: ...

    def workflow(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        start_on_latest: bool = False,
        compatible: str | None = None,
    ) -> Any:
        """Register an ``async def`` as a workflow (``@app.workflow`` or ``(name=...)``).

        ``start_on_latest=True``: its new runs start on the World's latest deployment
        rather than the starter's, so a chain of runs moves to new code (seed 004).
        ``compatible="orders-v3"``: the promise that this code replays the logs of any
        revision whose workflow of this name declares the same tag, so its runs may be
        moved here (``treadle runs move``, the operator's ``MoveRuns``).
        """

        def register(f: Callable[..., Awaitable[Any]]) -> functions.WorkflowFunction[..., Any]:
            wf: functions.WorkflowFunction[..., Any] = functions.WorkflowFunction(
                f, name=name or f.__name__, start_on_latest=start_on_latest,
                compatible=compatible,
            )  # fmt: skip
            if wf.name in self._workflows:
                raise ValueError(f"a workflow named {wf.name!r} is registered already")
            self._workflows[wf.name] = wf
            return wf

        return register(fn) if fn is not None else register

    @overload
    def step(self, fn: Callable[P, Awaitable[R]], /) -> functions.StepFunction[P, R]: ...
    @overload
    def step(self, fn: Callable[P, R], /) -> functions.StepFunction[P, R]: ...
    @overload
    def step(
        self, /, *, name: str | None = None, max_retries: int = functions.DEFAULT_MAX_RETRIES
    ) -> Callable[[Callable[P, Any]], functions.StepFunction[P, Any]]: ...

    def step(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        max_retries: int = functions.DEFAULT_MAX_RETRIES,
    ) -> Any:
        """Register a step (``async def`` or plain ``def``, which runs in a thread)."""

        def register(f: Callable[..., Any]) -> functions.StepFunction[..., Any]:
            st: functions.StepFunction[..., Any] = functions.StepFunction(
                f, name=name or f.__name__, max_retries=max_retries
            )
            if st.name in self._steps:
                raise ValueError(f"a step named {st.name!r} is registered already")
            self._steps[st.name] = st
            return st

        return register(fn) if fn is not None else register

    @property
    def workflows(self) -> dict[str, functions.WorkflowFunction[Any, Any]]:
        return dict(self._workflows)

    def get_workflow(self, name: str) -> functions.WorkflowFunction[Any, Any]:
        wf = self._workflows.get(name)
        if wf is None:
            known = ", ".join(sorted(self._workflows)) or "none"
            raise errors.WorkflowNotFound(f"no workflow named {name!r} (registered: {known})")
        return wf

    # -- the World ----------------------------------------------------------------------

    @property
    def settings(self) -> settings.Settings:
        if self._settings is None:
            self._settings = settings.load()
        return self._settings

    @property
    def payload_keys(self) -> payloads.KeyRing | None:
        """The keys values are encrypted with at rest (TREADLE_PAYLOAD_KEY), or None."""
        if self._payload_keys is _UNREAD:
            self._payload_keys = payloads.KeyRing.from_settings(self.settings)
        assert not isinstance(self._payload_keys, _Unread)
        return self._payload_keys

    def use_payload_keys(self) -> None:
        """Encode and decode in the current task under this app's payload keys."""
        payloads.use(self.payload_keys)

    @property
    def limits(self) -> limits.Limits:
        """What this app refuses before a write (``treadle.limits``, from its settings)."""
        return limits.Limits.from_settings(self.settings)

    async def world(self) -> contract.World:
        async with self._open_lock:
            if self._world is None:
                if isinstance(self._world_arg, str | None):
                    url = self._world_arg or self.settings.TREADLE_WORLD
                    self._world = await open_world(url, settings=self.settings)
                else:
                    # A World handed in unopened (``LocalWorld(path)``) is opened here.
                    opener = getattr(self._world_arg, "open", None)
                    if opener is not None:
                        await opener()
                    self._world = self._world_arg
                telemetry_hooks.instrument(self._world)  # spans, metrics, trace context: if on
                wants = self._want_worker
                if wants is None:
                    # An embedded World has no separate worker: the app serves its runs.
                    wants = self._world.__class__.__name__ in ("LocalWorld", "MemoryWorld")
                if wants:
                    await self._start_worker(self._world)
            return self._world

    def runtime(self, world: contract.World) -> Runtime:
        return Runtime(
            world=world,
            workflows=self._workflows,
            steps=self._steps,
            settings=self.settings,
            deployment_id=self.settings.TREADLE_DEPLOYMENT_ID,
        )

    async def _start_worker(self, world: contract.World, role: Role = "all") -> Worker:
        worker = Worker(self.runtime(world), role=role)
        await worker.start()
        self._worker = worker
        return worker

    @property
    def serving(self) -> bool:
        """A worker of this app runs in this process."""
        return self._worker is not None

    async def world_with_worker(self) -> contract.World:
        """The World, with this app's worker running in this process whichever World it
        is (``treadle run``: the run executes here on Postgres + NATS too)."""
        world = await self.world()
        async with self._open_lock:
            if self._worker is None:
                await self._start_worker(world)
        return world

    async def serve(self, role: Role = "all", concurrency: int | None = None) -> Worker:
        """Start a worker on this app's World (for ``treadle worker``); ``concurrency``
        None: ``TREADLE_WORKER_CONCURRENCY``, else derived (``orchestrator.concurrency``)."""
        self._want_worker = False
        world = await self.world()
        worker = Worker(self.runtime(world), role=role, concurrency=concurrency)
        await worker.start()
        self._worker = worker
        return worker

    async def close(self, *, grace_seconds: float = 30.0) -> None:
        if self._worker is not None:
            await self._worker.stop(grace_seconds=grace_seconds)
            self._worker = None
        if self._world is not None and isinstance(self._world_arg, str | None):
            await self._world.close()
        self._world = None

    async def __aenter__(self) -> Workflows:
        await self.world()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- runs -----------------------------------------------------------------------------

    async def start(
        self, workflow: functions.WorkflowFunction[P, Any] | str, /, *args: Any, **kwargs: Any
    ) -> Run:
        """Start a run of ``workflow`` with these arguments; returns at once."""
        name = workflow if isinstance(workflow, str) else workflow.name
        self.get_workflow(name)
        self.use_payload_keys()
        data = functions.encode_arguments(args, kwargs, f"workflow {name}", limits_=self.limits)
        return await self.start_encoded(name, data)

    async def start_encoded(self, name: str, data: JsonValue) -> Run:
        world = await self.world()
        spec = minted_spec_version(self.settings, world)
        deployment = self.settings.TREADLE_DEPLOYMENT_ID
        wf = self._workflows.get(name)
        deployments = getattr(world, "deployments", None)
        on_latest = wf is not None and wf.start_on_latest and deployments is not None
        run_id = ids.new_run_id()
        for attempt in range(1, LATEST_START_ATTEMPTS + 1):
            if on_latest and deployments is not None:
                deployment = await deployments.latest() or deployment
            try:
                await start_run(
                    world,
                    name=name,
                    data=data,
                    deployment_id=deployment,
                    spec_version=spec,
                    run_id=run_id,
                    limits_=self.limits,
                )
                break
            except errors.DeploymentRetired:
                # The latest was retired between the read and the write (review R1):
                # nothing was recorded; read the new latest and start there.
                if not on_latest or attempt == LATEST_START_ATTEMPTS:
                    raise
                log.info(
                    "run %s: %s retired meanwhile; starting on the new latest", run_id, deployment
                )
        return Run(self, run_id)

    def get_run(self, run_id: str) -> Run:
        if not ids.is_run_id(run_id):
            raise ValueError(f"{run_id!r} is not a run id (expected wrun_ and 26 characters)")
        return Run(self, run_id)

    async def resume_hook(
        self, token: str, payload: Any = None, *, signature: str | None = None
    ) -> Run:
        """Deliver ``payload`` to the live hook holding ``token``, then wake its run.

        Raises ``HookNotFound`` when no live hook holds the token (never created,
        disposed, already resumed, or its run ended, even between the lookup and the
        write); ``HookSignatureInvalid`` (nothing written) when the hook was created
        with ``require_signature=True`` and ``signature`` is missing or is not
        ``hook_signature(token, TREADLE_HOOK_KEY)``; ``HookPayloadNotRecorded`` when
        the write failed and recorded nothing (safe to call again); ``HookWakeFailed``
        when the payload is recorded but the wake could not be sent after retries (the
        run sees it on its next delivery). ``TREADLE_HOOK_TOKEN_NAMESPACE`` is applied.
        """
        limits.check_hook_token(token, self.limits)
        world = await self.world()
        stored = hooktokens.stored(token, self.limits.hook_token_namespace)
        try:
            hook = await world.hooks.get_by_token(stored)
        except errors.HookNotFound:
            raise errors.HookNotFound(token) from None
        hooktokens.check_signature(token, hook.metadata, signature, self._hook_key())
        return await self.resume_found_hook(token, hook, payload)

    async def resume_found_hook(self, token: str, hook: records.HookRecord, payload: Any) -> Run:
        """``resume_hook``'s writes, for a live hook the caller looked up and checked
        itself (``treadle serve``'s webhooks verify their own signatures first). The
        same refusals as ``resume_hook``."""
        world = await self.world()
        compat.require_known_format(await world.runs.get(hook.run_id))
        self.use_payload_keys()
        data = serde.encode(
            payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload,
            "hook payload",
            limits=self.limits,
        )
        await hookresume.record_payload(world, token, hook, data)
        await hookresume.wake(world, token, hook.run_id)
        return Run(self, hook.run_id)

    def hook_signature(self, token: str) -> str:
        """``treadle.hook_signature(token, key)`` with this app's ``TREADLE_HOOK_KEY``."""
        key = self._hook_key()
        if not key:
            raise errors.SettingsError(
                "hook signatures need TREADLE_HOOK_KEY (or TREADLE_HOOK_KEY_FILE)"
            )
        return hooktokens.signature(token, key)

    def _hook_key(self) -> str | None:
        """``TREADLE_HOOK_KEY`` (or its file, read once: no file read per resume)."""
        if self._hook_key_read is None:
            self._hook_key_read = (self.settings.secret_url("TREADLE_HOOK_KEY"),)
        return self._hook_key_read[0]
