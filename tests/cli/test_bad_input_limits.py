"""Bad input at the command line: refused before anything is recorded, one line, exit 2.

Issue 10 item 3 and "Bad input"; security.md M2 (depth), M3 (a 131,000-character
``--input`` left an orphan pending run), M4 (NUL, long hook tokens), L4 (deep JSON
ended in "unexpected RecursionError").
"""

from __future__ import annotations

import json

from tests.cli.conftest import Cli, one_error_line


def _deep(depth: int) -> str:
    return "[" * depth + '"leaf"' + "]" * depth


def test_a_nul_in_the_input_is_refused_and_records_nothing(cli: Cli) -> None:
    result = cli("start", "flows.py:hi", "--input", json.dumps({"name": "a\u0000b"}))
    assert result.returncode == 2, result.stderr
    assert "workflow hi argument 'name': a string with a NUL" in one_error_line(result)
    assert cli.json("runs", "list") == []


def test_input_nested_past_the_limit_is_refused_and_records_nothing(cli: Cli) -> None:
    """Depth 220 used to be stored and then unreadable; depth 5,000 was an unexpected
    RecursionError. Both are one line now, and no run is recorded."""
    deep = cli("start", "flows.py:hi", "--input", f'{{"name": {_deep(220)}}}')
    assert deep.returncode == 2, deep.stderr
    assert "TREADLE_MAX_VALUE_DEPTH" in one_error_line(deep)
    deeper = cli("start", "flows.py:hi", "--input", f'{{"name": {_deep(5000)}}}')
    assert deeper.returncode == 2, deeper.stderr
    assert "--input nests too deep to read" in one_error_line(deeper)
    assert cli.json("runs", "list") == []


def test_input_over_the_size_setting_is_refused_and_records_nothing(cli: Cli) -> None:
    result = cli(
        "start",
        "flows.py:hi",
        "--input",
        json.dumps({"name": "x" * 5000}),
        env={"TREADLE_MAX_VALUE_BYTES": "4096"},
    )
    assert result.returncode == 2, result.stderr
    assert "over the 4096-byte limit (TREADLE_MAX_VALUE_BYTES)" in one_error_line(result)
    assert cli.json("runs", "list") == []


def test_an_input_too_large_for_a_message_runs_and_leaves_no_orphan(cli: Cli) -> None:
    """Bug 7 / M3: a 130,000-character --input (over the 128 KiB message with its
    envelope) raised MessageTooLarge after the run was recorded: an orphan pending run.
    It now runs to completion, and it is the only run."""
    name = "x" * 130_000
    result = cli("run", "flows.py:hi", "-q", "--input", json.dumps({"name": name}))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == json.dumps(f"hi {name}")
    [run] = cli.json("runs", "list")
    assert run["status"] == "completed"


def test_a_hook_token_over_the_limit_is_refused_at_once(cli: Cli) -> None:
    result = cli("hooks", "resume", "t" * 3000, "--payload", "{}")
    assert result.returncode == 2, result.stderr
    assert "hook token: 3000 bytes, over the 256-byte limit" in one_error_line(result)
