-- treadle Postgres World, migration 0019: a step outcome only from the step's latest
-- started attempt (issue 17 item 5's leftover; docs/timeouts.md, docs/plans/s9-ar.md).
--
-- A background step's attempt that outlived its timeout, heartbeat or lease re-read the
-- step's events before writing its outcome, but a process stalling between that read
-- and its write could still land the outcome after a redelivery had started the next
-- attempt (and win, being the first outcome). Outcomes now name their attempt
-- (step_completed carries "attempt" too; one without it, written by an earlier
-- release, is not checked), and treadle_admit refuses a step_completed, step_failed or
-- step_retrying whose attempt is not the step's latest started one
-- (treadle_steps.attempt, kept as the GREATEST by the fold; 0 or no row: no attempt
-- started, anything accepted): TRD20 StaleStepOutcome, nothing allocated, as
-- storagerules.check_outcome_attempt decides for the local and memory Worlds. Decided
-- after the terminal-run check and the step's one-outcome check (TRD05; a
-- step_retrying is still not refused by an outcome) and the stale-start one.
--
-- treadle_admit is 0010's but for that check; treadle_append and
-- treadle_append_group are 0011's but for sending step_retrying through treadle_admit
-- (before, only a terminal run's step_retrying was). treadle_append_claim (0018) calls
-- treadle_append and is unchanged.
--
-- Error codes added (class TRD, mapped by sqlerrors.py): TRD20 StaleStepOutcome
-- (numbered after this migration, so another branch's codes do not clash).


-- One event's own checks (0010's, with an outcome of a superseded attempt refused).
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
    v_spec integer;
    v_kinds text[];
    v_first bigint;
BEGIN
    o_stored := p_event;
    IF v_type = 'wake_requested' THEN
        -- The run's row is locked by treadle_append already.
        SELECT r.spec_version INTO v_spec FROM treadle_runs r WHERE r.run_id = p_run_id;
        IF v_spec < 9 THEN
            o_code := 'TRD12';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'spec_version', v_spec, 'event_type', v_type);
            RETURN;
        END IF;
    END IF;
    -- storagerules.created_by: the earlier events that make this one a second creation.
    v_kinds := CASE
        WHEN v_type = 'run_started' THEN ARRAY['run_started']
        WHEN v_type = 'step_created' THEN ARRAY['step_created', 'step_started']
        WHEN v_type = 'wait_created' THEN ARRAY['wait_created']
        WHEN v_type = 'hook_created' THEN ARRAY['hook_created', 'hook_conflict']
        WHEN v_type = 'step_started' AND (p_event ->> 'inline')::boolean
            AND (p_event ->> 'attempt')::integer = 1 THEN ARRAY['step_created']
        END;
    IF v_kinds IS NOT NULL AND p_status NOT IN ('completed', 'failed', 'cancelled') THEN
        IF v_cid IS NULL THEN
            SELECT min(e.slot) INTO v_first FROM treadle_events e
            WHERE e.run_id = p_run_id AND e.correlation_id IS NULL
                AND e.type IN ('run_started', 'step_created', 'step_started', 'wait_created',
                    'hook_created', 'hook_conflict')
                AND e.type = ANY (v_kinds::treadle_event_type[]);
        ELSE
            SELECT min(e.slot) INTO v_first FROM treadle_events e
            WHERE e.run_id = p_run_id AND e.correlation_id = v_cid
                AND e.type IN ('run_started', 'step_created', 'step_started', 'wait_created',
                    'hook_created', 'hook_conflict')
                AND e.type = ANY (v_kinds::treadle_event_type[]);
        END IF;
    END IF;
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
    ELSIF v_first IS NOT NULL AND v_type <> 'step_started' THEN
        -- A second creation (checked before a hook's token claim: no hook_conflict).
        o_code := 'TRD11';
        o_detail := jsonb_build_object(
            'run_id', p_run_id, 'correlation_id', v_cid, 'event_type', v_type, 'slot', v_first);
    ELSIF v_type IN ('step_started', 'step_completed', 'step_failed', 'step_retrying') THEN
        SELECT s.outcome_slot, s.attempt INTO v_outcome, v_latest
        FROM treadle_steps s WHERE s.run_id = p_run_id AND s.step_id = v_cid;
        IF v_outcome IS NOT NULL AND v_type <> 'step_retrying' THEN
            o_code := 'TRD05';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid, 'outcome_slot', v_outcome,
                'event_type', v_type);
        ELSIF v_first IS NOT NULL THEN
            -- An inline creating start for a step a step_created created.
            o_code := 'TRD11';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'correlation_id', v_cid, 'event_type', v_type,
                'slot', v_first);
        ELSIF v_type = 'step_started' AND v_latest IS NOT NULL
            AND (p_event ->> 'attempt')::integer <= v_latest THEN
            -- A stale start: a later delivery already started this attempt or a later one.
            o_code := 'TRD09';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid,
                'attempt', (p_event ->> 'attempt')::integer, 'latest_attempt', v_latest);
        ELSIF v_type <> 'step_started' AND (p_event ->> 'attempt') IS NOT NULL
            AND COALESCE(v_latest, 0) > 0 AND (p_event ->> 'attempt')::integer <> v_latest THEN
            -- storagerules.check_outcome_attempt: an outcome of a superseded attempt.
            o_code := 'TRD20';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid, 'event_type', v_type,
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


