"""Fault points: the interceptor a MemoryWorld awaits before every call it makes.

A MemoryWorld (one simulated process) may carry an ``Interceptor``. Its
``before(point, run_id)`` is awaited at the start of every storage and queue
call made through that World, and inside its consumers before each delivery,
settlement, lease renewal and worker heartbeat (``queue.beat``: "lose" drops the beat). It may:

- return ``"proceed"``: the call runs as usual;
- raise: the call fails before doing anything (a transport failure raises
  ``errors.StorageUnavailable``, what the production World raises; a killed
  process raises its own ``BaseException``, which is never caught here);
- block: a stalled process; the call waits until the simulation resumes it;
- return ``"lose"``: on ``queue.send`` the send reports success but the message
  is dropped (a lost wake); on ``queue.settle`` and ``queue.renew`` the
  settlement or renewal is dropped (the lease then lapses); on ``queue.deliver``
  the handler is not called and the lease is left to lapse; on a storage point
  it is the same as ``"proceed"``;
- return ``"fail_after"``: the call is made, then ``StorageUnavailable`` is
  raised (an unknown outcome: the write committed).

The points are listed in ``POINTS``. Used by ``storage`` and ``consumer``.
"""

from __future__ import annotations

from typing import Literal, Protocol, TypeAlias

from treadle import errors

Interference: TypeAlias = Literal["proceed", "lose", "fail_after"]

POINTS: frozenset[str] = frozenset(
    {
        "runs.create",
        "runs.get",
        "runs.list",
        "runs.count",
        "runs.repin",
        "events.create",
        "events.create_batch",
        "events.list",
        "events.list_entity",
        "steps.list",
        "steps.get",
        "hooks.get_by_token",
        "deployments.register",
        "deployments.get",
        "deployments.latest",
        "deployments.list",
        "deployments.retire",
        "deployments.promote",
        "queue.send",
        "queue.settle",
        "queue.renew",
        "queue.deliver",
        "queue.beat",
        "schedules.put",
        "schedules.get",
        "schedules.list",
        "schedules.update",
        "schedules.claimed",  # after a won compare-and-set committed (a claim)
        "schedules.delete",
    }
)


class Interceptor(Protocol):
    """What a simulated process's World asks before each call (see the module docstring)."""

    async def before(self, point: str, run_id: str | None) -> Interference: ...


class Points:
    """The interceptor of one MemoryWorld, or none (every call proceeds)."""

    def __init__(self, interceptor: Interceptor | None) -> None:
        self.interceptor = interceptor

    async def before(self, point: str, run_id: str | None) -> Interference:
        if self.interceptor is None:
            return "proceed"
        answer = await self.interceptor.before(point, run_id)
        if answer not in ("proceed", "lose", "fail_after"):
            raise errors.WorldContractError(
                f"interceptor answered {answer!r} at {point}; expected proceed, lose or fail_after"
            )
        return answer


def failed_after(point: str, run_id: str | None) -> errors.StorageUnavailable:
    """The transport error raised after a call that committed (``"fail_after"``)."""
    where = f" (run {run_id})" if run_id is not None else ""
    return errors.StorageUnavailable(
        f"memory World: {point}{where} failed after it was applied (injected fault)",
        run_id=run_id,
    )
