"""The World contract: what every World (storage + queue) implements.

Modules, imported as modules (``from treadle.world import events``):

- ``constants``: the contract's numbers (fence start, dedupe window, limits).
- ``ids``: run ids (``wrun_<ulid>``) and the other id shapes.
- ``events``: the event models, a discriminated union on ``type``.
- ``messages``: queue message models and handler results.
- ``records``: what the read views return (runs, steps, hooks, pages).
- ``contract``: the typed Protocols a World implements (re-exporting those of
  ``contract_queue``, the queue's, and ``contract_stores``, the optional stores).
- ``routing``: pure functions deciding how a message is gated.
- ``conformance``: the test suite every World must pass (imports pytest).
"""
