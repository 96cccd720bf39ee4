"""``treadle runs stream RUN [NAME]``: print a run's stream chunks as they come
(issue 17 item 6, docs/streams.md). It follows the stream live and exits 0 once the
stream is closed or the run ended.

A text chunk is printed as it is, one per line (``--raw``: no newline added, so
tokens join up); any other value as its JSON. ``--json``: one JSON object per
chunk (``index``, ``step_id``, ``attempt``, ``seq``, ``data``: the stored JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from treadle import errors, streamread
from treadle.cli import common, output
from treadle.world import streamrules


async def cmd_runs_stream(args: argparse.Namespace) -> int:
    try:
        streamrules.check_name(args.name)
    except errors.StreamNameInvalid as exc:
        raise common.UsageError(str(exc)) from None
    if args.start < 0:
        raise common.UsageError(f"--start must be an index >= 0, not {args.start}")
    common.use_world(args.world)
    app = common.client()
    try:
        world = await app.world()
        run = await world.runs.get(common.check_run_id(args.run))
        app.use_payload_keys()
        poll = app.settings.TREADLE_STREAM_POLL_SECONDS
        async for chunk in streamread.read_chunks(
            world, run.run_id, args.name, start=args.start, poll_seconds=poll
        ):
            if args.json:
                output.emit_json(
                    {
                        "index": chunk.index,
                        "step_id": chunk.step_id,
                        "attempt": chunk.attempt,
                        "seq": chunk.seq,
                        "data": json.loads(output.json_text(chunk.data)),
                    }
                )
                continue
            value = streamread.decode(chunk, args.name).value
            text = value if isinstance(value, str) else output.json_text(chunk.data)
            sys.stdout.write(text if args.raw else text + "\n")
            sys.stdout.flush()
    finally:
        await app.close()
    if args.raw and not args.json:
        sys.stdout.write("\n")
    return common.OK


def add_parser(runs_commands: Any, shared: Sequence[argparse.ArgumentParser]) -> None:
    """``runs stream`` on ``runs_commands`` (the ``runs`` subparsers of cli.parser)."""
    stream = runs_commands.add_parser(
        "stream", parents=list(shared), help="print a run's stream chunks as they come"
    )
    stream.add_argument("run", metavar="RUN")
    stream.add_argument("name", metavar="NAME", nargs="?", default=streamrules.DEFAULT_NAME)
    stream.add_argument("--start", type=int, default=0, metavar="INDEX")
    stream.add_argument("--raw", action="store_true", help="no newline after text chunks")
    stream.set_defaults(handler=cmd_runs_stream)
