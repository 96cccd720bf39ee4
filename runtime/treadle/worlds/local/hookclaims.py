"""The local World's hook token claims: force-claim and token retention (issue 17 item 8).

``claim`` decides a ``hook_created``'s token inside the append's transaction, by the
shared rules (``storagerules.claim_decision``, ``holder_expired``): a token held by an
ended run whose retention passed is free (its row is dropped); another run's live or
retained hook is force-claimed when the creation asks (``hook_disposed`` with
``force_claimed_by`` written into the holder's log, out-of-band, by ``write_foreign``,
and the creation stored with ``claimed_from``); else the creation becomes
``hook_conflict``. Retention is kept in ``hook_retention`` (by token, beside ``hooks``);
``retain``, ``release`` and ``end_run`` keep the two tables together.

Called by ``eventlog._admit`` and ``eventlog._fold``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from treadle.world import events, storagerules

_ENDED = ("completed", "failed", "cancelled")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def claim(
    conn: sqlite3.Connection,
    run_id: str,
    event: events.HookCreated,
    *,
    now_us: int,
    write_foreign: Callable[[str, events.Event], events.LoggedEvent],
) -> events.Event:
    """What to store for ``event``: itself, its ``claimed`` form, or a ``hook_conflict``."""
    row = conn.execute(
        "SELECT h.run_id, h.hook_id, t.retain_until, r.status FROM hooks h "
        "JOIN runs r ON r.run_id = h.run_id LEFT JOIN hook_retention t ON t.token = h.token "
        "WHERE h.token = ?",
        (event.token,),
    ).fetchone()
    if row is None:
        return event
    holder, hook_id, retain_until, status = row
    ended = status in _ENDED
    if ended and (retain_until is None or retain_until <= now_us):
        _drop(conn, event.token)
        return event
    decision = storagerules.claim_decision(run_id, event, holder)
    if decision == "conflict":
        return storagerules.conflict(event, holder)
    if decision == "create":  # pragma: no cover - a holder was found
        return event
    _drop(conn, event.token)
    write_foreign(holder, storagerules.forced_disposal(hook_id, run_id))
    return storagerules.claimed(event, holder)


def _drop(conn: sqlite3.Connection, token: str) -> None:
    conn.execute("DELETE FROM hooks WHERE token = ?", (token,))
    conn.execute("DELETE FROM hook_retention WHERE token = ?", (token,))


def retain(conn: sqlite3.Connection, token: str, until: datetime | None) -> None:
    """A new hook's retention (none: a stale row of an earlier hook of the token goes)."""
    conn.execute("DELETE FROM hook_retention WHERE token = ?", (token,))
    if until is not None:
        conn.execute(
            "INSERT INTO hook_retention (token, retain_until) VALUES (?, ?)",
            (token, _us(until)),
        )


def release(conn: sqlite3.Connection, run_id: str, hook_id: str) -> None:
    """A hook disposed or resumed: its token (and any retention) is free."""
    conn.execute(
        "DELETE FROM hook_retention WHERE token IN "
        "(SELECT token FROM hooks WHERE run_id = ? AND hook_id = ?)",
        (run_id, hook_id),
    )
    conn.execute("DELETE FROM hooks WHERE run_id = ? AND hook_id = ?", (run_id, hook_id))


def end_run(conn: sqlite3.Connection, run_id: str, at_us: int) -> None:
    """The run's end frees its hooks, but those whose retention has not passed."""
    kept = "SELECT token FROM hook_retention WHERE retain_until > ?"
    conn.execute(
        f"DELETE FROM hook_retention WHERE token IN (SELECT token FROM hooks WHERE run_id = ? "
        f"AND token NOT IN ({kept}))",
        (run_id, at_us),
    )
    conn.execute(f"DELETE FROM hooks WHERE run_id = ? AND token NOT IN ({kept})", (run_id, at_us))


def _us(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
