"""The embedded local World: a SQLite event log and a durable queue in one file.

``LocalWorld(path)`` stores everything under the directory ``path`` (default
``.treadle``) and serves one process; see ``world.LocalWorld``.
"""

from treadle.worlds.local.world import LocalWorld

__all__ = ["LocalWorld"]
