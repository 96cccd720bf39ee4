"""``treadle.fastjson``: orjson's speed, the standard library's text and errors.

The sizes ``treadle.limits`` checks and the payloads it seals are written by it; a value
orjson cannot write exactly (an integer past 64 bits, a lone surrogate, a non-string
key) takes the standard library's path, so nothing reads back differently.
"""

from __future__ import annotations

import json

import pytest

from treadle import fastjson, limits, payloads


def _stdlib(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**63),
        2**64 - 1,
        0.1,
        2.5,
        'é ü ☃ \n \t \x01 "q" \\',
        {"a": [1, 2, {"b": None}], "c": "x" * 100},
        [[[[[]]]]],
        {"$t": "set", "v": [1, 2]},
    ],
)
def test_same_text_as_the_standard_library(value: object) -> None:
    assert fastjson.dumps(value) == _stdlib(value)
    assert json.loads(fastjson.dumps(value)) == value
    assert fastjson.dumps_str(value) == _stdlib(value).decode()


def test_a_big_integer_takes_the_standard_librarys_path() -> None:
    big = {"n": 10**60, "m": -(2**70)}
    assert fastjson.dumps(big) == _stdlib(big)
    assert json.loads(fastjson.dumps(big)) == big  # exact: never a float
    assert limits.stored_size(big) == len(_stdlib(big))


def test_a_non_string_key_is_written_as_the_standard_library_writes_it() -> None:
    assert fastjson.dumps({1: "a"}) == _stdlib({1: "a"})


def test_a_lone_surrogate_fails_as_it_did() -> None:
    with pytest.raises(UnicodeEncodeError):
        _stdlib("a\ud800")
    with pytest.raises(UnicodeEncodeError):
        fastjson.dumps("a\ud800")


def test_floats_read_back_identical() -> None:
    for value in (1e16, 1e-7, 1e300, 5e-324, -0.0, 123456789.123):
        assert json.loads(fastjson.dumps(value)) == value


def test_sealed_payload_opens_to_the_same_value() -> None:
    ring = payloads.KeyRing.parse("k1:" + "A" * 43 + "=")
    data = {"card": "4111", "n": 10**30, "items": [1.5, "é"]}
    assert payloads.open_(payloads.seal(data, ring), ring) == data
