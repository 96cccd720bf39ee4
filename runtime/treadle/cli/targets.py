"""Loading what a command names: ``path/to/file.py:workflow``, ``package.module:workflow``,
or a module or file alone (``treadle worker``).

A file is imported under a stable module name (its dotted path from the first
directory above it that is not a package), with that directory first on
``sys.path``, so pydantic models and dataclasses it defines round-trip through
the log by import path in every process that loads the same file. A dotted
module is imported with the current directory on ``sys.path``, as ``python -m``
does. Every failure is a ``UsageError`` naming the file or module.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from treadle.cli.common import UsageError
from treadle.client import Workflows
from treadle.sdk.functions import WorkflowFunction


@dataclass(frozen=True)
class Target:
    """A workflow to start: the app whose registry holds it, and its registered name."""

    app: Workflows
    workflow: WorkflowFunction[Any, Any]
    where: str

    @property
    def name(self) -> str:
        return self.workflow.name


def split_target(text: str) -> tuple[str, str | None]:
    """``"a/b.py:wf"`` -> ``("a/b.py", "wf")``; ``"pkg.mod"`` -> ``("pkg.mod", None)``."""
    where, sep, name = text.rpartition(":")
    if not sep:
        return text, None
    if not where or not name:
        raise UsageError(f"{text!r} is not a target; write path/to/file.py:NAME or module:NAME")
    return where, name


def _is_file_reference(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def _module_name_for(path: Path) -> tuple[str, Path]:
    """The dotted name of ``path`` and the directory to import it from."""
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file() and directory.parent != directory:
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts), directory


def _describe_import_error(where: str, exc: BaseException) -> str:
    """One line: the exception and the innermost frame in user code that raised it."""
    if isinstance(exc, SyntaxError):
        return f"cannot import {where}: SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "importlib" not in f.filename and not f.filename.startswith("<frozen")
    ]
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"cannot import {where}: {type(exc).__name__}: {exc}{at}"


def _import_file(where: str) -> ModuleType:
    path = Path(where)
    if path.suffix != ".py":
        raise UsageError(f"{where}: not a Python file (expected path/to/file.py)")
    if not path.is_file():
        raise UsageError(f"{where}: no such file")
    path = path.resolve()
    name, root = _module_name_for(path)
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise UsageError(
            f"{where}: its module name {name!r} is taken by {loaded!r}; rename the file"
        )
    if sys.path[:1] != [str(root)]:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        raise UsageError(_describe_import_error(where, exc)) from None
    if Path(getattr(module, "__file__", "") or "").resolve() != path:
        raise UsageError(f"{where}: importing {name!r} found {module.__file__}; rename the file")
    return module


def _import_dotted(where: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if importlib.util.find_spec(where) is None:
            raise UsageError(f"no module named {where!r}")
    except ModuleNotFoundError as exc:
        raise UsageError(f"no module named {exc.name or where!r}") from None
    except ValueError as exc:
        raise UsageError(f"{where!r} is not a module name: {exc}") from None
    except Exception as exc:
        raise UsageError(_describe_import_error(where, exc)) from None
    try:
        return importlib.import_module(where)
    except Exception as exc:
        raise UsageError(_describe_import_error(where, exc)) from None


def import_module(where: str) -> ModuleType:
    """Import a file path or a dotted module name; ``UsageError`` when that fails."""
    if _is_file_reference(where):
        return _import_file(where)
    return _import_dotted(where)


def apps_in(module: ModuleType) -> dict[str, Workflows]:
    """The ``Workflows`` apps a module holds, by attribute name (each app once)."""
    found: dict[str, Workflows] = {}
    for attr, value in vars(module).items():
        if isinstance(value, Workflows) and all(value is not v for v in found.values()):
            found[attr] = value
    return found


def load_target(text: str) -> Target:
    """The workflow ``text`` names, and the app that registered it."""
    where, name = split_target(text)
    if name is None:
        raise UsageError(
            f"{text!r} names no workflow; write {text}:WORKFLOW "
            "(path/to/file.py:NAME or module:NAME)"
        )
    module = import_module(where)
    apps = apps_in(module)
    if not apps:
        raise UsageError(f"{where} defines no treadle app (app = treadle.Workflows())")
    for app in apps.values():
        if name in app.workflows:
            return Target(app, app.workflows[name], where)
    attr = getattr(module, name, None)
    if isinstance(attr, WorkflowFunction):
        for app in apps.values():
            if any(attr is wf for wf in app.workflows.values()):
                return Target(app, attr, where)
    known = sorted({wf for app in apps.values() for wf in app.workflows})
    raise UsageError(
        f"no workflow named {name!r} in {where} (registered: {', '.join(known) or 'none'})"
    )


def load_app(text: str) -> tuple[Workflows, str]:
    """The app a ``treadle worker`` serves: ``MODULE_OR_FILE`` or ``MODULE_OR_FILE:APP``."""
    where, attr = split_target(text)
    module = import_module(where)
    apps = apps_in(module)
    if attr is not None:
        value = getattr(module, attr, None)
        if not isinstance(value, Workflows):
            names = ", ".join(apps) or "none"
            raise UsageError(f"{where} has no treadle app named {attr!r} (apps: {names})")
        return value, where
    if not apps:
        raise UsageError(f"{where} defines no treadle app (app = treadle.Workflows())")
    if len(apps) > 1:
        raise UsageError(
            f"{where} defines {len(apps)} treadle apps ({', '.join(apps)}); name one: {where}:APP"
        )
    return next(iter(apps.values())), where
