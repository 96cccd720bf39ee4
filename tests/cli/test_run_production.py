"""``treadle run`` on the production World (Postgres + NATS, real servers): the run
executes in this process as on the local World (issue 10 item 7).

Before, the app started no worker on Postgres + NATS, so ``treadle run`` printed
the run id and waited for ever. Each test has its own database and deployment
(so its own NATS consumers); the CLI runs as a real subprocess.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tests.cli.conftest import FLOWS, ROOT, Cli, one_error_line
from tests.nats.conftest import NatsServer, nats_server
from tests.postgres.conftest import pg_clones, pg_dsn, pg_server

from treadle.worlds.postgres import PostgresStorage

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


async def _foreign_run(dsn: str, deployment: str) -> str:
    storage = await PostgresStorage.connect(dsn)
    try:
        run = await storage.runs.create(
            workflow_name="elsewhere", input={"args": [], "kwargs": {}},
            deployment_id=deployment, spec_version=9,
        )  # fmt: skip
        return run.run_id
    finally:
        await storage.close()


def test_run_refuses_to_serve_a_deployment_with_active_runs_of_other_code(
    prod_cli: Cli, pg_dsn: str
) -> None:
    """The in-process worker would take every delivery of its deployment, and fail a run
    whose workflow this file lacks (WorkflowNotFound). With such a run active, ``treadle
    run`` refuses (exit 2, one line naming it) before recording anything."""
    foreign = asyncio.run(_foreign_run(pg_dsn, prod_cli.env["TREADLE_DEPLOYMENT_ID"]))
    result = prod_cli("run", "flows.py:hi", "--input", '["x"]')
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert "workflows flows.py does not define: elsewhere (1 active)" in line
    assert "TREADLE_DEPLOYMENT_ID" in line
    (listed,) = prod_cli.json("runs", "list")
    assert (listed["run_id"], listed["status"]) == (foreign, "pending")
