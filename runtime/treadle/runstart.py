"""Recording a run and sending its first message: ``start_run``, the format a new run
gets (``minted_spec_version``), and its start message.

Shared by ``Workflows.start`` (``treadle.client``), the schedules, ``treadle serve`` and
the operator; ``treadle.client`` re-exports ``start_run`` and ``minted_spec_version``.
"""

from __future__ import annotations

import logging

from pydantic import JsonValue

import treadle.telemetry.hooks as telemetry_hooks
from treadle import errors, limits, settings
from treadle import runwrites as out_of_band
from treadle.orchestrator import compat, limitgate
from treadle.world import attributes as run_attributes
from treadle.world import constants, contract, messages, records, specversions

# The mint warning's logger is the client's, as before the split (docs/spec8.md).
log = logging.getLogger("treadle.client")

# A start_on_latest start refused because its latest retired meanwhile reads again.
LATEST_START_ATTEMPTS = 3


@telemetry_hooks.run_start
async def start_run(
    world: contract.World,
    *,
    name: str,
    data: JsonValue,
    deployment_id: str,
    spec_version: int,
    run_id: str,
    attributes: dict[str, JsonValue] | None = None,
    limits_: limits.Limits | None = None,
    limit: limitgate.LimitEntry | None = None,
) -> records.RunRecord:
    """Record a run and send its first orchestrator message.

    A run of a limited workflow (``limit``) takes its slot first: held, its start
    message goes out (delayed to its rate reservation); waiting, nothing is sent now
    (the release that admits it sends it; ``treadle.orchestrator.limitgate``).

    The input is checked against ``treadle.limits`` first: a refused input
    records nothing. An input too large for a queue message is left out of the
    start message (the orchestrator reads it from the log: no turbo start), so
    a start is never refused by the queue after its run is recorded.

    Safe to retry with the same ``run_id``: the World returns the run already
    recorded, and a second start message is only a wake for a run that exists.
    ``FenceNotSupported`` (nothing recorded) for a spec 9 run on a World without the
    in-band fence (``Workflows.start`` never asks for one there: it mints 8).
    """
    limits.check_value(data, f"workflow {name} input", limits_, envelope=2)
    if attributes:
        attributes = run_attributes.check_attributes(attributes, f"workflow {name} start", limits_)
    compat.require_fence(world, spec_version)
    run = await world.runs.create(
        workflow_name=name,
        input=data,
        deployment_id=deployment_id,
        spec_version=spec_version,
        run_id=run_id,
        attributes=attributes,
    )
    start = _start_message(run, data)
    if limit is None:
        await world.queue.send(start)
        return run
    delay = await limitgate.enter(
        world, limit.workflow, limit.keys, run.run_id, limit.priority, start
    )
    if delay is not None:
        await world.queue.send(start, delay_seconds=delay)
    return run


async def start_on(
    world: contract.World,
    deployment_id: str,
    start_on_latest: bool,
    *,
    name: str,
    data: JsonValue,
    spec_version: int,
    run_id: str,
    attributes: dict[str, JsonValue] | None,
    limits_: limits.Limits,
    limit: limitgate.LimitEntry | None,
) -> None:
    """``start_run`` on ``deployment_id``, or (``start_on_latest``, on a World with
    deployments) on the World's latest deployment: when the latest is retired between
    its read and the write (review R1) nothing was recorded, and the start reads the new
    latest and starts there (up to ``LATEST_START_ATTEMPTS`` times)."""
    deployments = getattr(world, "deployments", None)
    on_latest = start_on_latest and deployments is not None
    deployment = deployment_id
    for attempt in range(1, LATEST_START_ATTEMPTS + 1):
        if on_latest and deployments is not None:
            deployment = await deployments.latest() or deployment
        try:
            await start_run(
                world, name=name, data=data, deployment_id=deployment,
                spec_version=spec_version, run_id=run_id, attributes=attributes,
                limits_=limits_, limit=limit,
            )  # fmt: skip
            return
        except errors.DeploymentRetired:
            if not on_latest or attempt == LATEST_START_ATTEMPTS:
                raise
            log.info("run %s: %s retired meanwhile; starting on the new latest", run_id, deployment)


_mint_warned: set[str] = set()


def minted_spec_version(current: settings.Settings, world: contract.World) -> int:
    """The format a new run gets (seed 003 "How new runs get their version"): minting is
    the only reader of ``WORKFLOW_SPEC_VERSION``; its warning is logged once per process."""
    minted = specversions.mint(
        current.WORKFLOW_SPEC_VERSION, in_band_fence=world.capabilities.in_band_fence
    )
    if minted.warning is not None and minted.warning not in _mint_warned:
        _mint_warned.add(minted.warning)
        log.warning("%s (%s)", minted.warning, compat.world_name(world))
    return minted.version


def _start_message(run: records.RunRecord, data: JsonValue) -> messages.OrchestratorMessage:
    """The run's start message; carrying its input (turbo) only if it fits a message."""
    message = messages.OrchestratorMessage(
        run_id=run.run_id,
        deployment_id=run.deployment_id,
        run_input=messages.RunInput(
            workflow_name=run.workflow_name,
            input=data,
            spec_version=run.spec_version,
            deployment_id=run.deployment_id,
            created_at=run.created_at,
        ),
    )
    if len(message.model_dump_json().encode()) > constants.MAX_MESSAGE_BYTES - 1024:
        return _wake(run)
    return message


def _wake(run: records.RunRecord) -> messages.OrchestratorMessage:
    return out_of_band.wake_message(run)
