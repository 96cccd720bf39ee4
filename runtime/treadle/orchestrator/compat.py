"""What this worker may do with a World and a run (seed 003 "Single-writer guarantee and
the in-band fence", "The rollback floor").

- ``require_fence``: a spec 9 run is created or driven only on a World that
  declares the in-band fence (``capabilities.in_band_fence``); otherwise
  ``FenceNotSupported``, before anything is written. A spec 8 run needs no
  fence; on a World without one, ``start`` mints 8 (``specversions.mint``), so
  this refuses only a spec 9 run asked for explicitly (``start_run``) or one a
  fenced process created that reaches a fence-less worker.
- ``require_known_format``: an out-of-band write to a run whose spec version
  this worker does not know (neither 8 nor 9: ``SUPPORTED_SPEC_VERSIONS``) is
  ``RunNotSupported``, before anything is written.

Called by ``treadle.client`` (start, resume_hook, cancel, wake_up) and by
``orchestrator.delivery`` at the start of every delivery.
"""

from __future__ import annotations

from treadle import errors
from treadle.world import constants, contract, records


def world_name(world: contract.World) -> str:
    """How an error names a World: its class, and its location when it has one."""
    where = getattr(world, "path", None) or getattr(world, "where", None)
    name = type(world).__name__
    return f"{name} ({where})" if where else name


def require_fence(world: contract.World, spec_version: int, *, run_id: str | None = None) -> None:
    """Refuse a spec 9 (or later) run on a World without the in-band fence."""
    if spec_version < constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
        return
    if not world.capabilities.in_band_fence:
        raise errors.FenceNotSupported(world_name(world), spec_version=spec_version, run_id=run_id)


def require_known_format(run: records.RunRecord) -> records.RunRecord:
    """Refuse writes to a run of a format this worker does not know; the run when fine."""
    if run.spec_version not in constants.SUPPORTED_SPEC_VERSIONS:
        raise errors.RunNotSupported(
            run.run_id,
            spec_version=run.spec_version,
            supported=constants.SUPPORTED_SPEC_VERSIONS,
        )
    return run
