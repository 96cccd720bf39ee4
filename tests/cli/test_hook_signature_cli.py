"""``treadle hooks resume TOKEN --signature HEX`` for a hook created with
``require_signature=True`` (issue 16 item 8): refused without it, in one line, and
nothing recorded; resumed with it."""

from __future__ import annotations

import asyncio
import json
import time

from tests.cli.conftest import Cli, one_error_line

from treadle import hook_signature
from treadle.errors import HookNotFound
from treadle.worlds import open_world

KEY = "cli-hook-key"
SIGNED = """
from treadle import Hook, Workflows

app = Workflows()


class Approval(Hook):
    approved: bool


@app.workflow
async def signed(token: str) -> bool:
    got = await Approval.wait(token=token, require_signature=True)
    return bool(got and got.approved)
"""


async def _hook_is_live(world_url: str, token: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    world = await open_world(world_url)
    try:
        while True:
            try:
                await world.hooks.get_by_token(token)
                return
            except HookNotFound:
                assert time.monotonic() < deadline, "the hook was never created"
                await asyncio.sleep(0.05)  # another process's progress: no event to await
    finally:
        await world.close()


def test_a_signed_hook_is_resumed_only_with_its_signature(cli: Cli) -> None:
    (cli.cwd / "signed.py").write_text(SIGNED)
    cli.env["TREADLE_HOOK_KEY"] = KEY
    runner = cli.background("run", "signed.py:signed", "--input", '{"token": "t-1"}', "-q")
    asyncio.run(_hook_is_live(cli.world, "t-1"))

    refused = cli("hooks", "resume", "t-1", "--payload", '{"approved": true}')
    assert refused.returncode == 2, refused.stderr
    assert "resume_hook('t-1') refused: the hook requires a signature" in one_error_line(refused)
    wrong = cli("hooks", "resume", "t-1", "--payload", "{}", "--signature", "ab" * 32)
    assert "the signature does not match" in one_error_line(wrong)
    [run] = cli.json("runs", "list")
    assert "hook_received" not in [e["type"] for e in cli.json("inspect", run["run_id"])["events"]]

    signature = hook_signature("t-1", KEY)
    resumed = cli(
        "hooks", "resume", "t-1", "--payload", '{"approved": true}', "--signature", signature
    )
    assert resumed.returncode == 0, resumed.stderr
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert json.loads(out) is True
