"""Payload encryption at rest (issue 16 item 4): the key ring, the envelope, serde.

Unit tests of ``treadle.payloads`` with real AES-GCM (the ``cryptography`` package).
The end-to-end tests on both Worlds are in tests/engine/test_payload_encryption.py,
the CLI's in tests/cli/test_payload_encryption_cli.py.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json

import pytest

from treadle import errors, payloads, register_types, serde

K1 = base64.b64encode(bytes(range(32))).decode()
K2 = base64.b64encode(bytes(range(100, 132))).decode()


@dataclasses.dataclass
class Order:
    sku: str
    at: dt.datetime


register_types(Order)  # a class the app declares (decoding never imports by name)


@pytest.fixture
def ring() -> payloads.KeyRing:
    return payloads.KeyRing.parse(f"k2:{K2},k1:{K1}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "is empty"),
        ("nocolon", "entry 1: expected <key id>:<base64 key>"),
        (f"k1:{K1},bad id:{K2}", "entry 2: expected"),
        ("k1:not base64!!", "entry 1 (key id 'k1'): the key is not valid base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "the key has 5 bytes; AES-256-GCM needs 32"),
        (f"k1:{K1},k1:{K2}", "key id 'k1' appears twice"),
    ],
)
def test_a_bad_key_setting_is_one_clear_error_that_never_shows_key_material(
    text: str, expected: str
) -> None:
    with pytest.raises(errors.SettingsError) as caught:
        payloads.KeyRing.parse(text)
    assert expected in str(caught.value)
    assert K1 not in str(caught.value) and K2 not in str(caught.value)


def test_the_first_key_encrypts_and_every_key_decrypts(ring: payloads.KeyRing) -> None:
    assert ring.primary == "k2"
    sealed = payloads.seal({"card": "4111-1111"}, ring)
    assert sealed["kid"] == "k2" and "4111" not in json.dumps(sealed)
    old = payloads.seal({"card": "old"}, payloads.KeyRing.parse(f"k1:{K1}"))
    assert payloads.open_(old, ring) == {"card": "old"}  # a value from before the rotation
    assert payloads.open_(sealed, ring) == {"card": "4111-1111"}
    assert K1 not in repr(ring) and K2 not in repr(ring)


def test_a_tampered_or_relabelled_envelope_does_not_open(ring: payloads.KeyRing) -> None:
    sealed = payloads.seal("pay 10", ring)
    raw = bytearray(base64.b64decode(str(sealed["v"])))
    raw[-1] ^= 1
    tampered = {**sealed, "v": base64.b64encode(bytes(raw)).decode()}
    with pytest.raises(errors.PayloadDecryptionFailed, match="does not authenticate"):
        payloads.open_(tampered, ring, "step pay result")
    relabelled = {**sealed, "kid": "k1"}  # the key id is authenticated with the value
    with pytest.raises(errors.PayloadDecryptionFailed):
        payloads.open_(relabelled, ring)
    with pytest.raises(errors.PayloadDecryptionFailed, match="too short"):
        payloads.open_({**sealed, "v": "AAAA"}, ring)


def test_a_value_whose_key_is_not_held_names_the_key_id(ring: payloads.KeyRing) -> None:
    sealed = payloads.seal([1, 2], ring)
    with pytest.raises(errors.PayloadKeyMissing, match="encrypted under key 'k2'"):
        payloads.open_(sealed, payloads.KeyRing.parse(f"k1:{K1}"), "workflow input")
    with pytest.raises(errors.PayloadKeyMissing):
        payloads.open_(sealed, None)


def test_serde_seals_every_value_under_the_ring_in_force_and_opens_it(
    ring: payloads.KeyRing,
) -> None:
    value = {"order": Order("sku-secret", dt.datetime(2026, 12, 1, tzinfo=dt.UTC)), "n": 3}
    payloads.use(ring)
    try:
        data = serde.encode(value, "step result")
        assert payloads.is_envelope(data)
        assert "sku-secret" not in json.dumps(data)
        assert serde.decode(data) == value
        two = serde.encode(value, "step result")
        assert two != data, "every value gets its own nonce"
    finally:
        payloads.use(None)
    plain = serde.encode(value, "step result")
    assert not payloads.is_envelope(plain) and "sku-secret" in json.dumps(plain)
    with pytest.raises(errors.PayloadKeyMissing):
        serde.decode(data)  # no ring in force now


def test_display_opens_what_it_can_and_shows_encrypted_for_the_rest(
    ring: payloads.KeyRing,
) -> None:
    sealed = payloads.seal({"x": 1}, ring)
    stored = {"args": [sealed], "kwargs": {}}
    assert payloads.display(stored, ring) == {"args": [{"x": 1}], "kwargs": {}}
    other = payloads.KeyRing.parse(f"k1:{K1}")
    assert payloads.display(stored, other) == {"args": ["<encrypted>"], "kwargs": {}}


def test_a_new_key_entry_parses_back() -> None:
    entry = payloads.new_key("k20261201")
    ring = payloads.KeyRing.parse(entry)
    assert ring.primary == "k20261201" and len(ring.keys["k20261201"]) == 32
    with pytest.raises(errors.SettingsError):
        payloads.new_key("no spaces")
