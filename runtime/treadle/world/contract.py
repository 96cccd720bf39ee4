"""The World contract as typed Protocols: storage (runs, events, steps, hooks)
and queue. Every World implements ``World``; ``treadle.world.conformance``
checks the behaviour described here against any implementation.

This module holds the storage side, the changes feed, streams and ``World``; the
queue's Protocols are in ``contract_queue`` and the optional World-wide stores
(schedules, limits, heartbeats) in ``contract_stores``. Every name of those two is
re-exported here, so callers write ``contract.Queue`` or ``contract.Schedules``.

Storage rules (DESIGN.md 3.1, seed 003 "Implementing spec 9 in a World"):

- ``runs.create`` writes ``run_created`` at slot 1; a new run holds
  ``seq = 1, seq_in_band = IN_BAND_SEQ_AT_RUN_CREATION``.
- ``events.create(..., in_band=True)`` needs ``expected_seq_in_band`` and
  ``event_count`` (else ``WorldContractError``). The fence is decided first:
  a count other than the run's ``seq_in_band`` raises ``InBandSuperseded`` and
  allocates nothing. An accepted in-band write moves ``seq`` and
  ``seq_in_band``; an out-of-band one moves ``seq`` only and is never fenced.
- The skipped-slot report of an in-band write is every event at slots
  ``event_count + 1 .. own_slot - 1`` (``has_more`` when cut short).
- An in-band write's ``occurred_at`` is stored as the event's ``created_at``.
- Refusals (``RunExpired``, ``StepAlreadyEnded``, ``StaleStepStart``,
  ``StaleStepOutcome``, ``WaitAlreadyCompleted``, ``EntityAlreadyCreated``,
  ``HookNotFound``) allocate nothing. A terminal run refuses new work
  (``events.REFUSED_ON_TERMINAL_RUN``) and keeps accepting a step's first outcome
  and a wait's first completion.
- One outcome per step, one completion per wait (DESIGN.md 10): a
  ``step_started``, ``step_completed`` or ``step_failed`` for a step that has
  its outcome raises ``StepAlreadyEnded``; a second ``wait_completed`` raises
  ``WaitAlreadyCompleted``; in-band or out-of-band, running run or ended. A
  stalled delivery that resumes therefore cannot add a second outcome: the
  first one written stands.
- Attempts only move forward: a ``step_started`` whose ``attempt`` is not
  greater than the highest attempt already started for that step raises
  ``StaleStepStart`` (with ``attempt`` and ``latest_attempt``), in-band or
  out-of-band. A delivery whose start write stalled past its lease therefore
  cannot start an attempt its redeliveries already ran (simulation seed 522).
- An outcome only from the latest started attempt
  (``storagerules.check_outcome_attempt``): a ``step_completed``, ``step_failed`` or
  ``step_retrying`` naming an ``attempt`` other than the step's highest started one
  raises ``StaleStepOutcome`` (with ``attempt`` and ``latest_attempt``), in-band or
  out-of-band, after the one-outcome check; a step no attempt started takes any, and a
  ``step_completed`` naming no attempt (an earlier release's writer) is not checked.
  A body that outlived its timeout or lease therefore cannot land its outcome once the
  next attempt started, however late it writes (docs/timeouts.md).
- One creation per entity (issue 12 item 2; ``storagerules.created_by``), in-band or
  out-of-band, every run, spec 8 or 9: a second ``run_started``; a second
  ``step_created`` for a step, or one for a step an inline ``step_started`` created; an
  inline creating ``step_started`` (``inline``, attempt 1) for a step a ``step_created``
  created; a second ``wait_created``; a second ``hook_created`` for a correlation id
  (also after its creation was stored as ``hook_conflict``) each raise
  ``EntityAlreadyCreated`` with the first creation's ``slot``, nothing allocated. Decided
  after the fence and the terminal-run check; for a ``step_started`` after the step's
  outcome check and before the stale-start one (a second inline creating start of an
  inline step stays ``StaleStepStart``); for a ``hook_created`` before the token claim,
  so a delivery re-creating its own run's hook never stores a ``hook_conflict``. In
  ``create_batch`` the refusal is the item's, and the later items of its correlation id
  are ``EarlierItemRefused``. Spec 9's single writer never meets these rules; a spec 8
  run has several writers and the loser of a creation race hears them.
- ``hook_created`` for a token a live hook holds stores ``hook_conflict``
  instead, in the creator's log, at the slot the creation would have taken.
- A hook takes one payload: an admitted ``hook_received`` frees the hook's
  token at once (the run may create a hook with it again), and a
  ``hook_received`` for a hook that is not live (never created, disposed,
  already received, or its run ended) is ``HookNotFound``, checked before the
  run's status, so a resume racing the run's end never hears ``RunExpired``.
- ``create_batch`` takes step and wait events only, allocates the admitted
  items as one block under one fence check, is not atomic, and refuses every
  later item of a correlation id once one of its items was refused.
- An ``idempotency_key`` on a write makes a retry converge: the second write
  returns the first one's event with ``allocated = 0``.
- ``runs.create`` on a retired deployment raises ``DeploymentRetired`` and
  records nothing (review R1); the check is made in the transaction that
  inserts the run, so a ``deployments.retire`` is wholly before or after any
  create. A retried create of a run that exists returns it, retired or not. An
  unknown deployment is accepted: workers may register after the first start.
- ``runs.repin`` moves a run's pin (``run_repinned``, out-of-band, with the run
  row's ``deployment_id``, atomically), only from the deployment it is on, only
  while it has not ended, only to a registered, unretired deployment; ``events.create``
  refuses ``run_created`` and ``run_repinned`` (``storagerules.check_event_write``).

Spec 8 runs (``run_created.spec_version`` below 9; seed 003 "Spec 8 and spec 9 side by
side", "Sleeps and timers, spec 8 against spec 9"):

- Every orchestrator write is out-of-band and unfenced: several deliveries of one run
  may write at once, and the creation rules above refuse the loser's duplicates.
- A ``step_started`` with a higher attempt on a running step is accepted (a retry, or
  owner recovery's re-stamped start); ``owner_message_id`` (seed 000) is stored with
  the event and listed back unchanged, and a start without it stores none (latest
  start wins).
- ``wait_completed`` may be written out-of-band by any delivery replaying after the
  wait is due and by ``run.wake_up()``; the first one stands, a second is
  ``WaitAlreadyCompleted``.
- A spec 9 event (``storagerules.SPEC_9_ONLY_TYPES``: ``wake_requested``) on a spec 8
  run is a ``WorldContractError`` naming the run and its version ("a spec 8 run never
  receives a spec 9 event"), decided before anything else, nothing written.

Queue rules (DESIGN.md 3.2, seed 003 "Spec 9 queue rules"): see ``Queue``
(``contract_queue``). A spec 8 orchestrator message (stamped below 9;
``routing.gated_run_id``) is never gated or coalesced: it runs beside any other message
of its run, each its own delivery.

Where treadle deviates from the seed: the seed's queue treats an UNSTAMPED orchestrator
message as spec 8 (never gated). treadle's ``routing.gated_run_id`` gates an unstamped
message whose run row is spec 9 or unknown (the local and memory Worlds read the row;
NATS, which reads no row, gates every unstamped one). Every producer in treadle stamps
its messages, so only a foreign producer sends one unstamped, and gating a message the
queue cannot place costs nothing: at worst it waits behind its run's holder, where the
seed's would have run beside it under the fence.

World-wide changes (``Changes``, for watchers such as the operator): see
``Changes.watch``; a queue's backlog (for autoscalers): ``Queue.backlog``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeAlias

from pydantic import JsonValue

from treadle.world import events, records
from treadle.world.contract_queue import Consumer as Consumer
from treadle.world.contract_queue import DeadLetters as DeadLetters
from treadle.world.contract_queue import Handler as Handler
from treadle.world.contract_queue import Queue as Queue
from treadle.world.contract_queue import QueueTuning as QueueTuning
from treadle.world.contract_stores import Heartbeats as Heartbeats
from treadle.world.contract_stores import LimitStore as LimitStore
from treadle.world.contract_stores import Schedules as Schedules
from treadle.world.contract_stores import heartbeats_of as heartbeats_of

EventCallback: TypeAlias = Callable[[events.LoggedEvent], None]
ErrorCallback: TypeAlias = Callable[[BaseException], None]


@dataclass(frozen=True, slots=True)
class Capabilities:
    in_band_fence: bool
    # The queue delivers a run's orchestrator messages one at a time.
    serializes_runs: bool
    # A message arriving while its run is held is folded into the holder.
    coalesces: bool
    # events.subscribe pushes committed events.
    live_feed: bool


class Subscription(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RunChanged:
    """A report of the world-wide changes feed: run ``run_id`` has events up to ``slot``.

    ``slot == 1`` is the run's creation (``created``), always reported on its own.
    ``deployment_id`` is the run's deployment on a creation report when the World
    knows it without a read (None otherwise, and on every later report).
    """

    run_id: str
    slot: int
    deployment_id: str | None = None

    @property
    def created(self) -> bool:
        return self.slot == 1


ChangeCallback: TypeAlias = Callable[[RunChanged], None]
ResyncCallback: TypeAlias = Callable[[], None]


class Changes(Protocol):
    """Every run's new events, world-wide, best effort (the operator's status sync)."""

    async def watch(self, on_change: ChangeCallback, on_resync: ResyncCallback) -> Subscription:
        """Report committed changes of every run until the subscription is closed.

        Returns once the feed is in place: an event committed after it returns (by
        any process of the World) is reported by ``on_change(RunChanged(run_id,
        slot))`` with ``slot`` at least the event's, unless the feed is lost
        meanwhile. Reports may be coalesced (one at slot N stands for every slot up to
        N of that run), repeated or out of order across runs; a slot never committed
        is never reported. When the World cannot tell what changed (its connection
        was lost and is back, another process wrote where no notification reaches),
        it calls ``on_resync()``: reports may have been missed, so the watcher
        re-reads whatever it follows. A lost feed reconnects by itself, retrying
        until closed, and calls ``on_resync()`` once it is back. Callbacks run on
        the event loop; an exception in one is logged and the feed goes on.
        ``StorageUnavailable`` when the feed cannot be set up at all.
        """
        ...


class Runs(Protocol):
    async def create(
        self,
        *,
        workflow_name: str,
        input: JsonValue,
        deployment_id: str,
        spec_version: int,
        run_id: str | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
        parent_run_id: str | None = None,
        parent_correlation_id: str | None = None,
    ) -> records.RunRecord:
        """Create a run with ``run_created`` at slot 1.

        ``parent_run_id`` and ``parent_correlation_id`` (child workflows): the run is a
        child of that run's ``child_created``; both are stored on ``run_created`` and on
        the run's record (``RunRecord.parent_run_id``). A retried create converges on
        the run whatever parent it names (the run id names one run).

        With a ``run_id`` that exists already, returns that run when it was created
        with the same workflow and input (a retried start), else raises
        ``WorldContractError``. A new run on a retired deployment raises
        ``DeploymentRetired``, nothing recorded (a start racing a rollout reads
        the new latest and tries again).
        """
        ...

    async def get(self, run_id: str) -> records.RunRecord: ...

    async def list(
        self,
        *,
        status: records.RunStatus | None = None,
        workflow_name: str | None = None,
        deployment_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
    ) -> records.RunPage:
        """Runs, newest first, filtered; page on with ``next_cursor``.

        ``attributes``: only runs whose attributes hold every one of these keys with an
        equal value (``treadle.world.attributes``: scalars only, checked by
        ``attributes.check_filter``, ``WorldContractError`` otherwise), answered from an
        index (Postgres: GIN on ``attributes``; local: ``run_attributes``)."""
        ...

    async def count(
        self,
        *,
        statuses: Sequence[records.RunStatus] | None = None,
        deployment_id: str | None = None,
        limit: int | None = None,
    ) -> int:
        """How many runs match (``statuses``: any of them; ``None``: every status), in one
        query, never a page walk. With ``limit`` the count stops there (``limit=1`` asks
        "is there any?", which a World answers without counting the rest). An empty
        ``statuses`` or a ``limit`` below 1 raises ``WorldContractError``
        (``storagerules.check_count``)."""
        ...

    async def repin(
        self,
        run_id: str,
        *,
        from_deployment: str,
        to_deployment: str,
        reason: str | None = None,
    ) -> records.RunRecord:
        """Move a run to another deployment: append ``run_repinned`` (out-of-band) and set
        the run row's ``deployment_id`` to ``to_deployment``, in one transaction.

        Conditional: ``RunNotRepinned`` (nothing written) when the run ended, is not on
        ``from_deployment`` (another mover won), or ``to_deployment`` is unknown or
        retired (``storagerules.check_repin``); ``RunNotFound`` for no such run. Returns
        the moved run. Waking the new deployment is the caller's (``treadle.moves``).
        """
        ...


class Events(Protocol):
    async def create(
        self,
        run_id: str,
        event: events.Event,
        *,
        in_band: bool,
        expected_seq_in_band: int | None = None,
        event_count: int | None = None,
        occurred_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> records.EventResult: ...

    async def create_batch(
        self,
        run_id: str,
        batch: Sequence[events.Event],
        *,
        in_band: bool,
        expected_seq_in_band: int | None = None,
        event_count: int | None = None,
        occurred_at: datetime | None = None,
    ) -> records.BatchResult: ...

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        """Events after ``after_slot`` in slot order, with the run's snapshot read first."""
        ...

    async def list_entity(
        self, run_id: str, correlation_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        """The events of one step, wait or hook (those whose ``correlation_id`` it is) after
        ``after_slot``, in slot order, with the run's snapshot read first: what ``list``
        pages would hold of it, without reading the rest of the log (a background step's
        delivery reads only its own step, however long the run's log is). ``cursor`` is
        the last listed slot (``after_slot`` on an empty page), ``has_more`` that more of
        the entity's events follow. ``RunNotFound`` for no such run; an empty page for an
        id the run has no event of. The same ``limit``/``after_slot`` bounds as ``list``
        (``storagerules.check_list_args``)."""
        ...

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: EventCallback,
        on_error: ErrorCallback,
    ) -> Subscription:
        """Push the run's committed events after ``after_slot``, in slot order, best effort."""
        ...


