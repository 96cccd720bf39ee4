"""Bad inputs that ended in "unexpected ..." (security.md L4, "Bad inputs tried"): each
is one clear line now, exit 2 (or a quiet 141 for a closed pipe), and records nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cli.conftest import Cli, one_error_line

RAW = b"x\xff\xfe".decode("utf-8", "surrogateescape")  # non-UTF-8 bytes in argv


def test_an_int_over_4300_digits_is_a_usage_error(cli: Cli) -> None:
    for argv in (
        ["start", "flows.py:hi", "--input", '{"name": ' + "9" * 5000 + "}"],
        ["hooks", "resume", "tok", "--payload", "9" * 5000],
    ):
        result = cli(*argv)
        assert result.returncode == 2, result.stderr
        line = one_error_line(result)
        assert "holds an integer of more than 4300 digits" in line
        assert "unexpected" not in line
    assert cli.json("runs", "list") == []


def test_non_utf8_bytes_in_an_argument_are_a_usage_error(cli: Cli) -> None:
    for argv in (
        ["runs", "list", "--workflow", RAW],
        ["start", "flows.py:hi", "--input", json.dumps({"name": RAW}, ensure_ascii=False)],
        ["hooks", "resume", RAW, "--payload", "{}"],
    ):
        result = cli(*argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert "unexpected" not in one_error_line(result)
    assert cli.json("runs", "list") == []


def test_a_closed_pipe_is_quiet(cli: Cli) -> None:
    """``treadle settings | head -1`` ended in ``unexpected BrokenPipeError``. Here the
    reader is gone before the first write, so the write always meets the closed pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "treadle.cli", "settings"],
            cwd=cli.cwd,
            env=cli.environment(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""
