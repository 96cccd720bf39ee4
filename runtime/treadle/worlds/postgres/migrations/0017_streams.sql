-- treadle Postgres World, migration 0012: streams (issue 17 item 6, docs/streams.md).
--
-- treadle_streams holds one row per stream (its chunk count, whether a writer closed
-- it); treadle_stream_chunks its chunks by index, each with the step attempt that
-- wrote it and its place (seq) among that attempt's chunks.
--
-- treadle_stream_append makes the decisions of treadle.world.streamrules.decide in
-- the same order, in one transaction, under a per-stream advisory lock (appends to
-- one stream are serialized; nothing else is): it reads the run row and the step row
-- FOR SHARE (a step_started or the run's end folding them waits for the append, and
-- the append sees them committed), the stream's row and the attempt's stored chunks.
-- It answers 'append' (stored, the stream's row moved), 'replayed' (an append of
-- chunks the attempt stored already, or a close of a closed stream: nothing stored),
-- 'refused' (with the state read, which Python hands to streamrules.decide for the
-- error) or 'no_run'. An append NOTIFYs 'treadle_streams' with 'run_id name' (a name
-- holds no space).

CREATE TABLE treadle_streams (
    run_id  text NOT NULL,
    name    text NOT NULL,
    count   bigint NOT NULL,
    closed  boolean NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE treadle_stream_chunks (
    run_id      text NOT NULL,
    name        text NOT NULL,
    idx         bigint NOT NULL,
    step_id     text NOT NULL,
    attempt     integer NOT NULL,
    seq         integer NOT NULL,
    data        jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, name, idx)
);
CREATE UNIQUE INDEX treadle_stream_chunks_by_attempt
    ON treadle_stream_chunks (run_id, name, step_id, attempt, seq);

CREATE FUNCTION treadle_stream_append(
    p_run_id text, p_name text, p_step_id text, p_attempt integer, p_first_seq integer,
    p_chunks jsonb, p_close boolean
)
RETURNS TABLE (
    o_code text, o_first_index bigint, o_count integer, o_closed boolean,
    o_run_ended boolean, o_step_attempt integer, o_stored integer
)
LANGUAGE plpgsql AS $$
DECLARE
    v_status treadle_run_status;
    v_step_attempt integer;
    v_count bigint := 0;
    v_closed boolean := false;
    v_stored integer;
    v_n integer := jsonb_array_length(p_chunks);
    v_ended boolean;
    v_at timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('treadle_stream ' || p_run_id || ' ' || p_name, 0));
    SELECT r.status INTO v_status FROM treadle_runs r WHERE r.run_id = p_run_id FOR SHARE;
    IF NOT FOUND THEN
        o_code := 'no_run';
        RETURN NEXT;
        RETURN;
    END IF;
    v_ended := v_status IN ('completed', 'failed', 'cancelled');
    SELECT s.attempt INTO v_step_attempt FROM treadle_steps s
    WHERE s.run_id = p_run_id AND s.step_id = p_step_id FOR SHARE;
    SELECT st.count, st.closed INTO v_count, v_closed FROM treadle_streams st
    WHERE st.run_id = p_run_id AND st.name = p_name;
    v_count := COALESCE(v_count, 0);
    v_closed := COALESCE(v_closed, false);
    SELECT COALESCE(MAX(c.seq) + 1, 0) INTO v_stored FROM treadle_stream_chunks c
    WHERE c.run_id = p_run_id AND c.name = p_name AND c.step_id = p_step_id
        AND c.attempt = p_attempt;
    o_closed := v_closed;
    o_run_ended := v_ended;
    o_step_attempt := v_step_attempt;
    o_stored := v_stored;
    IF (v_n > 0 AND p_first_seq + v_n <= v_stored) OR (v_n = 0 AND p_close AND v_closed) THEN
        o_code := 'replayed';
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_ended OR v_step_attempt IS NULL OR v_step_attempt <> p_attempt OR v_closed
        OR p_first_seq <> v_stored THEN
        o_code := 'refused';
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO treadle_stream_chunks (run_id, name, idx, step_id, attempt, seq, data, created_at)
    SELECT p_run_id, p_name, v_count + t.ord - 1, p_step_id, p_attempt, p_first_seq + t.ord - 1,
        t.value, v_at
    FROM jsonb_array_elements(p_chunks) WITH ORDINALITY AS t(value, ord);
    INSERT INTO treadle_streams AS st (run_id, name, count, closed)
    VALUES (p_run_id, p_name, v_count + v_n, p_close)
    ON CONFLICT (run_id, name) DO UPDATE SET count = v_count + v_n, closed = st.closed OR p_close;
    PERFORM pg_notify('treadle_streams', p_run_id || ' ' || p_name);
    o_code := 'append';
    o_first_index := v_count;
    o_count := v_n;
    o_closed := v_closed OR p_close;
    RETURN NEXT;
END;
$$;
