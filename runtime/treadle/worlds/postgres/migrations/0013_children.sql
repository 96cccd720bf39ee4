-- treadle Postgres World, migration 0012: child workflows (issue 17 item 1,
-- docs/children.md).
--
-- A parent's log holds child_created (in-band) and child_completed / child_failed
-- (out-of-band, written once under an idempotency key); a child run's run_created and
-- its row carry the parent run and the parent's child_created correlation id. The row's
-- columns are set from run_created by a trigger, so treadle_create_run is unchanged.

ALTER TYPE treadle_event_type ADD VALUE IF NOT EXISTS 'child_created' BEFORE 'noop';
ALTER TYPE treadle_event_type ADD VALUE IF NOT EXISTS 'child_completed' BEFORE 'noop';
ALTER TYPE treadle_event_type ADD VALUE IF NOT EXISTS 'child_failed' BEFORE 'noop';

ALTER TABLE treadle_runs ADD COLUMN parent_run_id text;
ALTER TABLE treadle_runs ADD COLUMN parent_correlation_id text;

CREATE FUNCTION treadle_child_link() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE treadle_runs SET parent_run_id = NEW.data ->> 'parent_run_id',
        parent_correlation_id = NEW.data ->> 'parent_correlation_id'
    WHERE run_id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER treadle_child_link AFTER INSERT ON treadle_events
FOR EACH ROW WHEN (NEW.slot = 1 AND (NEW.data ->> 'parent_run_id') IS NOT NULL)
EXECUTE FUNCTION treadle_child_link();

-- A child_created on an ended run is new work: refused as RunExpired (TRD04), as
-- treadle_admit refuses a step_created (events.REFUSED_ON_TERMINAL_RUN); the raise
-- rolls the whole append back, so nothing is allocated.
CREATE FUNCTION treadle_child_created_on_ended_run() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_status treadle_run_status;
BEGIN
    SELECT r.status INTO v_status FROM treadle_runs r WHERE r.run_id = NEW.run_id;
    IF v_status IN ('completed', 'failed', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'TRD04', MESSAGE = format(
            'run %s is %s: a child_created is refused', NEW.run_id, v_status),
            DETAIL = jsonb_build_object('run_id', NEW.run_id, 'status', v_status,
                'event_type', 'child_created')::text;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER treadle_child_created_on_ended_run BEFORE INSERT ON treadle_events
FOR EACH ROW WHEN (NEW.type::text = 'child_created')
EXECUTE FUNCTION treadle_child_created_on_ended_run();
