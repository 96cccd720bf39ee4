"""The commands that load user code: ``run``, ``start`` and ``worker``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections import Counter

from treadle import errors, payloads, telemetry
from treadle.cli import common, output
from treadle.cli.targets import load_app, load_target
from treadle.client import Workflows
from treadle.metrics import server as metricsserver
from treadle.sdk import functions
from treadle.world import contract, events, records

# How long ``treadle run`` lets its in-process worker finish a delivery on the way out;
# whatever is cut short is redelivered by the next worker on this World.
RUN_CLOSE_GRACE_SECONDS = 2.0
# Poll the log this often even with a live feed (the feed is best effort).
FOLLOW_POLL_SECONDS = 1.0
# ``treadle run`` on a World without an in-process worker checks this many runs per
# active status of its deployment for workflows it does not define.
FOREIGN_RUNS_SCAN = 1000
ACTIVE_STATUSES: tuple[records.RunStatus, ...] = ("pending", "running")


async def follow(
    world: contract.World,
    run_id: str,
    progress: output.Progress,
    deadline: float | None,
) -> bool:
    """Show the run's events in slot order until it ends; False when ``deadline`` passes."""
    news = asyncio.Event()
    sub = world.events.subscribe(run_id, 0, lambda _e: news.set(), lambda _exc: news.set())
    after = 0
    try:
        while True:
            news.clear()
            while True:
                page = await world.events.list(run_id, after_slot=after)
                for event in page.events:
                    progress.show(event)
                    if event.type in events.RUN_TERMINAL_TYPES:
                        return True
                after = page.cursor if page.events else after
                if not page.has_more:
                    break
            wait = FOLLOW_POLL_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(news.wait(), wait)
    finally:
        sub.close()


async def refuse_foreign_runs(
    world: contract.World, app: Workflows, where: str, target: str
) -> None:
    """Refuse to serve a deployment whose active runs include workflows this app lacks.

    The in-process worker of ``treadle run`` takes any delivery of its deployment,
    and a run whose workflow it does not define would be failed (WorkflowNotFound).
    Checks up to ``FOREIGN_RUNS_SCAN`` runs per active status.
    """
    deployment = app.settings.TREADLE_DEPLOYMENT_ID
    foreign: Counter[str] = Counter()
    for status in ACTIVE_STATUSES:
        page = await world.runs.list(
            status=status, deployment_id=deployment, limit=FOREIGN_RUNS_SCAN
        )
        foreign.update(r.workflow_name for r in page.runs if r.workflow_name not in app.workflows)
    if foreign:
        names = ", ".join(f"{name} ({n} active)" for name, n in sorted(foreign.items()))
        raise common.UsageError(
            f"deployment {deployment} has active runs of workflows {where} does not define: "
            f"{names}; serving it from here would fail them. Set TREADLE_DEPLOYMENT_ID to "
            f"this code's own deployment, or hand the run to its workers with: "
            f"treadle start {target}"
        )


def _report(args: argparse.Namespace, run: records.RunRecord) -> int:
    """Print a finished run's output (stdout) or error (stderr); the exit code."""
    if args.json:
        data: dict[str, object] = {"run_id": run.run_id, "status": run.status}
        if run.status == "completed":
            data["output"] = payloads.display(run.output)
        else:
            error = run.error or events.ErrorInfo(message="the run was cancelled", type="Cancelled")
            data["error"] = output.error_dict(error)
        output.emit_json(data)
        return common.OK if run.status == "completed" else common.FAILED
    if run.status == "completed":
        output.out(output.json_text(run.output))
        return common.OK
    if run.status == "cancelled":
        output.error_line(f"run {run.run_id} was cancelled")
    else:
        error = run.error or events.ErrorInfo(message="unknown error")
        output.error_line(f"run {run.run_id} failed: {error.type}: {error.message}")
    return common.FAILED


