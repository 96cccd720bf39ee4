"""Streams in the simulation (issue 17 item 6): generated stream writes and their
invariants.

``add_streams`` gives a share of the programs' step ops a ``"w"`` (chunks to
write) and a ``"wf"`` (flush before returning, or leave the chunks flushing: the
stream-flush handoff's ground), drawn from its own random stream so the programs'
other draws stay as they were. The step body (``workload.build``) calls ``write``:
chunk ``i`` of an attempt is ``"<op id>:<attempt>:<i>"`` on the run's ``sim``
stream; a refusal (a stale attempt, the run ended, an optimistic start refused) is
the engine keeping the rule, and the body goes on.

``violations`` checks what the memory World stored against the run's log:

- ``stream_dense``: the stream's indexes are 0, 1, ... without gaps;
- ``stream_attempt_order``: the chunks of one step attempt have seqs 0, 1, ... in
  index order, and each is the chunk that attempt wrote at that place;
- ``stream_unstarted``: no chunk of a step attempt whose ``step_started`` is not in
  the log (a refused start leaves no chunks: seed 003's run-ready barrier);
- ``stream_refused_body``: an attempt's chunks come from one run of its body, the last
  (a body run before a start that was then refused, which the redelivery runs again,
  writes none: each chunk names the run of the body that wrote it).

(No chunk after the run's end is the World's own rule, held by the conformance suite;
the log's times are the writers' stamps, so they cannot judge it here.)
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from treadle import errors
from treadle.sdk import streams
from treadle.testing.memory import streams as memory_streams
from treadle.world import events

if TYPE_CHECKING:  # invariants imports workload, which imports this module
    from treadle.testing.simulation.invariants import RunOutcome, Violation

NAME = "sim"
# ``stream_fences`` (a generator of its own, so seeds pinned with streams replay as
# found): of the runs whose first op is a stream-writing step, the share whose first
# write after run_created (turbo's run_started) is refused by the fence, when the plan
# has fences (``processes.ProcessInterceptor``).
FENCE_SHARE = 0.5
# The share of programs whose steps write a stream, and of their steps that do.
PROGRAM_SHARE = 0.4
STEP_SHARE = 0.5


def add_streams(programs: list[Any], rng: random.Random) -> None:
    """Mark some step ops of some programs to write ``w`` chunks (``wf``: flush first)."""
    for program in programs:
        if rng.random() >= PROGRAM_SHARE:
            continue
        for op in program.ops:
            for step in _steps_of(op):
                if rng.random() < STEP_SHARE:
                    step["w"] = rng.randint(1, 4)
                    step["wf"] = rng.random() < 0.5


def writes_first(program: Any) -> bool:
    """The program's first op is (or gathers) a step that writes chunks."""
    return bool(program.ops) and any(step.get("w") for step in _steps_of(program.ops[0]))


def _steps_of(op: dict[str, Any]) -> list[dict[str, Any]]:
    if op["k"] == "step":
        return [op]
    if op["k"] == "gather":
        return list(op["ops"])
    if op["k"] == "race":
        return [op["step"]]
    return []


async def write(op: dict[str, Any], attempt: int, body: int = 0) -> None:
    """The step body's stream writes (see the module docstring); ``body``: which run of
    this attempt's body this is (0 the first)."""
    count = int(op.get("w", 0))
    if not count:
        return
    try:
        out = streams.get_writable(NAME)
        for i in range(count):
            await out.write(f"{op['id']}:{attempt}:{i}:{body}")
        if op.get("wf"):
            await out.flush()
    except errors.StreamWriteRefused:
        return  # the World (or the barrier) refused this attempt's chunks: by the rules


def violations(outcome: RunOutcome, backend: Any) -> list[Violation]:
    from treadle.testing.simulation.invariants import Violation

    run_id = outcome.run_id
    stored = memory_streams.chunks_of(backend).get((run_id, NAME), [])
    found: list[Violation] = []
    if [c.index for c in stored] != list(range(len(stored))):
        found.append(Violation("stream_dense", run_id, f"indexes {[c.index for c in stored]}"))
    started = {
        (e.event.correlation_id, e.event.attempt)
        for e in outcome.log
        if isinstance(e.event, events.StepStarted)
    }
    seqs: dict[tuple[str, int], int] = {}
    writers: dict[tuple[str, int], set[int]] = {}
    for chunk in stored:
        key = (chunk.step_id, chunk.attempt)
        expected_seq = seqs.get(key, 0)
        seqs[key] = expected_seq + 1
        _, attempt, place, body = str(chunk.data).rsplit(":", 3)
        writers.setdefault(key, set()).add(int(body))
        if chunk.seq != expected_seq or (int(attempt), int(place)) != (chunk.attempt, chunk.seq):
            found.append(
                Violation(
                    "stream_attempt_order",
                    run_id,
                    f"chunk {chunk.index} {chunk.data!r}: attempt {chunk.attempt} seq "
                    f"{chunk.seq}, expected seq {expected_seq}",
                )
            )
        if key not in started:
            found.append(
                Violation(
                    "stream_unstarted",
                    run_id,
                    f"chunk {chunk.index} of step {chunk.step_id} attempt {chunk.attempt}, "
                    "whose start is not in the log",
                )
            )
    found += _refused_bodies(outcome, writers)
    return found


def _refused_bodies(outcome: RunOutcome, writers: dict[tuple[str, int], set[int]]) -> list[Any]:
    """``stream_refused_body``: an attempt's chunks come from one run of its body, the
    last (an earlier one ran before a start that was refused: turbo's early body, a
    run-ahead or optimistic start; the run-ready barrier and the World's attempt rule
    refuse its chunks, so the run that follows the committed start writes them)."""
    from treadle.testing.simulation.invariants import Violation

    runs: dict[tuple[str, int], int] = {}
    for b in outcome.bodies:
        runs[(b.step_id, b.attempt)] = runs.get((b.step_id, b.attempt), 0) + 1
    found = []
    for (step_id, attempt), bodies in sorted(writers.items()):
        last = runs.get((step_id, attempt), 1) - 1
        if bodies != {last}:
            found.append(
                Violation(
                    "stream_refused_body",
                    outcome.run_id,
                    f"step {step_id} attempt {attempt}: chunks from body run(s) "
                    f"{sorted(bodies)} of {last + 1}",
                )
            )
    return found
