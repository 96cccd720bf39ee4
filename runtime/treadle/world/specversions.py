"""Which run format a new run gets, and which format drives a delivery (seed 003).

One knob, ``WORKFLOW_SPEC_VERSION``, gates minting only: the version stamped
on a new run. Nothing that reads, routes or writes to an existing run reads
it; each of those follows the run's stamped version ("How new runs get their
version", "Resolving a delivery's spec").

- ``mint``: seed 003's minting table, with treadle's default: unset mints 9
  on a World with the in-band fence (treadle was built spec 9 first; the
  seed's runtime defaults to 8 only because its spec 9 was opt-in), 8 on one
  without (with the one-time warning the seed names).
- ``orchestrator_for``: 9 and later go to the spec 9 orchestrator, anything
  earlier to spec 8; a run never changes family.

Called by ``treadle.settings`` (validation), the client (start) and the
worker's routing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from treadle.world import constants

# The versions this build can drive.
SUPPORTED = frozenset({constants.SPEC_VERSION_LEGACY, constants.SPEC_VERSION_SINGLE_ORCHESTRATOR})


class Family(enum.Enum):
    SPEC8 = 8
    SPEC9 = 9


@dataclass(frozen=True)
class Minted:
    version: int
    warning: str | None = None


def mint(requested: int | None, *, in_band_fence: bool) -> Minted:
    """The version a World stamps on a new run for ``WORKFLOW_SPEC_VERSION=requested``."""
    fallback = (
        constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
        if in_band_fence
        else constants.SPEC_VERSION_LEGACY
    )
    if requested is None:
        if in_band_fence:
            return Minted(fallback)
        return Minted(
            fallback,
            "the World does not declare the in-band writer fence; new runs are spec 8",
        )
    if requested == constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
        if in_band_fence:
            return Minted(requested)
        return Minted(
            constants.SPEC_VERSION_LEGACY,
            "WORKFLOW_SPEC_VERSION=9 but the World does not declare the in-band writer fence; "
            "new runs are spec 8",
        )
    if requested == constants.SPEC_VERSION_LEGACY:
        return Minted(requested)
    return Minted(
        fallback,
        f"WORKFLOW_SPEC_VERSION={requested} is not a version this build mints (8 or 9); "
        f"new runs are spec {fallback}",
    )


def orchestrator_for(spec_version: int) -> Family:
    """The orchestrator family that drives a run of ``spec_version``."""
    if spec_version >= constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
        return Family.SPEC9
    return Family.SPEC8
