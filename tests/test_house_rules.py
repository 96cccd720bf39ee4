"""The house rules the test command enforces: lint, types, layering, layout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["runtime", "operator", "tests", "benchmarks"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_lint_passes() -> None:
    """ruff finds nothing in the source and the tests."""
    result = _run("ruff", "check", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied() -> None:
    """The tree is formatted as ``ruff format`` would write it."""
    result = _run("ruff", "format", "--check", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes_on_the_source() -> None:
    """``mypy --strict`` (configured in pyproject.toml) is clean on both source roots."""
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_are_kept() -> None:
    """treadle.sdk and treadle.replay never import a World implementation, asyncpg or nats."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_import_operator_is_the_standard_library() -> None:
    """No top-level ``operator`` package shadows the standard library's module."""
    probe = "import operator, sys; print(operator.__file__); print(hasattr(operator, 'itemgetter'))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    path, has_itemgetter = result.stdout.split()
    assert has_itemgetter == "True"
    assert Path(path).parent != ROOT / "operator"
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "runtime" / "__init__.py").exists()


@pytest.mark.parametrize("package", ["treadle", "treadle_operator"])
def test_source_roots_import(package: str) -> None:
    """Both source roots are importable packages of the one distribution."""
    result = _run("pip", "show", "-f", "treadle")
    assert result.returncode == 0, result.stderr
    module = __import__(package)
    assert module.__doc__
