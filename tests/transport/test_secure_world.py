"""The whole production World over authenticated, encrypted transport (issue 16 item 3).

A workflow runs end to end with every hop locked down: PostgreSQL over
``verify-full`` TLS as the least-privilege ``treadle_worker`` role (SCRAM), NATS
over mutual TLS as the least-privilege ``worker`` user, all from the
``TREADLE_*`` settings a worker pod gets. The read-only ``treadle_inspector``
role then reads the run. And the CLI, given a wrong credential, prints one
line naming the setting, without a traceback and without the secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from treadle import Workflows, settings, sleep
from treadle.world import contract, ids
from treadle.worlds import open_world
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.transport import PostgresTransport

from .certs import Pki
from .securenats import WORKER_PASSWORD, SecureNats
from .securepg import INSPECTOR_PASSWORD, SUPERUSER_PASSWORD, SecurePostgres
from .securepg import WORKER_PASSWORD as PG_WORKER_PASSWORD

TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": "300",
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": "200",
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": "0.05",
}
ROOT = Path(__file__).resolve().parents[2]


def worker_env(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki, tmp_path: Path
) -> dict[str, str]:
    """What the operator gives a worker pod: URLs without secrets, secrets in files."""
    password_file = tmp_path / "nats-password"
    password_file.write_text(WORKER_PASSWORD + "\n")
    password_file.chmod(0o600)
    return {
        "TREADLE_WORLD": "postgres",
        "TREADLE_DEPLOYMENT_ID": f"sec-{ids.new_run_id()[-8:].lower()}",
        "TREADLE_DATABASE_URL": secure_pg.dsn("treadle_worker", PG_WORKER_PASSWORD),
        "TREADLE_DATABASE_SSLMODE": "verify-full",
        "TREADLE_DATABASE_SSLROOTCERT": str(pki.ca),
        "TREADLE_NATS_URL": secure_nats.url,
        "TREADLE_NATS_USER": "worker",
        "TREADLE_NATS_PASSWORD_FILE": str(password_file),
        "TREADLE_NATS_TLS_CA": str(pki.ca),
        "TREADLE_NATS_TLS_CERT": str(pki.client_cert),
        "TREADLE_NATS_TLS_KEY": str(pki.client_key),
        **FAST,
    }


async def test_a_workflow_runs_end_to_end_over_tls_as_the_least_privileged_roles(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki, tmp_path: Path
) -> None:
    config = settings.load(worker_env(secure_pg, secure_nats, pki, tmp_path))
    log_before = len(secure_nats.log_text())
    world = await open_world("postgres", settings=config, tuning=TUNING)
    app = Workflows(world=world, settings_=config, worker=True)
    try:

        @app.step
        async def double(i: int) -> int:
            return 2 * i

        @app.workflow
        async def flow(n: int) -> int:
            first = await double(n)
            await sleep(1.0)  # a JetStream schedule, published by the worker user
            return first + await double(first)

        run = await app.start(flow, 5)
        assert await run.result(timeout=60) == 30
    finally:
        await app.close(grace_seconds=2)
        await world.close()
    # Nothing the worker did was outside its permissions.
    assert "violation" not in secure_nats.log_text()[log_before:].lower()

    # The read-only role reads the run and its log.
    inspector = PostgresTransport(sslmode="verify-full", sslrootcert=str(pki.ca)).dsn(
        secure_pg.dsn("treadle_inspector", INSPECTOR_PASSWORD)
    )
    async with await PostgresStorage.connect(inspector) as storage:
        record = await storage.runs.get(run.run_id)
        assert record.status == "completed"
        page = await storage.events.list(run.run_id)
        assert [e.type for e in page.events][-1] == "run_completed"


def treadle_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TREADLE_", "WORKFLOW_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator")])
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *argv],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("treadle: error: ")
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    for secret in (WORKER_PASSWORD, PG_WORKER_PASSWORD, SUPERUSER_PASSWORD, "not-it"):
        assert secret not in result.stderr + result.stdout


def test_the_cli_with_a_wrong_nats_password_prints_one_clear_line(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki, tmp_path: Path
) -> None:
    env = worker_env(secure_pg, secure_nats, pki, tmp_path)
    (tmp_path / "nats-password").write_text("not-it\n")
    result = treadle_cli("runs", "list", env=env)
    assert_one_clear_line(result, "cannot connect to NATS", "TREADLE_NATS_PASSWORD")


def test_the_cli_with_a_wrong_database_password_prints_one_clear_line(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki, tmp_path: Path
) -> None:
    env = worker_env(secure_pg, secure_nats, pki, tmp_path)
    env["TREADLE_DATABASE_URL"] = secure_pg.dsn("treadle_worker", "not-it")
    result = treadle_cli("runs", "list", env=env)
    assert_one_clear_line(result, "password authentication failed", "TREADLE_DATABASE_URL")


def test_the_cli_without_the_client_certificate_prints_one_clear_line(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki, tmp_path: Path
) -> None:
    env = worker_env(secure_pg, secure_nats, pki, tmp_path)
    del env["TREADLE_NATS_TLS_CERT"], env["TREADLE_NATS_TLS_KEY"]
    result = treadle_cli("runs", "list", env=env)
    assert_one_clear_line(result, "TLS handshake failed", "TREADLE_NATS_TLS_CERT")


def test_the_cli_with_a_missing_certificate_file_names_the_setting(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki, tmp_path: Path
) -> None:
    env = worker_env(secure_pg, secure_nats, pki, tmp_path)
    env["TREADLE_NATS_TLS_CA"] = str(tmp_path / "gone.pem")
    result = treadle_cli("runs", "list", env=env)
    assert_one_clear_line(result, "TREADLE_NATS_TLS_CA=", "cannot be read")


def test_the_settings_command_masks_the_nats_password(tmp_path: Path) -> None:
    result = treadle_cli(
        "settings", "--json", env={"TREADLE_NATS_PASSWORD": "sh0w-me", "TREADLE_NATS_TOKEN": "t0k"}
    )
    assert result.returncode == 0, result.stderr
    assert "sh0w-me" not in result.stdout and "t0k" not in result.stdout
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    names = {r["name"] for r in rows}
    assert {"TREADLE_NATS_CREDS_FILE", "TREADLE_NATS_TLS_CA", "TREADLE_DATABASE_SSLMODE"} <= names
