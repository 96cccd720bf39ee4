"""``treadle.redaction``: the one helper every URL-bearing message goes through.

security.md M7: ``redact``, ``describe`` and the NATS ``_redact`` read
``urlsplit(...).port``, which raised with a prefix of the password when it held an
unencoded '/' or '#'; a comma-separated NATS list crashed with AssertionError; the
operator's ``WorldUrls`` repr showed both URLs.
"""

from __future__ import annotations

import pytest

from treadle import errors, redaction
from treadle.worlds.nats import NatsQueue
from treadle.worlds.postgres.database import Database, describe
from treadle.worlds.production import redact
from treadle_operator.worlds import WorldUrls

from ..nats.conftest import NatsServer

SECRET = "s3cr3t/PW#x"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@db:5432/x?sslmode=require", "postgresql://db:5432"),
        ("nats://n:n4ts@nats:4222", "nats://nats:4222"),
        ("nats://a:4222,nats://b:4222", "nats://a:4222,nats://b:4222"),
        ("nats://u:p@a:4222,b:4222", "nats://a:4222,b:4222"),
        ("postgresql://u:p%2F@[::1]:5432/db", "postgresql://[::1]:5432"),
        ("postgresql://u:p@ss@db/x", "postgresql://db"),
        (f"postgresql://postgres:{SECRET}@127.0.0.1:40649/postgres", "<unparseable URL>"),
        ("postgresql://postgres:1234/PW#x@127.0.0.1:1/postgres", "<unparseable URL>"),
        ("postgresql://h/db?password=ab@cd", "<unparseable URL>"),
        ("nats://a:4222,nats://n:pw/x@b:4222", "<unparseable URL>"),
        ("not a url", "<unparseable URL>"),
        ("x://\n", "<unparseable URL>"),
        ("", "<unparseable URL>"),
    ],
)
def test_redaction_shows_scheme_host_and_port_or_says_unparseable(url: str, shown: str) -> None:
    """Never raises, never a piece of the password: a URL it cannot read with
    certainty (a '/', '#', '?' or '@' after the host) is ``<unparseable URL>``."""
    assert redaction.redact_url(url) == shown
    assert redact(url) == shown


def test_describe_names_the_user_and_database_but_not_a_misread_password() -> None:
    assert (
        describe("postgresql://app:pw@db:5432/orders") == "the Postgres database app@db:5432/orders"
    )
    assert describe(f"postgresql://app:{SECRET}@db/x") == (
        "the Postgres database at <unparseable URL>"
    )
    assert describe("host=db password=pw") == "the Postgres database in the given DSN"


def test_an_unreadable_dsn_is_refused_before_the_driver_sees_it() -> None:
    """asyncpg raised ``invalid literal for int() ... 's3cr3t'``: a prefix of the password."""
    with pytest.raises(errors.SettingsError) as caught:
        Database(f"postgresql://app:{SECRET}@db/x", 1)
    assert "s3cr3t" not in str(caught.value)
    assert "the Postgres DSN is not a URL treadle can read" in str(caught.value)


def test_split_servers_gives_one_url_per_server_with_its_credentials() -> None:
    assert redaction.split_servers("nats://u:p@a:4222,b:4222, nats://c:1") == [
        "nats://u:p@a:4222",
        "nats://u:p@b:4222",
        "nats://c:1",
    ]
    assert redaction.split_servers("a:1,b:2") == ["nats://a:1", "nats://b:2"]


def test_shown_and_quote_never_echo_a_url_nor_let_a_newline_through() -> None:
    assert redaction.shown("postgresql://u:pw@db/x") == redaction.HIDDEN
    assert redaction.shown("host=db password=pw") == redaction.HIDDEN
    assert redaction.shown("lots") == "'lots'"
    assert redaction.quote("x\ntreadle worker: stopping") == "'x\\ntreadle worker: stopping'"


def test_the_operator_world_urls_repr_is_masked() -> None:
    urls = WorldUrls("postgresql://u:s3cr3t@db/x", "nats://n:n4ts@nats:4222")
    for text in (repr(urls), str(urls), f"{urls!r}", repr([urls])):
        assert "s3cr3t" not in text and "n4ts" not in text
    assert repr(urls) == "WorldUrls(postgresql://db + nats://nats:4222)"


async def test_a_comma_separated_nats_list_connects(nats_server: NatsServer) -> None:
    """``nats://dead:1,<real>`` connected nowhere (AssertionError); now nats-py gets a
    server list and uses the live one."""
    queue = await NatsQueue.connect(
        f"nats://127.0.0.1:1,{nats_server.url}", deployment_id="comma-list"
    )
    try:
        assert queue.nc.is_connected
    finally:
        await queue.close()


async def test_a_nats_url_with_an_unencoded_slash_is_one_clear_error() -> None:
    with pytest.raises(errors.SettingsError) as caught:
        await NatsQueue.connect("nats://n:N4ts/pw@127.0.0.1:1", deployment_id="x")
    assert "N4ts" not in str(caught.value)
    assert "the NATS URL is not a URL treadle can read" in str(caught.value)
