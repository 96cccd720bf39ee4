"""Conformance of ``world.limits`` (``contract.LimitStore``, rules in ``limitrules``).

At most ``max`` holders per (scope, key), also under concurrent acquires; waiters by
priority then arrival; an acquire idempotent per holder; a release hands back the
admissible waiters; a holder whose run ended (or whose step has its outcome) holds
nothing; a rate reserves one start per interval and keeps a holder's reservation.
Subclass ``LimitConformance`` as ``Test...`` with a ``harness`` fixture.
"""

from __future__ import annotations

import asyncio

from treadle import clock
from treadle.world import contract, limitrules
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness


def _limits(world: contract.World) -> contract.LimitStore:
    found = getattr(world, "limits", None)
    assert isinstance(found, contract.LimitStore), "the World keeps no limits"
    return found


def _claim(scope: str, run_id: str, *, key: str = "k", max_: int = 1, priority: int = 0,
           holder: str | None = None, kind: limitrules.HolderKind = "workflow",
           ) -> limitrules.Claim:  # fmt: skip
    return limitrules.Claim(
        scope, key, max_, holder or run_id, run_id, kind, priority, f'{{"w": "{run_id}"}}'
    )


async def _runs(world: contract.World, n: int) -> list[str]:
    return [(await support.new_run(world)).run_id for _ in range(n)]


class LimitConformance:
    async def test_max_holders_then_waiters_by_priority_and_arrival(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            limits, scope = _limits(world), support.unique("workflow:w")
            now = clock.now_ms()
            a, b, c, d, e = await _runs(world, 5)
            assert (await limits.acquire(_claim(scope, a, max_=2), now_ms=now)).held
            assert (await limits.acquire(_claim(scope, b, max_=2), now_ms=now)).held
            assert (await limits.acquire(_claim(scope, a, max_=2), now_ms=now)).held  # again
            waits = [
                await limits.acquire(_claim(scope, r, max_=2, priority=p), now_ms=now)
                for r, p in ((c, 0), (d, 3), (e, 0))
            ]
            assert [(w.held, w.position) for w in waits] == [(False, 1), (False, 1), (False, 3)]
            shown = await limits.waiting([c, d, e], now_ms=now)
            assert {r: shown[r].position for r in (c, d, e)} == {d: 1, c: 2, e: 3}
            assert shown[c].key == "k"
            assert shown[c].scope == scope
            wakes = await limits.release(a)
            assert [(w.run_id, w.message) for w in wakes] == [(d, f'{{"w": "{d}"}}')]
            swept = await limits.sweep(now_ms=now, limit=10_000)  # the same wait, again
            assert [w.key for w in swept if w.run_id == d] == [wakes[0].key]
            assert not (await limits.acquire(_claim(scope, c, max_=2), now_ms=now)).held
            assert (await limits.acquire(_claim(scope, d, max_=2), now_ms=now)).held
            assert d not in await limits.waiting([d], now_ms=now)

    async def test_concurrent_acquires_never_pass_max(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            limits, scope = _limits(world), support.unique("workflow:w")
            runs = await _runs(world, 12)
            got = await asyncio.gather(
                *(limits.acquire(_claim(scope, r, max_=3), now_ms=clock.now_ms()) for r in runs)
            )
            assert sum(a.held for a in got) == 3
            assert sorted(a.position for a in got if not a.held) == list(range(1, 10))

    async def test_an_ended_run_holds_nothing(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            limits, scope = _limits(world), support.unique("workflow:w")
            holder, ended_waiter, waiter = await _runs(world, 3)
            now = clock.now_ms()
            assert (await limits.acquire(_claim(scope, holder), now_ms=now)).held
            assert not (await limits.acquire(_claim(scope, ended_waiter), now_ms=now)).held
            assert not (await limits.acquire(_claim(scope, waiter), now_ms=now)).held
            await support.end_run(world, ended_waiter, "cancelled")
            await support.end_run(world, holder, "failed")
            wakes = await limits.sweep(now_ms=now, limit=10_000)  # no release was called: backstop
            assert [w.run_id for w in wakes if w.run_id in (holder, ended_waiter, waiter)] == [
                waiter
            ]
            assert (await limits.acquire(_claim(scope, waiter), now_ms=now)).held

    async def test_a_step_with_its_outcome_holds_nothing(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            limits, scope = _limits(world), support.unique("step:s")
            run_id = await support.started_run(world)
            other = await support.started_run(world)
            step = support.unique("step")
            await support.in_band(world, run_id, support.step_created(step))
            mine = limitrules.step_holder(run_id, step)
            now = clock.now_ms()
            assert (await limits.acquire(_claim(scope, run_id, holder=mine, kind="step"),
                                         now_ms=now)).held  # fmt: skip
            theirs = _claim(scope, other, holder=limitrules.step_holder(other, "x"), kind="step")
            assert not (await limits.acquire(theirs, now_ms=now)).held
            await support.out_of_band(world, run_id, support.step_completed(step))
            assert (await limits.acquire(theirs, now_ms=now)).held

    async def test_a_rate_spaces_reservations_and_keeps_each(self, harness: WorldHarness) -> None:
        async with support.opened(harness) as world:
            limits, scope = _limits(world), support.unique("workflow:r")
            runs = await _runs(world, 4)
            now = clock.now_ms()

            def claim(run_id: str) -> limitrules.RateClaim:
                return limitrules.RateClaim(scope, "k", run_id, run_id, "workflow", 100, burst=2)

            got = [await limits.reserve(claim(r), now_ms=now) for r in runs]
            assert [g - now for g in got] == [0, 0, 100, 200]
            assert await limits.reserve(claim(runs[3]), now_ms=now + 50) == got[3]  # kept
            shown = await limits.waiting(runs, now_ms=now)
            assert shown[runs[3]].limit == "rate"
            assert runs[0] not in shown
            await limits.release(runs[3])
            assert await limits.reserve(claim(runs[3]), now_ms=now) == now + 300
