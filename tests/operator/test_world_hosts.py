"""The operator connects only to allowed World hosts when told (security review L6)."""

from __future__ import annotations

import pytest

from treadle_operator import worldhosts
from treadle_operator.errors import NotConfigured, WorldHostRefused

DB = "postgresql://u:s3cr3t@db.internal:5432/treadle"
NATS = "nats://nats.internal:4222"


def test_an_empty_allowlist_allows_any_host() -> None:
    worldhosts.check(worldhosts.parse(""), "postgresql://u:p@10.0.0.9:22/x", "nats://x:1")


def test_allowed_hosts_pass_with_default_ports_and_domains() -> None:
    allowed = worldhosts.parse("db.internal:5432, *.nats.svc,NATS.internal")
    worldhosts.check(allowed, DB, NATS)
    worldhosts.check(allowed, "postgresql://u:p@db.internal/t", "tls://a.nats.svc:4443")


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("postgresql://u:p@db.internal:22/t", "db.internal:22"),
        ("postgresql://u:p@db.internal:5432,evil:5432/t", "evil:5432"),
        ("postgresql://u:p@db.internal/t?host=169.254.169.254", "169.254.169.254:5432"),
        ("nats://nats.internal:4222,nats://evil:4222", "evil:4222"),
        ("postgresql://u:p@[::1]:5432/t", "::1:5432"),
    ],
)
def test_a_host_off_the_list_is_refused_naming_only_the_host(url: str, refused: str) -> None:
    allowed = worldhosts.parse("db.internal:5432,nats.internal")
    with pytest.raises(WorldHostRefused) as error:
        worldhosts.check(allowed, url)
    assert str(error.value) == (
        f"host {refused} is not in TREADLE_OPERATOR_WORLD_HOSTS; not connected"
    )
    assert "p@" not in str(error.value)


def test_a_url_of_another_kind_is_refused_when_a_list_is_set() -> None:
    with pytest.raises(WorldHostRefused, match="not postgres://, nats:// or tls://"):
        worldhosts.check(worldhosts.parse("db"), "host=db user=u password=p")


def test_a_bad_entry_is_a_clear_settings_error() -> None:
    with pytest.raises(NotConfigured, match="'db:x' has no valid port"):
        worldhosts.parse("db:x")
