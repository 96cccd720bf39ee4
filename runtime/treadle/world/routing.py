"""How a World gates a message: which run's orchestrator line, if any, it joins.

Pure functions, shared by every World so they gate the same way (seed 003,
"Queue: one orchestrator delivery per run"). A spec 9 run's orchestrator
messages are delivered one at a time per run; step messages, intermediate
timer hops and earlier runs' messages are never held.

Where treadle deviates from the seed: seed 003's queue counts an unstamped message as
spec 8 and never gates it; ``gated_run_id`` gates one whose run row is spec 9 or
unknown (every producer in treadle stamps, and holding an unplaceable message costs
nothing). The contract's docstring (``treadle.world.contract``) records why.
"""

from __future__ import annotations

from treadle.world import constants, messages


def stamped_spec_version(
    message: messages.OrchestratorMessage | messages.StepMessage,
) -> int | None:
    """The spec version the message carries, or None for an unstamped one."""
    return message.spec_version


def gated_run_id(
    message: messages.OrchestratorMessage | messages.StepMessage,
    run_spec_version: int | None,
) -> str | None:
    """The run whose orchestrator line this message joins, or None if it is never held.

    ``run_spec_version`` is the run row's version, which the World reads only for
    an unstamped message (None when the run does not exist).
    """
    if not isinstance(message, messages.OrchestratorMessage):
        return None
    if message.is_intermediate_hop:
        return None
    version = message.spec_version
    if version is None:
        version = run_spec_version
    if version is None or version >= constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
        # A run we cannot place (no stamp, no row) is gated anyway: holding it costs
        # nothing, and the fence keeps it safe if it does overlap.
        return message.run_id
    return None
