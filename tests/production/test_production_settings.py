"""Opening the production World from settings: URLs or mounted secret files, never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle import errors, settings
from treadle.worlds import open_world

from ..nats.conftest import NatsServer


async def test_the_urls_can_come_from_mounted_secret_files(
    pg_dsn: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    """TREADLE_DATABASE_URL_FILE and TREADLE_NATS_URL_FILE, as a Kubernetes secret mount."""
    (tmp_path / "db").write_text(pg_dsn + "\n")
    (tmp_path / "nats").write_text(nats_server.url + "\n")
    config = settings.load(
        {},
        TREADLE_WORLD="postgres",
        TREADLE_DATABASE_URL_FILE=str(tmp_path / "db"),
        TREADLE_NATS_URL_FILE=str(tmp_path / "nats"),
        TREADLE_DEPLOYMENT_ID="from-files",
    )
    world = await open_world("postgres", settings=config)
    try:
        run = await world.runs.create(
            workflow_name="wf", input=None, deployment_id="from-files", spec_version=9
        )
        assert (await world.runs.get(run.run_id)).deployment_id == "from-files"
    finally:
        await world.close()


async def test_missing_urls_are_named() -> None:
    """Without either URL the error names both settings and their _FILE forms."""
    with pytest.raises(errors.SettingsError, match="TREADLE_DATABASE_URL_FILE"):
        await open_world("postgres", settings=settings.load({}))


async def test_an_unreachable_database_is_a_clear_error_without_the_password() -> None:
    """The error names host and port, never the credentials in the URL."""
    config = settings.load(
        {},
        TREADLE_DATABASE_URL="postgresql://treadle:topsecret@127.0.0.1:1/db",
        TREADLE_NATS_URL="nats://127.0.0.1:2",
    )
    with pytest.raises(errors.StorageUnavailable) as failure:
        await open_world("postgres", settings=config)
    assert "topsecret" not in str(failure.value)
    assert "127.0.0.1" in str(failure.value)
    assert str(config.TREADLE_DATABASE_URL) == "**********"


async def test_an_empty_secret_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "db").write_text("")
    config = settings.load(
        {}, TREADLE_DATABASE_URL_FILE=str(tmp_path / "db"), TREADLE_NATS_URL="nats://x:1"
    )
    with pytest.raises(errors.SettingsError, match="is empty"):
        await open_world("postgres", settings=config)
