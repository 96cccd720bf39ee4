"""``treadle.errors`` exports every error its family modules define, under its own
name: the hierarchy drawn in its docstring is the classes' own, and each class's
``__module__`` is ``treadle.errors`` (tracebacks and pickles name that path)."""

from __future__ import annotations

import pickle
import pkgutil
import re
from importlib import import_module

from treadle import errors


def _defined() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(errors.__path__):
        module = import_module(f"treadle.errors.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, BaseException):
                found[name] = value
    return found


def _drawn_parents() -> dict[str, str]:
    """Each class of the docstring's tree, with the class drawn above it."""
    assert errors.__doc__
    parents: dict[str, str] = {}
    stack = ["TreadleError"]
    for line in errors.__doc__.splitlines():
        drawn = re.search(r"[├└]── ([A-Z]\w+)", line)
        if drawn is None:
            continue
        depth = (drawn.start() - 4) // 4 + 1  # the root is drawn at column 4
        del stack[depth:]
        parents[drawn.group(1)] = stack[-1]
        stack.append(drawn.group(1))
    return parents


def test_every_error_of_the_family_modules_is_exported_under_treadle_errors() -> None:
    defined = _defined()
    assert defined, "no error classes found"
    for name, cls in defined.items():
        assert name in errors.__all__, name
        assert getattr(errors, name) is cls
        assert cls.__module__ == "treadle.errors", name
    assert all(hasattr(errors, name) for name in errors.__all__)


def test_the_drawn_hierarchy_is_the_classes_own() -> None:
    parents = _drawn_parents()
    assert set(parents) | {"TreadleError"} == set(_defined())
    for name, parent in parents.items():
        cls = getattr(errors, name)
        assert getattr(errors, parent) in cls.__bases__, f"{name} is drawn under {parent}"


def test_an_error_pickles_by_its_public_path() -> None:
    dumped = pickle.dumps(errors.WorkflowNotFound("no workflow x"))
    assert b"treadle.errors" in dumped and b"treadle.errors.workflow" not in dumped
    assert type(pickle.loads(dumped)) is errors.WorkflowNotFound
