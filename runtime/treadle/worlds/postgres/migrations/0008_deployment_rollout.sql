-- treadle Postgres World, migration 0008: rollouts without stranded runs.
--
-- Review R1: a start that read "latest" just before a rollout retired that
-- revision recorded its run on it, and nobody served it again. treadle_create_run
-- now locks the deployment's row (FOR SHARE) and refuses a new run on a retired
-- deployment with DeploymentRetired (TRD10), nothing written; a retire (an UPDATE
-- of that row) therefore commits wholly before or wholly after any create. A retried
-- create of a run that exists still returns it. An unknown deployment is accepted
-- (workers may register after a client starts its first run).
--
-- Review R12: Deployments.promote(id) names the revision that takes new runs (the
-- operator promotes the revision it made latest). ``promoted`` is its order from a
-- sequence; latest() is the newest promoted non-retired deployment, else the newest
-- registered non-retired one (a World nobody promotes in keeps the old rule).

ALTER TABLE treadle_deployments ADD COLUMN promoted bigint;
CREATE SEQUENCE treadle_deployment_promotions;

CREATE OR REPLACE FUNCTION treadle_create_run(p_run_id text, p_data jsonb)
RETURNS TABLE (
    o_created boolean, o_first jsonb,
    o_run_id text, o_workflow_name text, o_status treadle_run_status, o_deployment_id text,
    o_spec_version integer, o_input jsonb, o_created_at timestamptz, o_updated_at timestamptz,
    o_seq bigint, o_seq_in_band bigint, o_started_at timestamptz, o_completed_at timestamptz,
    o_output jsonb, o_error jsonb, o_attributes jsonb
)
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz := clock_timestamp();
    v_retired boolean;
BEGIN
    SELECT d.retired INTO v_retired FROM treadle_deployments d
    WHERE d.deployment_id = p_data ->> 'deployment_id' FOR SHARE;
    IF v_retired AND NOT EXISTS (SELECT 1 FROM treadle_runs r WHERE r.run_id = p_run_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'TRD10', MESSAGE = format(
            'run %s not recorded: deployment %s is retired', p_run_id, p_data ->> 'deployment_id'),
            DETAIL = jsonb_build_object(
                'run_id', p_run_id, 'deployment_id', p_data ->> 'deployment_id')::text;
    END IF;
    INSERT INTO treadle_runs AS r (run_id, workflow_name, deployment_id, spec_version, status,
        input, attributes, seq, seq_in_band, created_at, updated_at)
    VALUES (p_run_id, p_data ->> 'workflow_name', p_data ->> 'deployment_id',
        (p_data ->> 'spec_version')::integer, 'pending', COALESCE(p_data -> 'input', 'null'),
        COALESCE(p_data -> 'attributes', '{}'), 1, 1, v_at, v_at)
    ON CONFLICT (run_id) DO NOTHING;
    o_created := FOUND;
    IF o_created THEN
        INSERT INTO treadle_events (run_id, slot, type, correlation_id, in_band, created_at, data)
        VALUES (p_run_id, 1, 'run_created', NULL, true, v_at, p_data);
        PERFORM pg_notify('treadle_events', p_run_id || ':1');
    ELSE
        SELECT e.data INTO o_first FROM treadle_events e WHERE e.run_id = p_run_id AND e.slot = 1;
    END IF;
    RETURN QUERY SELECT o_created, o_first, r.run_id, r.workflow_name, r.status, r.deployment_id,
        r.spec_version, r.input, r.created_at, r.updated_at, r.seq, r.seq_in_band, r.started_at,
        r.completed_at, r.output, r.error, r.attributes
    FROM treadle_runs r WHERE r.run_id = p_run_id;
END
$$;
