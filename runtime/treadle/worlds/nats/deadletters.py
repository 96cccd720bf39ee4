"""The NATS queue's dead letters: poison messages moved to a subject no consumer reads.

``bury`` (called by ``consumer.NatsConsumer``) publishes a message whose
handler raised on ``max_failed_deliveries`` deliveries, or that is not a
treadle message at all, to ``<prefix>.<deployment>.dead.<message_id>`` in the
same stream, with why and where it died in ``Treadle-Dead-*`` headers, then
acks the original. The stream's duplicate window (``Nats-Msg-Id`` of the
original's stream sequence) keeps a burial repeated after a crash to one copy.
No consumer filters the dead subjects, so the workqueue stream keeps them until
``requeue`` (published again to the subject it died on, its counts from zero)
or ``drop``. ``listing`` reads them with the stream's message-get API, so
listing takes nothing from anyone.
"""

from __future__ import annotations

import base64
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from nats.aio.msg import Msg

from treadle import clock, errors
from treadle.world import records
from treadle.worlds.nats import jetstream, names

if TYPE_CHECKING:
    from treadle.worlds.nats.queue import NatsQueue

log = logging.getLogger("treadle.worlds.nats")

MAX_ERROR_CHARS: Final = 1000
ACK_TIMEOUT_SECONDS: Final = 5.0
# JSNoMessageFoundErr: the message-get API found nothing at or after the sequence.
_NO_MESSAGE_FOUND: Final = 10037


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_ERROR_CHARS]


async def bury(
    queue: NatsQueue,
    msg: Msg,
    *,
    message_id: str,
    kind: str,
    run_id: str | None,
    deliveries: int,
    error: str,
) -> None:
    """Move ``msg`` to the dead letters: publish the copy, then ack the original."""
    headers = {
        names.MESSAGE_ID: message_id,
        names.DEAD_KIND: kind,
        names.DEAD_SUBJECT: msg.subject,
        names.DEAD_DELIVERIES: str(deliveries),
        names.DEAD_ERROR: _one_line(error) or "-",
        names.DEAD_AT: clock.utcnow().isoformat(),
        names.NATS_MSG_ID: f"dead-{msg.metadata.sequence.stream}",
    }
    if run_id:
        headers[names.DEAD_RUN_ID] = run_id
    key = (msg.headers or {}).get(names.KEY)
    if key is not None:
        headers[names.KEY] = key
    await queue.js.publish(queue.names.dead_subject(message_id), msg.data, headers=headers)
    await msg.ack_sync(timeout=ACK_TIMEOUT_SECONDS)
    log.error(
        "run %s: message %s moved to the dead letters after %d deliveries: %s",
        run_id,
        message_id,
        deliveries,
        _one_line(error),
    )


def _headers(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    lines = base64.b64decode(raw).decode(errors="replace").split("\r\n")[1:]
    out: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


async def _next(queue: NatsQueue, after: int) -> dict[str, Any] | None:
    """The next dead letter at a stream sequence above ``after``, raw; None at the end."""
    subject = f"$JS.API.STREAM.MSG.GET.{queue.names.stream}"
    try:
        reply = await jetstream.api_request(
            queue.nc, subject, {"seq": after + 1, "next_by_subj": queue.names.dead_filter}
        )
    except jetstream.ApiError as exc:
        if exc.err_code == _NO_MESSAGE_FOUND:
            return None
        raise errors.StorageUnavailable(f"reading the dead letters: {exc}") from exc
    message: dict[str, Any] = reply["message"]
    return message


def _record(raw: dict[str, Any]) -> records.DeadLetter:
    headers = _headers(raw.get("hdrs"))
    try:
        dead_at = datetime.fromisoformat(headers[names.DEAD_AT])
    except (KeyError, ValueError):
        dead_at = datetime.fromisoformat(str(raw["time"])[:19] + "+00:00")
    return records.DeadLetter(
        message_id=headers.get(names.MESSAGE_ID, f"seq-{raw['seq']}"),
        kind=headers.get(names.DEAD_KIND, "unknown"),
        run_id=headers.get(names.DEAD_RUN_ID) or None,
        deliveries=int(headers.get(names.DEAD_DELIVERIES, "0") or 0),
        error=headers.get(names.DEAD_ERROR, ""),
        dead_at=dead_at.astimezone(UTC),
    )


async def listing(queue: NatsQueue, limit: int) -> list[records.DeadLetter]:
    out: list[records.DeadLetter] = []
    after = 0
    while len(out) < limit and (raw := await _next(queue, after)) is not None:
        out.append(_record(raw))
        after = int(raw["seq"])
    return out


async def _find(queue: NatsQueue, message_id: str) -> dict[str, Any]:
    after = 0
    while (raw := await _next(queue, after)) is not None:
        if _headers(raw.get("hdrs")).get(names.MESSAGE_ID, f"seq-{raw['seq']}") == message_id:
            return raw
        after = int(raw["seq"])
    raise errors.DeadLetterNotFound(message_id)


async def _delete(queue: NatsQueue, sequence: int) -> None:
    subject = f"$JS.API.STREAM.MSG.DELETE.{queue.names.stream}"
    try:
        await jetstream.api_request(queue.nc, subject, {"seq": sequence})
    except jetstream.ApiError as exc:
        raise errors.StorageUnavailable(f"deleting a dead letter: {exc}") from exc


async def requeue(queue: NatsQueue, message_id: str) -> None:
    """Publish the dead letter again to the subject it died on, counts from zero."""
    raw = await _find(queue, message_id)
    headers = _headers(raw.get("hdrs"))
    target = headers.get(names.DEAD_SUBJECT)
    if not target:
        raise errors.WorldContractError(f"dead letter {message_id} does not say where it died")
    fresh = {names.MESSAGE_ID: headers.get(names.MESSAGE_ID, message_id)}
    if names.KEY in headers:
        fresh[names.KEY] = headers[names.KEY]
    data = base64.b64decode(raw.get("data") or "")
    await queue.js.publish(target, data, headers=fresh)
    await _delete(queue, int(raw["seq"]))


async def drop(queue: NatsQueue, message_id: str) -> None:
    raw = await _find(queue, message_id)
    await _delete(queue, int(raw["seq"]))
