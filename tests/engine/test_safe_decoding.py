"""Type-directed decoding end to end, on both Worlds (security.md H1, issue 16 item 1).

A forged ``$t`` tag in what the World stores (a run input, a step input, a step
result, a hook payload) makes the value's reader fail with a ``SerializationError``
naming the class and the value's path; no body runs and no gadget is called. A
normal app whose dataclasses and pydantic models are declared only by its
annotations (``safe_types`` is not an app module) keeps working and replays on a
new worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from treadle import Hook, SerializationError, create_hook
from treadle.errors import HookNotFound, RunFailedError, StepFailed
from treadle.world import events, messages, records

from .conftest import MakeApp, OpenWorld
from .faults import FaultyEvents, FaultyQueue, FaultyWorld
from .safe_types import Basket, Customer, Gift, Item, Quote


def gadget(marker: Path) -> dict[str, Any]:
    """H1's exploit: a dataclass tag that ran ``touch MARKER`` when decoded."""
    return {"$t": "dataclass", "cls": "subprocess:Popen", "v": {"args": ["touch", str(marker)]}}


class Confirm(Hook):
    quote: Quote | None
    approvers: list[Customer]


async def _hook_created(app: Any, token: str, timeout: float = 20) -> None:
    world = await app.world()
    deadline = time.monotonic() + timeout
    while True:
        try:
            await world.hooks.get_by_token(token)
            return
        except HookNotFound:
            assert time.monotonic() < deadline, f"hook {token} never created"
            await asyncio.sleep(0.02)  # polling another task's progress in the World


async def test_annotated_dataclasses_and_models_round_trip_and_replay_on_a_new_worker(
    make_app: MakeApp, open_world: OpenWorld
) -> None:
    """Inputs, step inputs and results, hook payloads and the output hold dataclasses and
    models (nested, Optional, list of, tuple of, dict of), declared only by annotations;
    the run waits on hooks, its worker stops, and a new worker replays it to the end."""
    seen: list[str] = []

    def declare(app: Any) -> Any:
        @app.step
        async def price(basket: Basket, extra: Item | None = None) -> Quote:
            assert isinstance(basket.customer, Customer)
            assert all(isinstance(i, Item) for i in basket.items)
            seen.append(f"price {len(basket.items)}")
            lines = (*basket.items, *([extra] if extra else []))
            return Quote(Decimal("1.5") * len(lines), lines, {i.sku: i for i in lines})

        @app.workflow
        async def checkout(basket: Basket, token: str) -> dict[str, Quote | Confirm | Gift | None]:
            quote = await price(basket, extra=Item("bag", 1))
            assert isinstance(quote, Quote) and isinstance(quote.lines[0], Item)
            confirm = await Confirm.wait(token=f"{token}:confirm")
            gift = await create_hook(f"{token}:gift").payload()
            return {"quote": quote, "confirm": confirm, "gift": gift}  # type: ignore[dict-item]

        return checkout

    first = make_app(WORKFLOW_MAX_INLINE_STEPS=0)
    checkout = declare(first)
    basket = Basket([Item("tea", 2), Item("cake", 1)], Customer(name="ada"), note=None)
    run = await first.start(checkout, basket, "order-1")
    await _hook_created(first, "order-1:confirm")
    await first.close(grace_seconds=2)
    await first._world_arg.close()  # type: ignore[union-attr]

    second = make_app()
    declare(second)
    quote = Quote(Decimal("4.5"), (Item("tea", 2), Item("cake", 1), Item("bag", 1)), {})
    quote.by_sku = {i.sku: i for i in quote.lines}
    approval = Confirm(quote=None, approvers=[Customer(name="bob")])
    await second.resume_hook("order-1:confirm", approval)
    await _hook_created(second, "order-1:gift")
    await second.resume_hook("order-1:gift", Gift(to="carol"))
    result = await second.get_run(run.run_id).result(timeout=30)
    assert result == {"quote": quote, "confirm": approval, "gift": Gift(to="carol")}
    assert seen == ["price 2"]  # the step ran once; the new worker replayed its result


async def test_a_forged_run_input_fails_the_run_and_runs_nothing(
    make_app: MakeApp, tmp_path: Path
) -> None:
    """H1's ``start_encoded`` path: the gadget reached ``treadle worker`` as a run input."""
    app = make_app()
    ran: list[Any] = []

    @app.workflow
    async def ident(x: Any) -> str:
        ran.append(x)
        return type(x).__name__

    marker = tmp_path / "MARKER"
    run = await app.start_encoded("ident", {"args": [gadget(marker)], "kwargs": {}})
    with pytest.raises(RunFailedError) as caught:
        await run.result(timeout=30)
    assert caught.value.error_type == "SerializationError"
    message = str(caught.value)
    assert "workflow ident input argument 0" in message
    assert "'subprocess:Popen', which this app does not declare" in message
    assert "not imported or called" in message
    assert ran == []
    assert not marker.exists()


