"""``treadle serve``: the HTTP API, webhooks and inspector over the configured World.

Opens the World as every command does (``--world`` or ``TREADLE_WORLD``; a client
with no workflows and no worker, as ``treadle runs`` uses), builds the
``ServeContext`` and runs ``treadle.serve.app.Server`` until SIGINT or SIGTERM,
then stops gracefully: streams end, open requests get ``GRACE_SECONDS``, the World
is closed. Refuses to start (exit 2) without auth configured
(``TREADLE_SERVE_TOKEN``, ``TREADLE_SERVE_READONLY_TOKEN`` or
``TREADLE_SERVE_TRUSTED_HEADER``) unless ``--insecure-no-auth``, which warns loudly.
Needs the ``serve`` extra (starlette, uvicorn).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from treadle import telemetry
from treadle.cli import common, output


async def cmd_serve(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 <= args.port <= 65535:
        raise common.UsageError(f"--port must be 0..65535, not {args.port}")
    common.use_world(args.world)
    try:
        from treadle.serve import app as serve_app
        from treadle.serve import settings as serve_settings
        from treadle.serve.context import ServeContext
    except ImportError as exc:  # starlette or uvicorn missing
        raise common.UsageError(
            f"treadle serve needs the serve extra (pip install 'treadle[serve]'): {exc}"
        ) from None

    configured = serve_settings.load()
    if configured.auth_configured and args.insecure_no_auth:
        raise common.UsageError(
            "--insecure-no-auth is for a server with no auth configured; this one has "
            "TREADLE_SERVE_TOKEN, TREADLE_SERVE_READONLY_TOKEN or TREADLE_SERVE_TRUSTED_HEADER"
        )
    if not configured.auth_configured and not args.insecure_no_auth:
        raise common.UsageError(
            "treadle serve needs auth: set TREADLE_SERVE_TOKEN (full role) and/or "
            "TREADLE_SERVE_READONLY_TOKEN, or TREADLE_SERVE_TRUSTED_HEADER behind an "
            "authenticating proxy; --insecure-no-auth serves everyone (a laptop only)"
        )
    host = args.host or configured.TREADLE_SERVE_HOST
    port = configured.TREADLE_SERVE_PORT if args.port is None else args.port
    # Before the World opens: its writes are counted (/metrics) and traced (OTEL_*).
    telemetry.configure(service_name="treadle-serve", metrics=True)
    client = common.client()
    loop = asyncio.get_running_loop()
    server: serve_app.Server | None = None
    try:
        world = await client.world()
        ctx = ServeContext(
            world=world,
            settings=client.settings,
            serve=configured,
            insecure_no_auth=args.insecure_no_auth,
        )
        server = serve_app.Server(
            ctx, host=host, port=port, log_level=args.log_level, access_log=args.access_log
        )
        await server.start()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.request_stop)
        if args.insecure_no_auth:
            output.err(
                "treadle serve: WARNING: --insecure-no-auth: no credentials are asked; anyone "
                f"who can reach {server.url} can read every run and cancel, wake, rerun and "
                "resume them"
            )
        output.err(
            f"treadle serve: listening on {server.url} (World {client.settings.TREADLE_WORLD}); "
            "Ctrl-C stops"
        )
        await server.wait()
        output.err("treadle serve: stopped")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if server is not None:
            await server.stop()
        await client.close()
    return common.OK
