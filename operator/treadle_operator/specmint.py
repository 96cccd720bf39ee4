"""The run format the operator mints for a WorkflowRun it starts (issue 12's kill switch).

A run started from code by a worker is minted by that worker's ``WORKFLOW_SPEC_VERSION``
(``treadle.client.minted_spec_version``). A WorkflowRun is started by the operator on the
deployment's behalf, so it is minted by the same setting as the deployment's workers read
it: ``spec.env``, else the ``worker`` container's env of ``spec.template`` (the operator
puts ``spec.env`` first in the worker container, so that one wins in the pod too). Unset,
``specversions.mint`` gives 9 on a World with the in-band fence. Setting
``WORKFLOW_SPEC_VERSION=8`` on a WorkflowDeployment is therefore a working kill switch for
``kubectl``-started runs as well as for runs started from code.

The value must be a literal 8 or 9, as ``treadle.settings`` requires of a worker: anything
else, or a ``valueFrom`` (the operator does not resolve ConfigMaps and Secrets for it),
refuses the WorkflowDeployment with a message naming the entry (its workers would refuse to
start with the same value).

Called by ``deployments.reconcile`` (``refusal``) and ``runs`` (``version_for``).
"""

from __future__ import annotations

import logging
from typing import Any

from treadle import specsettings
from treadle.world import contract, specversions
from treadle_operator.models import WorkflowDeploymentSpec
from treadle_operator.podtemplate import WORKER

log = logging.getLogger("treadle.operator.specmint")

SETTING = "WORKFLOW_SPEC_VERSION"

_warned: set[str] = set()


class InvalidSpecVersion(ValueError):
    """The deployment's ``WORKFLOW_SPEC_VERSION`` cannot be minted; the message says where."""


def _entries(spec: WorkflowDeploymentSpec) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for index, entry in enumerate(spec.env or []):
        if isinstance(entry, dict) and entry.get("name") == SETTING:
            found.append((f"spec.env[{index}]", entry))
    template = (spec.template.spec or {}) if spec.template is not None else {}
    for c_index, container in enumerate(template.get("containers") or []):
        if not isinstance(container, dict) or container.get("name") != WORKER:
            continue
        for index, entry in enumerate(container.get("env") or []):
            if isinstance(entry, dict) and entry.get("name") == SETTING:
                where = f"spec.template.spec.containers[{c_index}].env[{index}]"
                found.append((where, entry))
    return found


def requested(spec: WorkflowDeploymentSpec) -> int | None:
    """The version the deployment asks for (None: unset); ``InvalidSpecVersion`` if unusable."""
    entries = _entries(spec)
    if not entries:
        return None
    where, entry = entries[0]
    if "valueFrom" in entry:
        raise InvalidSpecVersion(
            f"{where} sets {SETTING} with valueFrom; the operator mints the runs it starts "
            "from this value and does not resolve valueFrom: give a literal 8 or 9"
        )
    try:
        return specsettings.spec_version(entry.get("value"))
    except ValueError as exc:
        raise InvalidSpecVersion(f"{where} sets {SETTING}={entry.get('value')!r}: {exc}") from None


def refusal(spec: WorkflowDeploymentSpec) -> str | None:
    """Why the deployment's ``WORKFLOW_SPEC_VERSION`` cannot be applied, or None."""
    try:
        requested(spec)
    except InvalidSpecVersion as exc:
        return str(exc)
    return None


def version_for(spec: WorkflowDeploymentSpec, capabilities: contract.Capabilities) -> int:
    """The format of a new run of this deployment on a World with ``capabilities`` (its
    warning logged once)."""
    minted = specversions.mint(requested(spec), in_band_fence=capabilities.in_band_fence)
    if minted.warning is not None and minted.warning not in _warned:
        _warned.add(minted.warning)
        log.warning("%s (runs the operator starts)", minted.warning)
    return minted.version
