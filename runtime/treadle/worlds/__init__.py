"""World implementations: ``local`` (embedded SQLite), later ``postgres`` and ``nats``."""
