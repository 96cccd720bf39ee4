"""What every command shares: the usage error, JSON arguments, the World to use,
and the plain client app for commands that load no user code.
"""

from __future__ import annotations

import json
import os
from typing import Any

from treadle import settings
from treadle.client import Workflows
from treadle.sdk import catalogue
from treadle.sdk.functions import WorkflowFunction
from treadle.serde import TAG
from treadle.world import ids

# Exit codes.
OK = 0
FAILED = 1
USAGE = 2
INTERRUPTED = 130
BROKEN_PIPE = 141


class UsageError(Exception):
    """A mistake in what the user asked for: one line on stderr, exit 2."""


def parse_json(text: str, option: str) -> Any:
    """``text`` as JSON; a ``UsageError`` naming ``option`` and where the JSON breaks."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{option} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise UsageError(f"{option} nests too deep to read (see TREADLE_MAX_VALUE_DEPTH)") from None
    except ValueError as exc:  # an int past Python's 4,300-digit conversion limit
        if "digits" in str(exc):
            raise UsageError(
                f"{option} holds an integer of more than 4300 digits, which cannot be read; "
                "send it as a string"
            ) from None
        raise UsageError(f"{option} cannot be read: {exc}") from None


def parse_input(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    """``--input``: a JSON object of keyword arguments, or a JSON array of positional ones."""
    if text is None:
        return [], {}
    value = parse_json(text, "--input")
    tagged = _tag_key_at(value, "--input")
    if tagged is not None:
        raise UsageError(
            f"{tagged} has a {TAG!r} key, which treadle reserves for its own stored values; "
            "pass plain JSON"
        )
    if isinstance(value, dict):
        return [], value
    if isinstance(value, list):
        return value, {}
    raise UsageError(
        "--input must be a JSON object (keyword arguments) or a JSON array "
        f"(positional arguments), not {type(value).__name__} {text.strip()}"
    )


def _tag_key_at(value: Any, path: str) -> str | None:
    """Where in parsed JSON an object holds a ``$t`` key (a forged tagged value), if anywhere."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            if TAG in item:
                return where
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def check_arguments(
    wf: WorkflowFunction[Any, Any], args: list[Any], kwargs: dict[str, Any]
) -> None:
    """Refuse arguments the workflow's signature cannot take, before anything is recorded."""
    problem = catalogue.check_arguments(catalogue.signature_of_function(wf.fn), args, kwargs)
    if problem is not None:
        raise UsageError(f"workflow {wf.name} cannot take this --input: {problem}")


def check_run_id(run_id: str) -> str:
    if not ids.is_run_id(run_id):
        raise UsageError(f"{run_id!r} is not a run id (expected wrun_ and 26 characters)")
    return run_id


def use_world(url: str | None) -> settings.Settings:
    """Point ``TREADLE_WORLD`` at ``url`` (when given) and validate every setting now.

    The environment is set before any user module is imported, so apps created
    with a bare ``Workflows()`` open this World too.
    """
    if url is not None:
        if not url.strip():
            raise UsageError("--world must not be empty (for example local:.treadle)")
        os.environ["TREADLE_WORLD"] = url
    return settings.load()


def client() -> Workflows:
    """An app with no workflows and no worker: reads and writes the World only."""
    return Workflows(worker=False)


def parse_attributes(pairs: list[str]) -> dict[str, Any]:
    """``treadle start --attr KEY=VALUE`` (repeatable): the value as JSON when it parses,
    else as a string; a bad key or pair is a ``UsageError`` naming it."""
    from treadle.world import attributes as run_attributes

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise UsageError(f"--attr {pair!r}: expected KEY=VALUE")
        if run_attributes.KEY_PATTERN.fullmatch(key) is None:
            raise UsageError(
                f"--attr {pair!r}: key {key!r} is not valid ({run_attributes.KEY_RULE})"
            )
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out
