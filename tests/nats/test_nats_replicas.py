"""``TREADLE_NATS_STREAM_REPLICAS`` (issue 15 item 6; docs/scaling.md): the queue stream
and its run lease bucket are created with the setting's replica count, an existing one
with another count is updated in place with a warning, and a count the server cannot
serve is a clear ``StorageUnavailable`` naming the setting. On one server and on a
real three-server JetStream cluster.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from nats.aio.client import Client

from treadle import errors, settings
from treadle.worlds.nats import NatsQueue

from . import natscluster, natsserver
from .conftest import NatsHarness, NatsServer


async def _api(url: str, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    nc = Client()
    await nc.connect(url)
    try:
        reply = await nc.request(subject, json.dumps(body or {}).encode(), timeout=10)
    finally:
        await nc.close()
    response: dict[str, Any] = json.loads(reply.data)
    return response


async def _replicas(url: str, stream: str) -> int:
    info = await _api(url, f"$JS.API.STREAM.INFO.{stream}")
    assert "error" not in info, info
    return int(info["config"]["num_replicas"])


async def _connect(harness: NatsHarness, url: str, replicas: int | None) -> NatsQueue:
    return await NatsQueue.connect(
        url, deployment_id="replicas", stream=harness.stream, subject_prefix=harness.prefix,
        replicas=replicas,
    )  # fmt: skip


def test_the_setting_defaults_to_one_and_refuses_zero() -> None:
    """``open_world`` passes the count on only where it is set (``model_fields_set``)."""
    assert settings.load({}).TREADLE_NATS_STREAM_REPLICAS == 1
    assert "TREADLE_NATS_STREAM_REPLICAS" not in settings.load({}).model_fields_set
    chosen = settings.load({"TREADLE_NATS_STREAM_REPLICAS": "1"})
    assert "TREADLE_NATS_STREAM_REPLICAS" in chosen.model_fields_set
    assert settings.load({"TREADLE_NATS_STREAM_REPLICAS": "3"}).TREADLE_NATS_STREAM_REPLICAS == 3
    with pytest.raises(errors.SettingsError, match="TREADLE_NATS_STREAM_REPLICAS='0'"):
        settings.load({"TREADLE_NATS_STREAM_REPLICAS": "0"})


async def test_one_server_gets_a_one_replica_stream_and_bucket(
    harness: NatsHarness, nats_server: NatsServer
) -> None:
    queue = await _connect(harness, nats_server.url, 1)
    await queue.close()
    assert await _replicas(nats_server.url, harness.stream) == 1
    assert await _replicas(nats_server.url, f"KV_{queue.names.lease_bucket}") == 1


async def test_more_replicas_than_one_server_serves_is_a_clear_error(
    harness: NatsHarness, nats_server: NatsServer
) -> None:
    """Creating the stream, and updating an existing one-replica stream, both refuse."""
    with pytest.raises(errors.StorageUnavailable, match="TREADLE_NATS_STREAM_REPLICAS") as new:
        await _connect(harness, nats_server.url, 3)
    assert f"stream {harness.stream} cannot have 3 replica(s)" in str(new.value)
    queue = await _connect(harness, nats_server.url, 1)
    await queue.close()
    with pytest.raises(errors.StorageUnavailable, match="at most the JetStream cluster's size"):
        await _connect(harness, nats_server.url, 3)
    assert await _replicas(nats_server.url, harness.stream) == 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[natscluster.Cluster]:
    try:
        running = natscluster.start(tmp_path_factory.mktemp("nats-cluster"))
    except natsserver.ServerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def cluster_url(cluster: natscluster.Cluster) -> str:
    await natscluster.wait_for_jetstream(cluster.url)
    return cluster.url


async def test_a_cluster_stream_is_created_with_the_setting_and_updated_when_it_changes(
    cluster_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Replicas 3 on a three-server cluster; then an existing stream and bucket made with 1
    replica are brought to 3 in place (a warning names both counts); a process without
    the setting keeps them at 3, silently; set to 1, they go back to 1."""
    created = NatsHarness(cluster_url)
    queue = await _connect(created, cluster_url, 3)
    await queue.close()
    assert await _replicas(cluster_url, created.stream) == 3
    assert await _replicas(cluster_url, f"KV_{queue.names.lease_bucket}") == 3

    grown = NatsHarness(cluster_url)
    queue = await _connect(grown, cluster_url, 1)
    await queue.close()
    assert await _replicas(cluster_url, grown.stream) == 1
    with caplog.at_level(logging.WARNING, logger="treadle.worlds.nats"):
        queue = await _connect(grown, cluster_url, 3)
    sent = await queue.send_batch([])  # the reopened queue works
    await queue.close()
    assert sent == []
    assert await _replicas(cluster_url, grown.stream) == 3
    assert await _replicas(cluster_url, f"KV_{queue.names.lease_bucket}") == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        f"stream {grown.stream} has 1 replica(s), TREADLE_NATS_STREAM_REPLICAS=3: "
        "updating it in place" in warnings
    )
    assert any(w.startswith(f"stream KV_{queue.names.lease_bucket} has 1") for w in warnings)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treadle.worlds.nats"):
        queue = await _connect(grown, cluster_url, None)  # the setting unset: kept as it is
    await queue.close()
    assert await _replicas(cluster_url, grown.stream) == 3
    assert await _replicas(cluster_url, f"KV_{queue.names.lease_bucket}") == 3
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    queue = await _connect(grown, cluster_url, 1)
    await queue.close()
    assert await _replicas(cluster_url, grown.stream) == 1


async def test_without_the_setting_a_new_stream_gets_one_replica(cluster_url: str) -> None:
    harness = NatsHarness(cluster_url)
    queue = await _connect(harness, cluster_url, None)
    await queue.close()
    assert await _replicas(cluster_url, harness.stream) == 1
    assert await _replicas(cluster_url, f"KV_{queue.names.lease_bucket}") == 1


async def test_more_replicas_than_the_cluster_has_is_a_clear_error(cluster_url: str) -> None:
    harness = NatsHarness(cluster_url)
    with pytest.raises(errors.StorageUnavailable, match="TREADLE_NATS_STREAM_REPLICAS"):
        await _connect(harness, cluster_url, 5)
