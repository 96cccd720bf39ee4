"""``treadle lint`` as a command (issue 17 item 9): exit codes, text and JSON output, bad
paths and syntax errors as one line naming the file; the worker's check on load (a
warning on ``treadle.lint``, never a failed start, off with TREADLE_LINT_ON_LOAD=0);
and the examples lint clean (CI)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from treadle import Workflows, lint, settings
from treadle.lint import onload

ROOT = Path(__file__).resolve().parents[2]

BAD = """
import time
from datetime import datetime as dt

from treadle import Workflows

app = Workflows()


@app.workflow
async def stamped() -> float:
    when = dt.now()  # treadle: ignore[TRD103]
    return time.time()
"""

CLEAN = """
from treadle import Workflows, now

app = Workflows()


@app.workflow
async def stamped() -> str:
    return now().isoformat()
"""


def treadle(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_findings_exit_1_with_one_line_each(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "clean.py").write_text(CLEAN)
    result = treadle("lint", "bad.py", "clean.py", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        "bad.py:13:12: TRD101 time.time() reads the real clock in workflow 'stamped'; "
        "use treadle.now()"
    ]
    assert "1 finding(s) in 2 files" in result.stderr
    clean = treadle("lint", "clean.py", cwd=tmp_path)
    assert (clean.returncode, clean.stdout) == (0, "")


def test_json_format_lists_findings_and_files(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text(BAD)
    (tmp_path / "pkg" / ".hidden").mkdir()
    (tmp_path / "pkg" / ".hidden" / "skipped.py").write_text(BAD)
    result = treadle("lint", "pkg", "--format", "json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["files"] == 1
    assert data["findings"] == [
        {
            "path": str(Path("pkg") / "bad.py"),
            "line": 13,
            "col": 12,
            "code": "TRD101",
            "message": "time.time() reads the real clock in workflow 'stamped'",
            "replacement": "use treadle.now()",
            "workflow": "stamped",
        }
    ]
    clean = treadle("lint", "pkg/.hidden/../../pkg/bad.py", "--format", "json", cwd=tmp_path)
    assert clean.returncode == 1


@pytest.mark.parametrize(
    ("content", "argv", "expected"),
    [
        (None, ["lint", "missing.py"], "treadle: error: missing.py: no such file or directory"),
        ("def broken(:\n", ["lint", "broken.py"], "treadle: error: broken.py:1: syntax error"),
        (b"x = '\xff'\n", ["lint", "latin.py"], "treadle: error: latin.py: is not UTF-8 text"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(
    tmp_path: Path, content: str | bytes | None, argv: list[str], expected: str
) -> None:
    if isinstance(content, str):
        (tmp_path / argv[1]).write_text(content)
    elif isinstance(content, bytes):
        (tmp_path / argv[1]).write_bytes(content)
    result = treadle(*argv, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert "Traceback" not in result.stderr


def test_the_examples_lint_clean() -> None:
    """CI: every example's workflow code is deterministic by the linter's rules."""
    findings, files = lint.lint_paths([str(ROOT / "examples")])
    assert files >= 4
    assert findings == [], "\n".join(f.text() for f in findings)


def _app_from(path: Path) -> Workflows:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"lintload_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: Workflows = module.app
    return app


async def test_a_worker_loading_an_app_logs_findings_as_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Workflows.serve`` (``treadle worker``) lints its app's workflow files: one warning
    per finding on treadle.lint, and the worker starts and serves anyway; with
    TREADLE_LINT_ON_LOAD=0 it says nothing."""
    bad = tmp_path / "loaded_bad.py"
    bad.write_text(BAD)
    loaded = _app_from(bad)
    for enabled in (False, True):
        onload._linted.clear()
        caplog.clear()
        app = Workflows(
            world=f"local:{tmp_path / ('w' + str(enabled))}",
            settings_=settings.load({}, TREADLE_LINT_ON_LOAD=enabled),
            worker=False,
        )
        app._workflows = loaded._workflows  # the loaded module's registry
        with caplog.at_level(logging.WARNING, logger="treadle.lint"):
            await app.serve()
            assert app.serving
            run = await app.start("stamped")
            assert isinstance(await run.result(timeout=30), float)
        await app.close()
        warned = [r.getMessage() for r in caplog.records if r.name == "treadle.lint"]
        if enabled:
            assert len(warned) == 1 and "TRD101" in warned[0] and str(bad.resolve()) in warned[0]
            assert "TREADLE_LINT_ON_LOAD=0" in warned[0]
        else:
            assert warned == []
