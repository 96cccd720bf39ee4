-- treadle Postgres World, migration 0012: schedules in the World (issue 17 item 3).
--
-- One row per schedule: its spec (JSON: workflow, cron, time zone, overlap policy,
-- catch-up window, input) and its firing state. Every write moves ``version``;
-- Schedules.update is ``UPDATE ... WHERE name = $1 AND version = $2``, the
-- compare-and-set that makes a firing happen once among several schedulers (workers,
-- pods). The rules of when and what to fire are treadle.schedules', shared by every
-- World.

CREATE TABLE treadle_schedules (
    name             text PRIMARY KEY,
    spec             jsonb NOT NULL,
    paused           boolean NOT NULL,
    next_fire_at     timestamptz,
    last_fired_at    timestamptz,
    last_run_id      text,
    previous_run_id  text,
    buffered_at      timestamptz,
    skipped          bigint NOT NULL DEFAULT 0,
    missed           bigint NOT NULL DEFAULT 0,
    version          bigint NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
