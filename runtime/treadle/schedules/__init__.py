"""Schedules in the World (issue 17 item 3; docs/schedules.md).

- ``cron``: the cron parser (CronJob syntax, time zones), shared with the operator.
- ``spec``: a schedule's options checked at the call (``ScheduleInvalid``).
- ``firing``: one firing: the overlap decision, the claim, the run (deterministic id).
- ``loop``: the firing loop every worker runs (no leader).
- ``api``: ``app.schedule`` and the ``Schedule`` handle.

The World stores schedules (``contract.Schedules``: the local, Postgres and memory
Worlds); every rule is here, shared by all of them.
"""
