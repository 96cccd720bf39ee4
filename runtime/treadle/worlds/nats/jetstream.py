"""Opening the JetStream side: the server check, the stream, the consumers, the lease bucket.

Called by ``queue.NatsQueue.connect`` (stream, bucket) and ``NatsQueue.consume``
(consumers). Everything is created idempotently, so every worker process runs
it at start: an existing stream is widened to what the queue needs (its
subjects, a 24 h duplicate window, message schedules), an existing consumer is
updated to the current lease. The stream and consumer configs go through the
raw JetStream API, since nats-py's ``StreamConfig`` may not carry
``allow_msg_schedules``.

Replicas (``TREADLE_NATS_STREAM_REPLICAS``, issue 15 item 6): where the setting is
set, an existing stream or lease bucket with another replica count is updated to
it in place, with a warning naming both counts (JetStream grows or shrinks a
stream's raft group online, so scaling a cluster up needs no manual edit); where
it is not set (a CLI, a client, the operator) a new stream gets one replica and an
existing one keeps its count. A count the server cannot serve (more than its
cluster's size, or above 1 on a server without clustering) is
``StorageUnavailable`` naming the setting.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from treadle import errors
from treadle.world import constants, messages
from treadle.worlds.nats import names

# Message schedules (``Nats-Schedule: @at``), used for delayed sends, came in 2.12.
MIN_SERVER_VERSION: Final = (2, 12, 0)
DUPLICATE_WINDOW_NS: Final = constants.QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS * 1_000_000
# A lease entry not renewed for this long is dead whatever it says; the bucket drops it.
LEASE_BUCKET_TTL_SECONDS: Final = 3600.0
API_TIMEOUT_SECONDS: Final = 5.0
_NS = 1_000_000_000
# JSStreamNameExistErr: "stream name already in use with a different configuration".
_STREAM_NAME_EXISTS = 10058
# JSStreamReplicasNotSupportedErr / JSClusterNoPeersErr / JSInsufficientResourcesErr:
# a replica count the server or its cluster cannot serve.
_REPLICAS_REFUSED = frozenset({10074, 10005, 10023})
REPLICAS_SETTING: Final = "TREADLE_NATS_STREAM_REPLICAS"

log = logging.getLogger("treadle.worlds.nats")


# JetStream's error code for a consumer that does not exist.
CONSUMER_NOT_FOUND = 10014


class ApiError(Exception):
    """A JetStream API call answered with an error."""

    def __init__(self, subject: str, error: dict[str, Any]) -> None:
        self.err_code = int(error.get("err_code", 0))
        self.description = str(error.get("description", ""))
        super().__init__(f"{subject}: {self.description} (err_code {self.err_code})")


def check_server_version(version: str) -> None:
    """Refuse a server older than ``MIN_SERVER_VERSION`` with a clear error."""
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    if match is None:
        raise errors.StorageUnavailable(f"nats-server reported an unreadable version {version!r}")
    found = (int(match[1]), int(match[2]), int(match[3]))
    if found < MIN_SERVER_VERSION:
        need = ".".join(map(str, MIN_SERVER_VERSION))
        raise errors.StorageUnavailable(
            f"nats-server {version} is too old for treadle's queue: it needs {need} or later "
            "(JetStream message schedules carry delayed sends)"
        )


async def api_request(nc: Client, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    """One JetStream API request; an error answer raises ``ApiError``."""
    try:
        reply = await nc.request(subject, json.dumps(body).encode(), timeout=API_TIMEOUT_SECONDS)
    except nats.errors.NoRespondersError:
        raise errors.StorageUnavailable(
            f"JetStream does not answer {subject}: start nats-server with JetStream on (-js)"
        ) from None
    response: dict[str, Any] = json.loads(reply.data)
    error = response.get("error")
    if error:
        raise ApiError(subject, error)
    return response


async def ensure_stream(nc: Client, ns: names.Names, *, replicas: int | None) -> int:
    """Create the stream, or widen an existing one to what the queue needs; its replicas.

    ``replicas`` None (the setting not set) creates a stream of one replica and keeps an
    existing stream's count, so a process without the setting never moves it.
    """
    wanted: dict[str, Any] = {
        "name": ns.stream,
        "subjects": ns.stream_subjects,
        "retention": "workqueue",
        "storage": "file",
        "num_replicas": 1 if replicas is None else replicas,
        "discard": "old",
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "duplicate_window": DUPLICATE_WINDOW_NS,
        "allow_msg_schedules": True,
    }
    prefix = "$JS.API.STREAM"
    try:
        response = await api_request(nc, f"{prefix}.CREATE.{ns.stream}", wanted)
    except ApiError as exc:
        if exc.err_code in _REPLICAS_REFUSED:
            raise _replicas_refused(ns.stream, wanted["num_replicas"], exc) from exc
        if exc.err_code != _STREAM_NAME_EXISTS:
            raise errors.StorageUnavailable(f"cannot create stream {ns.stream}: {exc}") from exc
        info = await api_request(nc, f"{prefix}.INFO.{ns.stream}", {})
        config: dict[str, Any] = info["config"]
        if config.get("retention") != "workqueue":
            raise errors.StorageUnavailable(
                f"stream {ns.stream} exists with retention {config.get('retention')!r}; "
                "treadle's queue needs a workqueue stream of its own"
            ) from exc
        widened = dict(config)
        widened["subjects"] = sorted(set(config.get("subjects") or []) | set(ns.stream_subjects))
        widened["duplicate_window"] = max(
            int(config.get("duplicate_window", 0)), DUPLICATE_WINDOW_NS
        )
        widened["allow_msg_schedules"] = True
        if replicas is not None:
            widened["num_replicas"] = replicas
            _warn_replicas(ns.stream, config, replicas)
        response = info
        if widened != config:
            try:
                response = await api_request(nc, f"{prefix}.UPDATE.{ns.stream}", widened)
            except ApiError as update_exc:
                if update_exc.err_code in _REPLICAS_REFUSED:
                    count = int(widened.get("num_replicas") or 1)
                    raise _replicas_refused(ns.stream, count, update_exc) from update_exc
                raise errors.StorageUnavailable(
                    f"cannot update stream {ns.stream}: {update_exc}"
                ) from update_exc
    if not response["config"].get("allow_msg_schedules"):
        raise errors.StorageUnavailable(
            f"stream {ns.stream} does not allow message schedules; "
            "treadle's queue needs nats-server 2.12 or later"
        )
    return int(response["config"].get("num_replicas") or 1)


def _warn_replicas(stream: str, config: dict[str, Any], replicas: int) -> None:
    found = int(config.get("num_replicas") or 1)
    if found != replicas:
        log.warning(
            "stream %s has %d replica(s), %s=%d: updating it in place",
            stream, found, REPLICAS_SETTING, replicas,
        )  # fmt: skip


def _replicas_refused(stream: str, replicas: int, exc: ApiError) -> errors.StorageUnavailable:
    return errors.StorageUnavailable(
        f"stream {stream} cannot have {replicas} replica(s) on this NATS server: "
        f"{exc.description} (err_code {exc.err_code}); set {REPLICAS_SETTING} to at most "
        "the JetStream cluster's size (1 on a server without clustering)"
    )


async def _update_replicas(nc: Client, stream: str, replicas: int) -> None:
    """Bring an existing stream (the lease bucket's) to ``replicas``, with a warning."""
    info = await api_request(nc, f"$JS.API.STREAM.INFO.{stream}", {})
    config: dict[str, Any] = info["config"]
    if int(config.get("num_replicas") or 1) == replicas:
        return
    _warn_replicas(stream, config, replicas)
    try:
        await api_request(
            nc, f"$JS.API.STREAM.UPDATE.{stream}", {**config, "num_replicas": replicas}
        )
    except ApiError as exc:
        if exc.err_code in _REPLICAS_REFUSED:
            raise _replicas_refused(stream, replicas, exc) from exc
        raise errors.StorageUnavailable(f"cannot update stream {stream}: {exc}") from exc


async def ensure_consumer(
    nc: Client, ns: names.Names, kind: messages.MessageKind, *, lease_seconds: float
) -> str:
    """Create or update the deployment's durable pull consumer for ``kind``; its name."""
    name = ns.consumer(kind)
    config: dict[str, Any] = {
        "name": name,
        "durable_name": name,
        "filter_subject": ns.filter_subject(kind),
        "deliver_policy": "all",
        "ack_policy": "explicit",
        # The delivery lease: a delivery that sends no progress for this long is redelivered.
        "ack_wait": max(int(lease_seconds * _NS), 1_000_000),
        # Unbounded here: the consumer counts failed deliveries itself and moves a message
        # past TREADLE_QUEUE_MAX_FAILED_DELIVERIES to the dead letters (``deadletters``).
        "max_deliver": -1,
        # Messages backing off count as pending; never stop delivering for them.
        "max_ack_pending": -1,
        "replay_policy": "instant",
    }
    body = {"stream_name": ns.stream, "config": config, "action": ""}
    try:
        await api_request(nc, f"$JS.API.CONSUMER.CREATE.{ns.stream}.{name}", body)
    except ApiError as exc:
        raise errors.StorageUnavailable(f"cannot create consumer {name}: {exc}") from exc
    return name


async def consumer_backlog(nc: Client, ns: names.Names, name: str) -> int:
    """Messages a durable consumer has not finished: waiting plus in flight (0 if none)."""
    try:
        info = await api_request(nc, f"$JS.API.CONSUMER.INFO.{ns.stream}.{name}", {})
    except ApiError as exc:
        if exc.err_code == CONSUMER_NOT_FOUND:
            return 0
        raise errors.StorageUnavailable(f"cannot read consumer {name}: {exc}") from exc
    return int(info.get("num_pending", 0)) + int(info.get("num_ack_pending", 0))


async def ensure_lease_bucket(
    js: JetStreamContext, ns: names.Names, *, replicas: int, nc: Client | None = None
) -> KeyValue:
    """Create or bind the KV bucket holding the stream's run leases (``nc``: bring an
    existing bucket to ``replicas`` too)."""
    try:
        return await js.create_key_value(
            bucket=ns.lease_bucket,
            history=1,
            ttl=LEASE_BUCKET_TTL_SECONDS,
            storage=api.StorageType.FILE,
            replicas=replicas,
        )
    except nats.js.errors.APIError as exc:
        if exc.err_code in _REPLICAS_REFUSED:
            error = {"err_code": exc.err_code, "description": exc.description or ""}
            raise _replicas_refused(
                f"KV_{ns.lease_bucket}", replicas, ApiError("KV", error)
            ) from exc
        if exc.err_code != _STREAM_NAME_EXISTS:
            raise errors.StorageUnavailable(
                f"cannot create the run lease bucket {ns.lease_bucket}: {exc}"
            ) from exc
        if nc is not None:
            await _update_replicas(nc, f"KV_{ns.lease_bucket}", replicas)
        return await js.key_value(ns.lease_bucket)
