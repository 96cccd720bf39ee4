"""Fault plans: which faults a seed injects, at which named points, how often.

A ``FaultPlan`` gives each fault kind a rate (the chance it fires at one call
of a point where it applies) and a budget; ``Injector.choose`` is asked at every
intercepted World call of a simulated process and draws from the seeded PRNG.
Kinds (the seeds' edge cases, DESIGN.md section 10):

- ``storage_error`` / ``queue_error``: the call raises before doing anything;
- ``fail_after``: the write commits, then the call raises (an unknown outcome);
- ``kill``: the process dies at this await point (state gone, leases lapse);
- ``lost_wake``: the process dies at a send, after the commit that owed it;
- ``stall``: the process stops past its lease, then resumes (stale, running);
- ``duplicate``: the delivery's lease is forced to lapse (a second delivery);
- ``fence``: at a write, the delivery's lease lapses and the write waits until the
  redelivery wrote, so the fence refuses it (an out-of-band start goes stale);
- ``lapse``: at a write, the delivery's lease lapses and the write commits at once
  (the lease lapsed while it wrote: the delivery learns it only afterwards);
- ``feed_drop``: the run's live subscriptions fail;
- ``pause``: not at a call: now and then (``rate`` per virtual second) a live
  process, one holding a run's delivery if any, stalls as ``stall`` does, whatever
  it is doing (lingering on a hook or sleep, running an inline body);
- ``crash``: not at a call either: a live process dies at an arbitrary instant
  (whatever await point its deliveries and bodies are at).
- ``kill_owner`` (spec 8): now and then (``rate`` per virtual second) the process of
  a delivery running an inline body of a spec 8 run dies mid-body; the owner's
  message comes back (owned recovery, seed 000);
- ``lose_owner`` (spec 8): the same, and the owner's message is lost with it (a
  dead-letter or purge the engine never sees: the lease and the backstop recover).
  It fires only while another message of the run is queued (a wake or a backstop
  that can drive it): a run with no message left wedges on any queue.

``FaultPlan.parse("kill=0.01,stall=0.004")`` and ``str(plan)`` round-trip, so a
shrunk plan goes into the one-line replay command. Used by the runner and
``processes.ProcessInterceptor``.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

KINDS = (
    "storage_error",
    "queue_error",
    "fail_after",
    "kill",
    "lost_wake",
    "stall",
    "duplicate",
    "fence",
    "lapse",
    "feed_drop",
    "pause",
    "crash",
    "kill_owner",
    "lose_owner",
)

# Kinds added after seeds were pinned (drawn from their own stream, ``FaultPlan.draw``).
LATER_KINDS = ("lapse", "pause", "crash")
# Spec 8 kinds (seed 000), at instants of their own, aimed at the owner of an inline
# body of a spec 8 run; drawn from a third stream, only for seeds with spec 8 runs:
# ``kill_owner`` kills its process mid-body (the message comes back: owned recovery),
# ``lose_owner`` also loses its message (the lease and the backstop must recover).
SPEC8_KINDS = ("kill_owner", "lose_owner")

STORAGE_POINTS = frozenset(
    {
        "runs.get",
        "runs.list",
        "events.list",
        "events.list_entity",
        "steps.list",
        "steps.get",
        "hooks.get_by_token",
    }
)
WRITE_POINTS = frozenset({"runs.create", "events.create", "events.create_batch"})

# Which kinds apply at which point.
_APPLIES: dict[str, tuple[str, ...]] = {
    "storage": ("storage_error", "kill", "stall", "feed_drop"),
    "write": ("storage_error", "fail_after", "kill", "stall", "fence", "lapse", "feed_drop"),
    "queue.send": ("queue_error", "fail_after", "lost_wake"),
    "queue.settle": ("queue_error", "kill", "stall"),
    "queue.renew": ("queue_error", "stall", "duplicate"),
    "queue.deliver": ("kill", "duplicate"),
    # Schedules (gen_schedules; only seeds with schedules reach them): a claim that fails
    # after it committed, reads that fail. A kill right after a claim is drawn apart
    # (``processes``: ``schedules.claimed``).
    "schedules.update": ("storage_error", "fail_after", "kill"),
    "schedules.get": ("storage_error", "kill", "stall"),
    "schedules.list": ("storage_error", "kill", "stall"),
}

DEFAULT_RATES = {
    "storage_error": 0.01,
    "queue_error": 0.01,
    "fail_after": 0.01,
    "kill": 0.004,
    "lost_wake": 0.004,
    "stall": 0.003,
    "duplicate": 0.01,
    "fence": 0.006,
    "lapse": 0.006,
    "feed_drop": 0.005,
    "pause": 0.004,
    "crash": 0.002,
    "kill_owner": 0.01,
    "lose_owner": 0.005,
}


def applicable(point: str) -> tuple[str, ...]:
    if point in WRITE_POINTS:
        return _APPLIES["write"]
    if point in STORAGE_POINTS:
        return _APPLIES["storage"]
    return _APPLIES.get(point, ())


@dataclass
class FaultPlan:
    """Rates per kind, a budget of faults, and the virtual time after which none fire."""

    rates: dict[str, float] = field(default_factory=dict)
    budget: int = 12
    quiet_after: float = 2000.0

    @classmethod
    def none(cls) -> FaultPlan:
        return cls({}, budget=0)

    @classmethod
    def draw(
        cls,
        rng: random.Random,
        later: random.Random | None = None,
        spec8: random.Random | None = None,
    ) -> FaultPlan:
        """A seed's plan: each kind on with probability 1/2, at 0.5-2x its default rate.

        The kinds added later (``LATER_KINDS``) draw from their own stream ``later``, so
        the plans every earlier kind gets stay what they were when the seeds were pinned;
        the spec 8 kinds from ``spec8``, given only for a seed with spec 8 runs.
        """
        rates = {
            k: DEFAULT_RATES[k] * rng.choice([0.5, 1.0, 2.0])
            for k in KINDS
            if k not in LATER_KINDS and k not in SPEC8_KINDS and rng.random() < 0.5
        }
        budget = rng.choice([4, 8, 12, 20])
        later = later or rng
        for k in LATER_KINDS:
            if later.random() < 0.5:
                rates[k] = DEFAULT_RATES[k] * later.choice([0.5, 1.0, 2.0])
        for k in SPEC8_KINDS:
            if spec8 is not None and spec8.random() < 0.5:
                rates[k] = DEFAULT_RATES[k] * spec8.choice([0.5, 1.0, 2.0])
        return cls(rates, budget=budget)

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``"kill=0.01,stall=0.004,budget=6"`` (``none`` for no faults)."""
        plan = cls({}, budget=12)
        if text.strip() in ("", "none"):
            return cls.none()
        for part in text.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name == "budget":
                plan.budget = int(value)
            elif name == "quiet_after":
                plan.quiet_after = float(value)
            elif name in KINDS:
                plan.rates[name] = float(value) if value else DEFAULT_RATES[name]
            else:
                raise ValueError(f"unknown fault kind {name!r} (known: {', '.join(KINDS)})")
        return plan

    def __str__(self) -> str:
        if not self.rates or self.budget == 0:
            return "none"
        parts = [f"{k}={v:g}" for k, v in sorted(self.rates.items())]
        return ",".join([*parts, f"budget={self.budget}"])

    def without(self, kind: str) -> FaultPlan:
        return FaultPlan(
            {k: v for k, v in self.rates.items() if k != kind}, self.budget, self.quiet_after
        )


