-- treadle Postgres World, migration 0007: a run's creation is announced with its deployment.
--
-- Every committed event NOTIFYs 'treadle_events' with 'run_id:slot'. A world-wide
-- watcher that mirrors only some deployments' runs (the operator's status sync,
-- contract.Changes) had to read every new run to learn its deployment (review
-- operator.md R5 (d)). Each new run row now also NOTIFYs 'treadle_runs' with
-- {"run_id": ..., "deployment_id": ...}, in the transaction that creates it, before
-- its run_created's own 'treadle_events' notification. Nothing else changes.

CREATE FUNCTION treadle_notify_run_created() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'treadle_runs',
        json_build_object('run_id', NEW.run_id, 'deployment_id', NEW.deployment_id)::text
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER treadle_runs_created AFTER INSERT ON treadle_runs
    FOR EACH ROW EXECUTE FUNCTION treadle_notify_run_created();
