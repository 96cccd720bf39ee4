"""A worker whose metrics port is taken keeps serving runs (found by the k8s suite: the
test cluster's process kubelet runs every worker pod on one host network, where the
operator's TREADLE_WORKER_METRICS_PORT=9464 is taken by the first pod)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from treadle.metrics import server as metricsserver
from treadle.worlds.local import LocalWorld


async def test_a_taken_metrics_port_is_an_error_log_not_a_dead_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    world = await LocalWorld(tmp_path / "world").open()
    try:
        with caplog.at_level(logging.ERROR, logger="treadle"):
            server = await metricsserver.start_for_worker(
                world, deployment_id="d1", port=taken, host="127.0.0.1"
            )
        assert server is None
        assert any(
            r.levelno == logging.ERROR and f"127.0.0.1:{taken}" in r.getMessage()
            for r in caplog.records
        )
        free = await metricsserver.start_for_worker(
            world, deployment_id="d1", port=0, host="127.0.0.1"
        )
        assert free is not None and free.port != taken
        await free.close()
    finally:
        holder.close()
        await world.close()
