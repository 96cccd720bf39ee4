"""The issue #2780 timeline, in one process, for seed 000's end-to-end tests.

A spec 8 workflow ``checkout`` awaits a long inline step ``charge`` whose body
records a side-effect marker (its attempt) and then blocks on an
``asyncio.Event`` the test holds. While it blocks, something wakes the run in
another delivery: a hook is resumed, a sleep comes due, or the run is
cancelled (``MidStep.wake``). Spec 8 does not serialize a run's deliveries, so
the wake is delivered beside the owner's at once (one worker, concurrency 32).
The test then waits for what the wake did (a backstop armed, or the body run a
second time), releases the body and reads the outcome.

Everything is observed through the engine suites' ``FaultyWorld``: each
delivery's message id and key, each send with who sent it, the log.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from treadle import Hook, RetryableError, Workflows, sleep, step_metadata
from treadle.orchestrator.spec8 import ownership
from treadle.world import events, messages

from ..engine.conftest import MakeApp
from ..engine.faults import FaultyWorld, Started, Traced

Wake = Literal["hook", "sleep", "cancel"]
# The sleep that comes due mid-step (short: the body blocks until the test lets it go).
SLEEP_SECONDS = 1.5
# A spec 8 delivery starts no inline step while an open wait comes due within its inline
# window plus WORKFLOW_OPEN_WAIT_CLOCK_SKEW_MS (the step is queued instead): for the
# sleep to come due mid-step, the window is made 1 s (the least) with no margin or skew.
SLEEP_PAST_THE_WINDOW = {
    "WORKFLOW_V2_TIMEOUT_MS": 1000,
    "WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS": 0,
    "WORKFLOW_OPEN_WAIT_CLOCK_SKEW_MS": 0,
}


class Proceed(Hook):
    go: bool


@dataclass
class MidStep:
    app: Workflows
    faulty: FaultyWorld
    run: Any
    wake: Wake
    order: str
    # The attempts the body started (its side-effect marker), in order.
    marker: list[int] = field(default_factory=list)
    # Set by the test once the body may go on (every attempt waits for it).
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the body first started.
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    # Attempt 1 raises RetryableError once released.
    fail_first: bool = False

    async def log(self) -> list[events.LoggedEvent]:
        return list(await self.run.events())

    async def first_start(self) -> events.LoggedEvent:
        """The lazy inline ``step_started`` that created ``charge`` (attempt 1)."""
        starts = [e for e in await self.log() if isinstance(e.event, events.StepStarted)]
        assert starts, "charge never started"
        return starts[0]

    async def until_log(self, what: str, predicate: Any, timeout: float = 20) -> None:
        """Poll the log (every 50 ms) until ``predicate(log)`` holds."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate(await self.log()):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        except TimeoutError:
            types = [e.type for e in await self.log()]
            raise AssertionError(f"{what} never happened; the log: {types}") from None

    async def do_wake(self) -> None:
        """Wake the run while the body blocks."""
        if self.wake == "hook":
            await self.app.resume_hook(f"go:{self.order}", {"go": True})
        elif self.wake == "cancel":
            await self.run.cancel("cancelled mid-step")
        # "sleep": its timer comes due by itself (SLEEP_SECONDS after it was created).

    def backstops(self) -> list[Traced]:
        """The backstop wakes sent (plain orchestrator messages keyed ``:backstop:``)."""
        return [
            t
            for t in self.faulty.trace
            if t.what == "send" and t.send is not None and ":backstop:" in (t.send.key or "")
        ]

    def step_sends(self, step_id: str) -> list[Traced]:
        """The step messages sent for ``step_id`` (keyed ``step:<run>:<cid>``)."""
        key = f"step:{self.run.run_id}:{step_id}"
        return [t for t in self.faulty.trace if t.what == "send" and t.name == key]

    def answered(self, started: Started) -> bool:
        return any(a.meta is started.meta for a in self.faulty.queue.answers)

    def deliveries_of(self, message_id: str) -> list[Started]:
        return [
            s
            for s in self.faulty.queue.started
            if s.kind == "orchestrator" and s.meta.message_id == message_id
        ]


