"""``treadle dead-letters list|requeue|drop`` as a user runs it, on both Worlds.

Issue 10 item 3 (poison messages go to a dead letter, never retried for ever);
security.md M1. A dead letter is made the way production makes one (a worker's
consumer meets a payload that is not a treadle message), then the command lists
it, requeues one and drops another, in its own process.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from treadle.world import ids
from treadle.world.conformance import queue as conformance
from treadle.world.conformance.queue import FAST, WAIT_SECONDS, Recorder
from treadle.worlds.local import LocalWorld
from treadle.worlds.nats import NatsQueue, names

from ..nats.conftest import nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server
from .conftest import Cli, make_cli, one_error_line

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]

DEPLOYMENT = "deadletters-cli"


async def _until_dead(queue: Any, wanted: set[str]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not wanted <= {d.message_id for d in await queue.dead_letters(limit=1000)}:
        assert time.monotonic() < deadline, "the messages never became dead letters"
        await asyncio.sleep(0.05)  # polling the queue: no event announces a burial


async def _local_dead_letters(path: Path, count: int) -> list[str]:
    """``count`` unreadable messages in the local World at ``path``, made dead letters by
    a consumer meeting them."""
    world = await LocalWorld(path, tuning=FAST).open()
    try:
        sent = [
            (await world.queue.send(conformance.step_message())).message_id for _ in range(count)
        ]

        def garble(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("UPDATE queue_messages SET payload = '[[[ not json'")

        await world.local_queue.db.call(garble)
        consumer = await world.queue.consume({"step": Recorder()})
        try:
            await _until_dead(world.local_queue, set(sent))
        finally:
            await consumer.close(grace_seconds=2)
    finally:
        await world.close()
    return sent


async def _nats_dead_letters(url: str, count: int) -> list[str]:
    queue = await NatsQueue.connect(url, deployment_id=DEPLOYMENT, tuning=FAST)
    sent = [f"msg_{ids.new_run_id()[5:]}" for _ in range(count)]
    try:
        for message_id in sent:
            subject = queue.names.subject("step", None, ids.new_run_id())
            await queue.js.publish(subject, b"[[[ not json", headers={names.MESSAGE_ID: message_id})
        consumer = await queue.consume({"step": Recorder()})
        try:
            await _until_dead(queue, set(sent))
        finally:
            await consumer.close(grace_seconds=2)
    finally:
        await queue.close()
    return sent


@pytest.fixture(params=["local", "postgres+nats"])
def world_cli(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Cli, list[str]]:
    """A ``Cli`` on the World under test, and the ids of two dead letters in it."""
    runner = make_cli(tmp_path)
    if request.param == "local":
        dead = asyncio.run(_local_dead_letters(tmp_path / "w", 2))
    else:
        url = request.getfixturevalue("nats_server").url
        runner.world = "postgres"
        runner.env = {
            "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
            "TREADLE_NATS_URL": url,
            "TREADLE_DEPLOYMENT_ID": DEPLOYMENT,
        }
        dead = asyncio.run(_nats_dead_letters(url, 2))
    return runner, dead


def _listed(cli: Cli) -> dict[str, dict[str, Any]]:
    return {d["message_id"]: d for d in cli.json("dead-letters", "list", "--limit", "1000")}


def test_dead_letters_list_requeue_and_drop(world_cli: tuple[Cli, list[str]]) -> None:
    """list shows both with their reason; requeue sends one back (it dies again, being
    unreadable, and is listed again with a delivery count from zero); drop deletes one
    for good; both then refuse an id that is not dead, exit 2."""
    cli, (first, second) = world_cli
    listed = _listed(cli)
    assert {first, second} <= set(listed)
    assert listed[first]["kind"] == "unknown"
    assert "not a treadle message" in listed[first]["error"]
    table = cli("dead-letters", "list")
    assert table.returncode == 0 and first in table.stdout and "LAST ERROR" in table.stdout

    dropped = cli("dead-letters", "drop", second)
    assert dropped.returncode == 0, dropped.stderr
    assert f"dead letter {second} dropped" in dropped.stdout
    assert second not in _listed(cli)

    requeued = cli.json("dead-letters", "requeue", first)
    assert requeued == {"message_id": first, "requeued": True}
    assert first not in _listed(cli)  # back in the queue, waiting for a consumer

    missing = cli("dead-letters", "drop", second)
    assert missing.returncode == 2
    assert f"no dead letter with message id {second!r}" in one_error_line(missing)
    again = cli("dead-letters", "requeue", second)
    assert again.returncode == 2 and "no dead letter" in one_error_line(again)


def test_dead_letters_list_refuses_a_bad_limit(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    result = cli("dead-letters", "list", "--limit", "0")
    assert result.returncode == 2
    assert "--limit must be at least 1" in one_error_line(result)
    empty = cli("dead-letters", "list")
    assert empty.returncode == 0 and "no dead letters" in empty.stderr
