"""The classes ``serde`` may rebuild: pydantic models and dataclasses the app declares.

A stored ``{"$t": "model" | "dataclass", "cls": "module:qualname", "v": ...}``
names its class by import path, but the decoder never imports that path nor
calls anything it has not been told about (security.md H1: a forged
``subprocess:Popen`` tag ran a command on every worker). A name decodes only
when it is *declared by the app*, which is one of:

1. **Annotated**: named, at any depth, by a parameter or return annotation of
   an ``@app.workflow`` or ``@app.step`` function, or by a field of a ``Hook``
   subclass (``list[X]``, ``dict[str, X]``, ``X | None``, ``tuple[X, ...]``,
   ``Annotated[X, ...]`` and the fields of a registered dataclass or model are
   all walked). Annotations are read lazily, so forward references to classes
   defined further down the module resolve.
2. **Registered**: passed to ``treadle.register_types(*classes)`` (their fields
   are walked too), for values typed ``Any`` or ``dict``.
3. **Defined in an app module**: a module-level dataclass or pydantic model
   whose ``__module__`` is a module that defines a registered workflow, step or
   ``Hook`` subclass, looked up in ``sys.modules`` (a module not loaded is not
   loaded) by plain ``__dict__`` reads (no ``getattr``, no descriptor runs).
   Re-exported classes (``from lib import Model``) do not count: their
   ``__module__`` is elsewhere.

``serde.encode`` refuses an instance of any other class, so what one process
writes the next one can read, given the same app code.

Called by ``serde`` (lookups), ``treadle.sdk.functions`` (workflow and step
annotations), ``treadle.sdk.hooks`` (``Hook`` subclasses) and the public
``treadle.register_types``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

_lock = threading.RLock()
_classes: dict[str, type] = {}
_app_modules: set[str] = set()
# Functions and classes whose annotations are not walked yet (read on first need).
_pending: list[Callable[..., Any] | type] = []


def class_path(cls: type) -> str:
    """``module:qualname``, the name a tag stores."""
    return f"{cls.__module__}:{cls.__qualname__}"


def is_serializable_class(obj: object) -> bool:
    """A class ``serde`` tags: a pydantic model or a dataclass (not an instance)."""
    if not isinstance(obj, type):
        return False
    return issubclass(obj, BaseModel) or dataclasses.is_dataclass(obj)


def register_types(*classes: type) -> None:
    """Allow these pydantic models and dataclasses (and those their fields name) to be
    decoded from the log, for values whose annotations do not name them (``Any``).

    Raises ``TypeError`` for anything else, or a class defined inside a function
    (its import path cannot name it in another process).
    """
    for cls in classes:
        if not is_serializable_class(cls):
            raise TypeError(f"register_types takes pydantic models and dataclasses, not {cls!r}")
        if "<locals>" in cls.__qualname__:
            raise TypeError(
                f"{cls.__qualname__} is defined inside a function; define it at module level"
            )
    with _lock:
        for cls in classes:
            _walk(cls, set())


def register_annotations(obj: Callable[..., Any] | type) -> None:
    """Read ``obj``'s annotations (a workflow or step function, a ``Hook`` class) when
    first needed, and count its module as an app module."""
    module = getattr(obj, "__module__", None)
    with _lock:
        if isinstance(module, str):
            _app_modules.add(module)
        if (
            isinstance(obj, type)
            and is_serializable_class(obj)
            and "<locals>" not in obj.__qualname__
        ):
            _classes[class_path(obj)] = obj
        _pending.append(obj)


def lookup(path: str) -> type | None:
    """The declared class stored under ``path``, or ``None``; imports and calls nothing."""
    found = _classes.get(path)
    if found is not None:
        return found
    with _lock:
        _resolve_pending()
        found = _classes.get(path)
        if found is not None:
            return found
        return _in_app_module(path)


def is_declared(cls: type) -> bool:
    """``cls`` is what ``lookup`` returns for its own path (so a value of it decodes)."""
    return lookup(class_path(cls)) is cls


def declared() -> dict[str, type]:
    """Every class registered so far (annotated or explicit), by path; for diagnostics."""
    with _lock:
        _resolve_pending()
        return dict(_classes)


def _in_app_module(path: str) -> type | None:
    module_name, sep, qualname = path.partition(":")
    if not sep or module_name not in _app_modules or "<locals>" in qualname:
        return None
    module = sys.modules.get(module_name)
    if module is None:
        return None
    obj: object = module
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", None)  # a plain attribute read of __dict__
        if not isinstance(namespace, dict | types.MappingProxyType):
            return None
        obj = namespace.get(part)
        if obj is None:
            return None
    if not is_serializable_class(obj):
        return None
    assert isinstance(obj, type)
    if obj.__module__ != module_name or obj.__qualname__ != qualname:
        return None  # re-exported from elsewhere, or an alias
    _classes[path] = obj
    _walk(obj, set())
    return obj


def _resolve_pending() -> None:
    """Walk the annotations of what is pending; keep what cannot be resolved yet."""
    if not _pending:
        return
    still: list[Callable[..., Any] | type] = []
    for obj in _pending:
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            if not obj.__pydantic_complete__:  # forward references pydantic has not resolved
                still.append(obj)
                continue
            _walk(obj, set())
            continue
        hints, complete = _hints(obj)
        if not complete:  # a forward reference not defined yet, say: try again later
            still.append(obj)
        seen: set[int] = set()
        for hint in hints:
            _walk(hint, seen)
    _pending[:] = still


def _hints(obj: Callable[..., Any] | type) -> tuple[list[Any], bool]:
    """``obj``'s resolved annotations, and whether all of them resolved.

    When one name cannot be resolved (defined later, or only under ``TYPE_CHECKING``),
    the others still count: each is resolved on its own.
    """
    try:
        return list(typing.get_type_hints(obj, include_extras=True).values()), True
    except Exception:
        pass
    raw = getattr(obj, "__annotations__", None)
    if not isinstance(raw, dict):
        return [], False
    namespace = getattr(obj, "__globals__", None)
    if namespace is None:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        namespace = vars(module) if module is not None else {}
    resolved: list[Any] = []
    for name, annotation in raw.items():
        holder = types.SimpleNamespace(__annotations__={name: annotation})
        try:
            resolved.extend(
                typing.get_type_hints(holder, globalns=namespace, include_extras=True).values()
            )
        except Exception:
            continue
    return resolved, False


def _walk(hint: Any, seen: set[int]) -> None:
    """Register every model and dataclass ``hint`` names, through containers and fields."""
    if id(hint) in seen:
        return
    seen.add(id(hint))
    supertype = getattr(hint, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        _walk(supertype, seen)
        return
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return
    if origin is not None:
        for arg in typing.get_args(hint):
            _walk(arg, seen)
        if isinstance(origin, type) and is_serializable_class(origin):
            _walk(origin, seen)
        return
    if not is_serializable_class(hint) or "<locals>" in hint.__qualname__:
        return
    _classes[class_path(hint)] = hint
    if issubclass(hint, BaseModel):
        for field in hint.model_fields.values():
            _walk(field.annotation, seen)
        return
    try:
        field_hints = typing.get_type_hints(hint, include_extras=True)
    except Exception:
        field_hints = {f.name: f.type for f in dataclasses.fields(hint)}
    for field_hint in field_hints.values():
        _walk(field_hint, seen)
