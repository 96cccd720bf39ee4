"""Prometheus metrics (issue 13 item 4): what a worker's and serve's ``/metrics`` show
after real runs on the local World, scraped over real HTTP, and that no label carries a
run id."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families
from tests.cli.conftest import Cli, cli

from treadle import Workflows, errors, metrics, settings
from treadle.metrics import server as metricsserver
from treadle.orchestrator import steps
from treadle.orchestrator.runtime import Runtime
from treadle.telemetry import names
from treadle.world import events

__all__ = ["cli"]

# A step that fails its first attempt (the retry logs a line naming the run and step).
FLAKY = """
from pathlib import Path

from treadle import Workflows

app = Workflows()


@app.step
async def once() -> str:
    marker = Path("once.marker")
    if not marker.exists():
        marker.write_text("1")
        raise RuntimeError("first attempt fails")
    return "ok"


@app.workflow
async def flaky() -> str:
    return await once()
"""


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_workers_metrics_count_deliveries_retries_and_step_attempts_by_step(
    metrics_on: None, local_app: Callable[..., Workflows]
) -> None:
    """A fan-out of three background steps, one retried once, then a scrape of the
    worker's endpoint: deliveries by kind and result, the step's attempts by outcome and
    their durations, the redelivery, the open-runs and dead-letter gauges."""
    before = _samples(metrics.exposition().decode())
    app = local_app(WORKFLOW_MAX_INLINE_STEPS=0)
    tries: dict[int, int] = {}

    @app.step
    async def metered(i: int) -> int:
        tries[i] = tries.get(i, 0) + 1
        if i == 1 and tries[i] == 1:
            raise RuntimeError("once")
        return i

    @app.workflow
    async def fan() -> int:
        return sum(await asyncio.gather(*(metered(i) for i in range(3))))

    run = await app.start(fan)
    assert await run.result(timeout=30) == 3
    world = await app.world()
    server = await metricsserver.start_for_worker(
        world, deployment_id=app.settings.TREADLE_DEPLOYMENT_ID, port=0, host="127.0.0.1"
    )
    assert server is not None
    try:
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{server.port}/metrics")
            missing = await client.get(f"http://127.0.0.1:{server.port}/nothing")
    finally:
        await server.close()
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert missing.status_code == 404
    assert "wrun_" not in answer.text, "a run id in a label"
    after = _samples(answer.text)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("treadle_deliveries_total", kind="orchestrator", result="ack") >= 1
    assert grew("treadle_deliveries_total", kind="step", result="ack") == 3
    assert grew("treadle_deliveries_total", kind="step", result="redeliver") == 1
    assert grew("treadle_redeliveries_total", kind="step") == 1
    assert grew("treadle_step_attempts_total", step="metered", outcome="completed") == 3
    assert grew("treadle_step_attempts_total", step="metered", outcome="retry") == 1
    assert grew("treadle_step_duration_seconds_count", step="metered") == 4
    assert grew("treadle_world_writes_total", event_type="run_completed", in_band="true") == 1
    assert grew("treadle_sends_total", kind="step") >= 3
    # The local queue knows each message's due time: the lag of every first delivery.
    assert grew("treadle_queue_lag_seconds_count", kind="orchestrator") >= 1
    assert grew("treadle_queue_lag_seconds_count", kind="step") >= 3
    assert _value(after, "treadle_open_runs", status="running") == 0
    assert _value(after, "treadle_dead_letters") == 0
    assert ("treadle_queue_backlog", (("kind", "step"),)) in after


async def test_a_step_the_registry_lacks_is_labelled_unregistered(metrics_on: None) -> None:
    """A forged or stale log naming a step this worker does not have cannot grow the
    label set: its attempt is counted under ``unregistered``."""
    rt = Runtime(
        world=None,  # type: ignore[arg-type]
        workflows={},
        steps={},
        settings=settings.load({}),
        deployment_id="d",
    )
    before = _value(_samples(metrics.exposition().decode()), "treadle_step_attempts_total",
                    step="unregistered", outcome="failed")  # fmt: skip
    outcome = await steps.execute(
        rt,
        run_id="wrun_x",
        workflow_name="w",
        step_id="s1",
        step_name="no-such-step-" + "x" * 20,
        input=None,
        attempt=1,
        max_retries=0,
        started_at=datetime.now(UTC),
    )
    assert outcome.kind == "failed"
    text = metrics.exposition().decode()
    assert "no-such-step" not in text
    after = _value(
        _samples(text), "treadle_step_attempts_total", step="unregistered", outcome="failed"
    )
    assert after == before + 1


def test_treadle_worker_serves_metrics_json_logs_and_spans(cli: Cli) -> None:
    """``treadle worker --metrics-port`` with ``TREADLE_LOG_FORMAT=json`` and
    ``OTEL_TRACES_EXPORTER=console``: the endpoint answers while the worker runs a run,
    every log line on stderr is one JSON object (with the run, step and trace), and the
    spans are exported."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (cli.cwd / "flaky.py").write_text(FLAKY)
    cli.env["TREADLE_LOG_FORMAT"] = "json"
    cli.env["OTEL_TRACES_EXPORTER"] = "console"  # spans on stderr, one JSON object a line
    run_id = cli("start", "flaky.py:flaky").stdout.strip()
    worker = cli.background(
        "worker", "flaky.py", "--grace", "1", "--metrics-port", str(port),
        "--metrics-host", "127.0.0.1",
    )  # fmt: skip
    cli.wait_for_run(run_id, lambda r: r["status"] == "completed")
    deadline = time.monotonic() + 20
    while True:
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            if "treadle_deliveries_total" in answer.text and 'kind="orchestrator"' in answer.text:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the worker's /metrics never answered"
        time.sleep(0.1)
    worker.terminate()
    stdout, stderr = worker.communicate(timeout=20)
    assert worker.returncode == 0, stderr
    objects = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    records = [o for o in objects if "logger" in o]
    exported = [o for o in objects if "context" in o]
    assert records, stderr
    assert {"time", "level", "logger", "message"} <= set(records[0])
    retried = [r for r in records if "retrying" in r["message"]]
    assert retried, records
    assert (retried[0]["run_id"], retried[0]["step"]) == (run_id, "once"), retried[0]
    assert retried[0]["logger"] == "treadle.orchestrator.steps"
    # Logged inside the step's attempt span: the line names its trace and span, which the
    # console exporter printed (configure() from OTEL_TRACES_EXPORTER).
    attempts = [o for o in exported if o["name"] == "step.execute"]
    assert {o["context"]["span_id"] for o in attempts} >= {f"0x{retried[0]['span_id']}"}
    assert {o["context"]["trace_id"] for o in exported} == {f"0x{retried[0]['trace_id']}"}
    assert not stdout, "spans never on a command's stdout"
    others = [line for line in stderr.splitlines() if not line.startswith("{")]
    assert all(line.startswith("treadle worker:") for line in others), others


