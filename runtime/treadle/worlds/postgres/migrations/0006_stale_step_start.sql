-- treadle Postgres World, migration 0006: a stale step_started is refused.
--
-- A background step's first delivery could stall inside its out-of-band
-- step_started past its lease; meanwhile redeliveries started and retried attempts
-- 1 and 2; then the stale write landed as "step_started attempt 1" and its body ran,
-- burning an attempt (simulation seed 522; logcheck: "attempt 1 after 2"). A
-- step_started whose attempt is not greater than the highest attempt already
-- started for the step (treadle_steps.attempt, kept as the GREATEST by the fold;
-- step_created folds it to 0) is now refused: StaleStepStart (TRD09), nothing
-- allocated, as the local and memory Worlds do. Only treadle_admit is replaced; it
-- is 0005's but for that check.

-- One event's own checks: run_created refused, a terminal run refuses new work,
-- a step_started or outcome after the step's outcome, a step_started whose attempt
-- is not past the latest started one, a second wait completion,
-- a hook_received for no live hook (which frees the hook's token when admitted).
-- A hook_created claims its token here; a held token turns it into hook_conflict.
-- Returns the refusal (o_code, o_message, o_detail) or the event to store.
CREATE OR REPLACE FUNCTION treadle_admit(
    p_run_id text, p_status treadle_run_status, p_event jsonb, p_at timestamptz,
    OUT o_code text, OUT o_message text, OUT o_detail jsonb, OUT o_stored jsonb
)
LANGUAGE plpgsql AS $$
DECLARE
    v_type text := p_event ->> 'type';
    v_cid text := p_event ->> 'correlation_id';
    v_token text;
    v_outcome bigint;
    v_latest integer;
    v_holder text;
BEGIN
    o_stored := p_event;
    IF v_type = 'run_created' THEN
        o_code := 'TRD02';
        o_message := format(
            'run %s: run_created is written by runs.create, not events.create', p_run_id);
        o_detail := jsonb_build_object('run_id', p_run_id);
    ELSIF p_status IN ('completed', 'failed', 'cancelled') AND v_type IN (
        'run_started', 'run_completed', 'run_failed', 'run_cancelled', 'step_created',
        'step_started', 'step_retrying', 'wait_created', 'hook_created', 'wake_requested'
    ) THEN
        o_code := 'TRD04';
        o_detail := jsonb_build_object('run_id', p_run_id, 'status', p_status, 'event_type', v_type);
    ELSIF v_type IN ('step_started', 'step_completed', 'step_failed') THEN
        SELECT s.outcome_slot, s.attempt INTO v_outcome, v_latest
        FROM treadle_steps s WHERE s.run_id = p_run_id AND s.step_id = v_cid;
        IF v_outcome IS NOT NULL THEN
            o_code := 'TRD05';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid, 'outcome_slot', v_outcome,
                'event_type', v_type);
        ELSIF v_type = 'step_started' AND v_latest IS NOT NULL
            AND (p_event ->> 'attempt')::integer <= v_latest THEN
            -- A stale start: a later delivery already started this attempt or a later one.
            o_code := 'TRD09';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid,
                'attempt', (p_event ->> 'attempt')::integer, 'latest_attempt', v_latest);
        END IF;
    ELSIF v_type = 'wait_completed' THEN
        SELECT e.slot INTO v_outcome FROM treadle_events e
        WHERE e.run_id = p_run_id AND e.correlation_id = v_cid AND e.type = 'wait_completed'
        LIMIT 1;
        IF v_outcome IS NOT NULL THEN
            o_code := 'TRD08';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'wait_id', v_cid, 'completed_slot', v_outcome);
        END IF;
    ELSIF v_type = 'hook_created' THEN
        v_token := p_event ->> 'token';
        LOOP
            -- Waits for a concurrent claim of the token to commit or roll back.
            INSERT INTO treadle_hooks (token, run_id, hook_id, created_at, metadata)
            VALUES (v_token, p_run_id, v_cid, p_at, p_event -> 'metadata')
            ON CONFLICT (token) DO NOTHING;
            EXIT WHEN FOUND;
            SELECT h.run_id INTO v_holder FROM treadle_hooks h WHERE h.token = v_token;
            IF FOUND THEN
                o_stored := jsonb_build_object(
                    'type', 'hook_conflict', 'correlation_id', v_cid, 'token', v_token,
                    'holder_run_id', v_holder, 'position', p_event -> 'position');
                EXIT;
            END IF;
            -- The holder let go between the two statements: claim again.
        END LOOP;
    ELSIF v_type = 'hook_received' THEN
        -- One payload per hook: taking it frees the token (rolled back with a refusal).
        DELETE FROM treadle_hooks h WHERE h.run_id = p_run_id AND h.hook_id = v_cid;
        IF NOT FOUND THEN
            o_code := 'TRD06';
            o_detail := jsonb_build_object('run_id', p_run_id, 'hook_id', v_cid);
        END IF;
    END IF;
END
$$;
