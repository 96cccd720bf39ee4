"""The Postgres World's storage half: the event log and read views on asyncpg.

``await PostgresStorage.connect(dsn)`` opens it on a database brought to this
treadle's schema by ``await treadle.worlds.postgres.migrate.migrate(dsn)``
(``treadle migrate``); the live feed is LISTEN/NOTIFY. Needs the ``postgres``
extra (asyncpg).
"""

from treadle.worlds.postgres.storage import PostgresStorage

__all__ = ["PostgresStorage"]
