"""The commands that only read or write the World: ``runs``, ``inspect``, ``hooks``,
``dead-letters`` and ``settings``. They load no user code and start no worker.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic_core import PydanticUndefined

from treadle import childtree, clock, errors, limitview, moves, payloads, redaction, settings
from treadle.cli import common, output, ownership
from treadle.client import Workflows
from treadle.world import attributes as run_attributes
from treadle.world import contract, records


@asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[Workflows]:
    common.use_world(args.world)
    app = common.client()
    try:
        yield app
    finally:
        await app.close()


async def _existing(app: Workflows, run_id: str) -> records.RunRecord:
    """The run's record; ``RunNotFound`` (exit 2) for an unknown id."""
    world = await app.world()
    (run,) = await limitview.annotate(world, [await world.runs.get(common.check_run_id(run_id))])
    return run


async def cmd_runs_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise common.UsageError(f"--limit must be at least 1, not {args.limit}")
    try:  # --attr KEY=VALUE, repeatable, ANDed (docs/attributes.md)
        wanted = run_attributes.parse_filter(getattr(args, "attr", None) or [])
    except ValueError as exc:
        raise common.UsageError(str(exc)) from None
    async with _client(args) as app:
        world = await app.world()
        found: list[records.RunRecord] = []
        cursor: str | None = None
        while len(found) < args.limit:
            page = await world.runs.list(
                status=args.status,
                workflow_name=args.workflow,
                limit=min(args.limit - len(found), 100),
                cursor=cursor,
                attributes=wanted or None,
            )
            found.extend(page.runs)
            cursor = page.next_cursor
            if cursor is None:
                break
        found = await limitview.annotate(world, found)  # what each waits on, if a limit
    if args.json:
        output.emit_json([output.run_dict(r) for r in found])
        return common.OK
    rows = [
        [
            r.run_id,
            r.workflow_name,
            output.status_text(r),
            output.short_time(r.created_at),
            output.short_time(r.updated_at),
        ]
        for r in found
    ]
    if rows:
        output.table(["RUN ID", "WORKFLOW", "STATUS", "CREATED (UTC)", "UPDATED (UTC)"], rows)
    else:
        output.err("no runs")
    return common.OK


async def cmd_runs_get(args: argparse.Namespace) -> int:
    async with _client(args) as app:
        run = await _existing(app, args.run)
        family = await childtree.tree(await app.world(), run)  # child workflows
    if args.json:
        output.emit_json({**output.run_dict(run), **output.tree_dict(family)})
    else:
        output.print_run(run)
        output.print_tree(family)
    return common.OK


async def cmd_runs_cancel(args: argparse.Namespace) -> int:
    async with _client(args) as app:
        run = await _existing(app, args.run)
        if run.is_terminal:
            raise common.UsageError(f"run {run.run_id} is {run.status} already; nothing to cancel")
        await app.get_run(run.run_id).cancel(reason=args.reason)
        run = await _existing(app, run.run_id)
    if args.json:
        output.emit_json({"run_id": run.run_id, "status": run.status})
    else:
        output.out(f"run {run.run_id} {run.status}")
    return common.OK


async def cmd_runs_wake(args: argparse.Namespace) -> int:
    async with _client(args) as app:
        run = await _existing(app, args.run)
        if run.is_terminal:
            raise common.UsageError(f"run {run.run_id} is {run.status}; it has no sleeps to end")
        asked = await app.get_run(run.run_id).wake_up()
    if args.json:
        output.emit_json({"run_id": run.run_id, "waits": asked})
    else:
        noun = "sleep" if asked == 1 else "sleeps"
        output.out(f"run {run.run_id}: asked {asked} {noun} to end now")
    return common.OK


