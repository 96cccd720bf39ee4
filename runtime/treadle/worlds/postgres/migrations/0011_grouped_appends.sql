-- treadle Postgres World, migration 0011: fewer round trips and notifications per
-- append (issue 15 item 4).
--
-- NOTIFY once per transaction: treadle_append (0010's otherwise) no longer NOTIFYs
-- 'treadle_events' with 'run_id:slot' for each event it commits, only once at the end
-- with the transaction's last slot. A listener that sees 'run_id:N' reads the run's
-- slots up to N it has not seen (feed.py); contract.Changes allows the coalesced
-- report. treadle_create_run and treadle_repin commit one event and NOTIFY once already.
--
-- treadle_append_group: several out-of-band events.create calls of one run in one
-- statement and one transaction (the Postgres World's write combiner, combiner.py,
-- sends the writes that queued while an append of that run was in flight: a fan-out's
-- step starts and outcomes). Each item is what an events.create of its own, out of
-- band and without an idempotency key, would be: admitted by treadle_admit against
-- the log as the earlier items left it, refused alone (a row with the code and detail
-- the single call would raise; no EarlierItemRefused cascade, unlike a batch), or
-- inserted and folded (treadle_fold) at the next slot. It takes no run-level event
-- (run_started, the run's outcome, attr_set: each folds the run's row and goes alone),
-- refused whole with TRD02. One notification, one update of the run's counters.


-- events.create and events.create_batch (0010's, notifying once).
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
                'step_completed', 'step_failed', 'wait_created', 'wait_completed',
                'hook_created', 'hook_received', 'wake_requested') THEN
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


-- Out-of-band events.create calls of one run, each admitted or refused on its own.
CREATE FUNCTION treadle_append_group(p_run_id text, p_events jsonb[])
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
                'wait_created', 'wait_completed', 'hook_created', 'hook_received',
                'wake_requested') THEN
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
