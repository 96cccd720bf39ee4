"""The bad-input suite, and the review's leak cases, run with a known password in the
World URLs: no output line, log line or error message carries any piece of it.

security.md M7 (a password with an unencoded '/' or '#' printed a prefix; a DSN put in
TREADLE_WORLD or a numeric setting was echoed; ``migrate --database-url`` put it in
argv; a comma NATS list ended in AssertionError) and issue 16 item 6. Real servers:
PostgreSQL (trust auth: the password is carried, not checked) and nats-server.
"""

from __future__ import annotations

import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.cli.conftest import Cli, make_cli, one_error_line
from tests.cli.test_bad_input import CASES
from tests.nats.conftest import NatsServer, nats_server
from tests.postgres.conftest import pg_clones, pg_dsn, pg_server

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]

PASSWORD = "Zq9Xv2Kp/Wm#7Rt?Lj@Hd"
ENCODED = "Zq9Xv2Kp%2FWm%237Rt%3FLj%40Hd"


def pieces(secret: str, size: int = 5) -> set[str]:
    """Every run of ``size`` characters of ``secret``: a prefix or a part is a leak too."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


LEAKS = pieces(PASSWORD) | pieces(ENCODED) | pieces("N4tsPw/Secr#t")


def assert_nothing_leaks(result: subprocess.CompletedProcess[str], what: str) -> None:
    text = result.stdout + result.stderr
    found = sorted(p for p in LEAKS if p in text)
    assert not found, f"{what}: {found} in {text!r}"


def with_password(url: str, user: str, password: str) -> str:
    scheme, _, rest = url.partition("://")
    host = rest.rpartition("@")[2]
    return f"{scheme}://{user}:{password}@{host}"


@pytest.fixture
def prod(tmp_path: Path, pg_dsn: str, nats_server: NatsServer) -> Cli:
    runner = make_cli(tmp_path)
    runner.world = "postgres"
    user = pg_dsn.partition("://")[2].partition("@")[0]
    runner.env = {
        "TREADLE_DATABASE_URL": with_password(pg_dsn, user, ENCODED),
        "TREADLE_NATS_URL": with_password(nats_server.url, "treadle", "N4tsPw%2FSecr%23t"),
        "TREADLE_DEPLOYMENT_ID": f"leak-{uuid.uuid4().hex[:12]}",
    }
    (tmp_path / "broken.py").write_text("def oops(:\n")
    return runner


def _run_all(runner: Cli, cases: list[Any]) -> dict[str, subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {c.id: pool.submit(runner, *c.values[0], env=c.values[1]) for c in cases}
        return {key: f.result() for key, f in futures.items()}


def test_the_bad_input_suite_on_postgres_prints_no_piece_of_the_password(prod: Cli) -> None:
    """Every case of tests/cli/test_bad_input.py, on Postgres + NATS with passwords in
    both URLs: still one clear line each, and no piece of either password."""
    results = _run_all(prod, CASES)
    for key, result in results.items():
        assert_nothing_leaks(result, key)
        if key not in ("incompatible-storage", "unknown-world"):
            assert result.returncode == 2, (key, result.stderr)
            one_error_line(result)


def test_a_run_and_its_log_lines_on_postgres_print_no_piece_of_the_password(prod: Cli) -> None:
    """The happy path too: the progress lines, the settings listing, runs list."""
    ran = prod("run", "flows.py:hi", "--input", '{"name": "x"}')
    assert ran.returncode == 0, ran.stderr
    for result in (ran, prod("settings"), prod("runs", "list"), prod("settings", "--json")):
        assert_nothing_leaks(result, " ".join(result.args[3:]))


def leak(key: str, argv: list[str], env: dict[str, str], message: str) -> Any:
    return pytest.param(argv, env, message, id=key)


BAD_DB = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5/postgres"
DIGITS = "postgresql://postgres:4096/Wm#7Rt?Lj@127.0.0.1:5/postgres"  # port-like prefix
NOT_READ = "is not a URL treadle can read (the value is not shown)"
POSTGRES = {"TREADLE_WORLD": "postgres", "TREADLE_NATS_URL": "nats://127.0.0.1:5"}
LEAK_CASES = [
    leak("slash-in-db-password", ["runs", "list"],
         {**POSTGRES, "TREADLE_DATABASE_URL": BAD_DB}, f"TREADLE_DATABASE_URL {NOT_READ}"),
    leak("digits-then-slash", ["runs", "list"],
         {**POSTGRES, "TREADLE_DATABASE_URL": DIGITS}, f"TREADLE_DATABASE_URL {NOT_READ}"),
    leak("slash-in-nats-password", ["runs", "list"],
         {**POSTGRES, "TREADLE_DATABASE_URL": "postgresql://u@127.0.0.1:5/x",
          "TREADLE_NATS_URL": "nats://n:N4tsPw/Secr#t@127.0.0.1:5"},
         f"TREADLE_NATS_URL {NOT_READ}"),
    leak("nats-list-slash", ["runs", "list"],
         {**POSTGRES, "TREADLE_DATABASE_URL": "postgresql://u@127.0.0.1:5/x",
          "TREADLE_NATS_URL": "nats://127.0.0.1:5,nats://n:N4tsPw/Secr#t@127.0.0.1:6"},
         f"TREADLE_NATS_URL {NOT_READ}"),
    leak("dsn-in-world", ["runs", "list"], {"TREADLE_WORLD": BAD_DB},
         "TREADLE_WORLD=<hidden: it looks like a URL or DSN> is not a World"),
    leak("dsn-in-a-number", ["runs", "list"], {"TREADLE_QUEUE_LEASE_SECONDS": BAD_DB},
         "TREADLE_QUEUE_LEASE_SECONDS=<hidden: it looks like a URL or DSN>: Input should be"),
    leak("keyword-dsn-in-a-number", ["runs", "list"],
         {"TREADLE_MAX_VALUE_DEPTH": f"host=db password={PASSWORD}"},
         "TREADLE_MAX_VALUE_DEPTH=<hidden"),
    leak("dsn-in-a-file-setting", ["runs", "list"],
         {**POSTGRES, "TREADLE_DATABASE_URL_FILE": BAD_DB},
         "TREADLE_DATABASE_URL_FILE=<hidden: it looks like a URL or DSN> cannot be read"),
    leak("migrate-argv", ["migrate", "--database-url", BAD_DB], {},
         f"the Postgres DSN {NOT_READ}"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "env", "message"), LEAK_CASES)
def test_a_secret_in_the_wrong_place_is_refused_without_echoing_it(
    cli: Cli, argv: list[str], env: dict[str, str], message: str
) -> None:
    result = cli(*argv, env=env)
    assert_nothing_leaks(result, " ".join(argv))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("treadle: error")]
    assert len(error) == 1 and message in error[0], result.stderr


def test_migrate_warns_when_the_dsn_is_on_the_command_line(cli: Cli) -> None:
    result = cli("migrate", "--database-url", "postgresql://u:pw@127.0.0.1:5/x")
    assert "treadle: warning: --database-url puts the password in the process list" in (
        result.stderr
    )


def test_migrate_reads_the_dsn_from_a_file_or_stdin(cli: Cli, tmp_path: Path) -> None:
    """--database-url-file PATH or '-' (stdin): the DSN never reaches argv; no warning."""
    secret = tmp_path / "dsn"
    secret.write_text(f"postgresql://u:{ENCODED}@127.0.0.1:5/x\n")
    from_file = cli("migrate", "--database-url-file", str(secret))
    from_stdin = subprocess.run(
        [*from_file.args[:3], "migrate", "--database-url-file", "-"],
        input=secret.read_text(),
        cwd=cli.cwd,
        env=cli.environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for result in (from_file, from_stdin):
        assert_nothing_leaks(result, "migrate")
        assert result.returncode == 2, result.stderr
        line = one_error_line(result)
        assert "cannot connect to the Postgres database u@127.0.0.1:5/x to migrate it" in line
    empty = tmp_path / "empty"
    empty.write_text("")
    result = cli("migrate", "--database-url-file", str(empty))
    assert f"--database-url-file: '{empty}' is empty" in one_error_line(result)