class Steps(Protocol):
    async def list(self, run_id: str) -> list[records.StepRecord]: ...

    async def get(self, run_id: str, step_id: str) -> records.StepRecord: ...


class Hooks(Protocol):
    async def get_by_token(self, token: str) -> records.HookRecord:
        """The live hook holding ``token``; ``HookNotFound`` when none does."""
        ...


class Deployments(Protocol):
    """The deployment revisions that serve runs, and which is the latest.

    A worker registers its deployment when it starts. The latest is the most
    recently promoted one not retired (``promote``: the operator promotes the
    revision it made ``latestRevision``, once it is ready); in a World where
    nothing not retired was ever promoted, it is the most recently
    first-registered one not retired. So on an operator-managed World a worker
    that registers (and may then crash-loop) never moves the latest; a local
    setup keeps the registration rule (review R12). A run pinned to a deployment
    that is unknown or retired cannot be served (``DeploymentMismatch``), and
    ``runs.create`` refuses a retired one (``DeploymentRetired``).
    """

    async def register(
        self, deployment_id: str, *, catalogue: JsonValue = None
    ) -> records.DeploymentRecord:
        """Record the deployment (idempotent: a second call keeps the first time).

        ``catalogue`` (the workflows its workers serve) replaces the recorded one
        when given, so that a client can check a start before recording it.
        """
        ...

    async def get(self, deployment_id: str) -> records.DeploymentRecord | None: ...

    async def latest(self) -> str | None: ...

    async def list(self, *, limit: int = 1000) -> list[records.DeploymentRecord]:
        """Every deployment the World has seen, the most recently registered first, up
        to ``limit`` (``treadle serve``'s deployments page); retired ones included."""
        ...

    async def retire(self, deployment_id: str) -> None: ...

    async def promote(self, deployment_id: str) -> None:
        """Make ``deployment_id`` the latest (recorded first if unknown).

        Idempotent: promoting the newest promoted one changes nothing; promoting an
        older one again makes it latest again (a rollback). ``DeploymentRetired``
        for a retired deployment.
        """
        ...


