"""``NatsQueue``: treadle's durable queue on NATS JetStream.

``await NatsQueue.connect(url, deployment_id=..., tuning=..., stream=...)``
checks the server (2.12 or later), creates the stream and the run lease bucket
if they are missing, and returns a queue that sends and consumes:

- A send publishes the message's JSON to its run's subject (``names``) with the
  message id in a header. A keyed send carries ``Nats-Msg-Id`` (a digest of the
  key), so the stream drops a repeat within its 24 h duplicate window whatever
  state the first is in; its message id is derived from the key, so the repeat
  reports the first send's id. An unkeyed send is never deduplicated. (The
  server keeps the window in memory and rebuilds it at a restart from the
  messages still in the stream: a key whose message was acked, or whose
  schedule fired, before a server restart is forgotten.)
- A delayed send is a JetStream message schedule (``Nats-Schedule: @at``, to the
  millisecond, rounded up, so it is never early) that publishes the message to its
  run's subject when due; the schedule carries the key's ``Nats-Msg-Id``. (Whole
  seconds made a timer up to a second late: issue 15's sleepers benchmark.)
- An undelayed, unkeyed orchestrator message for a run whose delivery is in
  flight is folded into that delivery (``leases.RunLeases.coalesce``) instead of
  published, as the local World does at send.
- ``consume`` creates (or updates) the deployment's durable pull consumers and
  starts a ``consumer.NatsConsumer``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from treadle import errors, redaction
from treadle.world import contract, ids, messages, queuerules, records, routing
from treadle.worlds.nats import deadletters, jetstream, leases, names
from treadle.worlds.nats.consumer import NatsConsumer
from treadle.worlds.nats.liveness import WorkerLiveness, ensure_worker_bucket
from treadle.worlds.transport import NatsTransport, PlaintextRefused, nats_refusal

log = logging.getLogger("treadle.worlds.nats")

PUBLISH_TIMEOUT_SECONDS: Final = 10.0


def _not_nats_tls_noise(record: logging.LogRecord) -> bool:
    """nats-py's protocol returns True from ``eof_received``, which asyncio warns about on
    every TLS connection that ends; a harmless line that would garble the CLI's one error."""
    return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_not_nats_tls_noise)


@dataclass(frozen=True, slots=True)
class _Prepared:
    message_id: str
    subject: str
    payload: bytes
    headers: dict[str, str]
    # The run lease to fold this send into when its run is held (undelayed, unkeyed wakes).
    coalesce_key: str | None


