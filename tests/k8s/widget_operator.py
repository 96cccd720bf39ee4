"""A one-handler kopf operator run by ``test_kopf_login.py``: annotates each new Widget."""

from __future__ import annotations

from typing import Any

import kopf

SEEN = "harness.test.treadle.dev/seen-size"


@kopf.on.create("harness.test.treadle.dev", "v1", "widgets")
def annotate(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    patch.metadata.annotations[SEEN] = str(spec["size"])
