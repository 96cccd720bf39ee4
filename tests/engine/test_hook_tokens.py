"""Hook tokens: minted, namespaced, signed; on both Worlds (issue 16 item 8).

security.md L1: tokens were user-chosen (the README derived them from input), global
to the World and first-come, so a run could squat another's token, and anything that
exposed ``resume_hook`` behind a route let whoever guessed a token resume it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from treadle import Hook, HookSignatureInvalid, create_hook, hook_signature, hooktokens
from treadle.errors import HookNotFound

from .conftest import MakeApp, OpenWorld

KEY = "k3y-the-app-holds"


class Approval(Hook):
    approved: bool


def _app_with_flows(make_app: MakeApp, world: Any = None, **settings: Any) -> Any:
    """An app with the workflows below; ``announced`` receives each hook's token."""
    app = make_app(world=world, **settings)
    announced: asyncio.Queue[str] = asyncio.Queue()
    app.announced = announced

    @app.step
    async def announce(token: str) -> str:
        announced.put_nowait(token)
        return token

    @app.workflow
    async def minted(signed: bool) -> list[Any]:
        hook = create_hook(require_signature=signed)
        await announce(hook.token)
        payload = await hook.payload()
        return [hook.token, payload]

    @app.workflow
    async def chosen(token: str) -> bool:
        got = await Approval.wait(token=token)
        return bool(got and got.approved)

    return app


async def _live_hook_count(app: Any, run: Any) -> int:
    return [e.event.type for e in await run.events()].count("hook_received")


async def test_create_hook_without_a_token_mints_128_random_bits(make_app: MakeApp) -> None:
    app = _app_with_flows(make_app)
    first = await app.start("minted", False)
    second = await app.start("minted", False)
    tokens = {await app.announced.get(), await app.announced.get()}
    assert len(tokens) == 2
    assert all(re.fullmatch(r"hk_[0-9a-f]{32}", t) for t in tokens), tokens
    for n, token in enumerate(sorted(tokens)):
        await app.resume_hook(token, {"n": n})
    results = [await run.result(timeout=20) for run in (first, second)]
    assert sorted(r[0] for r in results) == sorted(tokens)
    assert all(r[1] == {"n": sorted(tokens).index(r[0])} for r in results)


async def test_a_minted_signed_hook_replays_after_a_worker_restart(
    make_app: MakeApp, open_world: OpenWorld
) -> None:
    """The token comes from the log on replay: a new worker (after the first stopped)
    sees the same token, takes the signed resume, and the run completes without a
    divergence; the resume without a signature wrote nothing."""
    world = await open_world()
    try:
        before = _app_with_flows(make_app, world, TREADLE_HOOK_KEY=KEY)
        run = await before.start("minted", True)
        token = await before.announced.get()
        await before.close(grace_seconds=2)

        after = _app_with_flows(make_app, world, TREADLE_HOOK_KEY=KEY)
        with pytest.raises(HookSignatureInvalid, match="requires a signature"):
            await after.resume_hook(token, {"ok": 1})
        with pytest.raises(HookSignatureInvalid, match="does not match"):
            await after.resume_hook(token, {"ok": 1}, signature=hook_signature(token, "other"))
        assert await _live_hook_count(after, run) == 0
        assert (await world.hooks.get_by_token(token)).run_id == run.run_id
        assert after.hook_signature(token) == hook_signature(token, KEY)
        await after.resume_hook(token, {"ok": 1}, signature=hook_signature(token, KEY))
        assert await after.get_run(run.run_id).result(timeout=20) == [token, {"ok": 1}]
        types = [e.event.type for e in await run.events()]
        assert types.count("hook_created") == 1 and types.count("hook_received") == 1
    finally:
        await world.close()


async def test_a_signature_is_required_only_where_the_app_asks(make_app: MakeApp) -> None:
    """An unsigned hook resumes as before; a wrong signature given anyway is refused."""
    app = _app_with_flows(make_app, TREADLE_HOOK_KEY=KEY)
    run = await app.start("chosen", "plain-token")
    await _hook_is_live(app, "plain-token")
    with pytest.raises(HookSignatureInvalid):
        await app.resume_hook("plain-token", {"approved": True}, signature="00")
    await app.resume_hook("plain-token", {"approved": True})
    assert await run.result(timeout=20) is True


async def test_namespaces_keep_one_token_apart_across_deployments(
    make_app: MakeApp, open_world: OpenWorld
) -> None:
    """Two deployments sharing a World, each with its namespace: the same chosen token
    is two hooks (stored NS/token), each resumed by its own side; before, the second
    run failed with HookConflictError."""
    world = await open_world()
    try:
        team_a = _app_with_flows(make_app, world, TREADLE_HOOK_TOKEN_NAMESPACE="team-a")
        run_a = await team_a.start("chosen", "approve:o-1")
        await _hook_is_live(team_a, "team-a/approve:o-1")
        await team_a.close(grace_seconds=2)

        team_b = _app_with_flows(make_app, world, TREADLE_HOOK_TOKEN_NAMESPACE="team-b")
        run_b = await team_b.start("chosen", "approve:o-1")
        await _hook_is_live(team_b, "team-b/approve:o-1")
        await team_b.resume_hook("approve:o-1", {"approved": False})
        assert await run_b.result(timeout=20) is False
        await team_b.close(grace_seconds=2)

        plain = _app_with_flows(make_app, world)
        with pytest.raises(HookNotFound):
            await plain.resume_hook("approve:o-1", {"approved": True})
        await plain.close(grace_seconds=2)

        team_a_again = _app_with_flows(make_app, world, TREADLE_HOOK_TOKEN_NAMESPACE="team-a")
        await team_a_again.resume_hook("approve:o-1", {"approved": True})
        assert await team_a_again.get_run(run_a.run_id).result(timeout=20) is True
    finally:
        await world.close()


async def _hook_is_live(app: Any, stored: str, timeout: float = 20) -> None:
    world = await app.world()
    async with asyncio.timeout(timeout):
        while True:
            try:
                await world.hooks.get_by_token(stored)
                return
            except HookNotFound:
                await asyncio.sleep(0.02)  # another task's progress, seen through the World


def test_a_replay_keeps_the_recorded_token_across_a_namespace_change() -> None:
    """Changing TREADLE_HOOK_TOKEN_NAMESPACE never makes a run in flight diverge."""
    assert hooktokens.resolve("t", "new", "old/t") == "old/t"
    assert hooktokens.resolve("t", "new", "t") == "t"
    assert hooktokens.resolve("t", "new", None) == "new/t"
    assert hooktokens.resolve("t", None, "other") == "t"  # a real divergence stays one
    minted = "ns/hk_" + "a" * 32
    assert hooktokens.resolve(None, "ns", minted) == minted
    assert hooktokens.bare(minted) == "hk_" + "a" * 32
    with pytest.raises(ValueError, match="must be 1 to 64"):
        hooktokens.check_namespace("a/b")
