"""Timestamps taken inside workflow and step bodies, read by the process that measures.

Every system's benchmark workflows call ``mark(key, label)`` where a step body
starts (and ``join(key)`` where the workflow continues after a gather). Times
are ``time.perf_counter_ns()``: CLOCK_MONOTONIC on Linux, one clock for every
process on the machine, so a mark taken in a worker process compares with
the parent's ``perf_counter_ns()``.

In one process the marks stay in memory; when ``BENCH_PROBE_FILE`` is set
(worker processes, processes that get killed) each mark is one ``O_APPEND``
write of a line ``key label ns`` to that file, as it happens.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

PROBE_FILE_ENV = "BENCH_PROBE_FILE"

JOIN = "join"
END = "end"
NOT_STEPS = (JOIN, END)

MARKS: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
_fd: int | None = None


def _file_fd() -> int | None:
    global _fd
    if _fd is None and os.environ.get(PROBE_FILE_ENV):
        _fd = os.open(os.environ[PROBE_FILE_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


def mark(key: str, label: str | int) -> None:
    """Record that ``label`` (a step index, ``join``...) of the run ``key`` happened now."""
    now = time.perf_counter_ns()
    fd = _file_fd()
    if fd is None:
        MARKS[key].append((str(label), now))
    else:
        os.write(fd, f"{key} {label} {now}\n".encode())


def once(key: str, label: str) -> None:
    """Mark ``label`` the first time workflow code reaches it; replays come later and
    mark nothing (in memory; a file keeps every copy and readers take the first)."""
    if not any(seen == label for seen, _ in MARKS.get(key, ())):
        mark(key, label)


def join(key: str) -> None:
    """The workflow is past its gather."""
    once(key, JOIN)


def end(key: str) -> None:
    """The workflow's last line: its steps are done."""
    once(key, END)


def marked(key: str, prefix: str) -> bool:
    """Whether a mark of ``key`` starting with ``prefix`` exists already (in memory, or in
    the ``BENCH_PROBE_FILE`` every process of the run writes to)."""
    path = os.environ.get(PROBE_FILE_ENV)
    seen = read_file(Path(path)).get(key, []) if path else MARKS.get(key, [])
    return any(label.startswith(prefix) for label, _ in seen)


def reset(key: str) -> None:
    MARKS.pop(key, None)


def read_file(path: Path) -> defaultdict[str, list[tuple[str, int]]]:
    """The marks a ``BENCH_PROBE_FILE`` holds, by key, in the order they were written."""
    marks: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            key, label, ns = line.split()
            marks[key].append((label, int(ns)))
    return marks


def starts(marks: list[tuple[str, int]]) -> list[int]:
    """The step-start times among ``marks`` (every label but ``join`` and ``end``), in order."""
    return sorted(ns for label, ns in marks if label not in NOT_STEPS)


def time_of(marks: list[tuple[str, int]], label: str) -> int | None:
    """When ``label`` was first marked, if it was."""
    return min((ns for seen, ns in marks if seen == label), default=None)


def join_time(marks: list[tuple[str, int]]) -> int | None:
    return time_of(marks, JOIN)