# -- streams (issue 17 item 6, docs/streams.md; rules: ``world.streamrules``) ---------------

StreamCallback: TypeAlias = Callable[[], None]


class Streams(Protocol):
    """Named streams of chunks a run's steps write (``get_writable``) and anyone reads.

    A World that has them offers ``world.streams`` (``streamrules.streams_of``). A
    stream is ``(run_id, name)``; it exists once a chunk or a close was appended.
    """

    async def append(
        self,
        run_id: str,
        name: str,
        chunks: Sequence[JsonValue],
        *,
        step_id: str,
        attempt: int,
        first_seq: int,
        close: bool = False,
    ) -> records.StreamAppend:
        """Store ``chunks`` (already serde JSON) as one atomic block at the stream's next
        indexes, written by attempt ``attempt`` of step ``step_id`` as its chunks
        ``first_seq ..``; with ``close`` the stream is closed after them.

        Decided in one transaction, in this order (``streamrules.decide``): no run:
        ``RunNotFound``; chunks this attempt stored already (a retried append whose
        answer was lost): nothing stored, ``replayed``; the run ended: refused
        (``StreamWriteRefused`` ``run_ended``); the step's latest started attempt is not
        ``attempt`` (a later one started, or this one never did): ``stale_attempt`` or
        ``not_started``; the stream is closed: ``StreamClosedError``; ``first_seq`` not
        the attempt's next: ``WorldContractError``. A bad name or an empty append
        without ``close``: ``StreamNameInvalid`` / ``WorldContractError``. A refusal
        stores nothing. Readers subscribed to the stream hear of an append at once.
        """
        ...

    async def read(
        self, run_id: str, name: str, *, start: int = 0, limit: int = 1000
    ) -> records.StreamPage:
        """Chunks with index ``start`` .. (at most ``limit``), with the stream's count and
        closed state and whether the run ended, one snapshot. ``RunNotFound`` for no run;
        an empty page for a stream never written."""
        ...

    async def list(self, run_id: str) -> list[records.StreamInfo]:
        """The run's streams by name. ``RunNotFound`` for no run."""
        ...

    def subscribe(self, run_id: str, name: str, on_append: StreamCallback) -> Subscription:
        """Call ``on_append()`` (on the event loop) after appends to the stream, best
        effort: the reader still reads on a timer (``TREADLE_STREAM_POLL_SECONDS``)."""
        ...


class World(Protocol):
    capabilities: Capabilities
    runs: Runs
    events: Events
    steps: Steps
    hooks: Hooks
    deployments: Deployments
    queue: Queue
    changes: Changes

    async def close(self) -> None: ...