async def test_a_superseded_in_band_write_counts_as_a_fence_refusal(
    metrics_on: None, spans: InMemorySpanExporter, local_app: Callable[..., Workflows]
) -> None:
    """An in-band write with a stale count is refused by the World's fence: counted in
    ``treadle_fence_refusals_total`` and named on the write's span, which is not failed."""
    app = local_app()

    @app.workflow
    async def idle() -> int:
        return 1

    run = await app.start(idle)
    assert await run.result(timeout=30) == 1
    world = await app.world()
    before = metrics.REGISTRY.get_sample_value("treadle_fence_refusals_total") or 0
    try:
        await world.events.create(
            run.run_id, events.RunStarted(), in_band=True, expected_seq_in_band=999,
            event_count=1,
        )  # fmt: skip
    except errors.WorldError as exc:
        refusal = type(exc).__name__
    else:
        raise AssertionError("a stale in-band write was accepted")
    assert refusal == "InBandSuperseded"
    assert metrics.REGISTRY.get_sample_value("treadle_fence_refusals_total") == before + 1
    (write,) = [
        s for s in spans.get_finished_spans()
        if s.name == names.EVENTS_CREATE and (s.attributes or {}).get(names.REFUSAL)
    ]  # fmt: skip
    assert (write.attributes or {})[names.REFUSAL] == "InBandSuperseded"
    assert write.status.status_code == StatusCode.UNSET


async def test_handoffs_reruns_and_redeliveries_are_counted_apart(metrics_on: None) -> None:
    """The delivery wrapper's arithmetic: a Handoff answer counts a handoff; a coalesced
    re-run (``rerun`` above 0) counts a re-run, not a redelivery; a later attempt of the
    queue's counts a redelivery. No run id reaches a label."""
    from treadle.telemetry import worldwrap
    from treadle.world import messages

    run = "wrun_01ABCDEFGHJKMNPQRSTVWXYZ23"

    def sample(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    async def hands_off(
        message: messages.OrchestratorMessage | messages.StepMessage, meta: messages.DeliveryMeta
    ) -> messages.HandlerResult:
        return messages.HANDOFF

    handler = worldwrap.traced_handler(hands_off)
    message = messages.OrchestratorMessage(run_id=run, run_spec_version=9)
    before = (
        sample("treadle_handoffs_total", kind="orchestrator"),
        sample("treadle_coalesced_reruns_total"),
        sample("treadle_redeliveries_total", kind="orchestrator"),
    )
    for count, attempt, rerun in ((1, 1, 0), (2, 1, 1), (3, 2, 0)):
        meta = messages.DeliveryMeta(
            message_id="msg_1", delivery_count=count, attempt=attempt,
            invocation_started_at=0, rerun=rerun,
        )  # fmt: skip
        assert await handler(message, meta) == messages.HANDOFF
    after = (
        sample("treadle_handoffs_total", kind="orchestrator"),
        sample("treadle_coalesced_reruns_total"),
        sample("treadle_redeliveries_total", kind="orchestrator"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 1, 1]
    assert run not in metrics.exposition().decode()
