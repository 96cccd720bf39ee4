"""The linter's check when a worker loads an app (issue 17 item 9).

``Workflows.serve`` (``treadle worker``, an orchestrating role: ``all`` or
``orchestrator``) calls ``check_on_load`` before its worker starts: the source files of
the app's registered workflows are linted once per process, off the event loop, and
each finding is logged as a warning on ``treadle.lint``. Nothing here ever fails the
load: a file that cannot be read or parsed is logged at debug level and skipped.
``TREADLE_LINT_ON_LOAD=0`` turns the check off.

Used by ``treadle.client`` (``Workflows.serve``). The in-process workers of ``treadle
run`` and of a local app do not lint: they serve the code being written, and a test
suite's output is no place for the warnings.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.lint import Finding, lint_source, read_source

log = logging.getLogger("treadle.lint")

# Files linted by this process already (a second worker of one app says nothing new).
_linted: set[str] = set()


def _source_files(functions: Mapping[str, Callable[..., Any]]) -> list[str]:
    files: set[str] = set()
    for fn in functions.values():
        try:
            found = inspect.getsourcefile(inspect.unwrap(fn))
        except TypeError:
            found = None
        if found is not None and Path(found).is_file():
            files.add(str(Path(found).resolve()))
    return sorted(files)


def lint_loaded(functions: Mapping[str, Callable[..., Any]]) -> list[Finding]:
    """Lint the files defining ``functions`` (workflow name -> function) not linted yet
    in this process; log each finding as a warning and return them."""
    out: list[Finding] = []
    for path in _source_files(functions):
        if path in _linted:
            continue
        _linted.add(path)
        try:
            findings = lint_source(read_source(Path(path)), path)
        except errors.LintInputInvalid as exc:
            log.debug("treadle lint skipped %s: %s", path, exc)
            continue
        for finding in findings:
            log.warning("%s (TREADLE_LINT_ON_LOAD=0 turns this check off)", finding.text())
        out += findings
    return out


async def check_on_load(functions: Mapping[str, Callable[..., Any]], enabled: bool) -> None:
    """``lint_loaded`` in a thread (it reads and parses files); never raises."""
    if not enabled or not functions:
        return
    try:
        await asyncio.to_thread(lint_loaded, dict(functions))
    except Exception as exc:  # the check must never fail a worker's start
        log.debug("treadle lint on load failed: %r", exc)
