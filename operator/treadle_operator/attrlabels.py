"""Run attributes as WorkflowRun labels (issue 17 item 2, docs/attributes.md): so that
``kubectl get workflowruns -l attr.treadle.dev/customer=acme`` selects by attribute.

The rule, pure and total (an attribute that does not fit is skipped, never an error):

- the label is ``attr.treadle.dev/<key>``; the key must be a valid label *name*: 1 to 63
  characters, letters, digits, ``-``, ``_`` and ``.``, starting and ending with a letter
  or digit (so a key holding ``/``, a space or ``:`` is skipped);
- the value must be a scalar: a string, an integer, a finite number, or a boolean
  (``true``/``false``); written as text, it must be a valid label *value*: at most 63
  characters of the same alphabet, starting and ending with a letter or digit, or empty.
  Lists, objects and null are skipped;
- at most ``MAX_LABELS`` attributes, in key order, are shown (labels are indexed by the
  API server; a run with hundreds of attributes must not make a huge object).

The operator writes them when it mirrors a run (``mirrored``, ``schedulesync``) and with
every status write of a WorkflowRun it follows (``sync``): an attribute set later by
``set_attributes`` shows from the next status change on, and a label whose attribute no
longer fits is removed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

PREFIX = "attr.treadle.dev/"
MAX_LABELS = 32
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


def value_text(value: Any) -> str | None:
    """The label value an attribute's value is shown as, or None when it does not fit."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        return None
    return text if len(text) <= 63 and _VALUE.fullmatch(text) else None


def label_key(key: str) -> str | None:
    """``attr.treadle.dev/<key>``, or None when ``key`` is not a label name."""
    return PREFIX + key if _NAME.fullmatch(key) else None


def labels(attributes: Mapping[str, Any]) -> dict[str, str]:
    """The labels of the attributes that fit (see the module docstring)."""
    shown: dict[str, str] = {}
    for key in sorted(attributes):
        name, text = label_key(key), value_text(attributes[key])
        if name is None or text is None:
            continue
        shown[name] = text
        if len(shown) >= MAX_LABELS:
            break
    return shown


def wanted(have: Mapping[str, str], attributes: Mapping[str, Any]) -> dict[str, str | None]:
    """The attribute labels to hold given the object's labels ``have``: each fitting
    attribute's, and None (removal) for an ``attr.treadle.dev/`` label no longer among them."""
    shown: dict[str, str | None] = dict(labels(attributes))
    for key in have:
        if key.startswith(PREFIX) and key not in shown:
            shown[key] = None
    return shown
