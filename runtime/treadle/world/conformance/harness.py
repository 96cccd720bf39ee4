"""What a conformance suite needs from the World under test."""

from __future__ import annotations

import abc

from treadle.world import contract


class WorldHarness(abc.ABC):
    """Opens the World under test, on the same backing store each time.

    ``open`` may be called again after the previous World was closed: the new one
    sees everything the old one stored (that is how restarts are tested).
    """

    @abc.abstractmethod
    async def open(self, tuning: contract.QueueTuning | None = None) -> contract.World: ...