async def cmd_run(args: argparse.Namespace) -> int:
    """Start a run with an in-process worker, show its progress, print its outcome."""
    if args.timeout is not None and args.timeout <= 0:
        raise common.UsageError(
            f"--timeout must be a positive number of seconds, not {args.timeout}"
        )
    common.use_world(args.world)
    telemetry.configure(service_name="treadle-run")  # spans if OTEL_* asks for them
    target = load_target(args.target)
    call_args, call_kwargs = common.parse_input(args.input)
    common.check_arguments(target.workflow, call_args, call_kwargs)
    functions.encode_arguments(tuple(call_args), call_kwargs, f"workflow {target.name}")
    progress = output.Progress(quiet=args.quiet)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    app = target.app
    run_id: str | None = None
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    if main_task is not None:  # SIGTERM stops the wait as Ctrl-C does
        loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        try:
            world = await app.world()  # on the local World this starts the in-process worker
        except errors.StorageLocked as exc:
            raise common.UsageError(
                f"{exc}; stop it, or hand it the run with: treadle start {args.target}"
            ) from None
        if not app.serving:
            # Postgres + NATS: a bare app starts no worker; this one serves the run's
            # deployment here, unless that would serve others' runs with the wrong code.
            await refuse_foreign_runs(world, app, target.where, args.target)
            await app.world_with_worker()
        run = await app.start(target.workflow, *call_args, **call_kwargs)
        run_id = run.run_id
        if not args.quiet:
            output.err(f"run {run_id} ({target.name}) on {app.settings.TREADLE_WORLD}")
        if not await follow(world, run_id, progress, deadline):
            status = await run.status()
            message = (
                f"run {run_id} is still {status} after {args.timeout:g} s; it goes on "
                f"(see: treadle runs get {run_id})"
            )
            if args.json:
                output.emit_json(
                    {
                        "run_id": run_id,
                        "status": status,
                        "error": {"type": "Timeout", "message": message},
                    }
                )
            output.error_line(message)
            return common.FAILED
        return _report(args, await run.get())
    except (KeyboardInterrupt, asyncio.CancelledError):
        if run_id is None:
            output.error_line("interrupted")
        else:
            output.error_line(f"interrupted; run {run_id} goes on (see: treadle runs get {run_id})")
        return common.INTERRUPTED
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await app.close(grace_seconds=RUN_CLOSE_GRACE_SECONDS)


async def cmd_start(args: argparse.Namespace) -> int:
    """Record a run and queue its start; a worker on this World executes it."""
    common.use_world(args.world)
    telemetry.configure(service_name="treadle-start")  # the run's trace starts here
    target = load_target(args.target)
    call_args, call_kwargs = common.parse_input(args.input)
    common.check_arguments(target.workflow, call_args, call_kwargs)
    data = functions.encode_arguments(tuple(call_args), call_kwargs, f"workflow {target.name}")
    seeded = common.parse_attributes(getattr(args, "attr", None) or [])
    client = common.client()
    try:
        run = await client.start_encoded(target.name, data, attributes=seeded or None)
        record = await run.get()
    finally:
        await client.close()
    if args.json:
        output.emit_json({"run_id": run.run_id, "workflow": target.name, "status": record.status})
    else:
        output.out(run.run_id)
    return common.OK


async def cmd_worker(args: argparse.Namespace) -> int:
    """Serve the World's queue with one app's workflows and steps until SIGINT or SIGTERM."""
    if args.concurrency is not None and args.concurrency < 1:
        raise common.UsageError(f"--concurrency must be at least 1, not {args.concurrency}")
    if args.grace < 0:
        raise common.UsageError(f"--grace must be 0 or more seconds, not {args.grace}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise common.UsageError(f"--metrics-port must be 0..65535, not {args.metrics_port}")
    common.use_world(args.world)
    metrics_port = metricsserver.worker_port(args.metrics_port)
    telemetry.configure(service_name="treadle-worker", metrics=metrics_port is not None)
    app, where = load_app(args.module)
    metrics_server: metricsserver.MetricsServer | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        worker = await app.serve(role=args.role, concurrency=args.concurrency)
        metrics_server = await metricsserver.start_for_worker(
            await app.world(),
            deployment_id=app.settings.TREADLE_DEPLOYMENT_ID,
            port=metrics_port,
            host=args.metrics_host,
        )
        names = ", ".join(sorted(app.workflows)) or "no workflows"
        output.err(
            f"treadle worker: serving {names} from {where} on {app.settings.TREADLE_WORLD} "
            f"(role {args.role}, concurrency {worker.concurrency}); Ctrl-C stops"
        )
        await stop.wait()
        output.err("treadle worker: stopping")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if metrics_server is not None:
            await metrics_server.close()
        await app.close(grace_seconds=args.grace)
    return common.OK
