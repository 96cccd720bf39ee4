"""Values crossing the log: plain JSON plus tagged extensions.

Inputs, step results, hook payloads and outputs are stored as JSON. Beyond
JSON's own types, these round-trip exactly, as ``{"$t": tag, "v": value}``:
datetime, date, time, timedelta, bytes, Decimal, UUID, set, frozenset, tuple,
pydantic models and dataclasses, and dicts with non-string keys or a ``$t``
key of their own. A model or dataclass is stored under its import path but
rebuilt only if the app declares it (``treadle.serde_registry``: annotations,
the app's modules, ``treadle.register_types``); decoding never imports or calls
a name the data holds, and encoding refuses a class that would not decode. Anything else raises
``SerializationError`` naming where in the value it sits (``order.items[2]``),
and so does a value over ``treadle.limits`` (depth, size, NUL characters).
With a payload key set, ``encode`` seals the whole value (``treadle.payloads``) and
``decode`` opens it.

Called by the SDK (arguments and results), the replay engine (step results and
hook payloads), the client (outputs) and the orchestrator (what it writes).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, JsonValue, ValidationError

from treadle import errors, payloads
from treadle import limits as lim
from treadle import serde_registry as registry

TAG = "$t"


SerializationError = errors.SerializationError


def _tagged(tag: str, value: JsonValue) -> dict[str, JsonValue]:
    return {TAG: tag, "v": value}


def _class_path(cls: type) -> str:
    """The stored name of a model or dataclass; ``TypeError`` when it would not decode."""
    if "<locals>" in cls.__qualname__:
        raise TypeError(
            f"{cls.__qualname__} is defined inside a function; define it at module level"
        )
    if not registry.is_declared(cls):
        raise TypeError(
            f"a {cls.__qualname__} ({registry.class_path(cls)}) is not declared to treadle, so "
            "no worker could read it back; name it in a workflow, step or Hook annotation, "
            f"define it in the app's module, or call treadle.register_types({cls.__qualname__})"
        )
    return registry.class_path(cls)


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


class _Refused(Exception):
    """A stored value ``decode`` will not rebuild; ``where`` grows as it unwinds."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.where: list[str] = []


def decode(data: JsonValue, path: str = "value") -> Any:
    """The Python value ``encode`` made ``data`` from.

    A ``model`` or ``dataclass`` tag is rebuilt only when its class is declared by
    the app (``treadle.serde_registry``): nothing named in the data is imported or
    called. Anything else (an undeclared class, a malformed tag) raises
    ``SerializationError`` naming where in the value it sits (``path`` is its name).
    """
    try:
        return _decode(data)
    except _Refused as exc:
        raise SerializationError(path + "".join(reversed(exc.where)), exc.reason) from None


def _decode(data: JsonValue) -> Any:
    if isinstance(data, list):
        out_list = []
        for i, item in enumerate(data):
            try:
                out_list.append(_decode(item))
            except _Refused as exc:
                exc.where.append(f"[{i}]")
                raise
        return out_list
    if not isinstance(data, dict):
        return data
    tag = data.get(TAG)
    if tag is None:
        out: dict[str, Any] = {}
        for k, v in data.items():
            try:
                out[k] = _decode(v)
            except _Refused as exc:
                exc.where.append(f".{k}")
                raise
        return out
    try:
        return _decode_tagged(tag, data)
    except _Refused:
        raise
    except (ValueError, TypeError, OverflowError, binascii.Error) as exc:
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise _Refused(f"a malformed {tag!r} value in stored data ({detail})") from None


def _items(tag: str, v: JsonValue) -> list[Any]:
    if not isinstance(v, list):
        raise _Refused(f"a {tag!r} value holds {type(v).__name__}, not a list")
    out = []
    for i, item in enumerate(v):
        try:
            out.append(_decode(item))
        except _Refused as exc:
            exc.where.append(f"[{i}]")
            raise
    return out


def _decode_tagged(tag: object, data: dict[str, JsonValue]) -> Any:
    v = data.get("v")
    match tag:
        case payloads.TAG if "kid" in data:
            return _decode(payloads.open_(data, payloads.active()))
        case "float":
            return float(str(v))
        case "dict":
            pairs = _items("dict", v)
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise _Refused("a 'dict' value must be a list of [key, value] pairs")
            return {_hashable(k): val for k, val in pairs}
        case "tuple":
            return tuple(_items("tuple", v))
        case "set":
            return {_hashable(item) for item in _items("set", v)}
        case "frozenset":
            return frozenset(_hashable(item) for item in _items("frozenset", v))
        case "datetime":
            return dt.datetime.fromisoformat(str(v))
        case "date":
            return dt.date.fromisoformat(str(v))
        case "time":
            return dt.time.fromisoformat(str(v))
        case "timedelta":
            parts = v if isinstance(v, list) else []
            if len(parts) != 3:
                raise _Refused("a 'timedelta' value must be [days, seconds, microseconds]")
            days, seconds, micros = (int(str(x)) for x in parts)
            return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
        case "bytes":
            return base64.b64decode(str(v), validate=True)
        case "decimal":
            return Decimal(str(v))
        case "uuid":
            return uuid.UUID(str(v))
        case "model" | "dataclass":
            return _rebuild(tag, data.get("cls"), v)
    raise _Refused(f"unknown tag {tag!r} in stored data")


def _rebuild(tag: str, name: JsonValue, v: JsonValue) -> Any:
    """A declared model or dataclass, from its stored fields; never an import."""
    if not isinstance(name, str):
        raise _Refused(f"a {tag!r} value names no class")
    cls = registry.lookup(name)
    if cls is None:
        raise _Refused(
            f"the stored value names class {name!r}, which this app does not declare, so "
            "it was not imported or called (name it in a workflow, step or Hook annotation, "
            "define it in the app's module, or call treadle.register_types)"
        )
    fields = _decode(v)
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise _Refused(f"the fields of {name!r} are not an object")
    if tag == "model":
        if not issubclass(cls, BaseModel):
            raise _Refused(f"class {name!r} is not a pydantic model")
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise _Refused(f"cannot rebuild {name!r}: {_one_line(exc)}") from None
    if not dataclasses.is_dataclass(cls):
        raise _Refused(f"class {name!r} is not a dataclass")
    try:
        return cls(**fields)
    except TypeError as exc:
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise _Refused(f"cannot rebuild {name!r}: {detail}") from None


def _one_line(exc: ValidationError) -> str:
    errors_ = exc.errors()
    if not errors_:
        return str(exc).splitlines()[0]
    loc = ".".join(str(x) for x in errors_[0]["loc"]) or "the top"
    return f"{exc.error_count()} validation error(s), first at {loc}: {errors_[0]['msg']}"


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
