"""A start's own options (``attributes``, ``priority``, ``timeout``) kept apart from the
workflow's arguments (``treadle.startoptions``; docs/timeouts.md "Start options"), on
both real Worlds.

``app.start(wf, ..., timeout=...)`` reads the keyword as the run's option; a workflow
with a parameter of that name the positional arguments leave unfilled makes the call
ambiguous: ``StartOptionClash`` naming the option and the way out, nothing recorded.
``app.start(wf.options(timeout=...), ..., timeout=...)`` binds the run's options to the
workflow, and every keyword of the call is then the workflow's.
"""

from __future__ import annotations

from typing import Any

import pytest

from treadle import errors, runtimeouts
from treadle.world import events

from .conftest import MakeApp

WAIT = 20.0


async def _created(run: Any) -> events.RunCreated:
    created = (await run.events())[0].event
    assert isinstance(created, events.RunCreated)
    return created


@pytest.mark.parametrize("option", ["attributes", "priority", "timeout"])
async def test_an_option_keyword_naming_an_unfilled_workflow_parameter_is_refused(
    make_app: MakeApp, option: str
) -> None:
    app = make_app()

    async def body(x: int, attributes: Any = None, priority: Any = None, timeout: Any = None):
        return [x, attributes, priority, timeout]

    flow = app.workflow(name="flow")(body)
    value: Any = {"attributes": {"k": "v"}, "priority": 3, "timeout": 30}[option]
    with pytest.raises(errors.StartOptionClash) as refused:
        await app.start(flow, 1, **{option: value})
    text = str(refused.value)
    assert f"workflow flow has a parameter named {option!r}" in text
    assert f"app.start(flow.options({option}=...), ..., {option}=...)" in text
    assert "Nothing was recorded" in text
    assert isinstance(refused.value, TypeError)
    assert (refused.value.workflow, refused.value.option) == ("flow", option)
    world = await app.world()
    assert await world.runs.count() == 0


async def test_a_keyword_only_parameter_named_like_an_option_needs_the_options_form(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow
    async def labelled(*, attributes: dict[str, str]) -> str:
        return ",".join(sorted(attributes))

    with pytest.raises(errors.StartOptionClash, match="'attributes'"):
        await app.start(labelled, attributes={"a": "1"})
    run = await app.start(
        labelled.options(attributes={"team": "core"}), attributes={"b": "2", "c": "3"}
    )
    assert await run.result(timeout=WAIT) == "b,c"
    assert await run.attributes() == {"team": "core"}


async def test_the_options_form_passes_every_keyword_to_the_workflow(make_app: MakeApp) -> None:
    """The run's timeout and attributes come from ``.options()``; ``timeout=``,
    ``priority=`` and ``attributes=`` of the call, ``None`` too, are the workflow's."""
    app = make_app()

    @app.workflow
    async def fetch(url: str, timeout: float | None = 10.0, priority: int = 0) -> list[Any]:
        return [url, timeout, priority]

    run = await app.start(
        fetch.options(timeout="1h", attributes={"customer": "acme"}, priority=2),
        "u",
        timeout=None,
        priority=7,
    )
    assert await run.result(timeout=WAIT) == ["u", None, 7]
    created = await _created(run)
    assert runtimeouts.recorded(created.input) == 3600.0
    assert created.attributes == {"customer": "acme"}
    assert created.input["kwargs"] == {"timeout": None, "priority": 7}  # type: ignore[index]


async def test_a_parameter_filled_by_position_leaves_the_keyword_to_the_run(
    make_app: MakeApp,
) -> None:
    """The documented form before ``.options()``: the workflow's ``attributes`` by
    position, the run's by keyword. No clash, each gets its own."""
    app = make_app()

    @app.workflow
    async def tag(attributes: dict[str, int], timeout: int = 1) -> int:
        return sum(attributes.values()) + timeout

    run = await app.start(tag, {"a": 1, "b": 2}, 4, attributes={"k": "v"}, timeout="1h")
    assert await run.result(timeout=WAIT) == 7
    created = await _created(run)
    assert created.attributes == {"k": "v"}
    assert runtimeouts.recorded(created.input) == 3600.0


async def test_a_workflow_without_such_parameters_takes_the_keywords_as_before(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow
    async def plain(n: int, **extra: Any) -> list[Any]:
        return [n, extra]

    run = await app.start(plain, 1, timeout="2h", attributes={"k": "v"}, more=True)
    assert await run.result(timeout=WAIT) == [1, {"more": True}]
    created = await _created(run)
    assert (runtimeouts.recorded(created.input), created.attributes) == (7200.0, {"k": "v"})


async def test_bad_options_are_refused_at_the_call_and_nothing_is_recorded(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow
    async def w() -> None: ...

    with pytest.raises(ValueError, match=r"workflow w.options\(\): timeout"):
        w.options(timeout="later")
    with pytest.raises(ValueError, match="priority"):
        w.options(priority="high")  # type: ignore[arg-type]
    with pytest.raises(errors.WorkflowError, match="on_parent_close is the option of a child"):
        await app.start(w.options(on_parent_close="abandon"))
    with pytest.raises(errors.AttributeInvalid):
        await app.start(w.options(attributes={"": "empty key"}))
    world = await app.world()
    assert await world.runs.count() == 0


async def test_a_child_start_refuses_a_top_level_option(make_app: MakeApp) -> None:
    """Inside a workflow ``app.start`` starts a child, which takes no ``timeout`` (nor
    attributes, priority): a ``ValueError`` at the call, which the parent catches."""
    app = make_app()

    @app.workflow
    async def child(n: int) -> int:
        return n * 2

    @app.workflow
    async def parent() -> list[str]:
        seen = []
        for call in (
            lambda: app.start(child, 1, timeout="1h"),
            lambda: app.start(child.options(timeout="1h"), 1),
        ):
            try:
                await call()
            except ValueError as exc:
                seen.append(str(exc))
        return seen

    run = await app.start(parent)
    seen = await run.result(timeout=WAIT)
    assert len(seen) == 2
    assert all("a child run takes none of them" in text for text in seen)
    assert all("timeout" in text for text in seen)