-- events.create and events.create_batch (0011's, step_retrying admitted).
CREATE OR REPLACE FUNCTION treadle_append(
    p_run_id text, p_events jsonb[], p_in_band boolean, p_expected bigint, p_event_count bigint,
    p_occurred_at timestamptz, p_idempotency_key text, p_batch boolean, p_report_limit integer
)
RETURNS TABLE (
    o_kind text, o_item integer, o_slot bigint, o_created_at timestamptz, o_in_band boolean,
    o_data jsonb, o_code text, o_message text, o_detail jsonb
)
LANGUAGE plpgsql AS $$
DECLARE
    v_status treadle_run_status;
    v_seq bigint;
    v_seq_in_band bigint;
    v_start bigint;
    v_at timestamptz;
    v_event jsonb;
    v_type text;
    v_index integer := -1;
    v_cid text;
    v_refused text[] := ARRAY[]::text[];
    v_admit record;
    v_stored jsonb;
    v_run_event text;  -- the run-level event to fold into the run's row, if any
    v_run_data jsonb;
BEGIN
    -- The fence first: nothing is decided before the run's row is locked.
    SELECT r.status, r.seq, r.seq_in_band INTO v_status, v_seq, v_seq_in_band
    FROM treadle_runs r WHERE r.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TRD03', MESSAGE = format('run %s not found', p_run_id),
            DETAIL = jsonb_build_object('run_id', p_run_id)::text;
    END IF;
    IF p_in_band THEN
        IF p_expected IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'TRD02', MESSAGE = format(
                'run %s: an in-band write needs expected_seq_in_band '
                '(the count from the log load''s snapshot)', p_run_id),
                DETAIL = jsonb_build_object('run_id', p_run_id)::text;
        END IF;
        IF p_expected <> v_seq_in_band THEN
            RAISE EXCEPTION USING ERRCODE = 'TRD01', MESSAGE = format(
                'run %s: in-band write superseded', p_run_id),
                DETAIL = jsonb_build_object('run_id', p_run_id,
                    'expected_seq_in_band', p_expected, 'seq_in_band', v_seq_in_band)::text;
        END IF;
        IF p_event_count IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'TRD02', MESSAGE = format(
                'run %s: an in-band write needs event_count '
                '(the slot its decision was made against)', p_run_id),
                DETAIL = jsonb_build_object('run_id', p_run_id)::text;
        END IF;
        IF p_event_count < 0 OR p_event_count > v_seq THEN
            RAISE EXCEPTION USING ERRCODE = 'TRD02', MESSAGE = format(
                'run %s: event_count %s is outside the log (slots 1..%s exist)',
                p_run_id, p_event_count, v_seq),
                DETAIL = jsonb_build_object('run_id', p_run_id, 'slot', p_event_count)::text;
        END IF;
    END IF;
    v_at := CASE WHEN p_in_band AND p_occurred_at IS NOT NULL
        THEN p_occurred_at ELSE clock_timestamp() END;
    v_start := v_seq;

    IF p_idempotency_key IS NOT NULL THEN
        RETURN QUERY SELECT 'existing'::text, 0, e.slot, e.created_at, e.in_band, e.data,
            NULL::text, NULL::text, NULL::jsonb
        FROM treadle_events e
        WHERE e.run_id = p_run_id AND e.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;

    IF p_in_band AND p_event_count < v_seq THEN
        RETURN QUERY SELECT 'report'::text, NULL::integer, e.slot, e.created_at, e.in_band,
            e.data, NULL::text, NULL::text, NULL::jsonb
        FROM treadle_events e
        WHERE e.run_id = p_run_id AND e.slot > p_event_count AND e.slot <= v_seq
        ORDER BY e.slot LIMIT p_report_limit;
    END IF;

    FOREACH v_event IN ARRAY p_events LOOP
        v_index := v_index + 1;
        v_type := v_event ->> 'type';
        v_cid := COALESCE(v_event ->> 'correlation_id', '');
        o_kind := 'refused';
        o_item := v_index;
        o_slot := NULL;
        o_created_at := NULL;
        o_in_band := NULL;
        o_data := NULL;
        IF v_cid = ANY (v_refused) THEN
            o_code := 'TRD07';
            o_message := NULL;
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'correlation_id', v_cid, 'index', v_index);
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_stored := v_event;
        -- Only these events have checks of their own (or a token to claim).
        IF v_status IN ('completed', 'failed', 'cancelled')
            OR v_type IN ('run_created', 'run_started', 'step_created', 'step_started',
                'step_completed', 'step_failed', 'step_retrying', 'wait_created',
                'wait_completed', 'hook_created', 'hook_received', 'wake_requested') THEN
            SELECT * INTO v_admit FROM treadle_admit(p_run_id, v_status, v_event, v_at);
            IF v_admit.o_code IS NOT NULL THEN
                IF NOT p_batch THEN
                    RAISE EXCEPTION USING ERRCODE = v_admit.o_code,
                        MESSAGE = COALESCE(v_admit.o_message, 'refused'),
                        DETAIL = v_admit.o_detail::text;
                END IF;
                v_refused := v_refused || v_cid;
                o_code := v_admit.o_code;
                o_message := v_admit.o_message;
                o_detail := v_admit.o_detail;
                RETURN NEXT;
                CONTINUE;
            END IF;
            v_stored := v_admit.o_stored;
        END IF;
        v_seq := v_seq + 1;
        IF p_in_band THEN
            v_seq_in_band := v_seq_in_band + 1;
        END IF;
        INSERT INTO treadle_events (run_id, slot, type, correlation_id, in_band, created_at,
            idempotency_key, data)
        VALUES (p_run_id, v_seq, (v_stored ->> 'type')::treadle_event_type,
            v_stored ->> 'correlation_id', p_in_band, v_at, p_idempotency_key, v_stored);
        IF v_type IN ('run_started', 'run_completed', 'run_failed', 'run_cancelled', 'attr_set')
        THEN
            -- Never in a batch: one run-level event per call at most.
            v_run_event := v_type;
            v_run_data := v_stored;
        ELSIF v_type LIKE 'step\_%' OR v_type = 'hook_disposed' THEN
            PERFORM treadle_fold(p_run_id, v_stored, v_seq, v_at);
        END IF;
        o_kind := 'event';
        o_slot := v_seq;
        o_created_at := v_at;
        o_in_band := p_in_band;
        -- The caller holds the event it sent; only a replaced one comes back.
        o_data := CASE WHEN v_stored ->> 'type' <> v_type THEN v_stored END;
        o_code := NULL;
        o_message := NULL;
        o_detail := NULL;
        RETURN NEXT;
    END LOOP;

    IF v_seq <> v_start THEN
        -- The counters and the run-level event's fold, in one update of the run's row.
        UPDATE treadle_runs SET
            seq = v_seq,
            seq_in_band = v_seq_in_band,
            updated_at = v_at,
            status = CASE v_run_event
                WHEN 'run_started' THEN
                    CASE WHEN status = 'pending' THEN 'running'::treadle_run_status ELSE status END
                WHEN 'run_completed' THEN 'completed'::treadle_run_status
                WHEN 'run_failed' THEN 'failed'::treadle_run_status
                WHEN 'run_cancelled' THEN 'cancelled'::treadle_run_status
                ELSE status END,
            started_at = CASE WHEN v_run_event = 'run_started'
                THEN COALESCE(started_at, v_at) ELSE started_at END,
            completed_at = CASE WHEN v_run_event IN ('run_completed', 'run_failed', 'run_cancelled')
                THEN v_at ELSE completed_at END,
            output = CASE WHEN v_run_event = 'run_completed' THEN v_run_data -> 'output'
                WHEN v_run_event IN ('run_failed', 'run_cancelled') THEN NULL ELSE output END,
            error = CASE WHEN v_run_event = 'run_failed' THEN v_run_data -> 'error'
                WHEN v_run_event IN ('run_completed', 'run_cancelled') THEN NULL ELSE error END,
            attributes = CASE WHEN v_run_event = 'attr_set' THEN attributes
                || jsonb_build_object(v_run_data ->> 'key', v_run_data -> 'value')
                ELSE attributes END
        WHERE run_id = p_run_id;
        -- One notification per transaction, naming its last slot (listeners read the
        -- slots up to it they have not seen).
        PERFORM pg_notify('treadle_events', p_run_id || ':' || v_seq);
        IF v_run_event IN ('run_completed', 'run_failed', 'run_cancelled') THEN
            -- A terminal event frees every hook the run still holds.
            DELETE FROM treadle_hooks WHERE run_id = p_run_id;
        END IF;
    END IF;
