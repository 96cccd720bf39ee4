"""The options of one run's start, kept apart from the workflow's own arguments.

``app.start(workflow, *args, attributes=, priority=, timeout=, **kwargs)`` reads those
three keywords as the run's options (its first attributes, its place among runs
waiting on a limit, its run timeout). A workflow may have a parameter of one of those
names; ``app.start(workflow.options(attributes=..., priority=..., timeout=...), *args,
**kwargs)`` binds the options to the workflow instead, and then every keyword of the
call is the workflow's (the way Temporal's and Hatchet's clients keep start options
in their own argument, and DBOS's in a context, never among the workflow's).
``resolve`` decides which is which; a call whose option keyword names a parameter of
the workflow that its positional arguments leave unfilled is ambiguous and refused
(``StartOptionClash``), before anything is recorded.

Used by ``treadle.client.Workflows.start``.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from treadle import errors
from treadle.sdk import children, functions
from treadle.sdk.durations import Duration


class Unset(enum.Enum):
    """An option keyword the call did not pass (None may be a workflow's argument)."""

    UNSET = "unset"


UNSET = Unset.UNSET

# The start's own keywords, and what each one is to the run.
MEANINGS: dict[str, str] = {
    "attributes": "first attributes (docs/attributes.md)",
    "priority": "priority among runs waiting on a limit (docs/limits.md)",
    "timeout": "run timeout (docs/timeouts.md)",
}


@dataclass(frozen=True, slots=True)
class StartOptions:
    attributes: Mapping[str, Any] | None = None
    priority: int | None = None
    timeout: Duration | None = None
    start_on_latest: bool | None = None  # None: the workflow's own setting


def passed(**options: Any) -> dict[str, Any]:
    """The option keywords the call passed (not ``UNSET``)."""
    return {k: v for k, v in options.items() if v is not UNSET}


def resolve(
    workflow: functions.WorkflowFunction[..., Any] | children.ChildOptions,
    given: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    child: bool = False,
) -> tuple[StartOptions, dict[str, Any]]:
    """The run's options and the workflow's keyword arguments of one start call
    (``child``: the call is a child start, inside a workflow, which takes none of the
    top-level options: a ``ValueError`` if the call passes one)."""
    if isinstance(workflow, children.ChildOptions):
        if child:
            return StartOptions(), {**given, **kwargs}  # .options() checks its own
        if workflow.on_parent_close != "cancel":
            raise errors.WorkflowError(
                f"workflow {workflow.name}: on_parent_close is the option of a child call; "
                "a run started outside a workflow has no parent"
            )
        bound = StartOptions(
            attributes=workflow.attributes,
            priority=workflow.priority,
            timeout=workflow.timeout,
            start_on_latest=workflow.start_on_latest,
        )
        return bound, {**given, **kwargs}  # every keyword is the workflow's
    for option in given:
        check_clash(workflow, option, args)
    if child and given:
        raise ValueError(
            f"child workflow {workflow.name}: {', '.join(given)} are options of a "
            "top-level start; a child run takes none of them (docs/children.md)"
        )
    return StartOptions(**given), kwargs


def check_clash(
    workflow: functions.WorkflowFunction[..., Any], option: str, args: tuple[Any, ...]
) -> None:
    """``StartOptionClash`` if ``option`` is a parameter of the workflow that ``args``
    leave unfilled (one filled by position is no clash: the keyword is the run's)."""
    try:
        parameters = list(inspect.signature(workflow.fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: nothing can clash
        return
    for index, parameter in enumerate(parameters):
        if parameter.name != option:
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY or (
            parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and index >= len(args)
        ):
            raise errors.StartOptionClash(workflow.name, option, MEANINGS[option])
        return
