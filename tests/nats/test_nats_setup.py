"""Opening the NATS queue: the server check, the stream it creates or widens, its names.

DESIGN.md 3.3 ("nats queue"): one workqueue stream with a 24 h duplicate window
and message schedules (nats-server 2.12 or later), created idempotently by every
worker at start; an older server or a foreign stream is refused with a clear error.
"""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client

from treadle import errors
from treadle.world import ids
from treadle.world.conformance.queue import FAST, Recorder, step_message
from treadle.worlds.nats import NatsQueue, jetstream, names

from .conftest import NatsHarness, NatsServer


@pytest.mark.parametrize("version", ["2.11.9", "2.10.22", "2.9.0", "1.4.1", "v2.11.0-RC.1"])
def test_a_server_older_than_2_12_is_refused_with_a_clear_error(version: str) -> None:
    """A server without message schedules is refused, naming its version and the minimum."""
    with pytest.raises(errors.StorageUnavailable, match=r"too old.*2\.12\.0 or later") as caught:
        jetstream.check_server_version(version)
    assert version in str(caught.value)


@pytest.mark.parametrize("version", ["2.12.0", "2.12.3-beta.1", "2.15.1", "3.0.0"])
def test_a_server_from_2_12_on_is_accepted(version: str) -> None:
    jetstream.check_server_version(version)


def test_an_unreadable_server_version_is_refused() -> None:
    with pytest.raises(errors.StorageUnavailable, match="unreadable version"):
        jetstream.check_server_version("nightly")


async def test_no_server_at_the_url_is_storage_unavailable() -> None:
    """The first connection must be made in time; then the client reconnects for ever."""
    with pytest.raises(errors.StorageUnavailable, match="cannot reach NATS"):
        await NatsQueue.connect("nats://127.0.0.1:1", connect_timeout=0.5)


async def _raw(server: NatsServer, subject: str, body: dict[str, object]) -> dict[str, object]:
    nc = Client()
    await nc.connect(server.url)
    try:
        reply = await nc.request(subject, json.dumps(body).encode(), timeout=5)
    finally:
        await nc.close()
    response: dict[str, object] = json.loads(reply.data)
    return response


async def test_an_existing_stream_is_widened_to_what_the_queue_needs(
    harness: NatsHarness, nats_server: NatsServer
) -> None:
    """A stream made elsewhere gains the queue's subjects, the 24 h window and schedules."""
    await _raw(
        nats_server,
        f"$JS.API.STREAM.CREATE.{harness.stream}",
        {"name": harness.stream, "subjects": [f"{harness.prefix}-other.>"],
         "retention": "workqueue", "storage": "file", "duplicate_window": 120_000_000_000},
    )  # fmt: skip
    queue = await harness.connect(FAST)
    try:
        recorder = Recorder()
        consumer = await queue.consume({"step": recorder})
        sent = await queue.send(step_message(), key="k", delay_seconds=0.1)
        assert (await recorder.next()).meta.message_id == sent.message_id
        await consumer.close(grace_seconds=2)
    finally:
        await queue.close()
    info = await _raw(nats_server, f"$JS.API.STREAM.INFO.{harness.stream}", {})
    config = info["config"]
    assert isinstance(config, dict)
    assert config["allow_msg_schedules"] is True
    assert config["duplicate_window"] == 24 * 3600 * 1_000_000_000
    assert set(config["subjects"]) == {f"{harness.prefix}-other.>", f"{harness.prefix}.>"}


async def test_a_stream_that_is_not_a_work_queue_is_refused(
    harness: NatsHarness, nats_server: NatsServer
) -> None:
    await _raw(
        nats_server,
        f"$JS.API.STREAM.CREATE.{harness.stream}",
        {"name": harness.stream, "subjects": [f"{harness.prefix}.>"], "retention": "limits"},
    )
    with pytest.raises(errors.StorageUnavailable, match="workqueue"):
        await harness.connect(FAST)


async def test_opening_again_reuses_the_stream_consumers_and_leases(harness: NatsHarness) -> None:
    """Every worker runs the same idempotent setup; a second one shares the first's queue."""
    first = await harness.connect(FAST)
    await first.send(step_message(step_id="before"))
    await (await first.consume({"step": Recorder()})).close(grace_seconds=0)
    await first.close()
    second = await harness.connect(FAST)
    try:
        recorder = Recorder()
        consumer = await second.consume({"step": recorder})
        assert (await recorder.next()).message.run_id
        await consumer.close(grace_seconds=2)
    finally:
        await second.close()


def test_a_name_that_is_not_a_subject_token_is_made_one() -> None:
    """Deployment and run ids become one safe token each, and never the same one."""
    assert names.token("default") == "default"
    assert names.token(ids.new_run_id()).startswith("wrun_")
    odd = ["app.v2", "app v2", "app*", "app>", "app-v2", "é"]
    tokens = [names.token(value) for value in odd]
    assert len(set(tokens)) == len(odd)
    for token in tokens:
        assert names.validate_name(token, "token") == token


def test_a_keyed_message_id_is_derived_from_its_key() -> None:
    assert names.keyed_message_id("k") == names.keyed_message_id("k")
    assert names.keyed_message_id("k") != names.keyed_message_id("k2")
    assert names.keyed_message_id("k").startswith(ids.MESSAGE_PREFIX)
    assert names.decode_key(names.encode_key("a key\r\nwith: anything")) == (
        "a key\r\nwith: anything"
    )
