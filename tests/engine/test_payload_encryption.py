"""Payload encryption at rest (issue 16 item 4), end to end on both Worlds.

With ``TREADLE_PAYLOAD_KEY`` set, run inputs, step arguments and results, hook
payloads and outputs reach the World only as AES-GCM envelopes: the tests read the
World's own storage (every file of the local World; every row of the run in the
Postgres tables) and find none of the values' plaintext. A run started before a key
rotation replays after it: its old values open under the old key, new ones are
sealed under the new one.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import asyncpg

from treadle import Hook, payloads
from treadle.world import events

from .conftest import BOTH_FORMATS, MakeApp
from .test_hooks_and_waits import _wait_for_hook

pytestmark = BOTH_FORMATS

K1 = "k1:" + base64.b64encode(bytes(range(32))).decode()
K2 = "k2:" + base64.b64encode(bytes(range(50, 82))).decode()
CARD = "4111-SECRET-CARD"
NOTE = "HOOK-SECRET-NOTE"


class Signed(Hook):
    note: str


async def _stored_text(app: Any, run_id: str, tmp: Path) -> str:
    """Everything the World stores, as text: the local World's files, or the run's rows."""
    world = await app.world()
    world = getattr(world, "_world", world)  # make_app's lazily opened World, unwrapped
    storage = getattr(world, "storage", None)
    if storage is None:  # the local World: every file under its directory
        files = [p for p in (tmp / "world").rglob("*") if p.is_file()]
        assert files, "the local World's files were read"
        return "".join(p.read_bytes().decode("latin-1") for p in files)
    conn = await asyncpg.connect(storage._db.dsn)
    try:
        rows = []
        for table in ("treadle_runs", "treadle_events", "treadle_steps", "treadle_hooks"):
            rows += await conn.fetch(f"SELECT t::text FROM {table} t WHERE run_id = $1", run_id)
        assert rows, "the run's rows were read"
        return "\n".join(r[0] for r in rows)
    finally:
        await conn.close()


def _kids(log: list[events.LoggedEvent]) -> dict[str, set[str]]:
    """Which key ids sealed the values of each event type."""
    found: dict[str, set[str]] = {}

    def walk(data: Any, kind: str) -> None:
        if payloads.is_envelope(data):
            found.setdefault(kind, set()).add(data["kid"])
        elif isinstance(data, dict):
            for v in data.values():
                walk(v, kind)
        elif isinstance(data, list):
            for v in data:
                walk(v, kind)

    for e in log:
        walk(e.event.model_dump(mode="json"), e.type)
    return found


async def test_every_value_reaches_the_world_sealed_and_the_run_completes(
    make_app: MakeApp, tmp_path: Path
) -> None:
    app = make_app(TREADLE_PAYLOAD_KEY=K1)

    @app.step
    async def charge(card: str) -> dict[str, str]:
        return {"receipt": f"paid with {card}"}

    @app.workflow
    async def checkout(card: str) -> dict[str, str]:
        receipt = await charge(card)
        signed = await Signed.wait(token="sign:1")
        assert signed is not None
        return {**receipt, "note": signed.note}

    run = await app.start(checkout, CARD)
    await _wait_for_hook(app, "sign:1")
    await app.resume_hook("sign:1", {"note": NOTE})
    assert await run.result(timeout=20) == {"receipt": f"paid with {CARD}", "note": NOTE}

    stored = await _stored_text(app, run.run_id, tmp_path)
    assert run.run_id in stored  # the storage was really read
    for secret in (CARD, NOTE, "paid with"):
        assert secret not in stored, f"{secret!r} is stored in plaintext"
    kids = _kids(await run.events())
    for kind in ("run_created", "step_completed", "hook_received", "run_completed"):
        assert kids.get(kind) == {"k1"}, (kind, kids)


async def test_a_run_started_before_a_key_rotation_replays_after_it(make_app: MakeApp) -> None:
    def build(app: Any) -> Any:
        @app.step
        async def charge(card: str) -> str:
            return f"paid with {card}"

        @app.workflow
        async def checkout(card: str) -> str:
            receipt = await charge(card)
            signed = await Signed.wait(token="sign:2")
            assert signed is not None
            return f"{receipt}; {signed.note}"

        return checkout

    before = make_app(TREADLE_PAYLOAD_KEY=K1)
    run = await before.start(build(before), CARD)
    await _wait_for_hook(before, "sign:2")
    await before.close(grace_seconds=2)
    await before._world_arg.close()  # type: ignore[union-attr]  # the process is gone

    after = make_app(TREADLE_PAYLOAD_KEY=f"{K2},{K1}")  # k2 encrypts now; k1 still decrypts
    build(after)
    await after.resume_hook("sign:2", {"note": NOTE})
    # The replay opens the input and the step result sealed under k1.
    assert await after.get_run(run.run_id).result(timeout=20) == f"paid with {CARD}; {NOTE}"
    kids = _kids(await after.get_run(run.run_id).events())
    assert kids["run_created"] == {"k1"} and kids["step_completed"] == {"k1"}
    assert kids["hook_received"] == {"k2"} and kids["run_completed"] == {"k2"}