async def cmd_runs_move(args: argparse.Namespace) -> int:
    """``treadle runs move RUN --to DEPLOYMENT``: ``treadle.moves.move_run`` (repin + wake)."""
    async with _client(args) as app:
        run = await _existing(app, args.run)
        try:
            moved = await moves.move_run(
                await app.world(), run.run_id, to_deployment=args.to, reason=args.reason
            )
        except (errors.RunNotMovable, errors.RunNotRepinned) as exc:
            raise common.UsageError(str(exc)) from None
    if args.json:
        output.emit_json(
            {"run_id": run.run_id, "from": moved.from_deployment, "to": moved.to_deployment,
             "outcome": moved.outcome}
        )  # fmt: skip
    elif moved.outcome == "moved":
        output.out(f"run {run.run_id} moved from {moved.from_deployment} to {moved.to_deployment}")
    else:
        output.out(f"run {run.run_id} is on {moved.to_deployment} already; woken there")
    return common.OK


async def cmd_inspect(args: argparse.Namespace) -> int:
    async with _client(args) as app:
        run = await _existing(app, args.run)
        timeline = await app.get_run(run.run_id).events()
    lease = app.settings.WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
    owners = ownership.inline_ownership(run, timeline, lease_seconds=lease, now=clock.utcnow())
    if args.json:
        data = output.run_dict(run)
        data["events"] = [output.event_dict(e) for e in timeline]
        if owners is not None:
            data["inline_ownership"] = owners  # spec 8 runs only
        output.emit_json(data)
    else:
        output.print_timeline(run, timeline)
        if owners is not None:
            ownership.print_inline_ownership(owners, lease)
    return common.OK


async def cmd_hooks_resume(args: argparse.Namespace) -> int:
    payload = common.parse_json(args.payload, "--payload") if args.payload is not None else None
    async with _client(args) as app:
        run = await app.resume_hook(args.token, payload, signature=args.signature)
    if args.json:
        output.emit_json({"token": args.token, "run_id": run.run_id})
    else:
        output.out(f"hook {args.token!r} resumed run {run.run_id}")
    return common.OK


async def _dead_letters(app: Workflows) -> contract.DeadLetters:
    queue = (await app.world()).queue
    if not isinstance(queue, contract.DeadLetters):
        raise common.UsageError("this World's queue keeps no dead letters")
    return queue


async def cmd_dead_letters_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise common.UsageError(f"--limit must be at least 1, not {args.limit}")
    async with _client(args) as app:
        found = await (await _dead_letters(app)).dead_letters(limit=args.limit)
    if args.json:
        output.emit_json(
            [
                {
                    "message_id": d.message_id,
                    "kind": d.kind,
                    "run_id": d.run_id,
                    "deliveries": d.deliveries,
                    "error": d.error,
                    "dead_at": d.dead_at.isoformat(),
                }
                for d in found
            ]
        )
        return common.OK
    if not found:
        output.err("no dead letters")
        return common.OK
    output.table(
        ["MESSAGE ID", "KIND", "RUN ID", "DELIVERIES", "DEAD AT (UTC)", "LAST ERROR"],
        [
            [
                d.message_id,
                d.kind,
                d.run_id or "-",
                str(d.deliveries),
                output.short_time(d.dead_at),
                d.error[:80],
            ]
            for d in found
        ],
    )
    return common.OK


async def cmd_dead_letters_requeue(args: argparse.Namespace) -> int:
    async with _client(args) as app:
        await (await _dead_letters(app)).requeue_dead_letter(args.message)
    if args.json:
        output.emit_json({"message_id": args.message, "requeued": True})
    else:
        output.out(f"dead letter {args.message} requeued")
    return common.OK


async def cmd_dead_letters_drop(args: argparse.Namespace) -> int:
    async with _client(args) as app:
        await (await _dead_letters(app)).drop_dead_letter(args.message)
    if args.json:
        output.emit_json({"message_id": args.message, "dropped": True})
    else:
        output.out(f"dead letter {args.message} dropped")
    return common.OK


def _default(field: Any) -> Any:
    if field.default is PydanticUndefined:
        return None if field.default_factory is None else field.default_factory()
    return field.default


def _allowed(field: Any) -> str | None:
    """The values a setting takes, where its field names them (``allowed``)."""
    extra = field.json_schema_extra
    allowed = extra.get("allowed") if isinstance(extra, dict) else None
    return allowed if isinstance(allowed, str) else None


