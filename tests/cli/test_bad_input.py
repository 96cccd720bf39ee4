"""Every user mistake is one ``treadle: error:`` line naming it, exit 2, and no traceback;
nothing already recorded is lost."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from tests.cli.conftest import Cli, make_cli, one_error_line

Outcome = subprocess.CompletedProcess[str]

UNKNOWN_RUN = "wrun_01M8NPS8NKDA2Y6C0CEF99NY7Z"


def case(key: str, argv: list[str], message: str, env: dict[str, str] | None = None) -> Any:
    return pytest.param(argv, env or {}, message, id=key)


CASES = [
    case("unknown-file", ["run", "missing.py:hi"], "missing.py: no such file"),
    case("unknown-module", ["run", "no_such_module:hi"], "no module named 'no_such_module'"),
    case(
        "unregistered-workflow",
        ["run", "flows.py:nope"],
        "no workflow named 'nope' in flows.py (registered: approve, fails, hi, nap,",
    ),
    case("syntax-error", ["run", "broken.py:hi"], "cannot import broken.py: SyntaxError"),
    case(
        "bad-input-json",
        ["run", "flows.py:hi", "--input", "{name: 1}"],
        "--input is not valid JSON",
    ),
    case(
        "input-not-object",
        ["start", "flows.py:hi", "--input", "7"],
        "--input must be a JSON object",
    ),
    case(
        "input-does-not-fit",
        ["run", "flows.py:hi", "--input", '{"nmae": "x"}'],
        "workflow hi cannot take this --input: missing a required argument: 'name'",
    ),
    case("unknown-run", ["runs", "get", UNKNOWN_RUN], f"run {UNKNOWN_RUN} not found"),
    case("malformed-run-id", ["runs", "get", "run-42"], "'run-42' is not a run id"),
    case(
        "bad-setting",
        ["run", "flows.py:hi"],
        "bad setting: WORKFLOW_MAX_INLINE_STEPS='lots'",
        env={"WORKFLOW_MAX_INLINE_STEPS": "lots"},
    ),
    case(
        "bad-spec-version",
        ["start", "flows.py:hi", "--input", '{"name": "x"}'],
        "WORKFLOW_SPEC_VERSION='7': Value error, allowed values are 8 or 9 (or unset)",
        env={"WORKFLOW_SPEC_VERSION": "7"},
    ),
    case(
        "lease-not-a-number",
        ["start", "flows.py:hi", "--input", '{"name": "x"}'],
        "WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS='nan': Value error, must be a number of "
        "seconds (1 to 900",
        env={"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": "nan"},
    ),
    case(
        "unknown-world",
        ["runs", "list", "--world", "mongodb://db"],
        "TREADLE_WORLD=<hidden: it looks like a URL or DSN> is not a World",
    ),
    case(
        "incompatible-storage",
        ["runs", "list", "--world", "local:flows.py"],
        "it is a file, not a directory",
    ),
    case(
        "unknown-hook",
        ["hooks", "resume", "no-such-token", "--payload", "{}"],
        "no live hook with token 'no-such-token'",
    ),
    case(
        "bad-payload-json",
        ["hooks", "resume", "tok", "--payload", "{'a': 1}"],
        "--payload is not valid JSON",
    ),
    case(
        "worker-unknown-app",
        ["worker", "flows.py:application"],
        "flows.py has no treadle app named 'application'",
    ),
    case("missing-target", ["run"], "the following arguments are required: TARGET"),
    case("timeout", ["run", "flows.py:hi", "--timeout", "0"], "--timeout must be a positive"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every case, run at once in parallel processes against one World (each is read-only)."""
    runner = make_cli(tmp_path_factory.mktemp("mistakes"))
    (runner.cwd / "broken.py").write_text("def oops(:\n")
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {
            case.id: pool.submit(runner, *case.values[0], env=case.values[1]) for case in CASES
        }
        return {key: future.result() for key, future in futures.items() if key is not None}


@pytest.mark.parametrize(("argv", "env", "message"), CASES)
def test_a_mistake_is_one_line_and_exit_2(
    outcomes: dict[str, Outcome],
    request: pytest.FixtureRequest,
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    result = outcomes[request.node.callspec.id]
    assert result.returncode == 2, result.stderr
    assert message in one_error_line(result)
    assert result.stdout == ""


def test_mistakes_record_nothing_and_lose_nothing(cli: Cli) -> None:
    """After a run is recorded, bad requests neither add runs nor change the one there."""
    run_id = cli("start", "flows.py:hi", "--input", '{"name": "kept"}').stdout.strip()
    for argv in (
        ["start", "flows.py:hi", "--input", '{"who": 1}'],
        ["runs", "cancel", "not-a-run"],
    ):
        assert cli(*argv).returncode == 2
    [run] = cli.json("runs", "list")
    assert (run["run_id"], run["status"], run["input"]) == (
        run_id,
        "pending",
        {"args": [], "kwargs": {"name": "kept"}},
    )


def test_cancelling_a_finished_run_is_refused(cli: Cli) -> None:
    run_id = cli.json("run", "flows.py:hi", "--input", '{"name": "x"}')["run_id"]
    result = cli("runs", "cancel", run_id)
    assert result.returncode == 2
    assert f"run {run_id} is completed already; nothing to cancel" in one_error_line(result)
    assert cli.json("runs", "get", run_id)["status"] == "completed"
