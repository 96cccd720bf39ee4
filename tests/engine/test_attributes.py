"""Run attributes (issue 17 item 2, docs/attributes.md): every writer, replay identity,
search, bad input, spec 8, on both real Worlds (local, and Postgres + NATS).

Writers: ``app.start(attributes=...)`` (``run_created``), ``set_attributes()`` in
workflow code (an in-band ``attr_set`` at a replay position, written once), in step
code (out of band, by the step's own writer) and ``run.set_attributes()`` (out of
band). The run's record always shows the fold of its log; ``runs.list(attributes=)``
finds it. The turbo barrier cases are in test_attributes_turbo.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from treadle import AttributeInvalid, AttributesNeedSpec9, set_attributes, step_metadata
from treadle import errors as treadle_errors
from treadle.world import attributes, events

from .audit import assert_sound, cold_outcome
from .conftest import MakeApp


def _sets(log: list[events.LoggedEvent]) -> list[events.LoggedEvent]:
    return [e for e in log if isinstance(e.event, events.AttrSet)]


def _folded(log: list[events.LoggedEvent]) -> dict[str, Any]:
    created = log[0].event
    assert isinstance(created, events.RunCreated)
    pairs = [(e.event.key, e.event.value) for e in _sets(log)]  # type: ignore[union-attr]
    return attributes.fold(created.attributes, pairs)


async def test_every_writer_lands_in_the_record_and_the_log(make_app: MakeApp) -> None:
    """start() seeds, workflow code writes in-band at a position, a step writes out of
    band, run.set_attributes() out of band after the end; the record is the fold of
    the log, no attr_set comes before run_started, and the log is sound."""
    app = make_app()

    @app.step
    async def charge(amount: int) -> str:
        await set_attributes({"charged_attempt": step_metadata().attempt})
        return f"charged {amount}"

    @app.workflow
    async def order(amount: int) -> str:
        set_attributes({"stage": "charging", "amount": amount})
        receipt = await charge(amount)
        await set_attributes({"stage": "done"})
        return receipt

    run = await app.start(order, 5, attributes={"customer": "acme", "tier": "gold"})
    assert await run.result(timeout=30) == "charged 5"
    await run.set_attributes({"note": {"vip": True}})
    log = await assert_sound(run)
    record = await run.get()
    assert record.attributes == _folded(log)
    assert record.attributes == {
        "customer": "acme",
        "tier": "gold",
        "stage": "done",
        "amount": 5,
        "charged_attempt": 1,
        "note": {"vip": True},
    }
    started = next(e.slot for e in log if e.type == "run_started")
    ended = next(e.slot for e in log if e.type == "run_completed")
    sets = _sets(log)
    assert all(e.slot > started for e in sets)
    workflow_sets = [e for e in sets if e.event.position is not None]  # type: ignore[union-attr]
    assert [(e.event.key, e.in_band) for e in workflow_sets] == [  # type: ignore[union-attr]
        ("stage", True),
        ("amount", True),
        ("stage", True),
    ]
    assert all(e.correlation_id and e.correlation_id.startswith("attr_") for e in workflow_sets)
    assert all(e.slot < ended for e in workflow_sets), "written before the run's end"
    others = [e for e in sets if e.event.position is None]  # type: ignore[union-attr]
    assert [(e.event.key, e.in_band) for e in others] == [  # type: ignore[union-attr]
        ("charged_attempt", False),
        ("note", False),
    ]


async def test_a_finished_run_replays_without_writing_its_attributes_again(
    make_app: MakeApp,
) -> None:
    """Replay identity: a cold replay of the finished log reaches the same output with no
    attr_set left to write; waking the ended run writes nothing either."""
    app = make_app()

    @app.step
    async def double(x: int) -> int:
        return 2 * x

    @app.workflow
    async def tagged(x: int) -> int:
        set_attributes({"phase": "one"})
        y = await double(x)
        set_attributes({"phase": "two", "y": y})
        return await double(y)

    run = await app.start(tagged, 3)
    assert await run.result(timeout=30) == 12
    log = await run.events()
    assert cold_outcome(tagged, log) == ("completed", 12)
    # The same replay, kept open: every set_attributes() call found its event.
    from treadle.replay import engine
    from treadle.sdk import functions

    created = log[0].event
    assert isinstance(created, events.RunCreated)
    args, kwargs = functions.decode_arguments(created.input)
    replay = engine.Replay(
        run_id=run.run_id, workflow_name="tagged", workflow=tagged.fn, args=args,
        kwargs=kwargs, spec_version=created.spec_version,
    )  # fmt: skip
    try:
        for logged in log:
            if logged.type not in events.RUN_TERMINAL_TYPES:
                replay.feed(logged)
        outcome = replay.advance()
        assert outcome == engine.Completed(12)
        assert replay.pending_attributes == {}
    finally:
        replay.close()
    before = len(log)
    await run.wake_up()
    assert len(await run.events()) == before


async def test_attributes_set_just_before_returning_land_before_run_completed(
    make_app: MakeApp,
) -> None:
    """A workflow that sets attributes and returns at once: the attr_set events are
    written before run_completed (no suspension in between)."""
    app = make_app()

    @app.workflow
    async def quick() -> str:
        set_attributes({"a": 1})
        set_attributes({"b": [1, 2], "a": 2})
        return "ok"

    run = await app.start(quick)
    assert await run.result(timeout=30) == "ok"
    log = await assert_sound(run)
    kinds = [e.type for e in log]
    assert kinds == [
        "run_created", "run_started", "attr_set", "attr_set", "attr_set", "run_completed"
    ]  # fmt: skip
    assert (await run.get()).attributes == {"a": 2, "b": [1, 2]}


async def test_runs_list_finds_runs_by_their_attributes(make_app: MakeApp) -> None:
    """Search: seeded and workflow-set attributes, ANDed, typed, through runs.list."""
    app = make_app()

    @app.workflow
    async def sort(region: str) -> str:
        set_attributes({"region": region, "shard": len(region)})
        return region

    runs = {}
    for region, tier in (("eu", "gold"), ("us", "gold"), ("apac", "silver")):
        runs[region] = await app.start(sort, region, attributes={"tier": tier})
        await runs[region].result(timeout=30)
    world = await app.world()

    async def found(**wanted: Any) -> set[str]:
        page = await world.runs.list(workflow_name="sort", attributes=wanted)
        return {r.run_id for r in page.runs}

    assert await found(tier="gold") == {runs["eu"].run_id, runs["us"].run_id}
    assert await found(tier="gold", region="us") == {runs["us"].run_id}
    assert await found(shard=4) == {runs["apac"].run_id}
    assert await found(shard="4") == set()


async def test_bad_attributes_are_refused_at_the_call_before_anything_is_recorded(
    make_app: MakeApp,
) -> None:
    """A bad key, a value that is not JSON, a value over TREADLE_MAX_VALUE_BYTES: each a
    clear error naming the key, at start() (no run recorded), at run.set_attributes()
    (nothing written), and in workflow code (the run fails with it, no attr_set)."""
    app = make_app(TREADLE_MAX_VALUE_BYTES=1024)

    @app.workflow
    async def plain() -> str:
        return "ok"

    @app.workflow
    async def bad_in_code() -> str:
        set_attributes({"ok": 1, "no spaces": 2})
        return "never"

    world = await app.world()
    before = len((await world.runs.list(limit=1000)).runs)
    cases: list[tuple[dict[Any, Any], type[Exception], str]] = [
        ({"no spaces": 1}, AttributeInvalid, "'no spaces'"),
        ({"": 1}, AttributeInvalid, "key"),
        ({1: "x"}, AttributeInvalid, "1"),
        ({"when": object()}, AttributeInvalid, "'when'"),
        ({"ratio": float("nan")}, AttributeInvalid, "'ratio'"),
        ({"blob": "x" * 2000}, treadle_errors.ValueLimitExceeded, "'blob'"),
    ]
    for bad, kind, named in cases:
        with pytest.raises(kind, match=named):
            await app.start(plain, attributes=bad)
    assert len((await world.runs.list(limit=1000)).runs) == before, "nothing recorded"
    run = await app.start(plain)
    assert await run.result(timeout=30) == "ok"
    length = len(await run.events())
    for bad, kind, named in cases:
        with pytest.raises(kind, match=named):
            await run.set_attributes(bad)
    assert len(await run.events()) == length, "nothing written"
    failing = await app.start(bad_in_code)
    with pytest.raises(treadle_errors.RunFailedError, match="no spaces"):
        await failing.result(timeout=30)
    assert not _sets(await failing.events()), "the call's valid key is not written either"
    record = await failing.get()
    assert record.error is not None and record.error.type == "AttributeInvalid"
    with pytest.raises(treadle_errors.WorkflowError, match="inside a workflow or a step"):
        set_attributes({"outside": 1})


async def test_spec_8_run_refuses_workflow_attributes_and_takes_the_others(
    make_app: MakeApp,
) -> None:
    """A spec 8 run: set_attributes() in workflow code raises AttributesNeedSpec9 (the
    feature and WORKFLOW_SPEC_VERSION named; catchable), a step's set_attributes() and
    run.set_attributes() work, and start() seeds attributes."""
    app = make_app(WORKFLOW_SPEC_VERSION=8)

    @app.step
    async def mark() -> str:
        await set_attributes({"from_step": True})
        return "marked"

    @app.workflow
    async def legacy() -> str:
        try:
            set_attributes({"from_workflow": True})
        except AttributesNeedSpec9 as exc:
            refused = str(exc)
        return refused + " | " + await mark()

    run = await app.start(legacy, attributes={"seed": 1})
    out = await run.result(timeout=30)
    assert "set_attributes() in workflow code needs a spec 9 run" in out
    assert "WORKFLOW_SPEC_VERSION=8" in out and out.endswith("| marked")
    await run.set_attributes({"after": "x"})
    record = await run.get()
    assert record.spec_version == 8
    assert record.attributes == {"seed": 1, "from_step": True, "after": "x"}
    assert record.attributes == _folded(await run.events())
