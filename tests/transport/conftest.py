"""Fixtures for the transport tests: certificates, a locked-down nats-server and PostgreSQL.

Kept apart from ``tests/nats`` and ``tests/postgres`` so that their session
servers stay as fast and open as they are: the servers here start only when a
test of this folder asks for them, once per session, each in a second or two.
When a server cannot start, the tests using it are skipped with the reason.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..nats import natsserver
from ..postgres import pgserver
from . import certs, securenats, securepg


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def secure_nats(
    tmp_path_factory: pytest.TempPathFactory, pki: certs.Pki
) -> Iterator[securenats.SecureNats]:
    """nats-server with accounts, per-user permissions and TLS requiring client certificates."""
    try:
        server = securenats.start(tmp_path_factory.mktemp("secure-nats"), pki)
    except natsserver.ServerUnavailable as exc:
        print(exc)
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def token_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[securenats.SecureNats]:
    """nats-server admitting only one token."""
    try:
        server = securenats.start_token_server(tmp_path_factory.mktemp("token-nats"))
    except natsserver.ServerUnavailable as exc:
        print(exc)
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def creds_nats(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[securenats.SecureNats, Path]]:
    """nats-server in operator mode (JWT accounts) and a worker's ``.creds`` file."""
    try:
        server, creds = securenats.start_creds_server(tmp_path_factory.mktemp("creds-nats"))
    except natsserver.ServerUnavailable as exc:
        print(exc)
        pytest.skip(str(exc))
    try:
        yield server, creds
    finally:
        server.stop()


@pytest.fixture(scope="session")
def secure_pg(
    tmp_path_factory: pytest.TempPathFactory, pki: certs.Pki
) -> Iterator[securepg.SecurePostgres]:
    """PostgreSQL admitting only ``hostssl ... scram-sha-256``, with treadle's roles."""
    # Not under tmp_path: as root the server runs as nobody, who cannot enter pytest's 0700
    # base directory (tests/postgres/conftest.py does the same).
    directory = Path(tempfile.mkdtemp(prefix="treadle-securepg-"))
    directory.chmod(0o755)
    try:
        server = securepg.start(directory / "pg", pki)
    except (pgserver.ServerUnavailable, OSError) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        print(f"the TLS PostgreSQL did not start: {exc}")
        pytest.skip(f"the TLS PostgreSQL did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
