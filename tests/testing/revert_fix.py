"""Revert one engine fix on a scratch tree, to see which simulation seeds catch it.

    git worktree add --detach /tmp/rev-f3 HEAD
    python3 tests/testing/revert_fix.py /tmp/rev-f3 F3
    PYTHONPATH=/tmp/rev-f3/runtime python3 -m treadle.testing.simulation --seeds 200

Names: the keys of ``REVERTS`` (found_seeds.md, "Revert table", says what each undoes
and what the soak then reports). Each patch is a textual replacement that must match,
so a fix whose code moved fails loudly here. Never run it on a real checkout.
"""

# ruff: noqa: E501 (the patches are lines of engine code, kept whole to match exactly)

from __future__ import annotations

import sys

Patch = tuple[str, str, str]  # path under runtime/treadle, old text, new text

REVERTS: dict[str, list[Patch]] = {
    "bug1": [
        (
            "orchestrator/logstate.py",
            "                    if e.creator_message_id is not None:\n                        # An orchestrator moved",
            "                    if False:\n                        # An orchestrator moved",
        ),
    ],
    "bug2": [
        (
            "orchestrator/delivery.py",
            '            # is cut off mid side effect (seed 003 "A later batch fails", FO4; bug 2).\n            await self.inline.settle(quiet=True)',
            '            # is cut off mid side effect (seed 003 "A later batch fails", FO4; bug 2).\n            self.inline.cancel()  # REVERTED bug 2\n            await self.inline.settle(quiet=True)',
        ),
    ],
    "bug3": [
        (
            "orchestrator/delivery.py",
            "            if isinstance(event, events.StepStarted) and event.inline and call is not None:\n                self.inline.start_committed(call)\n",
            "            if isinstance(event, events.StepStarted) and event.inline and call is not None:\n                later.append(call)  # REVERTED bug 3\n",
        ),
        (
            "orchestrator/delivery.py",
            "        sends = []\n        for logged in committed:",
            "        sends = []\n        later = []\n        for logged in committed:",
        ),
        (
            "orchestrator/delivery.py",
            "        await self.session.send(sends)\n        if refused:\n",
            "        await self.session.send(sends)\n        for call in later:\n            self.inline.start_committed(call)\n        if refused:\n",
        ),
    ],
    "bug4": [
        (
            "orchestrator/delivery.py",
            "                # No free inline slot: wait for a running body to settle (never spin; bug 4).\n                await self._wait_for_news(self._next_wait_due_ms())\n",
            "                pass  # REVERTED bug 4: no wait, the pass runs again at once\n",
        ),
    ],
    "bug6": [
        (
            "testing/memory/log.py",
            "            case events.HookDisposed(correlation_id=hid) | events.HookReceived(correlation_id=hid):",
            "            case events.HookDisposed(correlation_id=hid):  # REVERTED bug 6",
        ),
    ],
    "F2": [
        (
            "testing/memory/log.py",
            "                ended = state.outcome_slots.get(event.correlation_id)\n                if ended is not None:",
            "                ended = state.outcome_slots.get(event.correlation_id)\n                if ended is not None and isinstance(event, events.StepStarted):  # REVERTED F2",
        ),
    ],
    "F3": [
        (
            "world/messages.py",
            "        return self.lease_lost is not None and self.lease_lost.is_set()",
            "        return False  # REVERTED F3",
        ),
    ],
    "F3all": [
        (
            "world/messages.py",
            "        return self.lease_lost is not None and self.lease_lost.is_set()",
            "        return False  # REVERTED F3",
        ),
        (
            "orchestrator/writer.py",
            "        if self._lease_lost is not None and self._lease_lost.is_set():",
            "        if False:  # REVERTED F3",
        ),
        (
            "orchestrator/session.py",
            "        if self.lease_lost is not None and self.lease_lost.is_set():",
            "        if False:  # REVERTED F3",
        ),
        (
            "orchestrator/delivery.py",
            "        if self.meta.lease_lost is not None:\n            watch =",
            "        if False:  # REVERTED F3\n            watch =",
        ),
    ],
    "unknown": [
        (
            "orchestrator/steps.py",
            "    except errors.StorageUnavailable as exc:\n        try:\n            state = await _read_step_log(",
            "    except errors.StorageUnavailable as exc:\n        raise  # REVERTED unknown outcomes\n        try:\n            state = await _read_step_log(",
        ),
        (
            "orchestrator/steps.py",
            "                if tries == WRITE_ATTEMPTS:\n                    raise",
            "                if True:  # REVERTED unknown outcomes\n                    raise",
        ),
    ],
    "settle_unknown": [
        (
            "orchestrator/writer.py",
            "                    found = await self._settle_unknown(exc, [event], against, write)",
            "                    raise  # REVERTED settle_unknown\n                    found = await self._settle_unknown(exc, [event], against, write)",
        ),
        (
            "orchestrator/writer.py",
            "                    found = await self._settle_unknown(exc, batch, against, write)",
            "                    raise  # REVERTED settle_unknown\n                    found = await self._settle_unknown(exc, batch, against, write)",
        ),
    ],
    "stale_start": [
        (
            "testing/memory/log.py",
            "                    and event.attempt <= held.attempt\n",
            "                    and event.attempt <= held.attempt\n                    and False  # REVERTED StaleStepStart\n",
        ),
    ],
    "resend": [
        (
            "orchestrator/delivery.py",
            '            f"{meta.message_id}/{meta.delivery_count - meta.rerun}/{meta.invocation_started_at}"\n',
            '            f"{meta.message_id}/{meta.invocation_started_at}"  # REVERTED resend_count\n',
        ),
        (
            "orchestrator/delivery.py",
            "        if self.rt.resent_invocations.seen(invocation):\n",
            "        if not self.rt.resent_invocations.first_time(invocation):  # REVERTED resend_mark\n",
        ),
        (
            "orchestrator/delivery.py",
            "        self.rt.resent_invocations.mark(invocation)\n",
            "",
        ),
    ],
    "resend_count": [
        (
            "orchestrator/delivery.py",
            '            f"{meta.message_id}/{meta.delivery_count - meta.rerun}/{meta.invocation_started_at}"\n',
            '            f"{meta.message_id}/{meta.invocation_started_at}"  # REVERTED resend_count\n',
        ),
    ],
    "resend_mark": [
        (
            "orchestrator/delivery.py",
            "        if self.rt.resent_invocations.seen(invocation):\n",
            "        if not self.rt.resent_invocations.first_time(invocation):  # REVERTED resend_mark\n",
        ),
        (
            "orchestrator/delivery.py",
            "        self.rt.resent_invocations.mark(invocation)\n",
            "",
        ),
    ],
    "linger_news": [
        (
            "orchestrator/delivery.py",
            "            if linger and not session.feed_live:\n                return False\n            remaining = limit - now_ms()",
            "            remaining = limit - now_ms()",
        ),
        (
            "orchestrator/delivery.py",
            "            poll_ms = self._polls.interval_ms(feed_live=session.feed_live)\n            session.news.clear()",
            "            poll_ms = self._polls.interval_ms(feed_live=session.feed_live)\n            if linger and not session.feed_live:\n                return False  # REVERTED linger_news\n            session.news.clear()",
        ),
        (
            "orchestrator/delivery.py",
            "        if self.session.tail > decided:\n",
            "        if False:  # REVERTED linger_news\n",
        ),
    ],
    "lapsed_start": [
        (
            "orchestrator/steps.py",
            "    if meta.lost_lease():\n        # Told its lease lapsed (it was delivered",
            "    if False:  # REVERTED lapsed_start (seed 58)\n        # Told its lease lapsed (it was delivered",
        ),
    ],
    "recheck_lease": [
        (
            "orchestrator/writer.py",
            "            self._check()\n            try:\n                return await write()",
            "            try:  # REVERTED recheck_lease (seed 208)\n                return await write()",
        ),
    ],
    "rearm_key": [
        (
            "orchestrator/timers.py",
            '    return f"m{message_id}:a{attempt}"',
            '    return f"a{attempt}"  # REVERTED rearm_key (TE11)',
        ),
    ],
    "A3": [
        (
            "orchestrator/delivery.py",
            "            if writer is not None and writer.superseded is not None and not self.meta.lost_lease():",
            "            if False:  # REVERTED A3",
        ),
    ],
}


def revert(tree: str, name: str) -> None:
    """Apply every patch of ``name`` to the checkout at ``tree``."""
    for path, old, new in REVERTS[name]:
        full = f"{tree}/runtime/treadle/{path}"
        with open(full) as f:
            text = f.read()
        if old not in text:
            raise SystemExit(f"{name}: {path} no longer has the fix's code; update revert_fix.py")
        with open(full, "w") as f:
            f.write(text.replace(old, new, 1))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in REVERTS:
        raise SystemExit(f"usage: revert_fix.py TREE NAME  (NAME: {', '.join(REVERTS)})")
    revert(sys.argv[1], sys.argv[2])
    print(f"reverted {sys.argv[2]} in {sys.argv[1]}")
