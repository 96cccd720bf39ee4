"""Seed 000 "Why in-process single-flight is a required layer": winner and loser."""

from __future__ import annotations

import asyncio

import pytest

from treadle.orchestrator.spec8.singleflight import SingleFlight


async def test_loser_waits_for_the_winner_to_settle_and_never_runs_the_body() -> None:
    flight = SingleFlight()
    ran: list[str] = []
    release = asyncio.Event()
    winner_inside = asyncio.Event()
    order: list[str] = []

    async def winner() -> None:
        async with flight.claim("wrun_1", "step_1") as claim:
            assert claim.won
            winner_inside.set()
            await release.wait()
            ran.append("winner")
        order.append("winner settled")

    async def loser() -> None:
        await winner_inside.wait()
        async with flight.claim("wrun_1", "step_1") as claim:
            order.append("loser resumed")
            if claim.won:
                ran.append("loser")

    tasks = [asyncio.create_task(winner()), asyncio.create_task(loser())]
    await winner_inside.wait()
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == [], "the loser must not go on (and ack) before the winner settles"
    release.set()
    await asyncio.gather(*tasks)
    assert ran == ["winner"]
    assert order == ["winner settled", "loser resumed"]
    assert flight.absorbed == 1
    assert not flight.running("wrun_1", "step_1")


async def test_keys_are_per_run_and_step() -> None:
    flight = SingleFlight()
    first = flight.claim("wrun_1", "step_1")
    other_step = flight.claim("wrun_1", "step_2")
    other_run = flight.claim("wrun_2", "step_1")
    async with first as a, other_step as b, other_run as c:
        assert a.won and b.won and c.won


async def test_a_failing_winner_still_releases_the_loser() -> None:
    flight = SingleFlight()
    inside = asyncio.Event()

    async def winner() -> None:
        async with flight.claim("wrun_1", "step_1"):
            inside.set()
            await asyncio.sleep(0)
            raise RuntimeError("body failed")

    async def loser() -> bool:
        await inside.wait()
        async with flight.claim("wrun_1", "step_1") as claim:
            return claim.won

    first = asyncio.create_task(winner())
    second = asyncio.create_task(loser())
    with pytest.raises(RuntimeError):
        await first
    assert await second is False
    async with flight.claim("wrun_1", "step_1") as fresh:
        assert fresh.won, "a settled key is free again"