def _serve_rows() -> list[dict[str, Any]]:
    """``treadle serve``'s own settings (``TREADLE_SERVE_*``), when its extra is installed."""
    try:
        from treadle.serve import settings as serve_settings
    except ImportError:
        return []
    current = serve_settings.load()
    return [
        {
            "name": name,
            "default": _default(field),
            "value": getattr(current, name),
            "from_environment": bool(os.environ.get(name, "").strip()),
            "description": field.description or "",
            "allowed": _allowed(field),
        }
        for name, field in serve_settings.ServeSettings.model_fields.items()
    ]


async def cmd_settings(args: argparse.Namespace) -> int:
    current = common.use_world(args.world)
    rows: list[dict[str, Any]] = []
    for name, field in settings.Settings.model_fields.items():
        rows.append(
            {
                "name": name,
                "default": _default(field),
                "value": getattr(current, name),
                "from_environment": bool(os.environ.get(name, "").strip()),
                "description": field.description or "",
                "allowed": _allowed(field),
            }
        )
    rows += _serve_rows()
    if args.json:
        output.emit_json(rows)
        return common.OK
    output.table(
        ["SETTING", "DEFAULT", "CURRENT", "DESCRIPTION"],
        [
            [
                r["name"],
                output.json_text(r["default"]),
                output.json_text(r["value"]) + (" (env)" if r["from_environment"] else ""),
                r["description"] + (f" Allowed: {r['allowed']}." if r["allowed"] else ""),
            ]
            for r in rows
        ],
    )
    return common.OK


def _migration_dsn(args: argparse.Namespace, current: settings.Settings) -> str:
    """The DSN to migrate: a file (or stdin), the settings, or (with a warning) argv."""
    if args.database_url_file:
        source = "stdin" if args.database_url_file == "-" else args.database_url_file
        try:
            if args.database_url_file == "-":
                text = sys.stdin.readline().strip()
            else:
                with open(args.database_url_file) as secret:
                    text = secret.readline().strip()
        except OSError as exc:
            raise common.UsageError(
                f"--database-url-file {redaction.shown(source)} cannot be read: {exc.strerror}"
            ) from None
        if not text:
            raise common.UsageError(f"--database-url-file: {redaction.shown(source)} is empty")
        return text
    if args.database_url:
        print(
            "treadle: warning: --database-url puts the password in the process list and "
            "shell history; prefer TREADLE_DATABASE_URL, TREADLE_DATABASE_URL_FILE or "
            "--database-url-file",
            file=sys.stderr,
        )
        return str(args.database_url)
    dsn = current.secret_url("TREADLE_DATABASE_URL")
    if not dsn:
        raise common.UsageError(
            "migrate needs TREADLE_DATABASE_URL, TREADLE_DATABASE_URL_FILE or --database-url-file"
        )
    return dsn


async def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply pending Postgres migrations, in order, each in its own transaction."""
    current = common.use_world(args.world)
    dsn = _migration_dsn(args, current)
    from treadle.worlds.postgres import migrate
    from treadle.worlds.transport import Transport

    # TREADLE_DATABASE_SSL* apply to the migration's connection as to the workers'.
    applied = await migrate.migrate(Transport.from_settings(current).postgres.dsn(dsn))
    if args.json:
        output.emit_json({"applied": applied})
    elif applied:
        print(f"applied migrations {', '.join(str(v) for v in applied)}")
    else:
        print("the schema is up to date")
    return common.OK


async def cmd_payload_key(args: argparse.Namespace) -> int:
    """Print a new ``kid:key`` entry for TREADLE_PAYLOAD_KEY (stdout only, nothing stored)."""
    kid = args.kid or clock.utcnow().strftime("k%Y%m%d")
    try:
        entry = payloads.new_key(kid)
    except errors.SettingsError as exc:
        output.error_line(str(exc))
        return common.USAGE
    output.out(entry)
    return common.OK
