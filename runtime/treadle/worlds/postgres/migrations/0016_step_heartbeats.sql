-- Step heartbeats (issue 17 item 5, docs/timeouts.md): the latest beat of each step,
-- upserted by the step's process at most once per throttle interval; never the log.
CREATE TABLE treadle_step_heartbeats (
    run_id   text NOT NULL,
    step_id  text NOT NULL,
    attempt  integer NOT NULL,
    details  jsonb,
    beat_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, step_id)
);
