-- treadle Postgres World, migration 0001: the event log, its read views and the append.
--
-- Applied by treadle.worlds.postgres.migrate in one transaction. Times are
-- timestamptz (microseconds); payloads are JSONB, decoded by treadle's models.
-- Every write of a run's log goes through treadle_append (or treadle_create_run
-- for slot 1), each called as one statement: one round trip per write.
--
-- Error codes raised (class TRD, mapped to treadle.errors by sqlerrors.py), with
-- DETAIL a JSON object of the error's attributes:
--   TRD01 InBandSuperseded   TRD02 WorldContractError   TRD03 RunNotFound
--   TRD04 RunExpired         TRD05 StepAlreadyEnded     TRD06 HookNotFound
--   TRD07 EarlierItemRefused (batch items only, returned as rows)

CREATE TYPE treadle_event_type AS ENUM (
    'run_created', 'run_started', 'run_completed', 'run_failed', 'run_cancelled',
    'step_created', 'step_started', 'step_retrying', 'step_completed', 'step_failed',
    'wait_created', 'wait_completed',
    'hook_created', 'hook_received', 'hook_disposed', 'hook_conflict',
    'attr_set', 'wake_requested', 'noop'
);
CREATE TYPE treadle_run_status AS ENUM ('pending', 'running', 'completed', 'failed', 'cancelled');
CREATE TYPE treadle_step_status AS ENUM ('created', 'running', 'retrying', 'completed', 'failed');

CREATE TABLE treadle_runs (
    run_id         text PRIMARY KEY,
    workflow_name  text NOT NULL,
    deployment_id  text NOT NULL,
    spec_version   integer NOT NULL,
    status         treadle_run_status NOT NULL,
    input          jsonb NOT NULL,
    output         jsonb,
    error          jsonb,
    attributes     jsonb NOT NULL,
    seq            bigint NOT NULL,
    seq_in_band    bigint NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    started_at     timestamptz,
    completed_at   timestamptz,
    CONSTRAINT treadle_runs_counters CHECK (0 <= seq_in_band AND seq_in_band <= seq)
);
CREATE INDEX treadle_runs_by_created ON treadle_runs (created_at DESC, run_id DESC);
CREATE INDEX treadle_runs_by_status ON treadle_runs (status, created_at DESC, run_id DESC);
CREATE INDEX treadle_runs_by_workflow ON treadle_runs (workflow_name, created_at DESC, run_id DESC);
CREATE INDEX treadle_runs_by_deployment
    ON treadle_runs (deployment_id, created_at DESC, run_id DESC);

