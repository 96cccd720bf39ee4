"""A World Secret's keys are decoded only when read (review R9: a binary key crashed reconciles)."""

from __future__ import annotations

import base64

import pytest

from treadle_operator.errors import WorldSecretMissing, WorldSecretUnreadable
from treadle_operator.secretdata import SecretData, from_strings

BINARY = base64.b64encode(b"\xff\xfe\x00keystore").decode()


def _data(**values: str) -> SecretData:
    raw = {k.replace("_", "-"): base64.b64encode(v.encode()).decode() for k, v in values.items()}
    return SecretData("ns/w", {**raw, "keystore.p12": BINARY}, "7")


def test_a_binary_key_nobody_reads_is_never_decoded() -> None:
    data = _data(database_url="postgresql://u@h/d", nats_url="nats://n:4222")
    assert data["database-url"] == "postgresql://u@h/d"
    assert data.get("nats-url") == "nats://n:4222"
    assert data.get("absent") is None
    assert set(data) == {"database-url", "nats-url", "keystore.p12"}
    assert data.resource_version == "7"
    assert "postgresql" not in repr(data)


def test_a_used_key_that_is_not_text_is_an_error_naming_the_secret_and_key() -> None:
    data = _data()
    with pytest.raises(WorldSecretUnreadable) as error:
        data["keystore.p12"]
    assert str(error.value).startswith("Secret ns/w key keystore.p12 is not UTF-8 text (11 bytes)")
    assert isinstance(error.value, WorldSecretMissing)  # the same condition family, retried


def test_the_checksum_covers_only_the_chosen_keys_and_changes_with_them() -> None:
    one = from_strings("ns/w", {"database-url": "a", "nats-url": "b", "other": "x"})
    two = from_strings("ns/w", {"database-url": "a", "nats-url": "b", "other": "y"})
    three = from_strings("ns/w", {"database-url": "a2", "nats-url": "b", "other": "x"})
    keys = ("database-url", "nats-url", "payload-key")
    assert one.checksum(keys) == two.checksum(keys)
    assert one.checksum(keys) != three.checksum(keys)
    # "ab" + "" and "a" + "b" never collide: lengths are part of the digest.
    left = from_strings("ns/w", {"k1": "ab", "k2": ""}).checksum(("k1", "k2"))
    assert left != from_strings("ns/w", {"k1": "a", "k2": "b"}).checksum(("k1", "k2"))
