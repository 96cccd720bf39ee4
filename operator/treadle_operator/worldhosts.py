"""The hosts the operator may connect to as a World (security review L6).

Whoever can create a Secret and a WorkflowDeployment chooses the URLs the
operator connects to, and reads in the ``WorldReachable`` condition whether the
connection was refused, timed out or failed authentication: a port scan and
SSRF from the operator's network position. ``TREADLE_OPERATOR_WORLD_HOSTS``
(chart value ``worldHosts``) closes it: when set, every host a World URL names
(PostgreSQL's, several when the URL lists several or a ``host=`` query
parameter, and each NATS server's) must be on it, or nothing is connected and
the condition says only which host was refused. Entries are ``host``,
``host:port`` or ``*.domain``; hosts compare case-insensitively. Empty means any
host, documented as such; a NetworkPolicy on the operator's egress is the
other mitigation. Called by ``worlds.Worlds.get`` before connecting.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from treadle_operator.errors import NotConfigured, WorldHostRefused

DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "nats": 4222, "tls": 4222}


@dataclass(frozen=True)
class Allowed:
    """The parsed allowlist; empty allows every host."""

    entries: frozenset[tuple[str, int | None]] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def allows(self, host: str, port: int) -> bool:
        host = host.lower()
        for pattern, wanted in self.entries:
            if wanted is not None and wanted != port:
                continue
            if pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
                return True
        return False


ANY = Allowed()


def parse(text: str) -> Allowed:
    entries: set[tuple[str, int | None]] = set()
    for raw in text.split(","):
        item = raw.strip().lower()
        if item:
            host, port = _split(item)
            entries.add((host, port))
    return Allowed(frozenset(entries))


def _split(hostport: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host, port = hostport, ""
    if port and not port.isdigit():
        raise NotConfigured(f"TREADLE_OPERATOR_WORLD_HOSTS: {hostport!r} has no valid port")
    return host, int(port) if port else None


def hosts_of(url: str) -> list[tuple[str, int]]:
    """Every (host, port) a PostgreSQL or NATS URL (or comma-separated NATS list) connects to."""
    found: list[tuple[str, int]] = []
    for part in url.split(",") if not url.startswith(("postgres://", "postgresql://")) else [url]:
        parsed = urlsplit(part.strip())
        default = DEFAULT_PORTS.get(parsed.scheme)
        if default is None:
            raise WorldHostRefused("a World URL that is not postgres://, nats:// or tls://")
        netloc = parsed.netloc.rpartition("@")[2]
        for hostport in netloc.split(",") if netloc else []:
            host, port = _split(hostport)
            found.append((host, port or default))
        query = parse_qs(parsed.query)
        ports = [int(p) for p in query.get("port", []) if p.isdigit()]
        for key in ("host", "hostaddr"):
            for value in query.get(key, []):
                for host in value.split(","):
                    found.append((host, ports[0] if ports else default))
        if not found:
            raise WorldHostRefused("a World URL with no host")
    return found


def check(allowed: Allowed, *urls: str) -> None:
    """Raise ``WorldHostRefused`` naming the first host not allowed (never the URL)."""
    if not allowed:
        return
    for url in urls:
        for host, port in hosts_of(url):
            if not allowed.allows(host, port):
                raise WorldHostRefused(
                    f"host {host}:{port} is not in TREADLE_OPERATOR_WORLD_HOSTS; not connected"
                )