def spec8_app(make_app: MakeApp, faulty: FaultyWorld, **overrides: Any) -> Workflows:
    """An app minting spec 8 runs on the World under test."""
    return make_app(world=faulty, WORKFLOW_SPEC_VERSION=8, **overrides)


async def start_mid_step(
    make_app: MakeApp,
    faulty: FaultyWorld,
    *,
    wake: Wake,
    ownership_on: bool = True,
    lease_seconds: float = 60.0,
    fail_first: bool = False,
    steps_elsewhere: bool = False,
    **overrides: Any,
) -> MidStep:
    """Start ``checkout`` and return once ``charge``'s body blocks (its start recorded).

    ``steps_elsewhere``: the app serves only orchestrator messages, and a second app (its
    own Runtime, so its own single-flight: another worker, as a second process would be)
    serves the step messages; without it one worker serves both kinds."""
    if wake == "sleep":
        overrides = {**SLEEP_PAST_THE_WINDOW, **overrides}
    tuned = {
        "WORKFLOW_INLINE_OWNERSHIP": ownership_on,
        "WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": lease_seconds,
        **overrides,
    }
    order = "o-1"
    # The steps app first: make_app closes apps in order, and the World with the last.
    steps = (
        make_app(world=Borrowed(faulty), WORKFLOW_SPEC_VERSION=8, **tuned)
        if steps_elsewhere
        else None
    )
    app = spec8_app(make_app, faulty, **tuned)
    scene = MidStep(app, faulty, None, wake, order, fail_first=fail_first)
    _declare(app, scene)
    if steps is not None:
        _declare(steps, scene)
        await app.serve(role="orchestrator")
        await steps.serve(role="steps")
    scene.run = await app.start("checkout", order)
    async with asyncio.timeout(20):
        await scene.entered.wait()
    first = await scene.first_start()
    assert first.event.attempt == 1 and first.event.inline, "charge did not start inline"
    if wake == "hook":
        await scene.until_log("hook_created", lambda log: "hook_created" in _types(log))
    return scene


class Borrowed:
    """A World another app owns (one local World takes one consumer per instance, so a
    second worker shares the instance): everything passes through, ``close`` does not."""

    def __init__(self, world: Any) -> None:
        self._world = world

    def __getattr__(self, name: str) -> Any:
        return getattr(self._world, name)

    async def close(self) -> None:
        return None


def _declare(app: Workflows, scene: MidStep) -> None:
    """``charge`` and ``checkout`` on ``app``; the body records into ``scene``."""
    wake = scene.wake

    @app.step
    async def charge(order: str) -> str:
        attempt = step_metadata().attempt
        scene.marker.append(attempt)
        scene.entered.set()
        await scene.release.wait()
        if attempt == 1 and scene.fail_first:
            raise RetryableError("the card processor timed out")
        return f"charged {order}"

    @app.workflow
    async def checkout(order: str) -> str:
        if wake == "hook":
            charged, _ = await asyncio.gather(charge(order), Proceed.wait(token=f"go:{order}"))
        elif wake == "sleep":
            charged, _ = await asyncio.gather(charge(order), sleep(SLEEP_SECONDS))
        else:
            charged = await charge(order)
        return str(charged)


def _types(log: list[events.LoggedEvent]) -> list[str]:
    return [e.type for e in log]


def expected_backstop_key(first: events.LoggedEvent) -> str:
    """Seed 000's epoch key: ``<cid>:backstop:<lastStartedAt>`` of the owner's start."""
    assert first.correlation_id is not None
    return ownership.backstop_key(first.correlation_id, first.created_at)


def orchestrator_send(t: Traced) -> messages.OrchestratorMessage:
    assert t.send is not None and isinstance(t.send.message, messages.OrchestratorMessage)
    return t.send.message
