"""``treadle run``: start, execute in process, show progress, print the outcome."""

from __future__ import annotations

import json

from tests.cli.conftest import EXAMPLES, ROOT, Cli


def test_run_hello_prints_its_output_and_progress(cli: Cli) -> None:
    """A relative file target from the repository; progress on stderr, JSON output on stdout."""
    result = cli("run", "examples/hello.py:hello", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == '"HELLO, WORLD!"\n'
    assert "[ok]    step greet (attempt 1)" in result.stderr
    assert "[ok]    step shout (attempt 1)" in result.stderr
    assert "[timer]" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_json_is_one_object_on_the_world_given(cli: Cli) -> None:
    """``--world`` wins over ``TREADLE_WORLD``, for the user's ``Workflows()`` app too."""
    other = f"local:{cli.cwd / 'other'}"
    hello = f"{EXAMPLES / 'hello.py'}:hello"
    result = cli("run", hello, "--input", '{"name": "ann"}', "--json", "--world", other)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"run_id", "status", "output"}
    assert data["status"] == "completed"
    assert data["output"] == "HELLO, ANN!"
    assert data["run_id"].startswith("wrun_")
    assert cli.json("runs", "get", data["run_id"], "--world", other)["status"] == "completed"
    assert cli.json("runs", "list") == []  # nothing on the TREADLE_WORLD one


def test_run_takes_positional_input_and_a_dotted_module(cli: Cli) -> None:
    """``module:workflow`` resolves from the current directory; an array is positional."""
    result = cli("run", "flows:hi", "--input", '["bo"]', "-q")
    assert (result.returncode, result.stdout, result.stderr) == (0, '"hi bo"\n', "")


def test_a_failing_run_exits_1_with_its_error(cli: Cli) -> None:
    result = cli("run", "flows.py:fails")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "[fail]  step boom (attempt 1): FatalError: the oven is off" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("treadle: error: run wrun_")
    assert "failed: StepFailed: step boom failed: FatalError: the oven is off" in last

    data = cli.json("run", "flows.py:fails", code=1)
    assert data["status"] == "failed"
    assert set(data) == {"run_id", "status", "error"}
    assert data["error"]["type"] == "StepFailed"
    assert "the oven is off" in data["error"]["message"]


def test_a_non_deterministic_workflow_fails_naming_the_call(cli: Cli) -> None:
    result = cli("run", "flows.py:uses_executor", "-q")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "NonDeterministicCall: run_in_executor() is not allowed in workflow code" in line


def test_an_unserializable_step_argument_fails_naming_it(cli: Cli) -> None:
    result = cli("run", "flows.py:sends_object", "-q")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "SerializationError: step echo argument 0" in line
    assert "cannot cross the event log" in line


def test_timeout_exits_1_and_the_run_goes_on(cli: Cli) -> None:
    result = cli("run", "flows.py:approve", "--input", '{"token": "t-1"}', "--timeout", "1")
    assert result.returncode == 1
    assert "[hook]  waiting on hook 't-1'" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "is still running after 1 s; it goes on" in last
    run_id = last.split("run ", 1)[1].split()[0]
    assert cli.json("runs", "get", run_id)["status"] == "running"


def test_example_order_finishes_through_the_hook_timeout(cli: Cli) -> None:
    """Fan-out, a retry, a sleep, then nobody approves within 2 s: held for review."""
    data = cli.json("run", f"{EXAMPLES / 'order.py'}:order", "--input", '{"order_id": "B-7"}')
    assert data["status"] == "completed"
    assert data["output"] == {
        "order_id": "B-7",
        "receipt": "charged 56.25 for B-7 on attempt 2",
        "status": "held for review",
    }
    timeline = cli.json("inspect", data["run_id"])["events"]
    types = [e["type"] for e in timeline]
    assert types.count("step_completed") == 5 + 1  # five reservations and the charge
    assert "step_retrying" in types
    assert types.count("wait_completed") == 2  # the sleep and the hook's timeout
    assert "hook_created" in types


def test_example_fanout_runs_100_steps(cli: Cli) -> None:
    result = cli("run", f"{EXAMPLES / 'fanout.py'}:fanout", "--json", "-q")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["status"], data["output"]) == ("completed", sum(range(100)))
    timeline = cli.json("inspect", data["run_id"])["events"]
    assert sum(e["type"] == "step_completed" for e in timeline) == 100
