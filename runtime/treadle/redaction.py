"""What of a secret-bearing value may appear in a message or a log line: one place.

Every error, log line and repr that names a World URL goes through here
(``worlds.production``, ``worlds.postgres``, ``worlds.nats``, ``settings``, the
CLI and the operator), so a password can only leak if this module is wrong:

- ``redact_url(url)``: ``scheme://host:port`` (each server of a comma list), never
  the user's password, never raises. A URL it cannot read with certainty prints
  ``<unparseable URL>``: an unencoded ``/``, ``#``, ``?`` or ``@`` in a password
  would otherwise make a URL parser take a prefix of the password for the host or
  the port.
- ``parse_url(url)``: the same reading as a ``UrlParts`` (``None`` when unreadable),
  for callers that also show the user name or the database (``describe``).
- ``require_readable(url, what)``: the URL, or a ``SettingsError`` naming only ``what``.
- ``split_servers(url)``: a comma-separated server list as one URL per server.
- ``shown(value)``: a setting's value as an error message may quote it; a value that
  looks like a URL or a DSN is never echoed.
- ``quote(value)``: a value for a log line, quoted so that no newline or control
  character in it can forge a second line.
- ``install_log_quoting()`` (run when ``treadle`` is imported): every record of a
  ``treadle.*`` logger gets its arguments quoted when they hold a newline or another
  control character, so a run id, token or error text taken from a message or a row
  can never forge a log line, whichever log call it reaches.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from treadle import errors

UNPARSEABLE = "<unparseable URL>"
HIDDEN = "<hidden: it looks like a URL or DSN>"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*\Z")
_HOST = re.compile(r"(?:[A-Za-z0-9_~-][A-Za-z0-9._~-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?\Z")
_USER = re.compile(r"[A-Za-z0-9._~%!$&'()*+,;=-]*\Z")
# A new server of a list starts with its own scheme: ``nats://a:4222,nats://b:4222``.
_NEXT_SERVER = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_DSN_WORDS = re.compile(r"(?i)\b(?:password|passwd|pwd|token|secret|user)\s*=")


@dataclass(frozen=True)
class UrlParts:
    """What a log may show of one URL: never the password, the query or the fragment."""

    scheme: str
    username: str | None
    hosts: tuple[str, ...]  # "host" or "host:port", in order
    path: str  # before any "?" or "#", for example "/postgres"

    def __str__(self) -> str:
        return f"{self.scheme}://{','.join(self.hosts)}"


def parse_url(url: str) -> UrlParts | None:
    """One URL (``scheme://[user[:password]@]host[:port][,host[:port]...][/path]``), or
    ``None`` when it cannot be read with certainty. Never raises."""
    try:
        return _parse(url)
    except Exception:  # total by design: a redactor must never fail
        return None


def _parse(url: str) -> UrlParts | None:
    scheme, sep, rest = url.strip().partition("://")
    if not sep or not _SCHEME.match(scheme):
        return None
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in tail:
        # Either a password with an unencoded '/', '?' or '#' (the part after the
        # '@' would be read as the host), or an '@' in the path or query: the host
        # cannot be told with certainty, so nothing is shown.
        return None
    userinfo, at, hostlist = authority.rpartition("@")
    username: str | None = None
    if at:
        username = userinfo.partition(":")[0] or None
        if username is not None and not _USER.match(username):
            return None
    hosts = tuple(h.strip() for h in hostlist.split(","))
    if not hosts or not all(_HOST.match(h) for h in hosts):
        return None
    path = re.split(r"[?#]", tail, maxsplit=1)[0]
    if any(ch.isspace() or not ch.isprintable() for ch in path):
        return None
    return UrlParts(scheme.lower(), username, hosts, path)


def split_servers(url: str, default_scheme: str = "nats") -> list[str]:
    """``nats://u:p@a:4222,b:4222, nats://c:4222`` as one URL per server, each with its
    scheme and the credentials of its list (``nats://u:p@b:4222``). Never raises."""
    servers: list[str] = []
    for piece in _NEXT_SERVER.split(url.strip()):
        piece = piece.strip()
        if not piece:
            continue
        scheme, sep, rest = piece.partition("://")
        if not sep:
            scheme, rest = default_scheme, piece
        cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        userinfo, at, hostlist = rest[:cut].rpartition("@")
        for host in hostlist.split(","):
            if host.strip():
                servers.append(f"{scheme}://{userinfo}{at}{host.strip()}{rest[cut:]}")
    return servers


def redact_url(url: str) -> str:
    """A URL fit for a log line: ``scheme://host:port`` for each server of a comma
    list, or ``<unparseable URL>``. Never the password; never raises."""
    try:
        parsed = [parse_url(p) for p in _NEXT_SERVER.split(url.strip()) if p.strip()]
    except Exception:
        return UNPARSEABLE
    if not parsed or any(p is None for p in parsed):
        return UNPARSEABLE
    return ",".join(str(p) for p in parsed)


def require_readable(url: str, what: str) -> str:
    """``url`` if ``parse_url`` reads every server of it, else a ``SettingsError`` naming
    ``what`` (never the value): a driver would misread it and may echo a password."""
    if all(parse_url(p) is not None for p in _NEXT_SERVER.split(url.strip())):
        return url
    raise errors.SettingsError(
        f"{what} is not a URL treadle can read (the value is not shown): write it as "
        "scheme://user:password@host:port/..., with '/', '?', '#' and '@' in the user name "
        "or password percent-encoded (for example '/' as %2F)"
    )


def looks_secret(value: str) -> bool:
    """True for what may carry a credential: a URL, a ``user@host`` or a keyword DSN."""
    return "://" in value or "@" in value or bool(_DSN_WORDS.search(value))


def shown(value: object) -> str:
    """A value as an error message may quote it: ``repr`` unless it looks like a URL
    or a DSN (then ``<hidden: ...>``, never the text)."""
    text = value if isinstance(value, str) else repr(value)
    if looks_secret(text):
        return HIDDEN
    return repr(value)


def quote(value: object) -> str:
    """``value`` for a log line: a ``repr`` (one line, control characters escaped)."""
    text = repr(value if isinstance(value, str) else str(value))
    return text if len(text) <= 200 else f"{text[:197]}..."


def _safe_arg(arg: object) -> object:
    if isinstance(arg, str | BaseException) and _UNSAFE.search(str(arg)):
        return quote(str(arg))
    return arg


def install_log_quoting() -> None:
    """Quote unsafe arguments of every ``treadle.*`` log record (idempotent; the
    previous record factory still runs first)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "treadle_quoting", False):
        return

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.startswith("treadle") and record.args:
            if isinstance(record.args, tuple):
                record.args = tuple(_safe_arg(a) for a in record.args)
            elif isinstance(record.args, dict):
                record.args = {k: _safe_arg(v) for k, v in record.args.items()}
        return record

    factory.treadle_quoting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