END
$$;


-- Out-of-band events.create calls of one run (0011's, step_retrying admitted).
CREATE OR REPLACE FUNCTION treadle_append_group(p_run_id text, p_events jsonb[])
RETURNS TABLE (
    o_kind text, o_item integer, o_slot bigint, o_created_at timestamptz, o_data jsonb,
    o_code text, o_message text, o_detail jsonb
)
LANGUAGE plpgsql AS $$
DECLARE
    v_status treadle_run_status;
    v_seq bigint;
    v_start bigint;
    v_at timestamptz := clock_timestamp();
    v_event jsonb;
    v_type text;
    v_index integer := -1;
    v_admit record;
    v_stored jsonb;
BEGIN
    SELECT r.status, r.seq INTO v_status, v_seq
    FROM treadle_runs r WHERE r.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TRD03', MESSAGE = format('run %s not found', p_run_id),
            DETAIL = jsonb_build_object('run_id', p_run_id)::text;
    END IF;
    v_start := v_seq;
    FOREACH v_event IN ARRAY p_events LOOP
        v_index := v_index + 1;
        v_type := v_event ->> 'type';
        IF v_type IN ('run_created', 'run_started', 'run_completed', 'run_failed',
            'run_cancelled', 'attr_set', 'run_repinned') THEN
            RAISE EXCEPTION USING ERRCODE = 'TRD02', MESSAGE = format(
                'run %s: a grouped append takes no %s (it goes alone)', p_run_id, v_type),
                DETAIL = jsonb_build_object('run_id', p_run_id)::text;
        END IF;
        o_item := v_index;
        o_slot := NULL;
        o_created_at := NULL;
        o_data := NULL;
        o_code := NULL;
        o_message := NULL;
        o_detail := NULL;
        v_stored := v_event;
        -- The same events as treadle_append's have checks of their own.
        IF v_status IN ('completed', 'failed', 'cancelled')
            OR v_type IN ('step_created', 'step_started', 'step_completed', 'step_failed',
                'step_retrying', 'wait_created', 'wait_completed', 'hook_created',
                'hook_received', 'wake_requested') THEN
            SELECT * INTO v_admit FROM treadle_admit(p_run_id, v_status, v_event, v_at);
            IF v_admit.o_code IS NOT NULL THEN
                o_kind := 'refused';
                o_code := v_admit.o_code;
                o_message := COALESCE(v_admit.o_message, 'refused');
                o_detail := v_admit.o_detail;
                RETURN NEXT;
                CONTINUE;
            END IF;
            v_stored := v_admit.o_stored;
        END IF;
        v_seq := v_seq + 1;
        INSERT INTO treadle_events (run_id, slot, type, correlation_id, in_band, created_at,
            idempotency_key, data)
        VALUES (p_run_id, v_seq, (v_stored ->> 'type')::treadle_event_type,
            v_stored ->> 'correlation_id', false, v_at, NULL, v_stored);
        IF v_type LIKE 'step\_%' OR v_type = 'hook_disposed' THEN
            PERFORM treadle_fold(p_run_id, v_stored, v_seq, v_at);
        END IF;
        o_kind := 'event';
        o_slot := v_seq;
        o_created_at := v_at;
        -- The caller holds the event it sent; only a replaced one comes back.
        o_data := CASE WHEN v_stored ->> 'type' <> v_type THEN v_stored END;
        RETURN NEXT;
    END LOOP;
    IF v_seq <> v_start THEN
        UPDATE treadle_runs SET seq = v_seq, updated_at = v_at WHERE run_id = p_run_id;
        PERFORM pg_notify('treadle_events', p_run_id || ':' || v_seq);
    END IF;
END
$$;
