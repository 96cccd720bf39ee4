"""Seed 003 "How new runs get their version": the minting table, and routing by family."""

from __future__ import annotations

import pytest

from treadle.world import specversions
from treadle.world.specversions import Family


@pytest.mark.parametrize(
    ("requested", "fence", "version", "warns"),
    [
        (None, True, 9, False),
        (None, False, 8, True),
        (9, True, 9, False),
        (9, False, 8, True),
        (8, True, 8, False),
        (8, False, 8, False),
        (7, True, 9, True),
        (12, False, 8, True),
    ],
)
def test_minting_table(requested: int | None, fence: bool, version: int, warns: bool) -> None:
    minted = specversions.mint(requested, in_band_fence=fence)
    assert minted.version == version
    assert (minted.warning is not None) is warns


def test_a_fenceless_world_with_nine_requested_names_the_fence_in_its_warning() -> None:
    minted = specversions.mint(9, in_band_fence=False)
    assert minted.warning is not None and "in-band writer fence" in minted.warning


@pytest.mark.parametrize(
    ("version", "family"),
    [(8, Family.SPEC8), (6, Family.SPEC8), (9, Family.SPEC9), (10, Family.SPEC9)],
)
def test_runs_of_nine_and_later_go_to_spec_9_anything_earlier_to_spec_8(
    version: int, family: Family
) -> None:
    assert specversions.orchestrator_for(version) is family
