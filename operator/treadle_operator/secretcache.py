"""World Secret reads, reused for a short while (review operator.md R5 (c)).

Every WorkflowDeployment reconcile (every ``TREADLE_OPERATOR_RECONCILE_SECONDS``)
and every WorkflowRun start read the World's Secret, twice for a start (URLs,
payload keys): one GET each. ``CachingKube`` is the operator's ``Kube`` with
``secret`` answered from memory when the same Secret was read less than
``TREADLE_OPERATOR_SECRET_CACHE_SECONDS`` ago (30 s by default; 0 turns it off),
**inside a periodic reconcile only** (``reuse()``, which the WorkflowDeployment
timer's handler enters). So a rotated Secret is picked up by reconciles within
that time, and at once by what acts on a change (a start, a cancel, a deletion),
which always reads it (and refreshes the copy). A missing Secret, or one the
operator may not read, is never cached: once it is created (or allowed), the
next read sees it. RBAC allows only ``get`` on the World Secret names, so a
watch (which would need ``list``/``watch`` on Secrets) is not an option.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

from treadle_operator.kube import Kube
from treadle_operator.secretdata import SecretData

_REUSE: contextvars.ContextVar[bool] = contextvars.ContextVar("treadle_secret_reuse", default=False)


@contextlib.contextmanager
def reuse() -> Iterator[None]:
    """Within this block (this task), Secret reads may come from the cache."""
    token = _REUSE.set(True)
    try:
        yield
    finally:
        _REUSE.reset(token)


class CachingKube(Kube):
    def __init__(self, api: Any, *, max_age: float) -> None:
        super().__init__(api)
        self.max_age = max_age
        # The SecretData itself (decoded key by key when read): copying it into a dict
        # would decode every key, and a binary key nothing reads would fail (R9).
        self._secrets: dict[tuple[str, str], tuple[float, SecretData]] = {}
        self.secret_reads = 0  # GETs actually made (for tests and the docs' figures)

    async def secret(self, namespace: str, name: str) -> SecretData | None:
        key = (namespace, name)
        now = time.monotonic()
        held = self._secrets.get(key)
        if held is not None and _REUSE.get() and now - held[0] < self.max_age:
            return held[1]
        self.secret_reads += 1
        data = await super().secret(namespace, name)
        if data is None:
            self._secrets.pop(key, None)
            return None
        if self.max_age > 0:
            self._secrets[key] = (now, data)
        return data

    def forget_secret(self, namespace: str, name: str) -> None:
        """Read this Secret again next time (its World failed to open, for example)."""
        self._secrets.pop((namespace, name), None)
