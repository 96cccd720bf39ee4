"""``treadle migrate`` against a real, empty PostgreSQL database."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from treadle.worlds.postgres.migrate import latest_version


async def _treadle(*args: str, dsn: str) -> tuple[int, str, str]:
    env = {**os.environ, "TREADLE_DATABASE_URL": dsn}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "treadle.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_migrate_applies_once_then_reports_up_to_date(empty_dsn: str) -> None:
    """The first run applies every migration; the second has nothing to do."""
    code, out, err = await _treadle("migrate", "--json", dsn=empty_dsn)
    assert code == 0, err
    assert json.loads(out)["applied"] == list(range(1, latest_version() + 1))
    code, out, err = await _treadle("migrate", dsn=empty_dsn)
    assert code == 0, err
    assert out.strip() == "the schema is up to date"


async def test_migrate_without_a_database_is_a_usage_error(empty_dsn: str) -> None:
    """No DSN anywhere: one line, exit 2, and the DSN is never printed."""
    code, _, err = await _treadle("migrate", dsn="")
    assert code == 2
    assert err.strip() == (
        "treadle: error: migrate needs TREADLE_DATABASE_URL, TREADLE_DATABASE_URL_FILE or "
        "--database-url-file"
    )
    assert "Traceback" not in err