CREATE TABLE treadle_events (
    run_id          text NOT NULL,
    slot            bigint NOT NULL,
    type            treadle_event_type NOT NULL,
    correlation_id  text,
    in_band         boolean NOT NULL,
    created_at      timestamptz NOT NULL,
    idempotency_key text,
    data            jsonb NOT NULL,
    PRIMARY KEY (run_id, slot),
    CONSTRAINT treadle_events_slot CHECK (slot >= 1),
    CONSTRAINT treadle_events_type CHECK (data ->> 'type' = type::text)
);
CREATE UNIQUE INDEX treadle_events_by_idempotency_key ON treadle_events (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Steps of a run, folded from its step events.
CREATE TABLE treadle_steps (
    run_id        text NOT NULL,
    step_id       text NOT NULL,
    step_name     text NOT NULL,
    status        treadle_step_status NOT NULL,
    attempt       integer NOT NULL,
    inline        boolean NOT NULL,
    outcome_slot  bigint,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    started_at    timestamptz,
    completed_at  timestamptz,
    retry_after   timestamptz,
    result        jsonb,
    error         jsonb,
    PRIMARY KEY (run_id, step_id)
);

-- Live hooks only: a row holds its token until hook_disposed or its run ends.
CREATE TABLE treadle_hooks (
    token       text PRIMARY KEY,
    run_id      text NOT NULL,
    hook_id     text NOT NULL,
    created_at  timestamptz NOT NULL,
    metadata    jsonb
);
CREATE INDEX treadle_hooks_by_run ON treadle_hooks (run_id, hook_id);


-- runs.create: the run row and run_created at slot 1, or the run that holds the id.
-- o_first is the stored run_created when the run existed (the caller compares it).
CREATE FUNCTION treadle_create_run(p_run_id text, p_data jsonb)
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
BEGIN
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


-- One event's own checks: run_created refused, a terminal run refuses new work,
-- a step_started after the step's outcome, a hook_received for no live hook.
-- A hook_created claims its token here; a held token turns it into hook_conflict.
-- Returns the refusal (o_code, o_message, o_detail) or the event to store.
CREATE FUNCTION treadle_admit(
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
        'step_started', 'step_retrying', 'wait_created', 'hook_created', 'hook_received'
    ) THEN
        o_code := 'TRD04';
        o_detail := jsonb_build_object('run_id', p_run_id, 'status', p_status, 'event_type', v_type);
    ELSIF v_type = 'step_started' THEN
        SELECT s.outcome_slot INTO v_outcome
        FROM treadle_steps s WHERE s.run_id = p_run_id AND s.step_id = v_cid;
        IF v_outcome IS NOT NULL THEN
            o_code := 'TRD05';
            o_detail := jsonb_build_object(
                'run_id', p_run_id, 'step_id', v_cid, 'outcome_slot', v_outcome);
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
        PERFORM 1 FROM treadle_hooks h WHERE h.run_id = p_run_id AND h.hook_id = v_cid;
        IF NOT FOUND THEN
            o_code := 'TRD06';
            o_detail := jsonb_build_object('run_id', p_run_id, 'hook_id', v_cid);
        END IF;
    END IF;
END
$$;


-- Keep the step and hook views in step with a stored step or hook event. (The
-- run row is folded by treadle_append with the counters, in one UPDATE; a
-- hook_created's row was inserted by treadle_admit.)
CREATE FUNCTION treadle_fold(p_run_id text, p_event jsonb, p_slot bigint, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_type text := p_event ->> 'type';
    v_cid text := p_event ->> 'correlation_id';
BEGIN
    CASE v_type
    WHEN 'step_created' THEN
        INSERT INTO treadle_steps (run_id, step_id, step_name, status, attempt, inline,
            created_at, updated_at)
        VALUES (p_run_id, v_cid, p_event ->> 'step_name', 'created', 0,
            COALESCE((p_event ->> 'inline')::boolean, false), p_at, p_at)
        ON CONFLICT (run_id, step_id) DO NOTHING;
    WHEN 'step_started' THEN
        INSERT INTO treadle_steps AS s (run_id, step_id, step_name, status, attempt, inline,
            created_at, updated_at, started_at)
        VALUES (p_run_id, v_cid, p_event ->> 'step_name', 'running',
            (p_event ->> 'attempt')::integer, COALESCE((p_event ->> 'inline')::boolean, false),
            p_at, p_at, p_at)
        ON CONFLICT (run_id, step_id) DO UPDATE
        SET status = 'running', attempt = GREATEST(s.attempt, EXCLUDED.attempt),
            updated_at = EXCLUDED.updated_at, started_at = EXCLUDED.started_at,
            retry_after = NULL;
    WHEN 'step_retrying' THEN
        UPDATE treadle_steps
        SET status = 'retrying', error = p_event -> 'error',
            retry_after = (p_event ->> 'retry_after')::timestamptz, updated_at = p_at
        WHERE run_id = p_run_id AND step_id = v_cid AND outcome_slot IS NULL;
    WHEN 'step_completed', 'step_failed' THEN
        INSERT INTO treadle_steps AS s (run_id, step_id, step_name, status, attempt, inline,
            outcome_slot, created_at, updated_at, completed_at, result, error)
        VALUES (p_run_id, v_cid, p_event ->> 'step_name',
            CASE WHEN v_type = 'step_completed' THEN 'completed' ELSE 'failed' END
                ::treadle_step_status,
            0, false, p_slot, p_at, p_at, p_at,
            CASE WHEN v_type = 'step_completed' THEN p_event -> 'result' END,
            CASE WHEN v_type = 'step_failed' THEN p_event -> 'error' END)
        ON CONFLICT (run_id, step_id) DO UPDATE
        SET status = EXCLUDED.status, outcome_slot = EXCLUDED.outcome_slot,
            updated_at = EXCLUDED.updated_at, completed_at = EXCLUDED.completed_at,
            result = EXCLUDED.result, error = EXCLUDED.error
        WHERE s.outcome_slot IS NULL;
    WHEN 'hook_disposed' THEN
        DELETE FROM treadle_hooks WHERE run_id = p_run_id AND hook_id = v_cid;
    ELSE
        NULL;
    END CASE;
END
$$;


-- events.create and events.create_batch in one statement: lock the run's row,
-- decide the fence, the contract and each event's checks, allocate, insert, fold,
-- move the counters and NOTIFY 'run_id:slot' per committed event.
--
-- p_events holds the events (one for events.create). A refusal of a single
-- write (p_batch false) raises; a batch item's refusal is a row, and every
-- later item of its correlation id is refused (TRD07).
-- Rows, in order: 'existing' (idempotency key convergence, alone), 'report'
-- (slots event_count+1 .. seq before the write, at most p_report_limit),
-- then per item 'event' (o_data only when the stored event differs from the
-- one sent) or 'refused' (o_code, o_message, o_detail).
CREATE FUNCTION treadle_append(
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
            OR v_type IN ('run_created', 'step_started', 'hook_created', 'hook_received') THEN
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
        PERFORM pg_notify('treadle_events', p_run_id || ':' || v_seq);
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
        IF v_run_event IN ('run_completed', 'run_failed', 'run_cancelled') THEN
            -- A terminal event frees every hook the run still holds.
            DELETE FROM treadle_hooks WHERE run_id = p_run_id;
        END IF;
    END IF;
END
$$;
