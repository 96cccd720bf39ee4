-- treadle Postgres World, migration 0005: a terminal run refuses a wake_requested.
--
-- A wake_up() after the run ended asked the orchestrator for nothing it could do,
-- and its event landed after the terminal event (logcheck: only outcomes, waits'
-- completions, hook disposals and attributes may follow it). wake_requested joins
-- events.REFUSED_ON_TERMINAL_RUN: RunExpired (TRD04), nothing allocated, as the
-- local and memory Worlds do from that frozenset. treadle_append already sends every
-- event of a terminal run through treadle_admit, so only treadle_admit is replaced;
-- it is 0004's but for the one name in the terminal list.

-- One event's own checks: run_created refused, a terminal run refuses new work,
-- a step_started or outcome after the step's outcome, a second wait completion,
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
        SELECT s.outcome_slot INTO v_outcome
        FROM treadle_steps s WHERE s.run_id = p_run_id AND s.step_id = v_cid;
        IF v_outcome IS NOT NULL THEN
            o_code := 'TRD05';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid, 'outcome_slot', v_outcome,
                'event_type', v_type);
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
