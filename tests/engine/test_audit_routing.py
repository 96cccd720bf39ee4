"""Audit routing rows (seed 003 "Routing edge cases"; audit RO1, RO3), on both Worlds.

- RO1: an orchestrator message naming a run the World does not hold, stamped or not,
  is acknowledged with a warning naming the run: no redelivery loop, nothing created.
  (Its step-message half is Bug 8 / H2, ``test_bugs_hooks.py``.)
- RO3: a copy the engine re-sends never overwrites the version stamp the message
  carries: a re-route to the run's deployment keeps ``run_spec_version``. (The step
  wake's stamp is Bug 9, ``test_bugs_hooks.py``.)
"""

from __future__ import annotations

import pytest

from treadle.world import ids, messages

from .conftest import MakeApp
from .faults import FaultyWorld


async def test_an_orchestrator_message_for_a_missing_run_is_acknowledged_and_logged(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit RO1 / seed 003 "A run that is not found during routing ... that orchestrator then
    handles the missing run": a stamped and an unstamped wake for a run id no World row
    holds are each delivered once and acknowledged, with a warning naming the run; no
    run appears and nothing else is sent."""
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        return "never"

    await app.world()  # the worker consumes the World under test
    caplog.set_level("WARNING", logger="treadle")
    missing = [ids.new_run_id(), ids.new_run_id()]
    await faulty.queue.send(messages.OrchestratorMessage(run_id=missing[0], run_spec_version=9))
    await faulty.queue.send(messages.OrchestratorMessage(run_id=missing[1]))
    await faulty.queue.until(lambda: len(faulty.queue.orchestrator_answers()) >= 2)
    answers = faulty.queue.orchestrator_answers()
    assert [(a.result, a.error) for a in answers] == [(messages.ACK, None)] * 2
    assert sorted(a.meta.delivery_count for a in answers) == [1, 1]
    for run_id in missing:
        assert [r for r in caplog.records if run_id in r.getMessage()], f"no warning for {run_id}"
    assert not (await faulty.runs.list()).runs
    assert len(faulty.queue.sent) == 2, "something was sent for a run that does not exist"


async def test_a_re_routed_copy_keeps_the_version_stamp_it_carries(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RO3 / seed 003 "withRunSpecVersion never overwrites a runSpecVersion the payload
    already carries": a wake stamped 9 for a run pinned (by its row) to deployment blue
    reaches a green worker; the copy it re-sends to blue keeps run_spec_version 9 (and names blue),
    and the run is not replayed here."""
    app = make_app(world=faulty, TREADLE_DEPLOYMENT_ID="green")
    replayed: list[int] = []

    @app.workflow
    async def flow() -> str:
        replayed.append(1)
        return "ran"

    await faulty.deployments.register("blue")  # live, but no worker of it here
    run = await faulty.runs.create(
        workflow_name="flow", input={"args": [], "kwargs": {}}, deployment_id="blue",
        spec_version=9,
    )  # fmt: skip
    # No deployment on the wake (the run row pins it): every queue hands it to this worker
    # (NATS routes a message by its deployment, so one stamped blue would never come here).
    await faulty.queue.send(messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=9))
    await app.world()

    def copies() -> list[messages.OrchestratorMessage]:
        return [
            s.message
            for s in faulty.queue.sent
            if isinstance(s.message, messages.OrchestratorMessage) and s.message.reroute_count
        ]

    await faulty.queue.until(lambda: bool(copies()))
    (copy,) = copies()[:1]
    assert (copy.run_spec_version, copy.deployment_id, copy.reroute_count) == (9, "blue", 1)
    assert replayed == []
