"""Local World hygiene: private files, no symlink following, exact run ids, unforgeable
log lines (issue 16 item 7; security.md L2 and L3).

L2: the directory was 0755 and the database 0644 under umask 022 (run inputs, outputs
and stack traces readable by every user), and ``ln -s VICTIM DIR/treadle.lock``
made the next worker truncate VICTIM and write its pid there. L3: ``is_run_id``
took a trailing newline, and a run id carried by a message forged a log line.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.conftest import Cli, cli, one_error_line

from treadle import errors, redaction
from treadle.world import ids, messages, storagerules
from treadle.worlds.local import LocalWorld
from treadle.worlds.local.database import DATABASE_FILE, INIT_LOCK_FILE, LOCK_FILE

__all__ = ["cli"]

RUN_ID = "wrun_01M8NPS8NKDA2Y6C0CEF99NY7Z"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The review's umask 022: what a fresh file gets unless treadle says otherwise."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


async def _ack(message: object, meta: object) -> messages.HandlerResult:
    return messages.ACK


async def _serve(world: LocalWorld) -> None:
    """Take the consumer lock as a worker does (an idle consumer), then stop it."""
    consumer = await world.queue.consume({"step": _ack})
    await consumer.close(grace_seconds=0)


@pytest.mark.usefixtures("loose_umask")
async def test_a_new_local_world_is_private_to_its_owner(tmp_path: Path) -> None:
    """Directory 0700; the db, its -wal and -shm and both lock files 0600; a .gitignore."""
    world = await LocalWorld(tmp_path / "w").open()
    try:
        await world.runs.create(workflow_name="wf", input=None, deployment_id="d", spec_version=9)
        await _serve(world)
        directory = tmp_path / "w"
        assert mode(directory) == 0o700
        names = [DATABASE_FILE, f"{DATABASE_FILE}-wal", f"{DATABASE_FILE}-shm"]
        for name in [*names, LOCK_FILE, INIT_LOCK_FILE]:
            assert (directory / name).exists(), name
            assert mode(directory / name) == 0o600, name
        assert (directory / ".gitignore").read_text().splitlines()[-1] == "*"
    finally:
        await world.close()


@pytest.mark.usefixtures("loose_umask")
async def test_an_older_world_is_tightened_when_its_owner_opens_it(tmp_path: Path) -> None:
    world = await LocalWorld(tmp_path / "w").open()
    await _serve(world)
    await world.close()
    directory = tmp_path / "w"
    os.chmod(directory, 0o755)
    for name in (DATABASE_FILE, LOCK_FILE):
        os.chmod(directory / name, 0o644)
    world = await LocalWorld(directory).open()
    try:
        await _serve(world)
        assert mode(directory) == 0o700
        assert mode(directory / DATABASE_FILE) == 0o600
        assert mode(directory / LOCK_FILE) == 0o600
    finally:
        await world.close()


async def test_a_symlink_at_the_lock_path_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    world = await LocalWorld(tmp_path / "w").open()
    await world.close()
    victim = tmp_path / "VICTIM"
    victim.write_text("IMPORTANT CONTENT")
    (tmp_path / "w" / LOCK_FILE).symlink_to(victim)
    world = await LocalWorld(tmp_path / "w").open()
    try:
        with pytest.raises(errors.StorageUnavailable, match="is a symbolic link"):
            await _serve(world)
    finally:
        await world.close()
    assert victim.read_text() == "IMPORTANT CONTENT"


def test_the_cli_refuses_a_planted_lock_symlink_in_one_line(cli: Cli, tmp_path: Path) -> None:
    """The review's attack through ``treadle run``: one clear error, VICTIM intact."""
    victim = tmp_path / "VICTIM"
    victim.write_text("IMPORTANT CONTENT")
    (tmp_path / "w" / LOCK_FILE).symlink_to(victim)
    result = cli("run", "flows.py:hi", "--input", '{"name": "x"}')
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'w' / LOCK_FILE} is a symbolic link" in one_error_line(result)
    assert victim.read_text() == "IMPORTANT CONTENT"


async def test_a_symlink_at_the_database_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir(mode=0o700)
    (tmp_path / "elsewhere.db").write_bytes(b"")
    (tmp_path / "w" / DATABASE_FILE).symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(errors.StorageUnavailable, match="is a symbolic link"):
        await LocalWorld(tmp_path / "w").open()


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another uid owns needs root")
async def test_a_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    os.chown(tmp_path / "w", 12345, 12345)
    with pytest.raises(errors.StorageUnavailable, match="belongs to uid 12345"):
        await LocalWorld(tmp_path / "w").open()


def test_a_run_id_must_match_exactly() -> None:
    """``re.match`` with ``$`` took ``wrun_...\\n``; fullmatch takes exactly the id."""
    assert ids.is_run_id(RUN_ID)
    for bad in (f"{RUN_ID}\n", f" {RUN_ID}", f"{RUN_ID}Z", RUN_ID.lower(), "wrun_", 7):
        assert not ids.is_run_id(bad), repr(bad)
    with pytest.raises(errors.WorldContractError, match="is not a run id"):
        storagerules.check_run_id(f"{RUN_ID}\n")


def test_the_cli_refuses_a_run_id_with_a_trailing_newline(cli: Cli) -> None:
    result = cli("runs", "get", f"{RUN_ID}\n")
    assert result.returncode == 2
    assert f"{RUN_ID!r}"[:-1] + "\\n' is not a run id" in one_error_line(result)


def test_a_newline_in_a_logged_value_cannot_forge_a_line(caplog: pytest.LogCaptureFixture) -> None:
    """Every treadle logger: an argument holding a newline is quoted, whatever the call."""
    forged = "x\ntreadle worker: stopping (forged log line)"
    with caplog.at_level(logging.INFO):
        logging.getLogger("treadle.orchestrator").warning("run %s: names no run", forged)
        logging.getLogger("treadle.worlds.nats").info("%s", ValueError(forged))
        logging.getLogger("treadle.x").info("run %s: fine", RUN_ID)
    lines = [r.getMessage() for r in caplog.records]
    assert all("\n" not in line for line in lines), lines
    assert lines[0] == "run 'x\\ntreadle worker: stopping (forged log line)': names no run"
    assert lines[2] == f"run {RUN_ID}: fine"
    assert redaction.quote("a\rb") == "'a\\rb'"
