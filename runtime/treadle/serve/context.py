"""What every route of ``treadle serve`` reads: the World, the settings, the client.

Built once by ``app.serve`` (or a test) and handed to each module's ``routes(ctx)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treadle.settings import Settings
from treadle.world import contract


@dataclass
class ServeContext:
    world: contract.World
    settings: Settings
    # Anything a module wants to share with the others (keyed by module name).
    extras: dict[str, Any] = field(default_factory=dict)
