"""The worker: serves a World's queue with the orchestrator and step handlers.

``Worker.start`` consumes the kinds its role takes (``all``, ``orchestrator``,
``steps``). Before a delivery replays anything, the orchestrator handler
settles the cheap cases: an intermediate timer hop (read the run's status,
send the next hop, write nothing), a misrouted message (re-sent to the run's
deployment after 1, 2, 4 s, then the run fails with ``DeploymentMismatch``),
and a plain wake with nothing new since this process last consumed the run
(one tail read, then ``Ack``). A step message of a run format this worker
does not know is left alone (no body, no write; redelivered after 900 s).

Routing by format (seed 003 "Resolving a delivery's spec"): an orchestrator
message goes to the orchestrator of its run's format, read from the message's
stamp (``run_input``, ``run_context``, ``run_spec_version``) or, unstamped, from
one run row read (``specrouting.resolve``). A spec 8 run's messages, timer hops
included, go to ``spec8.delivery.deliver`` after the deployment guard, never
through the spec 9 fast paths (a spec 8 backstop wake finds nothing new in the
log and must still replay). A version this build does not know goes to the
spec 9 delivery, which loads the run and leaves it for a worker that has its
format (or hands a wrongly hinted message to the run's own format). Step
messages of both formats go to ``steps.handle_step_message``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable
from typing import Literal

from treadle import clock, errors, limits, payloads
from treadle.orchestrator import limitgate, pinning, reads, specrouting, steps, timers
from treadle.orchestrator.concurrency import worker_concurrency
from treadle.orchestrator.delivery import OrchestratorDelivery
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.spec8 import delivery as spec8_delivery
from treadle.schedules import loop as schedule_loop
from treadle.sdk import catalogue
from treadle.world import constants, contract, messages, records, specversions

log = logging.getLogger("treadle.orchestrator.worker")

Role = Literal["all", "orchestrator", "steps"]

_frozen = False


def _freeze_startup_objects() -> None:
    """Once per process, at the first worker start: put what exists then (the imported
    modules, the app's definitions) out of the cyclic collector's reach, so its full
    collections walk only what deliveries allocate. Collections walking the imports
    took a fifth of a throughput run's wall time (2.1 of 10.2 s; 0.9 s frozen).
    Refcounting still frees those objects; only cycles among them are never collected."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


class Worker:
    def __init__(self, rt: Runtime, *, role: Role = "all", concurrency: int | None = None) -> None:
        self.rt = rt
        self.role = role
        # None: TREADLE_WORKER_CONCURRENCY, else sized from the CPUs and the step bodies.
        self.concurrency = worker_concurrency(rt.settings, rt.steps, concurrency)
        self._consumer: contract.Consumer | None = None
        self._limits = limits.Limits.from_settings(rt.settings)
        self._payload_keys = payloads.KeyRing.from_settings(rt.settings)  # bad keys: at start
        self._schedules: schedule_loop.FiringLoop | None = None
        self._limited = limitgate.limited_workflows(rt)
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        _freeze_startup_objects()
        deployments = getattr(self.rt.world, "deployments", None)
        if deployments is not None:
            served = {name: wf.fn for name, wf in self.rt.workflows.items()}
            tags = {name: wf.compatible for name, wf in self.rt.workflows.items()}
            await deployments.register(
                self.rt.deployment_id, catalogue=catalogue.describe(served, tags)
            )
        handlers: dict[messages.MessageKind, contract.Handler] = {}
        if self.role in ("all", "orchestrator"):
            handlers["orchestrator"] = self.handle
        if self.role in ("all", "steps"):
            handlers["step"] = self.handle
        self._consumer = await self.rt.world.queue.consume(handlers, concurrency=self.concurrency)
        if self.role in ("all", "orchestrator"):
            self._schedules = schedule_loop.start_for(self.rt)  # issue 17 item 3
        if self._limited or any(limitgate.step_limits(self.rt, n).any for n in self.rt.steps):
            self._sweeper = asyncio.get_running_loop().create_task(limitgate.sweeper(self.rt))

    def schedules_changed(self) -> None:
        """Wake this worker's schedules firing loop (a schedule changed in this process)."""
        if self._schedules is not None:
            self._schedules.wake()

    async def stop(self, *, grace_seconds: float = 30.0) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._schedules is not None:
            firing_loop, self._schedules = self._schedules, None
            await firing_loop.stop()
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.close(grace_seconds=grace_seconds)
        self.rt.warm.clear()  # the kept replays' coroutines closed now, not at collection

    async def handle(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        meta: messages.DeliveryMeta,
    ) -> messages.HandlerResult:
        # Workflow code and step bodies encode under this worker's limits (its settings).
        limits.use(self._limits)
        payloads.use(self._payload_keys)  # values sealed and opened under this worker's keys
        if isinstance(message, messages.StepMessage):
            if message.spec_version not in constants.SUPPORTED_SPEC_VERSIONS:
                return self._unknown_format(message)
            return await steps.handle_step_message(self.rt, message, meta)
        if not self._limited:
            return await self._orchestrate(message, meta)
        limited, answer = await limitgate.gate_run(self.rt, message)  # issue 17 item 4
        if answer is not None:
            return answer
        result = await self._orchestrate(message, meta)
        if limited and isinstance(result, messages.Ack):
            await limitgate.after_run(self.rt, message.run_id)
        return result

    async def _orchestrate(
        self, message: messages.OrchestratorMessage, meta: messages.DeliveryMeta
    ) -> messages.HandlerResult:
        if await self.family(message) is specversions.Family.SPEC8:
            if message.deployment_id not in (None, self.rt.deployment_id):
                return await self._misrouted(message, meta, specversions.Family.SPEC8)
            return await spec8_delivery.deliver(self.rt, message, meta)
        if message.is_intermediate_hop:
            return await self._hop(message)
        if message.deployment_id not in (None, self.rt.deployment_id):
            return await self._misrouted(message, meta)
        if await self._nothing_new(message, meta):
            return messages.ACK
        return await OrchestratorDelivery(self.rt, message, meta).run()

    async def family(self, message: messages.OrchestratorMessage) -> specversions.Family:
        """The orchestrator family of the message's run: its stamp, else one run row read.
        A version this build does not know is the spec 9 delivery's to leave alone."""
        version = await specrouting.resolve(self.rt, message)
        if version not in constants.SUPPORTED_SPEC_VERSIONS:
            return specversions.Family.SPEC9
        return specversions.orchestrator_for(version)

    async def _misrouted(
        self,
        message: messages.OrchestratorMessage,
        meta: messages.DeliveryMeta,
        family: specversions.Family = specversions.Family.SPEC9,
    ) -> messages.HandlerResult:
        """A message stamped with another deployment: the run's record, never the stamp,
        says where the run is pinned (security review H2: a forged stamp naming a gone
        deployment failed the run as pinned to it). One row read."""
        try:
            run = await self.rt.world.runs.get(message.run_id)
        except errors.RunNotFound:
            log.warning(
                "run %s: message %s names no run; nothing run or written",
                message.run_id,
                meta.message_id,
            )
            return messages.ACK
        if run.deployment_id == self.rt.deployment_id:
            log.warning(
                "run %s: message %s is stamped for deployment %s but the run is pinned "
                "here; served here",
                message.run_id,
                meta.message_id,
                message.deployment_id,
            )
            fixed = message.model_copy(update={"deployment_id": run.deployment_id})
            if family is specversions.Family.SPEC8:
                return await spec8_delivery.deliver(self.rt, fixed, meta)
            if await self._nothing_new(fixed, meta):
                return messages.ACK
            return await OrchestratorDelivery(self.rt, fixed, meta).run()
        return await pinning.reroute(
            self.rt, message, run.deployment_id, run_spec_version=run.spec_version
        )

    def _unknown_format(self, message: messages.StepMessage) -> messages.HandlerResult:
        """A step of a run whose format this worker does not know: no body, no write; the
        message waits for a worker of the release that created the run (RunNotSupported)."""
        log.error(
            "run %s: step %s has spec version %s, which this worker does not support; "
            "leaving it for %d s",
            message.run_id,
            message.step_id,
            message.spec_version,
            constants.MAX_REDELIVER_SECONDS,
        )
        return messages.Redeliver(constants.MAX_REDELIVER_SECONDS)

    async def _hop(self, message: messages.OrchestratorMessage) -> messages.HandlerResult:
        """An intermediate hop of a long wait: status only, then the next hop."""
        cont = message.wait_continuation
        assert cont is not None
        assert cont.resume_at_ms is not None
        try:
            run = await self.rt.world.runs.get(message.run_id)
        except errors.RunNotFound:
            log.warning("run %s: a timer hop names no run; nothing run or written", message.run_id)
            return messages.ACK
        if run.is_terminal:
            return messages.ACK  # the chain stops with the run
        send = timers.timer_send(
            run_id=message.run_id,
            deployment_id=message.deployment_id,
            spec_version=run.spec_version,
            correlation_id=cont.correlation_id,
            resume_at_ms=cont.resume_at_ms,
            now_ms=clock.now_ms(),
            max_hop_ms=int(self.rt.settings.WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS * 1000),
        )
        await self.rt.world.queue.send_batch([send])
        return messages.ACK

    async def _nothing_new(
        self, message: messages.OrchestratorMessage, meta: messages.DeliveryMeta
    ) -> bool:
        """The no-op wake: a plain first delivery, and the log ends where we left it."""
        consumed = self.rt.consumed.get(message.run_id)
        plain = (
            message.run_input is None
            and message.wait_continuation is None
            and not message.complete_waits
            and not message.recovery
        )
        if consumed is None or not plain or meta.delivery_count != 1:
            return False

        def read() -> Awaitable[records.EventPage]:
            return self.rt.world.events.list(message.run_id, after_slot=consumed, limit=1)

        try:
            page = await reads.bounded(
                read,
                timeout_ms=self.rt.settings.WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS,
                run_id=message.run_id,
                what="the no-op wake's tail read",
            )
        except errors.RunNotFound:
            return True
        return not page.events
