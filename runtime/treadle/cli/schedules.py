"""``treadle schedules list|get|pause|resume|trigger|backfill|upcoming|delete``: the World's
schedules (docs/schedules.md). They load no user code and start no worker; a schedule
is made with ``app.schedule(...)`` (or the operator's WorkflowSchedule). A trigger or
backfill is claimed and started by this command (``treadle.schedules.api``).
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from treadle import errors
from treadle.cli import common, output
from treadle.client import Workflows
from treadle.schedules.api import Schedule
from treadle.world import records


@asynccontextmanager
async def _schedule(args: argparse.Namespace) -> AsyncIterator[tuple[Workflows, Schedule]]:
    common.use_world(args.world)
    app = common.client()
    try:
        try:
            yield app, app.get_schedule(args.name)
        except (errors.ScheduleNotFound, errors.ScheduleInvalid) as exc:
            raise common.UsageError(str(exc)) from None
    finally:
        await app.close()


def schedule_dict(record: records.ScheduleRecord) -> dict[str, Any]:
    spec, state = record.spec, record.state
    return {
        "name": spec.name,
        "workflow": spec.workflow_name,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "overlap": spec.overlap,
        "catchup_window_seconds": spec.catchup_window_seconds,
        "catchup": spec.catchup,
        "deployment": spec.deployment_id,
        "input": spec.input,
        "paused": state.paused,
        "next_fire_at": output.iso(state.next_fire_at),
        "last_fired_at": output.iso(state.last_fired_at),
        "last_run_id": state.last_run_id,
        "buffered_at": output.iso(state.buffered_at),
        "skipped": state.skipped,
        "missed": state.missed,
        "version": record.version,
        "created_at": output.iso(record.created_at),
        "updated_at": output.iso(record.updated_at),
    }


def _show(args: argparse.Namespace, record: records.ScheduleRecord) -> int:
    if args.json:
        output.emit_json(schedule_dict(record))
        return common.OK
    for key, value in schedule_dict(record).items():
        shown = output.json_text(value) if key == "input" else ("-" if value is None else value)
        output.out(f"{key + ':':<24}{shown}")
    return common.OK


async def cmd_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise common.UsageError(f"--limit must be at least 1, not {args.limit}")
    common.use_world(args.world)
    app = common.client()
    try:
        found = await app.list_schedules(limit=args.limit)
    finally:
        await app.close()
    if args.json:
        output.emit_json([schedule_dict(r) for r in found])
        return common.OK
    rows = [
        [r.name, r.spec.workflow_name, r.spec.cron, r.spec.timezone, r.spec.overlap,
         "paused" if r.state.paused else "active", output.short_time(r.state.next_fire_at),
         r.state.last_run_id or "-"]
        for r in found
    ]  # fmt: skip
    if rows:
        output.table(
            ["NAME", "WORKFLOW", "CRON", "TZ", "OVERLAP", "STATE", "NEXT (UTC)", "LAST RUN"], rows
        )
    else:
        output.err("no schedules")
    return common.OK


async def cmd_get(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        record = await schedule.get()
    return _show(args, record)


async def cmd_pause(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        record = await schedule.pause()
    return _show(args, record)


async def cmd_resume(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        record = await schedule.resume()
    return _show(args, record)


async def cmd_trigger(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        run = await schedule.trigger(overlap=args.overlap)
        record = await schedule.get()
    run_id = None if run is None else run.run_id
    if args.json:
        output.emit_json({"name": args.name, "run_id": run_id, "skipped": record.state.skipped,
                          "buffered_at": output.iso(record.state.buffered_at)})  # fmt: skip
    elif run_id is not None:
        output.out(run_id)
    else:
        output.out(f"schedule {args.name}: the firing was skipped or buffered (overlap policy)")
    return common.OK


async def cmd_backfill(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        done = await schedule.backfill(args.start, args.end, overlap=args.overlap)
    if args.json:
        output.emit_json([{"time": output.iso(t), "decision": d} for t, d in done])
    elif done:
        output.table(["TIME (UTC)", "DECISION"], [[output.short_time(t), d] for t, d in done])
    else:
        output.err(f"schedule {args.name}: no firing time between {args.start} and {args.end}")
    return common.OK


async def cmd_upcoming(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        times = await schedule.upcoming(args.count, after=args.after)
    if args.json:
        output.emit_json([output.iso(t) for t in times])
    else:
        for t in times:
            output.out(output.iso(t) or "")
    return common.OK


async def cmd_delete(args: argparse.Namespace) -> int:
    async with _schedule(args) as (_, schedule):
        gone = await schedule.delete()
    if not gone:
        raise common.UsageError(f"no schedule named {args.name!r}")
    if args.json:
        output.emit_json({"name": args.name, "deleted": True})
    else:
        output.out(f"schedule {args.name} deleted")
    return common.OK


def add_commands(commands: Any, shared: Sequence[argparse.ArgumentParser]) -> None:
    """The ``schedules`` command group (called by ``parser.build_parser``)."""
    group = commands.add_parser(
        "schedules", help="list, show, pause, trigger or backfill schedules"
    )
    sub = group.add_subparsers(dest="schedules_command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", parents=list(shared), help="every schedule, by name")
    listing.add_argument("--limit", type=int, default=1000, metavar="N")
    listing.set_defaults(handler=cmd_list)
    overlaps = list(records.SCHEDULE_OVERLAPS)
    for name, handler, text in (
        ("get", cmd_get, "one schedule and its firing state"),
        ("pause", cmd_pause, "stop firing (trigger and backfill still fire)"),
        ("resume", cmd_resume, "fire again from the next time after now"),
        ("trigger", cmd_trigger, "fire once now"),
        ("backfill", cmd_backfill, "one firing per cron time in [START, END]"),
        ("upcoming", cmd_upcoming, "the next firing times"),
        ("delete", cmd_delete, "remove the schedule (its runs stay)"),
    ):
        command = sub.add_parser(name, parents=list(shared), help=text)
        command.add_argument("name", metavar="NAME")
        command.set_defaults(handler=handler)
        if name in ("trigger", "backfill"):
            command.add_argument("--overlap", choices=overlaps, help="instead of the schedule's")
        if name == "backfill":
            command.add_argument("start", metavar="START", help="ISO 8601 time with its zone")
            command.add_argument("end", metavar="END", help="ISO 8601 time with its zone")
        if name == "upcoming":
            command.add_argument("--count", type=int, default=5, metavar="N")
            command.add_argument("--after", metavar="TIME", help="ISO 8601 (default: now)")
