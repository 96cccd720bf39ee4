"""Postgres TLS and SCRAM against a real TLS-only server (issue 16 item 3, review H2/L5).

The server (``securepg``) accepts only ``hostssl ... scram-sha-256`` (and a
client certificate from the operator's role) and has the three roles of
``docs/security-transport.md``. Each test opens the storage the way a worker
does, with ``PostgresTransport`` putting ``sslmode`` and the certificate files
into the DSN, and asserts a working connection or one clear ``WorldAuthFailed``
naming the setting (never the password).
"""

from __future__ import annotations

import re

import pytest

from treadle import errors, settings
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres.migrate import migrate
from treadle.worlds.transport import PostgresTransport, Transport

from ..postgres import pgserver
from ..postgres.conftest import pg_clones, pg_dsn, pg_server
from .certs import Pki
from .securepg import (
    INSPECTOR_PASSWORD,
    OPERATOR_PASSWORD,
    SUPERUSER_PASSWORD,
    WORKER_PASSWORD,
    SecurePostgres,
)

__all__ = ["pg_clones", "pg_dsn", "pg_server"]


def verified(pki: Pki, **more: str) -> PostgresTransport:
    return PostgresTransport(sslmode="verify-full", sslrootcert=str(pki.ca), **more).check()


async def refused(dsn: str, transport: PostgresTransport) -> errors.WorldAuthFailed:
    with pytest.raises(errors.WorldAuthFailed) as caught:
        await PostgresStorage.connect(transport.dsn(dsn))
    message = str(caught.value)
    assert caught.value.server == "PostgreSQL"
    assert "localhost" in message
    for secret in (SUPERUSER_PASSWORD, WORKER_PASSWORD, OPERATOR_PASSWORD, "pg-s3cr3t"):
        assert secret not in message
    assert "\n" not in message
    return caught.value


async def test_the_worker_role_connects_with_verify_full(
    secure_pg: SecurePostgres, pki: Pki
) -> None:
    dsn = verified(pki).dsn(secure_pg.dsn("treadle_worker", WORKER_PASSWORD))
    async with await PostgresStorage.connect(dsn) as storage:
        record = await storage.deployments.register("pg-tls-check")
        assert record.deployment_id == "pg-tls-check"


async def test_a_wrong_password_is_one_clear_error(secure_pg: SecurePostgres, pki: Pki) -> None:
    failure = await refused(secure_pg.dsn("treadle_worker", "not-it"), verified(pki))
    assert "password authentication failed" in failure.what
    assert "TREADLE_DATABASE_URL" in failure.hint


async def test_a_plain_connection_to_a_tls_only_server_is_one_clear_error(
    secure_pg: SecurePostgres,
) -> None:
    failure = await refused(secure_pg.dsn(), PostgresTransport(sslmode="disable"))
    assert "no encryption" in failure.what
    assert "TREADLE_DATABASE_SSLMODE=verify-full" in failure.hint


async def test_a_server_certificate_from_another_ca_is_one_clear_error(
    secure_pg: SecurePostgres, pki: Pki
) -> None:
    transport = PostgresTransport(sslmode="verify-full", sslrootcert=str(pki.other_ca))
    failure = await refused(secure_pg.dsn(), transport)
    assert "certificate verify failed" in failure.what
    assert "TREADLE_DATABASE_SSLROOTCERT" in failure.hint


async def test_a_missing_certificate_file_is_a_settings_error_naming_it() -> None:
    config = settings.load(
        {"TREADLE_DATABASE_SSLMODE": "verify-full", "TREADLE_DATABASE_SSLROOTCERT": "/nope/ca.pem"}
    )
    with pytest.raises(
        errors.SettingsError, match=re.escape("TREADLE_DATABASE_SSLROOTCERT='/nope/ca.pem'")
    ):
        Transport.from_settings(config)
    with pytest.raises(errors.SettingsError, match="TREADLE_DATABASE_SSLMODE must be one of"):
        Transport.from_settings(settings.load({"TREADLE_DATABASE_SSLMODE": "on"}))


async def test_the_operator_role_needs_its_client_certificate(
    secure_pg: SecurePostgres, pki: Pki
) -> None:
    dsn = secure_pg.dsn("treadle_operator", OPERATOR_PASSWORD)
    failure = await refused(dsn, verified(pki))
    assert "certificate" in failure.what
    assert "TREADLE_DATABASE_SSLCERT" in failure.hint
    other = verified(pki, sslcert=str(pki.other_client_cert), sslkey=str(pki.other_client_key))
    # A certificate from another CA: under TLS 1.3 the server's refusal arrives after the
    # client's handshake is done, so the driver sees only a closed connection (the
    # server's log says why); still one StorageUnavailable line without the password.
    with pytest.raises(errors.StorageUnavailable) as caught:
        await PostgresStorage.connect(other.dsn(dsn))
    assert OPERATOR_PASSWORD not in str(caught.value)
    mine = verified(pki, sslcert=str(pki.client_cert), sslkey=str(pki.client_key))
    async with await PostgresStorage.connect(mine.dsn(dsn)) as storage:
        await storage.runs.list(limit=1)


async def test_the_inspector_role_reads_but_cannot_write(
    secure_pg: SecurePostgres, pki: Pki
) -> None:
    """The read-only role of the docs: every read the inspector needs, no write."""
    dsn = verified(pki).dsn(secure_pg.dsn("treadle_inspector", INSPECTOR_PASSWORD))
    async with await PostgresStorage.connect(dsn) as storage:
        await storage.runs.list(limit=5)
        await storage.deployments.latest()
        with pytest.raises(errors.StorageUnavailable, match="permission denied"):
            await storage.deployments.register("inspector-may-not")


async def test_migrate_goes_over_tls_with_the_transport_settings(
    secure_pg: SecurePostgres, pki: Pki
) -> None:
    """``treadle migrate`` applies TREADLE_DATABASE_SSL*: nothing to apply, over TLS."""
    assert await migrate(verified(pki).dsn(secure_pg.dsn())) == []
    with pytest.raises(errors.WorldAuthFailed, match="no encryption"):
        await migrate(PostgresTransport(sslmode="disable").dsn(secure_pg.dsn()))


def test_the_dsn_keeps_its_own_parameters_and_the_settings_win() -> None:
    dsn = "postgresql://u:p%2Fw@db:5432/x?application_name=a&sslmode=prefer"
    out = PostgresTransport(sslmode="verify-full", sslrootcert="/ca.pem").dsn(dsn)
    assert out == (
        "postgresql://u:p%2Fw@db:5432/x?application_name=a&sslmode=verify-full"
        "&sslrootcert=%2Fca.pem"
    )
    assert PostgresTransport().dsn(dsn) == dsn
    assert pgserver.SUPERUSER == "postgres"


async def test_sslmode_require_against_a_server_without_tls_is_one_clear_error(
    pg_dsn: str, pki: Pki
) -> None:
    """The embedded server of tests/postgres has no TLS: asking for it never falls back."""
    for mode in ("require", "verify-full"):
        transport = PostgresTransport(sslmode=mode, sslrootcert=str(pki.ca))
        with pytest.raises(errors.WorldAuthFailed, match="does not offer TLS"):
            await PostgresStorage.connect(transport.dsn(pg_dsn))
