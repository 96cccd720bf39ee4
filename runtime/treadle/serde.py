"""Values crossing the log: plain JSON plus tagged extensions.

Inputs, step results, hook payloads and outputs are stored as JSON. Beyond
JSON's own types, these round-trip exactly, as ``{"$t": tag, "v": value}``:
datetime, date, time, timedelta, bytes, Decimal, UUID, set, frozenset, tuple,
pydantic models and dataclasses (rebuilt by import path), and dicts with
non-string keys or a ``$t`` key of their own. Anything else raises
``SerializationError`` naming where in the value it sits (``order.items[2]``),
and so does a value over ``treadle.limits`` (depth, size, NUL characters).
With a payload key set, ``encode`` seals the whole value (``treadle.payloads``) and
``decode`` opens it.

Called by the SDK (arguments and results) and the orchestrator (what it writes).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import importlib
import math
import uuid
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, JsonValue

from treadle import errors, payloads
from treadle import limits as lim

TAG = "$t"


SerializationError = errors.SerializationError


def _tagged(tag: str, value: JsonValue) -> dict[str, JsonValue]:
    return {TAG: tag, "v": value}


def _class_path(cls: type) -> str:
    if "<locals>" in cls.__qualname__:
        raise TypeError(
            f"{cls.__qualname__} is defined inside a function; define it at module level"
        )
    return f"{cls.__module__}:{cls.__qualname__}"


def encode(
    value: Any, path: str = "value", *, limits: lim.Limits | None = None, sized: bool = True
) -> JsonValue:
    """A Python value as JSON-compatible data; raises ``SerializationError``.

    Within ``limits`` (default ``treadle.limits.active()``): its depth, its strings
    and (unless ``sized=False``: the caller checks a whole it is part of) its stored
    size are checked here, so nothing refused is ever written.
    """
    limits = limits or lim.active()
    data = _encode(value, path, 0, limits)
    if sized:
        lim.check_size(data, path, limits)  # the value's own size, before any encryption
    ring = payloads.active()
    return data if ring is None else payloads.seal(data, ring)


def _encode(value: Any, path: str, depth: int, limits: lim.Limits) -> JsonValue:
    """``value`` encoded; ``depth`` is how many containers enclose it in the stored JSON."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        lim.check_string(value, path)
        return value
    if isinstance(value, int):
        lim.check_int(value, path)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return _tagged("float", repr(value))
        return value
    inner = depth + 1
    lim.check_depth(inner, path, limits)
    if isinstance(value, list):
        return [_encode(item, f"{path}[{i}]", inner, limits) for i, item in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            out: dict[str, JsonValue] = {}
            for k, v in value.items():
                lim.check_string(k, f"{path}<key>")
                out[k] = _encode(v, f"{path}.{k}", inner, limits)
            return out
        # {"$t": "dict", "v": [[key, value], ...]}: the pairs sit three containers in.
        lim.check_depth(depth + 3, path, limits)
        return _tagged(
            "dict",
            [
                [
                    _encode(k, f"{path}<key>", depth + 3, limits),
                    _encode(v, f"{path}[{k!r}]", depth + 3, limits),
                ]
                for k, v in value.items()
            ],
        )
    if isinstance(value, tuple):
        lim.check_depth(depth + 2, path, limits)
        return _tagged(
            "tuple",
            [_encode(item, f"{path}[{i}]", depth + 2, limits) for i, item in enumerate(value)],
        )
    if isinstance(value, set | frozenset):
        lim.check_depth(depth + 2, path, limits)
        items = [_encode(item, f"{path}<item>", depth + 2, limits) for item in value]
        items.sort(key=repr)  # a stable order, so equal sets encode equally
        return _tagged("frozenset" if isinstance(value, frozenset) else "set", items)
    if isinstance(value, dt.datetime):
        return _tagged("datetime", value.isoformat())
    if isinstance(value, dt.date):
        return _tagged("date", value.isoformat())
    if isinstance(value, dt.time):
        return _tagged("time", value.isoformat())
    if isinstance(value, dt.timedelta):
        lim.check_depth(depth + 2, path, limits)
        return _tagged("timedelta", [value.days, value.seconds, value.microseconds])
    if isinstance(value, bytes | bytearray):
        return _tagged("bytes", base64.b64encode(bytes(value)).decode("ascii"))
    if isinstance(value, Decimal):
        return _tagged("decimal", str(value))
    if isinstance(value, uuid.UUID):
        return _tagged("uuid", str(value))
    if isinstance(value, BaseModel):
        try:
            cls = _class_path(type(value))
        except TypeError as exc:
            raise SerializationError(path, str(exc)) from None
        fields_ = _encode(value.model_dump(mode="python"), path, inner, limits)
        return {TAG: "model", "cls": cls, "v": fields_}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            cls = _class_path(type(value))
        except TypeError as exc:
            raise SerializationError(path, str(exc)) from None
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        return {TAG: "dataclass", "cls": cls, "v": _encode(fields, path, inner, limits)}
    raise SerializationError(
        path,
        f"a {type(value).__qualname__} cannot cross the event log; use JSON types, datetime, "
        "bytes, Decimal, UUID, set, tuple, a pydantic model or a dataclass",
    )


def _load_class(path: str) -> type:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise SerializationError(path, "does not name a class")
    return obj


def decode(data: JsonValue) -> Any:
    """The Python value ``encode`` made ``data`` from."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    tag = data.get(TAG)
    if tag is None:
        return {k: decode(v) for k, v in data.items()}
    v = data.get("v")
    match tag:
        case payloads.TAG if "kid" in data:
            return decode(payloads.open_(data, payloads.active()))
        case "float":
            return float(str(v))
        case "dict":
            assert isinstance(v, list)
            return {
                _hashable(decode(k)): decode(val)
                for k, val in (pair for pair in v if isinstance(pair, list))
            }
        case "tuple":
            assert isinstance(v, list)
            return tuple(decode(item) for item in v)
        case "set":
            assert isinstance(v, list)
            return {_hashable(decode(item)) for item in v}
        case "frozenset":
            assert isinstance(v, list)
            return frozenset(_hashable(decode(item)) for item in v)
        case "datetime":
            return dt.datetime.fromisoformat(str(v))
        case "date":
            return dt.date.fromisoformat(str(v))
        case "time":
            return dt.time.fromisoformat(str(v))
        case "timedelta":
            assert isinstance(v, list)
            days, seconds, micros = (int(str(x)) for x in v)
            return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
        case "bytes":
            return base64.b64decode(str(v))
        case "decimal":
            return Decimal(str(v))
        case "uuid":
            return uuid.UUID(str(v))
        case "model":
            cls = _load_class(str(data["cls"]))
            assert issubclass(cls, BaseModel)
            return cls.model_validate(decode(v))
        case "dataclass":
            cls = _load_class(str(data["cls"]))
            fields = decode(v)
            assert isinstance(fields, dict)
            return cls(**fields)
    raise SerializationError("value", f"unknown tag {tag!r} in stored data")


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
