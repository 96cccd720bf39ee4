"""World implementations (``local``; ``postgres`` + ``nats`` later) and opening one by URL.

``open_world("local:.treadle")`` opens the embedded World under ``.treadle``.
"""

from __future__ import annotations

from treadle import errors
from treadle.world import contract


async def open_world(url: str, *, tuning: contract.QueueTuning | None = None) -> contract.World:
    """Open the World a URL names: ``local:PATH`` (a bare ``local`` means ``.treadle``)."""
    scheme, _, rest = url.partition(":")
    if scheme == "local":
        from treadle.worlds.local import LocalWorld

        return await LocalWorld(rest or ".treadle", tuning=tuning).open()
    raise errors.SettingsError(
        f"TREADLE_WORLD={url!r} is not a World treadle knows; use local:PATH "
        "(postgres and nats are not built yet)"
    )
