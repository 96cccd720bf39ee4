"""Bad input on both Worlds: refused before anything is recorded, the same everywhere.

Issue 10 item 3 and "Bad input"; engine-audit.md Bug 7 (E7, SE10); security.md M2
(depth), M3 (size, the orphan run), M4 (NUL, hook token length). Every case
runs on the local World and on Postgres + NATS (the ``make_app`` fixture).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

import pytest

from treadle import FatalError, Hook, StepFailed, Workflows, create_hook
from treadle.errors import RunFailedError, SerializationError, ValueLimitExceeded
from treadle.world import events

from .conftest import MakeApp


class Answer(Hook):
    text: str


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


async def _runs_of(app: Workflows, name: str) -> list[str]:
    world = await app.world()
    page = await world.runs.list(workflow_name=name)
    return [run.run_id for run in page.runs]


async def _event_seen(app: Workflows, run_id: str, event_type: str, timeout: float = 15) -> None:
    """Wait (on the World's live feed) until ``run_id``'s log holds an ``event_type``."""
    world = await app.world()
    seen = asyncio.Event()

    def on_event(event: events.LoggedEvent) -> None:
        if event.type == event_type:
            seen.set()

    sub = world.events.subscribe(run_id, 0, on_event, lambda exc: None)
    try:
        page = await world.events.list(run_id, after_slot=0)
        if not any(e.type == event_type for e in page.events):
            await asyncio.wait_for(seen.wait(), timeout)
    finally:
        sub.close()


# -- Bug 7: a start that cannot be queued leaves no run behind -------------------------------


async def test_large_workflow_input_starts_from_the_log_and_leaves_no_orphan(
    make_app: MakeApp,
) -> None:
    """Bug 7 / E7 / SE10 / M3: a 200 KiB input is over the 128 KiB message limit. The
    start used to record the run, then fail with MessageTooLarge, leaving it pending for
    ever. Now the start message carries no run_input and the run reads it from the log."""
    app = make_app()

    @app.workflow
    async def big_input(blob: str) -> int:
        return len(blob)

    run = await app.start(big_input, "x" * 200 * 1024)
    assert await run.result(timeout=20) == 200 * 1024
    assert await _runs_of(app, "big_input") == [run.run_id]
    types = [e.type for e in await run.events()]
    assert types[:2] == ["run_created", "run_started"] and types[-1] == "run_completed"


# -- workflow input: refused before runs.create ---------------------------------------------


async def test_input_over_the_size_limit_is_refused_and_records_nothing(
    make_app: MakeApp,
) -> None:
    """M3: an input over TREADLE_MAX_VALUE_BYTES raises to the caller; no run exists."""
    app = make_app(TREADLE_MAX_VALUE_BYTES=64 * 1024)

    @app.workflow
    async def sized(blob: str) -> int:
        return len(blob)

    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_VALUE_BYTES") as caught:
        await app.start(sized, "x" * 100_000)
    assert caught.value.setting == "TREADLE_MAX_VALUE_BYTES"
    assert str(caught.value).startswith("workflow sized arguments: ")
    assert await _runs_of(app, "sized") == []
    run = await app.start(sized, "x" * 1000)  # under the limit: runs
    assert await run.result(timeout=15) == 1000


async def test_input_nested_past_the_depth_limit_is_refused_and_records_nothing(
    make_app: MakeApp,
) -> None:
    """M2: at depth 220 the input used to be stored and then unreadable (the run stuck
    pending). It is refused at the start; one at the limit round-trips."""
    app = make_app()

    @app.workflow
    async def deep(value: Any) -> int:
        depth = 0
        while isinstance(value, list):
            value, depth = value[0], depth + 1
        return depth

    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_VALUE_DEPTH"):
        await app.start(deep, _nested(220))
    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_VALUE_DEPTH"):
        await app.start(deep, _nested(100_000))  # no RecursionError either
    assert await _runs_of(app, "deep") == []
    run = await app.start(deep, _nested(64))
    assert await run.result(timeout=15) == 64
    assert len(await run.events()) >= 3  # the log reads back


async def test_encoded_input_is_checked_before_it_is_recorded(make_app: MakeApp) -> None:
    """start_encoded (the CLI's and operator's path) checks JSON it did not encode."""
    app = make_app()

    @app.workflow
    async def takes(x: Any) -> Any:
        return x

    with pytest.raises(SerializationError, match="NUL"):
        await app.start_encoded("takes", {"args": ["a\x00b"], "kwargs": {}})
    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_VALUE_DEPTH"):
        await app.start_encoded("takes", {"args": [_nested(200)], "kwargs": {}})
    assert await _runs_of(app, "takes") == []


async def test_nul_in_workflow_input_is_refused_on_every_world(make_app: MakeApp) -> None:
    """M4: a NUL was accepted locally and refused by PostgreSQL; now refused on both."""
    app = make_app()

    @app.workflow
    async def echo(text: str) -> str:
        return text

    with pytest.raises(SerializationError, match=r"argument 0: a string with a NUL"):
        await app.start(echo, "a\x00b")
    assert await _runs_of(app, "echo") == []


# -- step results and arguments --------------------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "background"])
async def test_step_result_with_nul_fails_the_step_once_without_rerunning_its_body(
    make_app: MakeApp, inline: bool
) -> None:
    """M4: on Postgres a step returning a NUL ran its body 4 times, then failed with a
    misleading StepAttemptsExhausted. Now the result is refused before the write: one
    body run, one step_failed naming the NUL, which the workflow can catch."""
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=3 if inline else 0)
    ran: Counter[str] = Counter()

    @app.step
    async def charge(order: str) -> str:
        ran[order] += 1
        return f"receipt\x00{order}"

    @app.workflow
    async def pay() -> str:
        try:
            return await charge("o-42")
        except StepFailed as exc:
            return f"{exc.error_type}: {exc.error_message}"

    run = await app.start(pay)
    outcome = await run.result(timeout=20)
    assert outcome.startswith("SerializationError: step charge result: a string with a NUL")
    assert ran["o-42"] == 1
    types = Counter(e.type for e in await run.events())
    assert types["step_started"] == 1 and types["step_failed"] == 1
    assert types["step_completed"] == 0 and types["step_retrying"] == 0


async def test_step_result_over_the_size_limit_fails_the_step_once(make_app: MakeApp) -> None:
    """A result over TREADLE_MAX_VALUE_BYTES fails its step at once (no retries)."""
    app = make_app(TREADLE_MAX_VALUE_BYTES=32 * 1024)
    ran: Counter[str] = Counter()

    @app.step
    async def produce() -> str:
        ran["produce"] += 1
        return "y" * 40_000

    @app.workflow
    async def big_result() -> str:
        try:
            await produce()
        except StepFailed as exc:
            return exc.error_message
        return "not reached"

    run = await app.start(big_result)
    message = await run.result(timeout=20)
    assert "step produce result" in message and "TREADLE_MAX_VALUE_BYTES" in message
    assert ran["produce"] == 1


async def test_step_argument_nested_too_deep_fails_that_step_not_the_run(
    make_app: MakeApp,
) -> None:
    """M2: a step input computed at depth 205 made the log unreadable. Now the step
    fails before its creation carries the value; the workflow goes on."""
    app = make_app()

    @app.step
    async def walk(value: Any) -> str:
        return "ran"

    @app.workflow
    async def computes() -> str:
        try:
            await walk(_nested(205))
        except StepFailed as exc:
            return f"{exc.error_type}: {exc.error_message}"
        return "not reached"

    run = await app.start(computes)
    outcome = await run.result(timeout=20)
    assert outcome.startswith("SerializationError: step walk argument 0")
    assert "TREADLE_MAX_VALUE_DEPTH" in outcome


async def test_workflow_output_with_nul_fails_the_run_naming_it(make_app: MakeApp) -> None:
    """An output the World could not store fails the run with the reason, once."""
    app = make_app()

    @app.workflow
    async def bad_output() -> str:
        return "done\x00"

    run = await app.start(bad_output)
    with pytest.raises(RunFailedError, match="workflow bad_output output: a string with a NUL"):
        await run.result(timeout=20)


# -- hooks -----------------------------------------------------------------------------------


async def test_hook_token_over_the_limit_fails_the_run_before_any_hook_is_recorded(
    make_app: MakeApp,
) -> None:
    """M4: a random 4,000-character token retried for hours on Postgres (the btree index
    limit). create_hook refuses it in workflow code, the same on both Worlds."""
    app = make_app()
    token = secrets.token_urlsafe(3000)

    @app.workflow
    async def long_token() -> str:
        create_hook(token)
        return "not reached"

    run = await app.start(long_token)
    with pytest.raises(
        RunFailedError, match=r"hook token: 4000 bytes, over .*\(TREADLE_MAX_HOOK_TOKEN_BYTES\)"
    ):
        await run.result(timeout=20)
    assert "hook_created" not in [e.type for e in await run.events()]


async def test_resume_hook_with_a_refused_payload_records_nothing(make_app: MakeApp) -> None:
    """A hook payload with a NUL, too deep or too large raises to the caller; the log
    has no hook_received, and a good payload then resumes the run."""
    app = make_app(TREADLE_MAX_VALUE_BYTES=16 * 1024)

    @app.workflow
    async def waits() -> str:
        answer = await Answer.wait(token="limits:answer")
        assert answer is not None
        return answer.text

    run = await app.start(waits)
    await _event_seen(app, run.run_id, "hook_created")
    with pytest.raises(SerializationError, match=r"hook payload\.text: a string with a NUL"):
        await app.resume_hook("limits:answer", {"text": "a\x00b"})
    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_VALUE_DEPTH"):
        await app.resume_hook("limits:answer", {"text": _nested(100)})
    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_VALUE_BYTES"):
        await app.resume_hook("limits:answer", {"text": "z" * 20_000})
    with pytest.raises(ValueLimitExceeded, match="TREADLE_MAX_HOOK_TOKEN_BYTES"):
        await app.resume_hook("t" * 5000, {"text": "ok"})
    assert "hook_received" not in [e.type for e in await run.events()]
    await app.resume_hook("limits:answer", {"text": "ok"})
    assert await run.result(timeout=20) == "ok"


async def test_a_step_error_with_a_nul_is_recorded_escaped_and_the_body_runs_once(
    make_app: MakeApp,
) -> None:
    """M4's cousin: an exception message with a NUL made the step_failed write fail on
    PostgreSQL, so the body ran again. The error is stored escaped, once."""
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[str] = Counter()

    @app.step
    async def refuse() -> None:
        ran["refuse"] += 1
        raise FatalError("card\x00declined")

    @app.workflow
    async def nul_error() -> str:
        try:
            await refuse()
        except StepFailed as exc:
            return exc.error_message
        return "not reached"

    run = await app.start(nul_error)
    assert await run.result(timeout=20) == "card\\x00declined"
    assert ran["refuse"] == 1
    assert Counter(e.type for e in await run.events())["step_failed"] == 1
