"""``spec.inputFrom``: a run's input read from a ConfigMap or Secret key, once, at its start.

``runs.start`` calls ``resolve`` before it judges and records a run: the value is
the key's text decoded as JSON, then judged like an inline ``spec.input`` (shape
and the engine's limits, ``admission.input_problems``), without the inline size
limit: a ConfigMap carries up to about 1 MiB, the World's own value limit
(``TREADLE_MAX_VALUE_BYTES``, 4 MiB by default) applies when the run is recorded.

What time can fix raises ``InputNotReady`` (the object stays Pending with the
reason as its ``Started`` condition, retried): the ConfigMap or Secret or key is
missing, or its text is not JSON (a user fixes it in place). What it cannot fix
raises ``InputRefused`` (the object ends Failed): a Secret the operator is not
allowed to read inputs from (``TREADLE_OPERATOR_INPUT_SECRETS``, the chart's
``rbac.inputSecretNames``), or the World Secret of the run's deployment.

The input is read when the run starts and recorded in the World; later changes to
the ConfigMap or Secret change nothing for that run.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from treadle_operator import admission
from treadle_operator.models import KeyRef, WorkflowRunSpec
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.inputs")


class InputNotReady(Exception):
    """The input cannot be read yet (retried): the message names the object and key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class InputRefused(Exception):
    """The input can never be read for this run (the object ends Failed)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def allowed_secrets(setting: str) -> frozenset[str]:
    """``TREADLE_OPERATOR_INPUT_SECRETS`` (comma-separated names) as a set."""
    return frozenset(name.strip() for name in setting.split(",") if name.strip())


async def resolve(
    state: State, namespace: str, name: str, spec: WorkflowRunSpec, world_secret: str
) -> WorkflowRunSpec:
    """``spec`` with ``input`` read from ``inputFrom`` (unchanged without ``inputFrom``).

    ``namespace``/``name``: the WorkflowRun's; ``world_secret``: its deployment's World
    Secret name, never read as an input.
    """
    source = spec.input_from
    if source is None:
        return spec
    if spec.input is not None:
        raise InputRefused("InvalidInput", admission.BOTH_INPUTS)
    if source.config_map_key_ref is not None and source.secret_key_ref is None:
        ref, kind = source.config_map_key_ref, "ConfigMap"
        text = await _config_map_key(state, namespace, ref)
    elif source.secret_key_ref is not None and source.config_map_key_ref is None:
        ref, kind = source.secret_key_ref, "Secret"
        _may_read(state, ref, world_secret)
        text = await _secret_key(state, namespace, ref)
    else:
        raise InputRefused(
            "InvalidInput",
            "spec.inputFrom must name exactly one of configMapKeyRef and secretKeyRef",
        )
    where = f"{kind} {namespace}/{ref.name} key {ref.key}"
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise InputNotReady(
            "InvalidInputFrom", f"spec.inputFrom: {where} is not JSON ({exc}); fix it in place"
        ) from None
    problems = admission.input_problems(value, f"spec.inputFrom ({where})")
    if problems:
        raise InputNotReady("InvalidInputFrom", f"{problems[0]}; fix it in place")
    log.info("WorkflowRun %s/%s: input read from %s", namespace, name, where)
    return spec.model_copy(update={"input": value})


def _no_constant(name: str) -> Any:
    """Python's json takes NaN and Infinity; JSON (and PostgreSQL's JSONB) does not."""
    raise ValueError(f"{name} is not a JSON value")


def _may_read(state: State, ref: KeyRef, world_secret: str) -> None:
    allowed = allowed_secrets(state.settings.TREADLE_OPERATOR_INPUT_SECRETS)
    if ref.name == world_secret:
        raise InputRefused(
            "InputSecretNotAllowed",
            f"spec.inputFrom.secretKeyRef names {ref.name}, the World Secret of the "
            "deployment: a run's input is never read from it",
        )
    if ref.name not in allowed:
        names = ", ".join(sorted(allowed)) or "none"
        raise InputRefused(
            "InputSecretNotAllowed",
            f"spec.inputFrom.secretKeyRef names Secret {ref.name}, not one the operator may read "
            f"inputs from (the chart's rbac.inputSecretNames: {names})",
        )


async def _config_map_key(state: State, namespace: str, ref: KeyRef) -> str:
    where = f"ConfigMap {namespace}/{ref.name}"
    try:
        found = await state.kube.core.read_namespaced_config_map(ref.name, namespace)
    except ApiException as exc:
        raise _unreadable(exc, where) from None
    data: dict[str, str] = dict(found.data or {})
    if ref.key not in data:
        binary = ref.key in (found.binary_data or {})
        note = " (it is in binaryData: inputs are JSON text, in data)" if binary else ""
        raise InputNotReady("InputNotFound", f"spec.inputFrom: {where} has no key {ref.key}{note}")
    return data[ref.key]


async def _secret_key(state: State, namespace: str, ref: KeyRef) -> str:
    where = f"Secret {namespace}/{ref.name}"
    try:
        found = await state.kube.core.read_namespaced_secret(ref.name, namespace)
    except ApiException as exc:
        raise _unreadable(exc, where) from None
    data: dict[str, Any] = dict(found.data or {})
    if ref.key not in data:
        raise InputNotReady("InputNotFound", f"spec.inputFrom: {where} has no key {ref.key}")
    try:
        return base64.b64decode(data[ref.key]).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise InputNotReady(
            "InvalidInputFrom", f"spec.inputFrom: {where} key {ref.key} is not UTF-8 text"
        ) from None


def _unreadable(exc: ApiException, where: str) -> Exception:
    if exc.status == 404:
        return InputNotReady("InputNotFound", f"spec.inputFrom: {where} not found")
    if exc.status == 403:
        return InputNotReady(
            "InputForbidden", f"spec.inputFrom: the operator may not read {where} (RBAC)"
        )
    return InputNotReady("InputUnreadable", f"spec.inputFrom: {where} cannot be read: {exc.reason}")