class NatsQueue:
    """Sends, and starts consumers; construct with ``await NatsQueue.connect(...)``."""

    def __init__(
        self,
        nc: Client,
        ns: names.Names,
        tuning: contract.QueueTuning,
        run_leases: leases.RunLeases,
        *,
        replicas: int = 1,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.names = ns
        self.tuning = tuning
        self.leases = run_leases
        self.consumers: list[NatsConsumer] = []
        self.replicas = replicas
        # This process as a worker (``liveness``): from its first consume to its last close.
        self.liveness: WorkerLiveness | None = None
        self._liveness_refused = False

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        deployment_id: str = "default",
        tuning: contract.QueueTuning | None = None,
        stream: str | None = None,
        subject_prefix: str | None = None,
        replicas: int | None = None,
        connect_timeout: float = 10.0,
        connect_options: Mapping[str, Any] | None = None,
        transport: NatsTransport | None = None,
    ) -> NatsQueue:
        """Connect, check the server, and create the stream and lease bucket if missing.

        ``stream`` and ``subject_prefix`` default to ``TREADLE`` and ``treadle``; a
        second queue on one server needs both of its own. Once connected the client
        reconnects for ever; the first connection must be made within
        ``connect_timeout`` seconds, else ``StorageUnavailable``. ``transport`` carries
        credentials and TLS (``worlds.transport``); a server refusing them (a wrong
        password, an untrusted certificate, TLS it requires) is ``WorldAuthFailed`` at
        once, not after the timeout. ``connect_options`` go to nats-py's
        ``Client.connect`` as they are.
        """
        ns = names.Names(
            stream=names.validate_name(stream or names.DEFAULT_STREAM, "stream name"),
            prefix=names.validate_name(
                subject_prefix or names.DEFAULT_SUBJECT_PREFIX, "subject prefix"
            ),
            deployment=deployment_id,
        )
        tuning = tuning or contract.QueueTuning()
        transport = transport or NatsTransport()
        nc = Client()
        options: dict[str, Any] = {
            "name": f"treadle-{names.token(deployment_id)}",
            "max_reconnect_attempts": -1,
            **transport.connect_options(
                require_tls=_wants_tls(url),
                # nats-py upgrades to TLS exactly when the server's INFO requires it.
                tls_in_effect=lambda: bool(nc._server_info.get("tls_required")),
            ),
        }
        options.update(connect_options or {})
        # One URL per server (a comma list crashed nats-py), each checked first: a
        # password with an unencoded '/' made nats-py fail with a prefix of it.
        servers = redaction.split_servers(url)
        for server in servers or [url]:
            redaction.require_readable(server, "the NATS URL")
        refused = await _connect(nc, url, servers or [url], options, transport, connect_timeout)
        if refused is not None:
            raise refused from None
        try:
            jetstream.check_server_version(_server_version(nc))
            # ``replicas`` None keeps an existing stream's and bucket's count (jetstream).
            explicit = replicas is not None
            replicas = await jetstream.ensure_stream(nc, ns, replicas=replicas)
            kv = await jetstream.ensure_lease_bucket(
                nc.jetstream(), ns, replicas=replicas, nc=nc if explicit else None
            )
        except BaseException:
            await nc.close()
            raise
        return cls(nc, ns, tuning, leases.RunLeases(kv, tuning.lease_seconds), replicas=replicas)

    async def send(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        *,
        key: str | None = None,
        delay_seconds: float = 0.0,
    ) -> messages.SendResult:
        (result,) = await self.send_batch([messages.Send(message, key, delay_seconds)])
        return result

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        prepared = [self._prepare(send) for send in sends]
        results: list[messages.SendResult | None] = []
        pending: list[tuple[int, asyncio.Future[Any]]] = []
        try:
            for index, item in enumerate(prepared):
                if item.coalesce_key is not None and await self._coalesce(item.coalesce_key):
                    # Its run's delivery is in flight: the holder re-runs for it before it acks.
                    results.append(messages.SendResult(message_id=item.message_id))
                    continue
                results.append(None)
                future = await self.js.publish_async(
                    item.subject, item.payload, headers=item.headers
                )
                pending.append((index, future))
            for index, future in pending:
                ack = await asyncio.wait_for(future, PUBLISH_TIMEOUT_SECONDS)
                results[index] = messages.SendResult(
                    message_id=prepared[index].message_id, deduplicated=bool(ack.duplicate)
                )
        except (TimeoutError, nats.errors.Error) as exc:
            for _, future in pending:
                future.cancel()
            raise errors.StorageUnavailable(
                f"publishing to stream {self.names.stream}: {exc}"
            ) from exc
        return [result for result in results if result is not None]

    async def _coalesce(self, lease_key: str) -> bool:
        """Fold into the run's holder at the send; when the leases cannot be read, publish
        (the delivery coalesces it instead)."""
        try:
            return await self.leases.coalesce(lease_key)
        except (TimeoutError, nats.errors.Error, errors.StorageUnavailable) as exc:
            log.warning("run lease %s unreadable at send (%s); publishing instead", lease_key, exc)
            return False

    def _prepare(self, send: messages.Send) -> _Prepared:
        message, key, delay = send.message, send.key, send.delay_seconds
        run_id = message.run_id
        payload = queuerules.encode_send(send).encode()
        message_id = ids.new_message_id() if key is None else names.keyed_message_id(key)
        target = self.names.subject(message.kind, message.deployment_id, run_id)
        headers = {names.MESSAGE_ID: message_id}
        if key is not None:
            headers[names.KEY] = names.encode_key(key)
            headers[names.NATS_MSG_ID] = names.dedupe_id(key)
        coalesce_key = None
        if delay > 0:
            headers[names.NATS_SCHEDULE] = f"@at {_due_at(delay, run_id)}"
            headers[names.NATS_SCHEDULE_TARGET] = target
            subject = self.names.schedule_subject(message.deployment_id, message_id)
        else:
            subject = target
            gate = routing.gated_run_id(message, None)
            if gate is not None and key is None:
                coalesce_key = self.names.lease_key(gate, message.deployment_id)
        return _Prepared(message_id, subject, payload, headers, coalesce_key)

    async def consume(
        self,
        handlers: Mapping[messages.MessageKind, contract.Handler],
        *,
        concurrency: int = 32,
    ) -> contract.Consumer:
        consumer = NatsConsumer(self, dict(handlers), concurrency)
        durable = {
            kind: await jetstream.ensure_consumer(
                self.nc, self.names, kind, lease_seconds=self.tuning.lease_seconds
            )
            for kind in handlers
        }
        await self._start_liveness()
        await consumer.start(durable)
        self.consumers.append(consumer)
        return consumer

    async def dead_letters(self, *, limit: int = 100) -> list[records.DeadLetter]:
        return await deadletters.listing(self, limit)

    async def requeue_dead_letter(self, message_id: str) -> None:
        await deadletters.requeue(self, message_id)

    async def drop_dead_letter(self, message_id: str) -> None:
        await deadletters.drop(self, message_id)

    async def backlog(self, kind: messages.MessageKind, deployment_id: str) -> int:
        """``kind`` messages of ``deployment_id`` not yet finished (``contract.Queue.backlog``):
        its durable consumer's waiting plus in flight, 0 before it first consumed."""
        name = self.names.consumer(kind, deployment_id)
        return await jetstream.consumer_backlog(self.nc, self.names, name)

    pending = backlog  # the name tests/nats/test_nats_backlog.py knows

    async def _start_liveness(self) -> None:
        """Become a worker: take this identity's heartbeat entry (restart in place releases
        what a previous incarnation held) and watch the others (survivor takeover)."""
        if self.liveness is not None or self._liveness_refused:
            return
        live: WorkerLiveness | None = None
        try:
            kv = await ensure_worker_bucket(self.js, self.names, replicas=self.replicas)
            live = WorkerLiveness(
                self.nc,
                kv,
                self.names,
                self.leases,
                worker_id=self.tuning.worker_id,
                liveness_seconds=self.tuning.liveness_seconds,
                lease_seconds=self.tuning.lease_seconds,
            )
            await live.start()
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            # A user whose permissions predate the worker bucket (docs/security-transport.md):
            # serve on, recovering dead workers' deliveries by the lease only.
            self._liveness_refused = True
            if live is not None:
                await live.close()  # whatever it started (its beats) stops
            log.error(
                "worker bucket %s unusable (%s): this worker runs without liveness; a dead "
                "worker's deliveries come back after TREADLE_QUEUE_LEASE_SECONDS, not at once "
                "(grant the worker bucket's subjects: docs/security-transport.md)",
                self.names.worker_bucket,
                exc,
            )
            return
        self.liveness = live

    async def forget(self, consumer: NatsConsumer) -> None:
        """A consumer closed; after the last one this process is no longer a worker."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if not self.consumers and self.liveness is not None:
            live, self.liveness = self.liveness, None
            await live.close()

    async def close(self) -> None:
        """Close every consumer (running deliveries are cut off and redelivered), then the
        connection."""
        for consumer in list(self.consumers):
            await consumer.close(grace_seconds=0)
        if self.liveness is not None:
            live, self.liveness = self.liveness, None
            await live.close()
        if not self.nc.is_closed:
            try:
                await self.nc.flush()
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("nats queue: flush before close failed: %s", exc)
            await self.nc.close()


def _due_at(delay: float, run_id: str) -> str:
    """The ``@at`` time of a schedule: milliseconds, rounded up, so never early."""
    try:
        due = datetime.fromtimestamp(math.ceil((time.time() + delay) * 1000) / 1000, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise errors.WorldContractError(
            f"run {run_id}: a delay of {delay} s is past any date the queue can schedule",
            run_id=run_id,
        ) from exc
    return due.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


async def _connect(
    nc: Client,
    url: str,
    servers: list[str],
    options: dict[str, Any],
    transport: NatsTransport,
    connect_timeout: float,
) -> errors.WorldAuthFailed | None:
    """Make the first connection; a refusal ends the attempt at once (nats-py would
    retry it for ever). Later connection errors are only logged."""
    where = f"cannot connect to NATS at {_redact(url)}"
    refused: asyncio.Future[errors.WorldAuthFailed] = asyncio.get_running_loop().create_future()
    connecting = True
    fallback = options.pop("error_cb", _log_error)

    last_error: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        if not connecting:
            await fallback(exc)
            return
        # While the first connection is tried, an error is either a refusal (the end) or
        # one more failed try: kept for the timeout's message, not logged as a warning.
        refusal = nats_refusal(exc, transport, where)
        if refusal is not None and not refused.done():
            refused.set_result(refusal)
        last_error[:] = [exc]
        log.debug("nats connection attempt to %s failed: %s", _redact(url), exc)

    attempt: asyncio.Future[None] = asyncio.ensure_future(
        nc.connect(servers, **options, error_cb=on_error)
    )
    waiting: set[asyncio.Future[Any]] = {attempt, refused}
    try:
        done, _ = await asyncio.wait(
            waiting, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if attempt in done:
            attempt.result()
            return await _refuse_plaintext(nc, url, transport, where)
        attempt.cancel()
        await asyncio.gather(attempt, return_exceptions=True)
        await nc.close()
        if refused.done():
            return refused.result()
        raise TimeoutError
    except (TimeoutError, OSError, nats.errors.Error, PlaintextRefused) as exc:
        await nc.close()
        refusal = nats_refusal(exc, transport, where)
        if refusal is not None:
            return refusal
        reason = exc if str(exc) else f"no connection within {connect_timeout} s"
        if last_error and not str(exc):
            reason = f"{reason} (last: {last_error[0]})"
        raise errors.StorageUnavailable(f"cannot reach NATS at {_redact(url)}: {reason}") from None
    finally:
        connecting = False
        if not attempt.done():
            attempt.cancel()


async def _refuse_plaintext(
    nc: Client, url: str, transport: NatsTransport, where: str
) -> errors.WorldAuthFailed | None:
    """nats-py upgrades to TLS only when the server's INFO asks for it, so a server (or a
    man in the middle) that does not ask gets a plaintext connection even from a client
    configured for TLS: refuse it. (A password or token is never sent over it: the
    transport's guard refuses at CONNECT; this catches credential-less connections.)"""
    if not (transport.uses_tls or _wants_tls(url)) or nc._server_info.get("tls_required"):
        return None
    await nc.close()
    return errors.WorldAuthFailed(
        "NATS",
        where,
        "the server did not offer TLS, and treadle is configured for it",
        "turn TLS on in the server, or unset TREADLE_NATS_TLS_* and use a nats:// URL",
    )


def _wants_tls(url: str) -> bool:
    return any(one.strip().lower().startswith("tls://") for one in url.split(","))


def _redact(url: str) -> str:
    """The servers a URL names, without credentials: fit for an error message."""
    return redaction.redact_url(",".join(redaction.split_servers(url)))


def _server_version(nc: Client) -> str:
    version = nc.connected_server_version
    try:
        return f"{version.major}.{version.minor}.{version.patch}"
    except ValueError:
        return str(nc._server_info.get("version", ""))


async def _log_error(exc: Exception) -> None:
    log.warning("nats connection: %s", exc)
