"""A fault-injecting World whose queue mints a fresh message id per delivery (seed 000's
"Worlds with unstable message IDs"), in the style of tests/engine/faults.py.

Neither real World can do this: the local queue and NATS both keep one message id
across redeliveries (seed 000 "Why the identity is the queue messageId"). So
``UnstableIdsWorld`` wraps a real World and hands every handler a copy of its
``DeliveryMeta`` with a new ``message_id`` (``fresh-<n>``) on every delivery,
redeliveries included; everything else (the message, its key, counts, the
lease) is the real queue's. Wrap it in a ``FaultyWorld`` to record what the
handlers saw: ``FaultyWorld(UnstableIdsWorld(world))``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

from treadle.world import contract, messages

_fresh = itertools.count(1)


class UnstableIdsQueue:
    def __init__(self, inner: contract.Queue) -> None:
        self._inner = inner
        # (the real queue's id, the id the handler was given), one per delivery.
        self.minted: list[tuple[str, str]] = []

    async def consume(
        self, handlers: Mapping[messages.MessageKind, contract.Handler], *, concurrency: int = 32
    ) -> contract.Consumer:
        def fresh_ids(handler: contract.Handler) -> contract.Handler:
            async def with_a_fresh_id(message: Any, meta: messages.DeliveryMeta) -> Any:
                minted = f"fresh-{next(_fresh)}"
                self.minted.append((meta.message_id, minted))
                return await handler(message, dataclasses.replace(meta, message_id=minted))

            return with_a_fresh_id

        wrapped = {kind: fresh_ids(h) for kind, h in handlers.items()}
        return await self._inner.consume(wrapped, concurrency=concurrency)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class UnstableIdsWorld:
    """A real World whose queue gives each delivery a message id never seen before."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queue = UnstableIdsQueue(inner.queue)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def close(self) -> None:
        await self.inner.close()
