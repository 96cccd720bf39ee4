"""Limits on what crosses the event log, the same on every World, checked before a write.

A value (a workflow input, a step's arguments or result, a hook payload, a
workflow output) is refused with a ``SerializationError`` naming what and
where when it

- nests deeper than ``TREADLE_MAX_VALUE_DEPTH`` containers (lists and objects of
  its stored JSON; default 64, at most 128): JSON parsers stop near 200 levels,
  and the log's envelope adds about 8, so a deeper value would be stored and
  then never read back;
- is larger than ``TREADLE_MAX_VALUE_BYTES`` as stored JSON (default 4 MiB);
- holds a string (or an object key) with a NUL character (PostgreSQL's JSONB
  refuses ``\\u0000``) or a lone surrogate (not UTF-8), or an integer over
  4,000 digits (Python cannot print it back).

A hook token is at most ``TREADLE_MAX_HOOK_TOKEN_BYTES`` bytes of UTF-8
(default 256, at most 2,048: PostgreSQL cannot index a key over 2,704 bytes).

``serde.encode`` checks depth, strings and size as it encodes; ``check_value``
checks JSON that arrives already encoded (``Workflows.start_encoded``, the CLI,
the operator). The limits in force are ``active()``: the ones a worker's
handler installed (``use``, from its settings), else the process's settings.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pydantic import JsonValue

from treadle import errors, fastjson

if TYPE_CHECKING:
    from treadle.settings import Settings

DEFAULT_MAX_DEPTH: Final = 64
MAX_MAX_DEPTH: Final = 128
DEFAULT_MAX_VALUE_BYTES: Final = 4 * 1024 * 1024
MAX_MAX_VALUE_BYTES: Final = 128 * 1024 * 1024
DEFAULT_MAX_HOOK_TOKEN_BYTES: Final = 256
MAX_MAX_HOOK_TOKEN_BYTES: Final = 2048
# Python refuses to print an int over 4,300 digits; 14,000 bits is about 4,214.
MAX_INT_BITS: Final = 14_000


@dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int = DEFAULT_MAX_DEPTH
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_hook_token_bytes: int = DEFAULT_MAX_HOOK_TOKEN_BYTES
    # Not a limit, but read where the limits are (the worker's settings, per handler):
    # TREADLE_HOOK_TOKEN_NAMESPACE, the prefix of stored hook tokens (``hooktokens``).
    hook_token_namespace: str | None = None
    # Nor this: TREADLE_PUBLIC_URL, the base of create_webhook() URLs (``webhookspec``).
    public_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_depth=settings.TREADLE_MAX_VALUE_DEPTH,
            max_value_bytes=settings.TREADLE_MAX_VALUE_BYTES,
            max_hook_token_bytes=settings.TREADLE_MAX_HOOK_TOKEN_BYTES,
            hook_token_namespace=settings.TREADLE_HOOK_TOKEN_NAMESPACE,
            public_url=settings.TREADLE_PUBLIC_URL,
        )


_CURRENT: contextvars.ContextVar[Limits | None] = contextvars.ContextVar(
    "treadle_limits", default=None
)
_process: Limits | None = None


def active() -> Limits:
    """The limits in force: a handler's (``use``), else the process settings' (read once)."""
    global _process
    current = _CURRENT.get()
    if current is not None:
        return current
    if _process is None:
        from treadle import settings

        try:
            _process = Limits.from_settings(settings.load())
        except errors.SettingsError:
            _process = Limits()
    return _process


def use(limits: Limits) -> None:
    """Install ``limits`` for the current task (and the tasks it starts)."""
    _CURRENT.set(limits)


def check_depth(depth: int, path: str, limits: Limits) -> None:
    if depth > limits.max_depth:
        raise errors.ValueLimitExceeded(
            _short(path),
            f"nested more than {limits.max_depth} levels deep (TREADLE_MAX_VALUE_DEPTH)",
            setting="TREADLE_MAX_VALUE_DEPTH",
            limit=limits.max_depth,
        )


def check_string(value: str, path: str) -> None:
    """Refuse a string no World can store alike: a NUL, or a lone surrogate."""
    if "\x00" in value:
        raise errors.SerializationError(
            path,
            "a string with a NUL character (\\u0000) cannot be stored (PostgreSQL refuses "
            "it); send binary data as bytes",
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise errors.SerializationError(
                path,
                f"a string with a lone surrogate ({value[exc.start]!r}) is not valid UTF-8 "
                "and cannot be stored",
            ) from None


def storable(text: str) -> str:
    """``text`` escaped where no World could store it alike (an error message, a stack):
    a NUL becomes ``\\x00``, a lone surrogate its ``\\udXXX`` escape."""
    if text.isascii():
        return text.replace("\x00", "\\x00")
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def check_int(value: int, path: str) -> None:
    if value.bit_length() > MAX_INT_BITS:
        raise errors.SerializationError(
            path, "an integer of more than 4,000 digits cannot be stored; use a string"
        )


def stored_size(data: JsonValue) -> int:
    """Bytes of ``data`` as compact UTF-8 JSON (what the World stores, near enough)."""
    return len(fastjson.dumps(data))


def check_size(data: JsonValue, path: str, limits: Limits | None = None) -> None:
    lim = limits or active()
    size = stored_size(data)
    if size > lim.max_value_bytes:
        raise errors.ValueLimitExceeded(
            path,
            f"{size} bytes as JSON, over the {lim.max_value_bytes}-byte limit "
            "(TREADLE_MAX_VALUE_BYTES)",
            setting="TREADLE_MAX_VALUE_BYTES",
            limit=lim.max_value_bytes,
        )


def check_value(
    data: JsonValue, path: str, limits: Limits | None = None, *, envelope: int = 0
) -> None:
    """Check already-encoded JSON: depth, strings, integers and size.

    ``envelope``: the outer levels that are not the user's (2 for an input's
    ``{"args": [...], "kwargs": {...}}``), so depth means what ``serde.encode`` counts.
    """
    lim = limits or active()
    # Iterative, so a value nested far past the limit never meets Python's recursion limit.
    stack: list[tuple[JsonValue, str, int]] = [(data, path, -envelope)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            check_string(value, where)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            check_int(value, where)
        elif isinstance(value, list):
            check_depth(depth + 1, where, lim)
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, dict):
            check_depth(depth + 1, where, lim)
            for key, item in value.items():
                check_string(key, f"{where}<key>")
                stack.append((item, f"{where}.{key}", depth + 1))
    check_size(data, path, lim)


def _short(path: str) -> str:
    """A path fit for a message: a deep one keeps its head and its tail."""
    return path if len(path) <= 120 else f"{path[:60]}...{path[-40:]}"


def check_hook_token(token: str, limits: Limits | None = None) -> None:
    """A hook token must be a non-empty string of at most the limit's bytes, without NUL."""
    lim = limits or active()
    if not isinstance(token, str) or not token:
        raise ValueError("a hook token must be a non-empty string")
    check_string(token, "hook token")
    size = len(token.encode())
    if size > lim.max_hook_token_bytes:
        raise errors.ValueLimitExceeded(
            "hook token",
            f"{size} bytes, over the {lim.max_hook_token_bytes}-byte limit "
            "(TREADLE_MAX_HOOK_TOKEN_BYTES)",
            setting="TREADLE_MAX_HOOK_TOKEN_BYTES",
            limit=lim.max_hook_token_bytes,
        )
