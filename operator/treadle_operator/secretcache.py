"""World Secret reads, reused for a short while (review operator.md R5 (c)).

Every WorkflowDeployment reconcile (every ``TREADLE_OPERATOR_RECONCILE_SECONDS``)
and every WorkflowRun start read the World's Secret, twice for a start (URLs,
payload keys): one GET each. ``CachingKube`` is the operator's ``Kube`` with
``secret`` answered from memory when the same Secret was read less than
``TREADLE_OPERATOR_SECRET_CACHE_SECONDS`` ago (30 s by default; 0 turns it off).
So a rotated Secret is picked up within that time. A missing Secret, or one the
operator may not read, is never cached: once it is created (or allowed), the
next read sees it. RBAC allows only ``get`` on the World Secret names, so a
watch (which would need ``list``/``watch`` on Secrets) is not an option.
"""

from __future__ import annotations

import time
from typing import Any

from treadle_operator.kube import Kube


class CachingKube(Kube):
    def __init__(self, api: Any, *, max_age: float) -> None:
        super().__init__(api)
        self.max_age = max_age
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        self.secret_reads = 0  # GETs actually made (for tests and the docs' figures)

    async def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        key = (namespace, name)
        now = time.monotonic()
        held = self._secrets.get(key)
        if held is not None and now - held[0] < self.max_age:
            return dict(held[1])
        self.secret_reads += 1
        data = await super().secret(namespace, name)
        if data is None:
            self._secrets.pop(key, None)
            return None
        if self.max_age > 0:
            self._secrets[key] = (now, dict(data))
        return data

    def forget_secret(self, namespace: str, name: str) -> None:
        """Read this Secret again next time (its World failed to open, for example)."""
        self._secrets.pop((namespace, name), None)
