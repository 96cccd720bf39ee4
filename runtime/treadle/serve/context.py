"""What every route of ``treadle serve`` reads: the World, the settings, the client.

Built once by ``app.serve`` (or a test) and handed to each module's ``routes(ctx)``.
``serve`` holds the ``TREADLE_SERVE_*`` settings (``serve.settings``); ``client``
is a ``Workflows`` without workflows or worker on the same World (cancel, wake,
resume_hook go through it, as the CLI's do); ``stopping`` is set when the server
begins to shut down, so long-lived responses (the SSE streams) end cleanly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from treadle.client import Workflows
from treadle.serve import settings as serve_settings
from treadle.settings import Settings
from treadle.world import contract


@dataclass
class ServeContext:
    world: contract.World
    settings: Settings
    # Anything a module wants to share with the others (keyed by module name).
    extras: dict[str, Any] = field(default_factory=dict)
    serve: serve_settings.ServeSettings = field(default_factory=serve_settings.load)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # ``treadle serve --insecure-no-auth``: every request has the full role (a laptop, tests).
    insecure_no_auth: bool = False
    _client: Workflows | None = field(default=None, repr=False)

    @property
    def client(self) -> Workflows:
        """The World's client (no workflows, no worker): the actions' way in."""
        if self._client is None:
            self._client = Workflows(world=self.world, worker=False, settings_=self.settings)
        return self._client
