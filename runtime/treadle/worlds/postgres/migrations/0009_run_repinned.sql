-- treadle Postgres World, migration 0009: runs.repin moves a run to another deployment.
--
-- A run_repinned event (out-of-band) and the run row's deployment_id change in one
-- statement's transaction, under the run row's lock. treadle_repin decides as
-- treadle.world.storagerules.check_repin does (the run ended; it is not on the
-- deployment it is moved from; the target is unknown or retired) and, when it
-- refuses, writes nothing and returns the facts (o_moved false) from which
-- storage.PostgresRuns.repin raises that same RunNotRepinned. events.create never
-- writes a run_repinned (refused in Python, storagerules.check_event_write).

ALTER TYPE treadle_event_type ADD VALUE IF NOT EXISTS 'run_repinned' BEFORE 'noop';

CREATE FUNCTION treadle_repin(p_run_id text, p_data jsonb)
RETURNS TABLE (
    o_moved boolean, o_status treadle_run_status, o_current text, o_target_retired boolean,
    o_slot bigint, o_created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz := clock_timestamp();
    v_seq bigint;
BEGIN
    SELECT r.status, r.seq, r.deployment_id INTO o_status, v_seq, o_current
    FROM treadle_runs r WHERE r.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TRD03', MESSAGE = format('run %s not found', p_run_id),
            DETAIL = jsonb_build_object('run_id', p_run_id)::text;
    END IF;
    SELECT d.retired INTO o_target_retired
    FROM treadle_deployments d WHERE d.deployment_id = p_data ->> 'to_deployment';
    o_moved := o_status NOT IN ('completed', 'failed', 'cancelled')
        AND o_current = p_data ->> 'from_deployment'
        AND o_target_retired IS NOT NULL AND NOT o_target_retired;
    IF o_moved THEN
        v_seq := v_seq + 1;
        INSERT INTO treadle_events (run_id, slot, type, correlation_id, in_band, created_at, data)
        VALUES (p_run_id, v_seq, 'run_repinned', NULL, false, v_at, p_data);
        UPDATE treadle_runs SET seq = v_seq, updated_at = v_at,
            deployment_id = p_data ->> 'to_deployment'
        WHERE run_id = p_run_id;
        PERFORM pg_notify('treadle_events', p_run_id || ':' || v_seq);
        o_slot := v_seq;
        o_created_at := v_at;
    END IF;
    RETURN NEXT;
END;
$$;
