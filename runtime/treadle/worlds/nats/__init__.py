"""The queue half of the production World, on NATS JetStream (server 2.12 or later).

``await NatsQueue.connect("nats://host:4222", deployment_id=...)`` opens it; see
``queue.NatsQueue``. One stream holds every deployment's messages on per-run
subjects (``names``), each deployment pulls them through two durable consumers
(``consumer``, ``pulling``), and a run lease in JetStream KV (``leases``) keeps
a run's orchestrator deliveries one at a time across every worker process.
"""

from treadle.worlds.nats.queue import NatsQueue

__all__ = ["NatsQueue"]
