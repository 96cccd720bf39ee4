"""The worker's ``/metrics`` endpoint (``treadle worker --metrics-port N``).

A small HTTP/1.1 server on asyncio (no thread, no framework: a worker image needs no web
stack for it) answering ``GET /metrics`` with ``treadle.metrics.exposition()`` after
refreshing the World's gauges (``WorldGauges``), ``GET /healthz`` with ``ok``, anything
else 404 and a method other than GET 405. One request per connection; a request whose
head is not read within ``READ_TIMEOUT_SECONDS`` or exceeds ``MAX_HEAD_BYTES`` is
dropped. Started by ``cli.execute.cmd_worker`` through ``start_for_worker``, on
``--metrics-port`` or else ``TREADLE_WORKER_METRICS_PORT`` (``worker_port``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping

from treadle import errors, metrics
from treadle.metrics.world import WorldGauges
from treadle.world import contract

log = logging.getLogger("treadle.metrics")

PORT_VARIABLE = "TREADLE_WORKER_METRICS_PORT"
READ_TIMEOUT_SECONDS = 5.0
MAX_HEAD_BYTES = 8192


class MetricsServer:
    def __init__(self, gauges: WorldGauges | None, *, host: str, port: int) -> None:
        self.gauges = gauges
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (``port=0`` picks a free one)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        bound: int = self._server.sockets[0].getsockname()[1]
        self.port = bound
        return bound

    async def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), timeout=READ_TIMEOUT_SECONDS
                )
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            if len(head) > MAX_HEAD_BYTES:
                return
            parts = head.split(b"\r\n", 1)[0].split(b" ")
            method, target = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
            path = target.split(b"?", 1)[0]
            if method != b"GET":
                await self._answer(writer, 405, b"method not allowed\n")
            elif path == b"/metrics":
                if self.gauges is not None:
                    await self.gauges.refresh()
                await self._answer(writer, 200, metrics.exposition(), metrics.CONTENT_TYPE)
            elif path == b"/healthz":
                await self._answer(writer, 200, b"ok\n")
            else:
                await self._answer(writer, 404, b"not found\n")
        except Exception as exc:  # a scrape must never take the worker down
            log.warning("metrics: answering a request failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _answer(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()


def worker_port(flag: int | None, environ: Mapping[str, str] | None = None) -> int | None:
    """``--metrics-port``, else ``TREADLE_WORKER_METRICS_PORT`` (the operator sets it on
    worker pods), else None (off). ``SettingsError`` naming the variable for a bad one."""
    if flag is not None:
        return flag
    raw = (environ if environ is not None else os.environ).get(PORT_VARIABLE, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise errors.SettingsError(f"{PORT_VARIABLE}={raw[:20]!r} is not a port (0..65535)")
    return int(raw)


async def start_for_worker(
    world: contract.World, *, deployment_id: str, port: int | None, host: str = "0.0.0.0"
) -> MetricsServer | None:
    """The worker's endpoint on ``port`` (None: off), over the World it serves; metrics
    are recorded from then on (``metrics.enable``).

    A port it cannot listen on (taken by another process on a shared host network, say)
    is logged as an error and the worker serves its runs without ``/metrics``: metrics
    never stop a worker from working.
    """
    if port is None:
        return None
    server = MetricsServer(WorldGauges(world, deployment_id=deployment_id), host=host, port=port)
    try:
        bound = await server.start()
    except OSError as exc:
        log.error(
            "metrics: cannot listen on %s:%d (%s); this worker serves without /metrics",
            host,
            port,
            exc,
        )
        return None
    metrics.enable()
    log.info("metrics: serving /metrics on %s:%d", host, bound)
    return server
