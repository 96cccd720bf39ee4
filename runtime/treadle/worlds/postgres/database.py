"""The Postgres World's connections: one statement per call, errors as treadle errors.

Every storage operation is one statement (``fetch`` or ``fetchrow``) on a
pooled connection in autocommit, so each is its own transaction and one round
trip: asyncpg keeps a prepared statement per connection, so a repeated call is
a single Bind/Execute/Sync exchange. Each connection holds up to
``statement_cache_size`` (``STATEMENT_CACHE_SIZE``; the setting
``TREADLE_DATABASE_STATEMENT_CACHE_SIZE``) and keeps them for its life
(asyncpg's default drops each after 300 s and prepares it again). 0 turns
prepared statements off, for a pooler that cannot hold them (PgBouncer in
transaction mode without ``max_prepared_statements``): every call then prepares
an unnamed statement first, a second round trip.

The pool here is a small one of its own rather than ``asyncpg.Pool``: asyncpg's
pool resets a connection's session on every release (a second round trip) and
releases through a new task, which together more than halve the appends a
connection does per second. treadle's storage never changes session state on a
pooled connection (the LISTEN connection is its own, in ``feed``), so a
connection goes back to the pool as it is, unless its call failed in a way that
may leave it in an unknown state (cancelled, a broken socket): then it is
dropped and a new one is opened when needed.

No statement runs without a deadline (``STATEMENT_TIMEOUT_MS``): the server's
``statement_timeout`` cancels a long one, and the client's command timeout
gives up on a call whose answer never comes (a hung connection).

Called by ``storage``, ``feed``, ``migrate`` and ``PostgresStorage``.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Protocol, cast

import asyncpg

from treadle import errors, redaction
from treadle.worlds.postgres import sqlerrors

APPLICATION_NAME = "treadle"
DEFAULT_POOL_SIZE = 10  # TREADLE_DATABASE_POOL_SIZE (settings.py) picks it for open_world
# No statement without a deadline: the server cancels one that runs longer than this
# (``statement_timeout``), and the client gives up on a call whose answer never comes
# (a hung connection or server) this much later; either is ``StorageUnavailable`` and
# the connection is dropped. ``statement_timeout_ms=0`` turns both off; the setting
# ``TREADLE_DATABASE_STATEMENT_TIMEOUT_MS`` picks it for ``open_world("postgres")``.
STATEMENT_TIMEOUT_MS = 60_000
CLIENT_TIMEOUT_GRACE_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 30.0
# Prepared statements kept per connection (asyncpg's default size); 0: none (a pooler).
STATEMENT_CACHE_SIZE = 100

# What a driver call can raise besides a server error: a closed connection
# (InterfaceError), a socket error or a timeout (OSError).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
)


class Row(Protocol):
    """A result row (``asyncpg.Record``): by position or column name."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def __len__(self) -> int: ...


def describe(dsn: str) -> str:
    """The database a DSN names, for messages: never its password."""
    if "://" not in dsn:
        return "the Postgres database in the given DSN"
    parts = redaction.parse_url(dsn)
    if parts is None:
        return f"the Postgres database at {redaction.UNPARSEABLE}"
    user = f"{parts.username}@" if parts.username else ""
    hosts = ",".join(parts.hosts) or "localhost"
    return f"the Postgres database {user}{hosts}{parts.path or '/'}"


def map_error(exc: BaseException, where: str) -> errors.WorldError:
    return sqlerrors.storage_error(exc, where)


