"""``Workflows``: the registry users decorate, and the client that starts and drives runs.

The run handle it returns is ``treadle.runhandle.Run``; recording a run and its start
message is ``treadle.runstart`` (both re-exported here: ``treadle.client.Run``,
``start_run``, ``minted_spec_version``).

It opens its World lazily (``TREADLE_WORLD``, default ``local:.treadle``, or
``Workflows(world=...)``). On the local World it also runs an in-process
worker, so ``await app.start(...)`` followed by ``await run.result()`` just
works in one process; ``worker=False`` turns that off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast, overload

from pydantic import BaseModel, JsonValue

import treadle.telemetry.hooks as telemetry_hooks
from treadle import (
    errors,
    hookredirects,
    hookresume,
    hooktokens,
    limits,
    payloads,
    runstart,
    runtimeouts,
    serde,
    settings,
    startoptions,
)
from treadle.lint import onload as lint_onload
from treadle.orchestrator import compat, limitgate
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.worker import Role, Worker
from treadle.runhandle import Run as Run  # re-exported: treadle.client.Run
from treadle.runstart import minted_spec_version as minted_spec_version
from treadle.runstart import start_run as start_run
from treadle.schedules import api as schedules_api
from treadle.schedules import spec as schedule_spec
from treadle.sdk import children as sdk_children
from treadle.sdk import context as sdk_context
from treadle.sdk import functions, limiting
from treadle.sdk.durations import Duration
from treadle.world import attributes as run_attributes
from treadle.world import (
    contract,
    ids,
    records,
)
from treadle.worlds import open_world

log = logging.getLogger("treadle.client")

P = ParamSpec("P")
R = TypeVar("R")


# -- child workflows (docs/children.md) ----------------------------------------------


def _child_start(
    workflow: functions.WorkflowFunction[Any, Any] | sdk_children.ChildOptions,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> sdk_children.ChildHandle | None:
    """``app.start`` inside a workflow: a child run's handle (None outside one)."""
    replay = sdk_context.current_replay()
    if replay is None:
        return None
    options = (
        workflow
        if isinstance(workflow, sdk_children.ChildOptions)
        else sdk_children.ChildOptions(workflow)
    )
    return sdk_children.start(replay, options, args, kwargs)


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
        concurrency: limiting.Limit | None = None,
        rate: limiting.Rate | None = None,
        priority: int = 0,
        timeout: Duration | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], functions.WorkflowFunction[P, R]]: ...

    def workflow(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        start_on_latest: bool = False,
        compatible: str | None = None,
        concurrency: limiting.Limit | None = None,
        rate: limiting.Rate | None = None,
        priority: int = 0,
        timeout: Duration | None = None,
    ) -> Any:
        """Register an ``async def`` as a workflow (``@app.workflow`` or ``(name=...)``).

        ``start_on_latest=True``: its new runs start on the World's latest deployment
        rather than the starter's, so a chain of runs moves to new code (seed 004).
        ``compatible="orders-v3"``: the promise that this code replays the logs of any
        revision whose workflow of this name declares the same tag, so its runs may be
        moved here (``treadle runs move``, the operator's ``MoveRuns``).
        ``concurrency=Limit(key=..., max=N)``, ``rate=Rate(key=..., per_second=...)``: its
        runs share slots and a start rate per key across the World; ``priority``: its
        runs' default place among waiters (``docs/limits.md``).
        ``timeout="1h"``: the run timeout its runs record at their start unless the start
        passes its own; past it the run fails with ``RunTimedOut`` (docs/timeouts.md).
        """

        def register(f: Callable[..., Awaitable[Any]]) -> functions.WorkflowFunction[..., Any]:
            where = f"workflow {name or f.__name__}"
            wf: functions.WorkflowFunction[..., Any] = functions.WorkflowFunction(
                f, name=name or f.__name__, start_on_latest=start_on_latest,
                compatible=compatible, limits=limiting.declared(where, concurrency, rate),
                priority=priority, timeout=timeout,
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
        self,
        /,
        *,
        name: str | None = None,
        max_retries: int = functions.DEFAULT_MAX_RETRIES,
        concurrency: limiting.Limit | None = None,
        rate: limiting.Rate | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
    ) -> Callable[[Callable[P, Any]], functions.StepFunction[P, Any]]: ...

    def step(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        max_retries: int = functions.DEFAULT_MAX_RETRIES,
        concurrency: limiting.Limit | None = None,
        rate: limiting.Rate | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
    ) -> Any:
        """Register a step (``async def`` or plain ``def``, which runs in a thread).

        ``concurrency=`` and ``rate=`` limit its attempts per key across the World; such
        a step runs from its own queue message, never inline (``docs/limits.md``).

        ``timeout="30s"``: each attempt's start-to-close timeout; ``heartbeat_timeout``:
        the longest gap between ``step_heartbeat()`` calls. An attempt past either fails
        with ``StepTimedOut`` and is retried per ``max_retries`` (docs/timeouts.md).
        """

        def register(f: Callable[..., Any]) -> functions.StepFunction[..., Any]:
            where = f"step {name or f.__name__}"
            st: functions.StepFunction[..., Any] = functions.StepFunction(
                f, name=name or f.__name__, max_retries=max_retries,
                limits=limiting.declared(where, concurrency, rate), timeout=timeout,
                heartbeat_timeout=heartbeat_timeout,
            )  # fmt: skip
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
        if role in ("all", "orchestrator"):  # the determinism linter (docs/lint.md)
            served = {name: wf.fn for name, wf in self._workflows.items()}
            await lint_onload.check_on_load(served, self.settings.TREADLE_LINT_ON_LOAD)
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
        self,
        workflow: functions.WorkflowFunction[P, Any] | sdk_children.ChildOptions | str,
        /,
        *args: Any,
        attributes: Mapping[str, Any] | startoptions.Unset | None = startoptions.UNSET,
        priority: int | startoptions.Unset | None = startoptions.UNSET,
        timeout: Duration | startoptions.Unset | None = startoptions.UNSET,
        **kwargs: Any,
    ) -> Run:
        """Start a run of ``workflow`` with these arguments; returns at once.

        The start's own keywords (the run's options, never passed to the workflow):

        - ``attributes``: the run's first attributes (``run_created``), searchable at
          once (docs/attributes.md); checked before anything is recorded;
        - ``priority`` (default: the workflow's): its place among runs waiting on the
          same limit, higher first, first come first within one priority (docs/limits.md);
        - ``timeout``: this run's run timeout, over the workflow's own (docs/timeouts.md).

        ``app.start(workflow.options(attributes=..., priority=..., timeout=...), *args,
        **kwargs)`` binds them to the workflow instead, and then every keyword of the
        call is the workflow's: the way to start a workflow whose own parameter is named
        ``attributes``, ``priority`` or ``timeout``. Passing such a keyword to a workflow
        with a parameter of that name that the positional arguments leave unfilled is
        ``StartOptionClash``, nothing recorded (docs/timeouts.md "Start options").

        Inside a workflow it starts a child run instead and returns a
        ``treadle.ChildHandle`` (``run_id``, ``await handle.result()``), typed here as
        the ``Run`` it stands for (docs/children.md); a child run takes none of the
        options above (a ``ValueError`` at the call).
        """
        if isinstance(workflow, str):
            workflow = self.get_workflow(workflow)
        given = startoptions.passed(attributes=attributes, priority=priority, timeout=timeout)
        in_workflow = sdk_context.current_replay() is not None
        options, kwargs = startoptions.resolve(workflow, given, args, kwargs, child=in_workflow)
        child = _child_start(workflow, args, kwargs)
        if child is not None:
            return cast(Run, child)
        name = workflow.name
        wf = self.get_workflow(name)
        seeded = None
        if options.attributes is not None:
            seeded = run_attributes.check_attributes(options.attributes, "app.start()", self.limits)
        keys = None
        if wf.limits.any:  # a key the input cannot give: refused here, nothing recorded
            keys = limitgate.keys_for(wf.limits, args, kwargs, f"workflow {name}")
        self.use_payload_keys()
        data = functions.encode_arguments(args, kwargs, f"workflow {name}", limits_=self.limits)
        return await self.start_encoded(
            name,
            data,
            attributes=seeded,
            priority=options.priority,
            limit_keys=keys,
            timeout=options.timeout,
            start_on_latest=options.start_on_latest,
        )

    async def start_encoded(
        self,
        name: str,
        data: JsonValue,
        *,
        attributes: Mapping[str, Any] | None = None,
        priority: int | None = None,
        limit_keys: tuple[str | None, str | None] | None = None,
        timeout: Duration | None = None,
        start_on_latest: bool | None = None,
    ) -> Run:
        """Start a run of workflow ``name`` whose input is encoded already (the CLI's,
        ``treadle serve``'s): ``start``'s options as keywords (``start_on_latest`` None:
        the workflow's own setting)."""
        seeded = None
        if attributes is not None:
            seeded = run_attributes.check_attributes(attributes, "app.start()", self.limits)
        self.use_payload_keys()  # a stored input decoded for its limit keys opens here
        limit = limitgate.entry(self._workflows.get(name), name, data, priority, limit_keys)
        wf = self._workflows.get(name)
        # Run timeouts (issue 17 item 5): recorded in run_created's input; checked first.
        data = runtimeouts.with_timeout(
            data, timeout, wf.timeout if wf is not None else None, workflow=name
        )
        world = await self.world()
        if limit is not None:
            limitgate.require_store(world, f"workflow {name}")
        spec = minted_spec_version(self.settings, world)
        runtimeouts.require_spec9(runtimeouts.recorded(data), spec, name)
        if start_on_latest is None:
            start_on_latest = wf is not None and wf.start_on_latest
        run_id = ids.new_run_id()
        await runstart.start_on(
            world,
            self.settings.TREADLE_DEPLOYMENT_ID,
            start_on_latest,
            name=name,
            data=data,
            spec_version=spec,
            run_id=run_id,
            attributes=seeded,
            limits_=self.limits,
            limit=limit,
        )
        return Run(self, run_id)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: records.RunStatus | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
        limit: int = 100,
    ) -> list[records.RunRecord]:
        """Runs newest first, up to ``limit``: of ``workflow``, in ``status``, holding every
        one of ``attributes`` (scalars, equality; docs/attributes.md)."""
        world = await self.world()
        found: list[records.RunRecord] = []
        cursor: str | None = None
        while len(found) < limit:
            page = await world.runs.list(
                workflow_name=workflow, status=status, attributes=attributes,
                limit=min(limit - len(found), 100), cursor=cursor,
            )  # fmt: skip
            found += page.runs
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

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
        write), ``HookRunEnded`` (a ``HookNotFound``) when an ended run retains it; a
        token force-claimed between the lookup and the write is followed to its new
        owner (up to 3 times); ``HookSignatureInvalid`` (nothing written) when the hook was created
        with ``require_signature=True`` and ``signature`` is missing or is not
        ``hook_signature(token, TREADLE_HOOK_KEY)``; ``HookPayloadNotRecorded`` when
        the write failed and recorded nothing (safe to call again); ``HookWakeFailed``
        when the payload is recorded but the wake could not be sent after retries (the
        run sees it on its next delivery). ``TREADLE_HOOK_TOKEN_NAMESPACE`` is applied.
        """
        limits.check_hook_token(token, self.limits)
        world = await self.world()
        stored = hooktokens.stored(token, self.limits.hook_token_namespace)
        redirects = 0
        while True:
            try:
                hook = await world.hooks.get_by_token(stored)
            except errors.HookNotFound:
                raise errors.HookNotFound(token) from None
            hooktokens.check_signature(token, hook.metadata, signature, self._hook_key())
            await hookredirects.check_live(world, token, hook)  # HookRunEnded (retained)
            try:
                return await self.resume_found_hook(token, hook, payload)
            except errors.HookNotFound:
                # Force-claimed between the lookup and the write: follow it (seed 003).
                if redirects >= hookredirects.MAX_FORCE_CLAIM_REDIRECTS or (
                    await hookredirects.force_claimed_by(world, hook) is None
                ):
                    raise
                redirects += 1

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

    # -- schedules (issue 17 item 3: treadle.schedules, docs/schedules.md) ----------------

    async def schedule(
        self,
        name: str,
        workflow: functions.WorkflowFunction[..., Any] | str,
        *,
        cron: str = "0 * * * *",
        timezone: str | None = None,
        overlap: str = schedule_spec.DEFAULT_OVERLAP,
        catchup_window: float | timedelta = schedule_spec.DEFAULT_CATCHUP_WINDOW,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        input: JsonValue = None,
        paused: bool = False,
        deployment: str | None = None,
        catchup: str = "all",
    ) -> schedules_api.Schedule:
        """Create or update the schedule ``name`` in the World: a run of ``workflow`` (with
        ``args``/``kwargs``, or ``input`` already encoded) at every ``cron`` time in
        ``timezone`` (UTC), under the ``overlap`` policy (skip, buffer_one, allow,
        cancel_other) and catching up missed firings within ``catchup_window``: ``all`` of
        them, or only the ``latest`` (CronJob's rule). ``deployment``: the deployment id its
        runs start on (its workers fire it); None: any worker serving the workflow, on its
        own. Bad input is ``ScheduleInvalid`` naming the field, before anything is recorded."""
        return await schedules_api.put(
            self, name, workflow, cron=cron, timezone=timezone, overlap=overlap,
            catchup_window=catchup_window, args=args, kwargs=kwargs, input=input, paused=paused,
            deployment=deployment, catchup=catchup,
        )  # fmt: skip

    def get_schedule(self, name: str) -> schedules_api.Schedule:
        """A handle on the schedule ``name`` (pause, resume, trigger, backfill...)."""
        return schedules_api.Schedule(self, name)

    async def list_schedules(self, *, limit: int = 1000) -> list[records.ScheduleRecord]:
        return await schedules_api.list_schedules(self, limit=limit)

    def schedules_changed(self) -> None:
        """Wake this process's firing loop (a schedule changed here)."""
        if self._worker is not None:
            self._worker.schedules_changed()