class Forging(FaultyEvents):
    """Rewrites chosen events on their way into the World: what an attacker with write
    access to the database (a row, the SQLite file) makes the log hold."""

    def __init__(self, inner: Any, forge: dict[str, tuple[str, Any]]) -> None:
        super().__init__(inner)
        self.forge = forge  # event type -> (field, forged value)

    def _forged(self, event: events.Event) -> events.Event:
        if event.type in self.forge:
            name, value = self.forge[event.type]
            return event.model_copy(update={name: value})
        return event

    async def create(self, run_id: str, event: events.Event, **kw: Any) -> records.EventResult:
        return await super().create(run_id, self._forged(event), **kw)

    async def create_batch(
        self, run_id: str, batch: Sequence[events.Event], **kw: Any
    ) -> records.BatchResult:
        return await super().create_batch(run_id, [self._forged(e) for e in batch], **kw)


class ForgingQueue(FaultyQueue):
    """Puts the forged step input into step messages that carry an input (a NATS publish,
    H2); a message that leaves its input in the log is left alone."""

    def __init__(self, inner: Any, step_input: Any) -> None:
        super().__init__(inner)
        self.step_input = step_input

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        forged = [
            messages.Send(
                s.message.model_copy(update={"input": self.step_input}), s.key, s.delay_seconds
            )
            if isinstance(s.message, messages.StepMessage) and s.message.input is not None
            else s
            for s in sends
        ]
        return await super().send_batch(forged)


async def test_a_forged_step_input_fails_that_step_and_runs_no_body(
    make_app: MakeApp, faulty: FaultyWorld, tmp_path: Path
) -> None:
    """The step's input in the World (its ``step_created``, and its message) is the gadget:
    the step fails with the clear error, its body never runs, nothing is called."""
    marker = tmp_path / "MARKER"
    forged = {"args": [gadget(marker)], "kwargs": {}}
    faulty.events = Forging(faulty.inner.events, {"step_created": ("input", forged)})
    faulty.queue = ForgingQueue(faulty.inner.queue, forged)
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: list[Any] = []

    @app.step
    async def take(item: Item) -> str:
        ran.append(item)
        return item.sku

    @app.workflow
    async def flow() -> str:
        try:
            return await take(Item("tea", 1))
        except StepFailed as exc:
            return f"{exc.error_type}: {exc}"

    run = await app.start(flow)
    outcome = await run.result(timeout=30)
    assert outcome.startswith("SerializationError: ")
    assert "step take input argument 0: the stored value names class 'subprocess:Popen'" in (
        outcome
    )
    failed = [e for e in await run.events() if e.type == "step_failed"]
    assert len(failed) == 1 and failed[0].event.error.type == "SerializationError"  # type: ignore[attr-defined]
    assert ran == []
    assert not marker.exists()


async def test_a_forged_step_result_is_raised_where_the_workflow_awaits_it(
    make_app: MakeApp, faulty: FaultyWorld, tmp_path: Path
) -> None:
    """The replay engine decoded step results with no guard: a forged result now raises a
    ``SerializationError`` at the ``await``, the same on every replay, and nothing runs."""
    marker = tmp_path / "MARKER"
    faulty.events = Forging(faulty.inner.events, {"step_completed": ("result", gadget(marker))})
    app = make_app(world=faulty)

    @app.step
    async def make() -> Item:
        return Item("tea", 1)

    @app.workflow
    async def flow() -> str:
        try:
            return repr(await make())
        except SerializationError as exc:
            return str(exc)

    run = await app.start(flow)
    outcome = await run.result(timeout=30)
    assert outcome.startswith("step make result: the stored value names class 'subprocess:Popen'")
    assert not marker.exists()


async def test_a_forged_hook_payload_fails_the_run_and_calls_nothing(
    make_app: MakeApp, faulty: FaultyWorld, tmp_path: Path
) -> None:
    """``hook_received`` holding the gadget (a written row): the waiting run fails with the
    error naming the hook, the workflow's code past the wait never runs."""
    marker = tmp_path / "MARKER"
    faulty.events = Forging(faulty.inner.events, {"hook_received": ("payload", gadget(marker))})
    app = make_app(world=faulty)
    after: list[Any] = []

    @app.workflow
    async def flow() -> None:
        after.append(await create_hook("forged-1").payload())

    run = await app.start(flow)
    await _hook_created(app, "forged-1")
    await app.resume_hook("forged-1", {"ok": True})
    with pytest.raises(RunFailedError) as caught:
        await run.result(timeout=30)
    assert caught.value.error_type == "SerializationError"
    expected = "hook 'forged-1' payload: the stored value names class 'subprocess:Popen'"
    assert expected in str(caught.value)
    assert after == []
    assert not marker.exists()