class Database:
    """Up to ``pool_size`` connections to one database; every call maps driver errors."""

    def __init__(
        self,
        dsn: str,
        pool_size: int,
        *,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
        statement_cache_size: int = STATEMENT_CACHE_SIZE,
    ) -> None:
        if pool_size < 1:
            raise errors.WorldContractError(f"pool_size must be >= 1, got {pool_size}")
        if statement_timeout_ms < 0:
            raise errors.WorldContractError(
                f"statement_timeout_ms must be >= 0, got {statement_timeout_ms}"
            )
        if statement_cache_size < 0:
            raise errors.WorldContractError(
                f"statement_cache_size must be >= 0, got {statement_cache_size}"
            )
        if "://" in dsn:
            redaction.require_readable(dsn, "the Postgres DSN")
        self.dsn = dsn
        self.statement_timeout_ms = statement_timeout_ms
        self.statement_cache_size = statement_cache_size
        self.where = describe(dsn)
        self._size = pool_size
        self._open = 0
        self._idle: list[Any] = []
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
        statement_cache_size: int = STATEMENT_CACHE_SIZE,
    ) -> Database:
        """A pool with one connection open (so a bad DSN fails here)."""
        db = cls(
            dsn,
            pool_size,
            statement_timeout_ms=statement_timeout_ms,
            statement_cache_size=statement_cache_size,
        )
        db._release(await db._acquire(), healthy=True)
        return db

    async def fetch(self, sql: str, *args: object) -> list[Row]:
        return cast(list[Row], await self._call("fetch", sql, args))

    async def fetch_first(self, sql: str, *args: object) -> list[Row]:
        """``fetch``, ahead of every call waiting for a connection (a write many wait on:
        the combiner's, which would otherwise queue behind the reads twice in a row)."""
        return cast(list[Row], await self._call("fetch", sql, args, first=True))

    async def fetchrow(self, sql: str, *args: object) -> Row | None:
        return cast(Row | None, await self._call("fetchrow", sql, args))

    async def _call(
        self, method: str, sql: str, args: tuple[object, ...], *, first: bool = False
    ) -> Any:
        conn = await self._acquire(first=first)
        healthy = False
        try:
            result = await getattr(conn, method)(sql, *args)
            healthy = True
            return result
        except asyncpg.PostgresError as exc:
            # The server answered: the connection is fine unless the error ended it.
            healthy = not conn.is_closed()
            cause = None if sqlerrors.is_treadle_code(exc.sqlstate) else exc
            raise map_error(exc, self.where) from cause
        except (asyncpg.InterfaceError, OSError) as exc:
            raise map_error(exc, self.where) from exc
        finally:
            self._release(conn, healthy=healthy)

    async def _acquire(self, *, first: bool = False) -> Any:
        waited = first
        while True:
            if self._closed:
                raise errors.StorageUnavailable(f"the Postgres World on {self.where} is closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    return conn
                self._open -= 1
            if self._open < self._size:
                self._open += 1
                try:
                    return await self._connect()
                except BaseException as exc:
                    self._open -= 1
                    self._wake_one()
                    if isinstance(exc, DRIVER_ERRORS):
                        raise map_error(exc, f"cannot connect to {self.where}") from exc
                    raise
            waiter = asyncio.get_running_loop().create_future()
            # One woken but overtaken waits again at the front of the line.
            (self._waiters.appendleft if waited else self._waiters.append)(waiter)
            waited = True
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the turn this waiter was given on
                raise

    async def _connect(self) -> Any:
        settings = {"application_name": APPLICATION_NAME}
        command_timeout: float | None = None
        if self.statement_timeout_ms > 0:
            settings["statement_timeout"] = str(self.statement_timeout_ms)
            command_timeout = self.statement_timeout_ms / 1000 + CLIENT_TIMEOUT_GRACE_SECONDS
        return await asyncpg.connect(
            self.dsn,
            server_settings=settings,
            command_timeout=command_timeout,
            timeout=CONNECT_TIMEOUT_SECONDS,
            statement_cache_size=self.statement_cache_size,
            max_cached_statement_lifetime=0,  # treadle's statements are few and fixed
        )

    def _release(self, conn: Any, *, healthy: bool) -> None:
        if healthy and not self._closed and not conn.is_closed():
            self._idle.append(conn)
        else:
            self._open -= 1
            if not conn.is_closed():
                conn.terminate()
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # it wakes, sees the pool closed and raises
        idle, self._idle = self._idle, []
        for conn in idle:
            self._open -= 1
            try:
                await conn.close(timeout=5)
            except DRIVER_ERRORS:  # TimeoutError is an OSError
                conn.terminate()
