"""``treadle run`` on the production World (Postgres + NATS, real servers): the run
executes in this process as on the local World (issue 10 item 7).

Before, the app started no worker on Postgres + NATS, so ``treadle run`` printed
the run id and waited for ever. Each test has its own database and deployment
(so its own NATS consumers); the CLI runs as a real subprocess.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from tests.cli.conftest import FLOWS, ROOT, Cli
from tests.nats.conftest import NatsServer, nats_server
from tests.postgres.conftest import pg_clones, pg_dsn, pg_server

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]


@pytest.fixture
def prod_cli(tmp_path: Path, pg_dsn: str, nats_server: NatsServer) -> Cli:
    (tmp_path / "flows.py").write_text(FLOWS)
    return Cli(
        cwd=tmp_path,
        world="postgres",
        env={
            "TREADLE_DATABASE_URL": pg_dsn,
            "TREADLE_NATS_URL": nats_server.url,
            "TREADLE_DEPLOYMENT_ID": f"cli-{uuid.uuid4().hex[:12]}",
        },
    )


def test_run_on_postgres_and_nats_executes_in_process_and_prints_the_output(
    prod_cli: Cli,
) -> None:
    """The newcomer's path: steps and the timer shown, the output on stdout, exit 0, and
    the run recorded as completed in the production World."""
    result = prod_cli("run", "examples/hello.py:hello", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == '"HELLO, WORLD!"\n'
    assert "[ok]    step greet (attempt 1)" in result.stderr
    assert "[ok]    step shout (attempt 1)" in result.stderr
    assert "[timer]" in result.stderr
    assert " on postgres" in result.stderr.splitlines()[0]
    assert "Traceback" not in result.stderr
    (listed,) = prod_cli.json("runs", "list")
    assert listed["status"] == "completed"


def test_a_failing_run_on_postgres_and_nats_exits_1_with_its_error(prod_cli: Cli) -> None:
    """Exit codes as on local: a failed run is 1, with its error as one JSON object."""
    data = prod_cli.json("run", "flows.py:fails", code=1)
    assert data["status"] == "failed"
    assert data["error"]["type"] == "StepFailed"
    assert "the oven is off" in data["error"]["message"]


def test_run_timeout_on_postgres_and_nats_exits_1_and_the_run_goes_on(prod_cli: Cli) -> None:
    """A run that waits on a hook outlives ``--timeout``: exit 1, the run is still running,
    and a later resume finishes it with another in-process worker."""
    result = prod_cli("run", "flows.py:approve", "--input", '{"token": "p-1"}', "--timeout", "2")
    assert result.returncode == 1, result.stderr
    assert "[hook]  waiting on hook 'p-1'" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "is still running after 2 s; it goes on" in last
    run_id = last.split("run ", 1)[1].split()[0]
    assert prod_cli.json("runs", "get", run_id)["status"] == "running"
