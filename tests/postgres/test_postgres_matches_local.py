"""The Postgres storage answers exactly as the local World does, call for call.

One script of storage calls (writes that succeed, converge and are refused in
every way the contract names, batches, read views) runs against a local World
and against the Postgres storage with the same run ids; every answer, refusal
(type, message, attributes) and read view must be equal, leaving out the times
the Worlds' clocks stamp.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.world import constants, contract, events, ids
from treadle.worlds.local import LocalWorld
from treadle.worlds.postgres import PostgresStorage

AT = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
BOOM = events.ErrorInfo(message="boom")
_CLOCK_FIELDS = {"created_at", "updated_at", "started_at", "completed_at"}


def _plain(value: Any) -> Any:
    """A comparable form: dataclasses and events as dicts without clock times."""
    if isinstance(value, events.LoggedEvent):
        kept = value.created_at if value.created_at == AT else None
        return ("event", value.run_id, value.slot, value.in_band, value.event, kept)
    if isinstance(value, errors.WorldError):
        facts = {k: _plain(v) for k, v in vars(value).items()}
        return ("error", type(value).__name__, str(value), facts)
    if is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in fields(value)
            if f.name not in _CLOCK_FIELDS
        }
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class Recorder:
    def __init__(self, world: contract.World) -> None:
        self.world = world
        self.answers: list[tuple[str, Any]] = []

    async def __call__(self, label: str, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            result = await call()
        except errors.WorldError as exc:
            self.answers.append((label, _plain(exc)))
            return None
        self.answers.append((label, _plain(result)))
        return result


async def _script(world: contract.World, run_ids: list[str], token: str) -> list[tuple[str, Any]]:
    rec = Recorder(world)
    w = world
    a, b, c, missing = run_ids
    ev = w.events

    def create(rid: str, event: events.Event, **kw: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: ev.create(rid, event, **kw)

    def batch(rid: str, items: list[events.Event], **kw: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: ev.create_batch(rid, items, **kw)

    def fenced(seq_in_band: int, count: int) -> dict[str, Any]:
        return {"in_band": True, "expected_seq_in_band": seq_in_band, "event_count": count}

    for rid, name in ((a, "wf_a"), (b, "wf_b"), (c, "wf_a")):
        await rec(f"create {rid}", lambda rid=rid, name=name: w.runs.create(
            workflow_name=name, input={"n": 1, "a": [1, 2]}, deployment_id="dpl",
            spec_version=9, run_id=rid, attributes={"x": 1},
        ))  # fmt: skip
    await rec("retried create", lambda: w.runs.create(
        workflow_name="wf_a", input={"a": [1, 2], "n": 1}, deployment_id="dpl", spec_version=9,
        run_id=a,
    ))  # fmt: skip
    await rec("conflicting create", lambda: w.runs.create(
        workflow_name="wf_a", input=2, deployment_id="dpl", spec_version=9, run_id=a
    ))  # fmt: skip
    await rec("bad run id", lambda: w.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=9, run_id="nope"
    ))  # fmt: skip
    await rec("get missing", lambda: w.runs.get(missing))
    await rec("write to missing", create(missing, events.Noop(), in_band=False))
    await rec("run_started", create(a, events.RunStarted(), **fenced(1, 1), occurred_at=AT))
    await rec("run_created refused", create(a, events.RunCreated(
        workflow_name="w", deployment_id="d", spec_version=9), in_band=False))  # fmt: skip
    await rec("no expected", create(a, events.Noop(), in_band=True, event_count=2))
    await rec("no count", create(a, events.Noop(), in_band=True, expected_seq_in_band=2))
    await rec("count past seq", create(a, events.Noop(), **fenced(2, 3)))
    await rec("negative count", create(a, events.Noop(), **fenced(2, -1)))
    await rec("stale", create(a, events.Noop(), **fenced(1, 1)))
    await rec(
        "naive time", create(a, events.Noop(), **fenced(2, 2), occurred_at=datetime(2020, 1, 1))
    )
    await rec(
        "attr out", create(a, events.AttrSet(key="k", value={"z": 1, "y": [2]}), in_band=False)
    )
    await rec("wake", create(a, events.WakeRequested(waits=["w1"]), in_band=False))
    await rec("inline start", create(a, events.StepStarted(
        correlation_id="s1", step_name="add", attempt=1, inline=True, input=[1, 2]),
        **fenced(2, 2), occurred_at=AT))  # fmt: skip
    await rec("batch", batch(a, [
        events.StepCreated(correlation_id="s2", step_name="fetch", input={"u": 1}),
        events.WaitCreated(correlation_id="w1", resume_at=AT),
        events.StepCompleted(correlation_id="s1", step_name="add", result=3),
    ], **fenced(3, 5), occurred_at=AT))  # fmt: skip
    await rec("retrying", create(a, events.StepRetrying(
        correlation_id="s2", step_name="fetch", attempt=1, error=BOOM, retry_after=AT),
        in_band=False))  # fmt: skip
    await rec("naive retry_after", create(a, events.StepRetrying(
        correlation_id="s2", step_name="fetch", attempt=1, error=BOOM,
        retry_after=datetime(2030, 1, 1)), in_band=False))  # fmt: skip
    await rec("refusing batch", batch(a, [
        events.StepStarted(correlation_id="s1", step_name="add", attempt=2),
        events.StepCompleted(correlation_id="s1", step_name="add", result=4),
        events.StepStarted(correlation_id="s2", step_name="fetch", attempt=2),
        events.StepFailed(correlation_id="s2", step_name="fetch", attempt=2, error=BOOM),
    ], in_band=False))  # fmt: skip
    await rec("started after outcome", create(a, events.StepStarted(
        correlation_id="s2", step_name="fetch", attempt=3), in_band=False))  # fmt: skip
    await rec("empty batch", batch(a, [], in_band=False))
    await rec("foreign batch", batch(a, [events.Noop()], in_band=False))
    too_many = [events.WaitCompleted(correlation_id=f"w{i}") for i in range(65)]
    await rec("big batch", batch(a, list(too_many), in_band=False))
    await rec("stale batch", batch(a, [events.WaitCompleted(correlation_id="w1")], **fenced(1, 1)))
    await rec(
        "hook", create(a, events.HookCreated(correlation_id="h1", token=token), **fenced(6, 11))
    )
    clash = events.HookCreated(correlation_id="h2", token=token, metadata={"m": 1}, position=4)
    await rec("hook clash", create(b, clash, in_band=False))
    await rec(
        "received", create(a, events.HookReceived(correlation_id="h1", payload=[1]), in_band=False)
    )
    await rec(
        "received unknown", create(a, events.HookReceived(correlation_id="h9"), in_band=False)
    )
    await rec("hook by token", lambda: w.hooks.get_by_token(token))
    await rec(
        "idempotent",
        create(a, events.AttrSet(key="i", value=1), in_band=False, idempotency_key="k1"),
    )
    await rec(
        "idempotent again",
        create(a, events.AttrSet(key="i", value=1), in_band=False, idempotency_key="k1"),
    )
    await rec("complete", create(a, events.RunCompleted(output={"done": True}), in_band=False))
    await rec("hook freed", lambda: w.hooks.get_by_token(token))
    for refused in (events.RunStarted(), events.WaitCreated(correlation_id="w9", resume_at=AT),
                    events.HookReceived(correlation_id="h1"), events.RunCancelled()):  # fmt: skip
        await rec(f"terminal {refused.type}", create(a, refused, in_band=False))
    await rec("terminal batch", batch(a, [
        events.StepCreated(correlation_id="s7", step_name="x"),
        events.StepCompleted(correlation_id="s7", step_name="x"),
        events.StepFailed(correlation_id="s2", step_name="fetch", attempt=1, error=BOOM),
        events.WaitCompleted(correlation_id="w1"),
    ], in_band=False))  # fmt: skip
    await rec("fail b", create(b, events.RunFailed(error=BOOM), in_band=False))
    await rec("cancel c", create(c, events.RunCancelled(reason="r"), in_band=False))
    await rec("report", create(c, events.Noop(), **fenced(1, 1), occurred_at=AT))
    await rec("steps a", lambda: w.steps.list(a))
    await rec("steps missing", lambda: w.steps.list(missing))
    await rec("step missing", lambda: w.steps.get(a, "nope"))
    for rid in (a, b, c):
        await rec(f"run {rid}", lambda rid=rid: w.runs.get(rid))
        await rec(f"log {rid}", lambda rid=rid: ev.list(rid))
        await rec(f"log page {rid}", lambda rid=rid: ev.list(rid, after_slot=2, limit=2))
    await rec("log missing", lambda: ev.list(missing))
    await rec("log bad limit", lambda: ev.list(a, limit=0))
    for status in ("completed", "failed", "cancelled", "running", "pending"):
        await rec(f"list {status}", lambda status=status: w.runs.list(status=status))
    await rec("list wf_a", lambda: w.runs.list(workflow_name="wf_a"))
    await rec("list bad cursor", lambda: w.runs.list(cursor="x"))
    return rec.answers


async def test_postgres_answers_as_the_local_world_does(tmp_path: Path, pg_dsn: str) -> None:
    run_ids = [ids.new_run_id() for _ in range(4)]
    token = "shared-token"
    local = await LocalWorld(tmp_path / "world").open()
    try:
        expected = await _script(local, run_ids, token)
    finally:
        await local.close()
    async with await PostgresStorage.connect(pg_dsn) as storage:
        got = await _script(storage, run_ids, token)  # type: ignore[arg-type]
    assert [label for label, _ in got] == [label for label, _ in expected]
    for (label, answer), (_, want) in zip(got, expected, strict=True):
        assert answer == want, label
    assert constants.MAX_BATCH_EVENTS == 64  # "big batch" above is one past it
