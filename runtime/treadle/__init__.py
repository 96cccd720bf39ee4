"""treadle: a durable workflow engine for Python.

The public API (``Workflows``, ``sleep``, ``Hook``, ...) is re-exported here as
it lands; today the package holds the World contract (``treadle.world``) and
the embedded local World (``treadle.worlds.local``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
