"""Run attributes: what a key and a value may be, and how a filter on them matches.

Attributes are a run's searchable key/value pairs (docs/attributes.md): seeded by
``app.start(..., attributes=...)`` (``run_created.attributes``), set later by an
``attr_set`` event each (workflow code in-band, step code and ``run.set_attributes`` out
of band); the run's record holds their fold, the last write of a key winning. Every
World folds them alike and answers ``runs.list(attributes={...})`` from an index.

The rules here are shared by every writer (checked at the call, before anything is
recorded) and every World (the filter):

- a key is 1 to 128 characters: a letter or ``_`` first, then letters, digits, ``_``,
  ``-``, ``.`` or ``/`` (``KEY_PATTERN``), so Kubernetes-style prefixed keys such as
  the operator's ``treadle.dev/binding`` are keys too;
- a value is JSON (None, bool, int, finite float, str, lists, objects with string keys)
  within ``treadle.limits`` (depth, strings, ``TREADLE_MAX_VALUE_BYTES``);
- a filter value is a JSON scalar (str, int, float, bool, None) of at most
  ``MAX_FILTER_VALUE_BYTES`` as JSON; it matches a run whose attribute equals it (a
  string equals a string, a number equals a number of the same value, ``true`` is not
  ``1``). Several filters are ANDed. Lists and objects are stored and shown but not
  searchable (Postgres containment and SQLite equality would disagree on them).

Used by ``treadle.client``, ``treadle.sdk.attributes``, the orchestrator, the CLI, the
serve API and the three Worlds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pydantic import JsonValue

from treadle import errors, limits

KEY_PATTERN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_./\-]{0,127}")
KEY_RULE: Final = (
    "1 to 128 characters: a letter or '_' first, then letters, digits, '_', '-', '.' or '/'"
)
# A filter value's JSON at most this long; longer stored values are never indexed.
MAX_FILTER_VALUE_BYTES: Final = 1024
# Keys one call may set (a guard against a mapping built by mistake from big data).
MAX_KEYS_PER_CALL: Final = 64


def check_key(key: object) -> str:
    """``key`` if it is a valid attribute key, else ``AttributeInvalid`` naming it."""
    if not isinstance(key, str):
        raise errors.AttributeInvalid(
            f"attribute key {key!r}", f"a key must be a string ({KEY_RULE})"
        )
    if KEY_PATTERN.fullmatch(key) is None:
        raise errors.AttributeInvalid(f"attribute {key!r}", f"a key must be {KEY_RULE}")
    return key


def _check_json(value: object, path: str) -> None:
    """Refuse what is not JSON (a set, a datetime, NaN, a non-string object key)."""
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, bool | int | str):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise errors.AttributeInvalid(where, f"{item!r} is not a JSON number")
            continue
        if isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise errors.AttributeInvalid(where, f"object key {k!r} is not a string")
                stack.append((v, f"{where}.{k}"))
            continue
        raise errors.AttributeInvalid(
            where,
            f"a value of type {type(item).__name__} is not JSON (use str, int, float, bool, "
            "None, lists and dicts of them)",
        )


def _plain(value: Any) -> JsonValue:
    """Tuples as lists: what the log will hold."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value  # type: ignore[no-any-return]


def check_attributes(
    attributes: object, where: str, lim: limits.Limits | None = None
) -> dict[str, JsonValue]:
    """Validate a mapping of attributes before anything is written; return it as JSON.

    ``where`` names the call (``"app.start"``, ``"set_attributes()"``) in the error.
    """
    if not isinstance(attributes, Mapping):
        raise errors.AttributeInvalid(
            where, f"attributes must be a mapping of key to value, not {type(attributes).__name__}"
        )
    if len(attributes) > MAX_KEYS_PER_CALL:
        raise errors.AttributeInvalid(
            where, f"{len(attributes)} attributes in one call, over {MAX_KEYS_PER_CALL}"
        )
    out: dict[str, JsonValue] = {}
    for key, value in attributes.items():
        check_key(key)
        path = f"attribute {key!r}"
        _check_json(value, path)
        plain = _plain(value)
        limits.check_value(plain, path, lim)
        out[key] = plain
    return out


# -- filters ---------------------------------------------------------------------------------


def canonical(value: JsonValue) -> str | None:
    """The indexed form of a scalar value (its compact JSON, an integral float as an int),
    or None for a value no filter can match (a list, an object, a long scalar)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    if isinstance(value, list | dict):
        return None
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text.encode()) <= MAX_FILTER_VALUE_BYTES else None


def check_filter(attributes: Mapping[str, JsonValue] | None) -> dict[str, JsonValue] | None:
    """A ``runs.list`` attribute filter, checked (``WorldContractError``): valid keys,
    scalar values of at most ``MAX_FILTER_VALUE_BYTES``. None or empty: no filter."""
    if not attributes:
        return None
    out: dict[str, JsonValue] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or KEY_PATTERN.fullmatch(key) is None:
            raise errors.WorldContractError(
                f"runs.list attribute filter: key {key!r} is not valid ({KEY_RULE})"
            )
        if isinstance(value, list | dict) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise errors.WorldContractError(
                f"runs.list attribute filter {key!r}: only a string, number, boolean or "
                "null can be searched"
            )
        if canonical(value) is None:
            raise errors.WorldContractError(
                f"runs.list attribute filter {key!r}: the value is over "
                f"{MAX_FILTER_VALUE_BYTES} bytes as JSON"
            )
        out[key] = value
    return out


def matches(held: Mapping[str, JsonValue], wanted: Mapping[str, JsonValue] | None) -> bool:
    """Whether a run's attributes ``held`` satisfy the filter (every key equal)."""
    if not wanted:
        return True
    for key, value in wanted.items():
        if key not in held:
            return False
        have = canonical(held[key])
        if have is None or have != canonical(value):
            return False
    return True


def parse_filter(pairs: Iterable[str], where: str = "--attr") -> dict[str, JsonValue]:
    """``["tier=gold", "n=3"]`` (the CLI's ``--attr`` and the API's ``attr=``) as a filter.

    The value is read as JSON when it is a JSON scalar (``3``, ``true``, ``null``,
    ``"3"`` quoted), else taken as a string; ``ValueError`` naming the pair otherwise.
    """
    out: dict[str, JsonValue] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"{where} {pair!r}: expected KEY=VALUE")
        if KEY_PATTERN.fullmatch(key) is None:
            raise ValueError(f"{where} {pair!r}: key {key!r} is not valid ({KEY_RULE})")
        value: JsonValue
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if isinstance(value, list | dict) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            value = text
        if canonical(value) is None:
            raise ValueError(f"{where} {pair!r}: over {MAX_FILTER_VALUE_BYTES} bytes")
        out[key] = value
    return out


def fold(
    seeded: Mapping[str, JsonValue], sets: Iterable[tuple[str, JsonValue]]
) -> dict[str, JsonValue]:
    """The attributes a run's record must show: the seed, then each ``attr_set`` in
    slot order (the simulation's invariant, and the conformance check)."""
    out = dict(seeded)
    for key, value in sets:
        out[key] = value
    return out