@dataclass
class Injected:
    """One fault that fired (for the report and the verbose replay)."""

    at: float
    kind: str
    point: str
    run_id: str | None
    process: str


class Injector:
    """Draws faults from a plan, counts and records them."""

    def __init__(
        self, plan: FaultPlan, rng: random.Random, later: random.Random | None = None
    ) -> None:
        self.plan = plan
        self.rng = rng
        # The kinds added later draw from their own stream: turning one on leaves the
        # draws (so the timelines) of the earlier kinds as they were.
        self.later = later or rng
        self.counts: collections.Counter[str] = collections.Counter()
        self.log: list[Injected] = []
        self.left = plan.budget

    def take(self, kind: str, point: str, run_id: str | None, process: str, now: float) -> bool:
        """Spend one fault of ``kind`` drawn elsewhere (a ``pause``); False past the budget."""
        if self.left <= 0 or now >= self.plan.quiet_after:
            return False
        self.left -= 1
        self.counts[kind] += 1
        self.log.append(Injected(now, kind, point, run_id, process))
        return True

    def choose(self, point: str, run_id: str | None, process: str, now: float) -> str | None:
        if self.left <= 0 or now >= self.plan.quiet_after:
            return None
        for kind in applicable(point):
            if kind in ("pause", "crash") or kind in SPEC8_KINDS:
                continue
            rate = self.plan.rates.get(kind, 0.0)
            rng = self.later if kind in LATER_KINDS else self.rng
            if rate and rng.random() < rate:
                self.left -= 1
                self.counts[kind] += 1
                self.log.append(Injected(now, kind, point, run_id, process))
                return kind
        return None
