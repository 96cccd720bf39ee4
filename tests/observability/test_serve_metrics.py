"""``treadle serve``'s ``GET /metrics`` (issue 13 item 4) on the real app under uvicorn
(tests/serve's fixture): public by default with the World's open runs, behind the
tokens with ``TREADLE_SERVE_METRICS_AUTH=1``."""

from __future__ import annotations

import asyncio
import signal

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.cli.conftest import Cli, cli
from tests.cli.test_serve_cli import _url_of
from tests.serve.conftest import (
    StartServe,
    nats_server,
    pg_clones,
    pg_dsn,
    pg_server,
    start_serve,
)

from treadle import create_hook

__all__ = ["cli", "nats_server", "pg_clones", "pg_dsn", "pg_server", "start_serve"]


def _open_runs(text: str, status: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "treadle_open_runs" and sample.labels == {"status": status}:
                return sample.value
    raise AssertionError(f"no treadle_open_runs{{status={status!r}}} in:\n{text}")


async def test_serve_metrics_are_public_and_show_the_worlds_open_runs(
    start_serve: StartServe,
) -> None:
    served = await start_serve()

    @served.app.workflow
    async def parked() -> object:
        return await create_hook(token="obs-serve-park").payload()

    run = await served.app.start(parked)
    for _ in range(400):
        if (await run.get()).status == "running":
            break
        await asyncio.sleep(0.025)
    answer = await served.anonymous.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert _open_runs(answer.text, "running") >= 1
    assert "wrun_" not in answer.text
    await served.app.resume_hook("obs-serve-park", None)
    assert await run.result(timeout=20) is None


async def test_serve_metrics_ask_for_a_token_when_told_to(start_serve: StartServe) -> None:
    served = await start_serve(TREADLE_SERVE_METRICS_AUTH=True)
    refused = await served.anonymous.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"]
    assert (await served.reader.get("/metrics")).status_code == 200


def test_treadle_serve_counts_its_own_writes(cli: Cli) -> None:
    """The ``treadle serve`` process turns metrics on before it opens its World: a cancel
    made through the API is a ``run_cancelled`` write on its ``/metrics``."""
    run_id = cli("start", "flows.py:nap").stdout.strip()  # no worker: the run stays pending
    proc = cli.background("serve", "--port", "0", "--insecure-no-auth", "--log-level", "warning")
    url, _ = _url_of(proc)
    cancelled = httpx.post(f"{url}/api/runs/{run_id}/cancel", json={}, timeout=10)
    assert cancelled.status_code in (200, 202), cancelled.text
    text = httpx.get(f"{url}/metrics", timeout=10).text
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert 'treadle_world_writes_total{event_type="run_cancelled",in_band="false"} 1.0' in text
