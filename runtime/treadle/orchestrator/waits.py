"""A delivery's waits: the timers it arms and the waits it completes (seed 003 "Timers").

``WaitArmer`` sends each wait's timer at most once per delivery, before the
write that needs it commits: a new wait's chain before ``wait_created``, the
rest of a chain before a ``wait_completed`` ends its head; re-arms a final
timer that came early under its own key; and, for a delivery that may hold a
coalesced timer, re-arms every wait due very soon. The key and hop rules are
``timers``; which waits are due is ``decisions``.
"""

from __future__ import annotations

from datetime import datetime

from treadle import clock, errors
from treadle.orchestrator import decisions, timers
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.session import RunSession
from treadle.replay import operations
from treadle.world import events, messages


def now_ms() -> int:
    return clock.now_ms()


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class WaitArmer:
    def __init__(
        self,
        rt: Runtime,
        session: RunSession,
        message: messages.OrchestratorMessage,
        meta: messages.DeliveryMeta,
    ) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.session = session
        self.message = message
        self.meta = meta
        self.run_id = message.run_id
        self.timed: set[str] = set()  # waits whose timer this delivery sent

    def timer(
        self, wait_id: str, resume_at: datetime, *, suffix: str | None = None, near: bool = False
    ) -> messages.Send:
        state = self.session.state
        return timers.timer_send(
            run_id=self.run_id,
            deployment_id=state.deployment_id,
            spec_version=state.spec_version,
            correlation_id=wait_id,
            resume_at_ms=ms(resume_at),
            now_ms=now_ms(),
            max_hop_ms=int(self.settings.WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS * 1000),
            key_suffix=suffix,
            near_due=near,
        )

    async def arm(self, wait_id: str, resume_at: datetime) -> None:
        """Send a wait's timer once per delivery (a due wait needs none: the pass completes it)."""
        if wait_id in self.timed or ms(resume_at) <= now_ms():
            return
        # A last hop sent by a delivery that is not its message's first gets a per-second key,
        # the key a near-due re-arm of the same second has: each goes out once per process
        # (``near_due_sent``; the queue would drop the second as a duplicate anyway). CI saw
        # one key twice: this send, then ``arm_near_due`` of a later delivery in that second.
        near = self.meta.delivery_count > 1
        send = self.timer(wait_id, resume_at, near=near)
        key = send.key if near and timers.is_near_due_key(send.key) else None
        if key is None or not self.rt.near_due_sent.seen(key):
            await self.session.send([send])
            if key is not None:
                self.rt.near_due_sent.mark(key)  # once sent: a send that raised is retried
        self.timed.add(wait_id)

    async def arm_new_waits(self, waits: list[operations.Sleep]) -> None:
        """The timer of this message's chain's earliest wait, new ones included."""
        chain = [(w.resume_at, w.wait_id) for w in self.session.state.chain(self.meta.message_id)]
        chain += [(w.resume_at, w.correlation_id) for w in waits]
        resume_at, wait_id = min(chain)
        await self.arm(wait_id, resume_at)

    async def arm_owned_chains(self) -> None:
        """Arm the chains this delivery owns: its message's, its timer's, all on recovery."""
        state = self.session.state
        owners: set[str | None] = {self.meta.message_id}
        if self.message.recovery:
            owners |= {w.creator_message_id for w in state.open_waits()}
        cont = self.message.wait_continuation
        if cont is not None and cont.correlation_id in state.waits:
            owners.add(state.waits[cont.correlation_id].creator_message_id)
        for owner in sorted(owners, key=_owner_order):
            chain = state.chain(owner)
            if chain:
                await self.arm(chain[0].wait_id, chain[0].resume_at)
        if cont is None or cont.resume_at_ms is not None:
            return
        wait = state.waits.get(cont.correlation_id)
        if wait is not None and not wait.completed and ms(wait.resume_at) > now_ms():
            # A final timer that came before its wait was due re-arms it under a key of its
            # own message and next attempt (never the key of the message in hand: TE11).
            suffix = timers.rearm_suffix(self.meta.message_id, self.meta.attempt + 1)
            send = self.timer(wait.wait_id, wait.resume_at, suffix=suffix)
            await self.session.send([send])
            self.timed.add(wait.wait_id)

    async def complete_due_waits(self) -> None:
        """At the top of a pass: ``wait_completed`` for each due or woken wait, in-band."""
        state = self.session.state
        # Only the log's wake_requested events wake a wait early: a message's own
        # ``complete_waits`` is never trusted (security review H2).
        woken = state.waits_woken()
        due = decisions.due_waits(state, now_ms=now_ms(), woken=woken)
        if not due:
            return
        finishing = {w.wait_id for w in due}
        for owner in sorted({w.creator_message_id for w in due}, key=_owner_order):
            rest = [w for w in state.chain(owner) if w.wait_id not in finishing]
            if rest:
                await self.arm(rest[0].wait_id, rest[0].resume_at)  # before the completion
        for wait in due:
            try:
                await self.session.write(events.WaitCompleted(correlation_id=wait.wait_id))
            except errors.WaitAlreadyCompleted:
                await self.session.read_tail()  # its completion is in the log: take it

    async def arm_near_due(self) -> None:
        """A delivery that may hold a coalesced timer re-arms every wait due very soon."""
        window_ms = max(5.0, self.settings.WORKFLOW_NEAR_ELAPSED_WAIT_THRESHOLD_SECONDS) * 1000
        sends = []
        for wait in decisions.near_due_waits(
            self.session.state, now_ms=now_ms(), window_ms=window_ms
        ):
            send = self.timer(wait.wait_id, wait.resume_at, near=True)
            if send.key is not None and self.rt.near_due_sent.first_time(send.key):
                sends.append(send)  # marked before the send: a concurrent delivery skips it
        try:
            await self.session.send(sends)
        except BaseException:
            for send in sends:  # forgotten again: a redelivery retries a failed send
                assert send.key is not None
                self.rt.near_due_sent.forget(send.key)
            raise


def _owner_order(owner: str | None) -> tuple[bool, str]:
    """A set of chain owners in a fixed order (set order follows the hash seed)."""
    return owner is not None, owner or ""
