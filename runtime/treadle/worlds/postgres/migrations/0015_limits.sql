-- treadle Postgres World, migration 0012: concurrency and rate limits (issue 17 item 4).
--
-- The rules are treadle.world.limitrules'; these functions are the Postgres World's one
-- transaction per call. A key's row in treadle_limit_keys is locked (FOR UPDATE) before
-- its holders are counted, so two workers acquiring one key at once are serialised and
-- never both take its last slot; a release that touches several keys locks them in
-- (scope, key) order (no deadlock against another release or a sweep). The key's row also
-- holds its rate's token bucket (tat_ms). A holder (or waiter) is dead when its run ended
-- or its step has its outcome (treadle_limit_dead): dropped by the next call on its key.

CREATE TABLE treadle_limit_keys (
    scope   text NOT NULL,
    key     text NOT NULL,
    tat_ms  bigint,
    PRIMARY KEY (scope, key)
);

CREATE TABLE treadle_limit_holders (
    scope     text NOT NULL,
    key       text NOT NULL,
    holder    text NOT NULL,
    run_id    text NOT NULL,
    kind      text NOT NULL,
    since_ms  bigint NOT NULL,
    PRIMARY KEY (scope, key, holder)
);
CREATE INDEX treadle_limit_holders_by_run ON treadle_limit_holders (run_id);
CREATE INDEX treadle_limit_holders_by_holder ON treadle_limit_holders (holder);

CREATE SEQUENCE treadle_limit_arrivals;

CREATE TABLE treadle_limit_waiters (
    scope     text NOT NULL,
    key       text NOT NULL,
    holder    text NOT NULL,
    run_id    text NOT NULL,
    kind      text NOT NULL,
    priority  integer NOT NULL,
    arrival   bigint NOT NULL,
    since_ms  bigint NOT NULL,
    max       integer NOT NULL,
    wake      text NOT NULL,
    PRIMARY KEY (scope, key, holder)
);
CREATE INDEX treadle_limit_waiters_by_rank
    ON treadle_limit_waiters (scope, key, priority DESC, arrival);
CREATE INDEX treadle_limit_waiters_by_run ON treadle_limit_waiters (run_id);
CREATE INDEX treadle_limit_waiters_by_holder ON treadle_limit_waiters (holder);

CREATE TABLE treadle_limit_reservations (
    scope   text NOT NULL,
    key     text NOT NULL,
    holder  text NOT NULL,
    run_id  text NOT NULL,
    at_ms   bigint NOT NULL,
    PRIMARY KEY (scope, key, holder)
);
CREATE INDEX treadle_limit_reservations_by_run ON treadle_limit_reservations (run_id);
CREATE INDEX treadle_limit_reservations_by_holder ON treadle_limit_reservations (holder);

CREATE FUNCTION treadle_limit_dead(p_run_id text, p_kind text, p_holder text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM treadle_runs r
        WHERE r.run_id = p_run_id AND r.status IN ('pending', 'running')
    ) OR (p_kind = 'step' AND EXISTS (
        SELECT 1 FROM treadle_steps s
        WHERE s.run_id = p_run_id AND s.step_id = substr(p_holder, length(p_run_id) + 2)
          AND s.status IN ('completed', 'failed')
    ))
$$;

-- Lock a key's row (creating it first); drop its dead holders and waiters.
CREATE FUNCTION treadle_limit_lock(p_scope text, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO treadle_limit_keys (scope, key) VALUES (p_scope, p_key) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM treadle_limit_keys WHERE scope = p_scope AND key = p_key FOR UPDATE;
    DELETE FROM treadle_limit_holders h WHERE h.scope = p_scope AND h.key = p_key
        AND treadle_limit_dead(h.run_id, h.kind, h.holder);
    DELETE FROM treadle_limit_waiters w WHERE w.scope = p_scope AND w.key = p_key
        AND treadle_limit_dead(w.run_id, w.kind, w.holder);
END
$$;

CREATE FUNCTION treadle_limit_acquire(
    p_scope text, p_key text, p_max integer, p_holder text, p_run_id text, p_kind text,
    p_priority integer, p_wake text, p_now_ms bigint
)
RETURNS TABLE (o_held boolean, o_position integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_holders integer;
    v_priority integer;
    v_arrival bigint;
    v_ahead integer;
    v_waiting boolean;
BEGIN
    PERFORM treadle_limit_lock(p_scope, p_key);
    IF EXISTS (SELECT 1 FROM treadle_limit_holders
               WHERE scope = p_scope AND key = p_key AND holder = p_holder) THEN
        RETURN QUERY SELECT true, 0;
        RETURN;
    END IF;
    SELECT count(*) INTO v_holders FROM treadle_limit_holders
        WHERE scope = p_scope AND key = p_key;
    SELECT priority, arrival INTO v_priority, v_arrival FROM treadle_limit_waiters
        WHERE scope = p_scope AND key = p_key AND holder = p_holder;
    v_waiting := FOUND;
    IF NOT v_waiting THEN
        v_priority := p_priority;
        v_arrival := nextval('treadle_limit_arrivals');
    END IF;
    SELECT count(*) INTO v_ahead FROM treadle_limit_waiters
        WHERE scope = p_scope AND key = p_key AND holder <> p_holder
          AND (priority > v_priority OR (priority = v_priority AND arrival < v_arrival));
    IF v_ahead < p_max - v_holders THEN
        DELETE FROM treadle_limit_waiters
            WHERE scope = p_scope AND key = p_key AND holder = p_holder;
        INSERT INTO treadle_limit_holders (scope, key, holder, run_id, kind, since_ms)
            VALUES (p_scope, p_key, p_holder, p_run_id, p_kind, p_now_ms);
        RETURN QUERY SELECT true, 0;
        RETURN;
    END IF;
    IF NOT v_waiting THEN
        INSERT INTO treadle_limit_waiters
            (scope, key, holder, run_id, kind, priority, arrival, since_ms, max, wake)
            VALUES (p_scope, p_key, p_holder, p_run_id, p_kind, v_priority, v_arrival,
                    p_now_ms, p_max, p_wake);
    END IF;
    RETURN QUERY SELECT false, v_ahead + 1;
END
$$;

CREATE FUNCTION treadle_limit_reserve(
    p_scope text, p_key text, p_holder text, p_run_id text, p_interval_ms bigint,
    p_burst integer, p_now_ms bigint
)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_at bigint;
    v_tat bigint;
    v_base bigint;
BEGIN
    INSERT INTO treadle_limit_keys (scope, key) VALUES (p_scope, p_key) ON CONFLICT DO NOTHING;
    SELECT tat_ms INTO v_tat FROM treadle_limit_keys
        WHERE scope = p_scope AND key = p_key FOR UPDATE;
    SELECT at_ms INTO v_at FROM treadle_limit_reservations
        WHERE scope = p_scope AND key = p_key AND holder = p_holder;
    IF FOUND THEN
        RETURN v_at;
    END IF;
    v_base := greatest(coalesce(v_tat, p_now_ms), p_now_ms);
    v_at := greatest(p_now_ms, v_base - (p_burst - 1) * p_interval_ms);
    UPDATE treadle_limit_keys SET tat_ms = v_base + p_interval_ms
        WHERE scope = p_scope AND key = p_key;
    INSERT INTO treadle_limit_reservations (scope, key, holder, run_id, at_ms)
        VALUES (p_scope, p_key, p_holder, p_run_id, v_at);
    RETURN v_at;
END
$$;

-- The waiters of a locked key that may take a slot now (the first max - holders by rank).
CREATE FUNCTION treadle_limit_admissible(p_scope text, p_key text)
RETURNS TABLE (o_run_id text, o_holder text, o_wake text, o_arrival bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_holders integer;
    v_max integer;
BEGIN
    SELECT w.max INTO v_max FROM treadle_limit_waiters w WHERE w.scope = p_scope AND w.key = p_key
        ORDER BY w.priority DESC, w.arrival LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_holders FROM treadle_limit_holders
        WHERE scope = p_scope AND key = p_key;
    RETURN QUERY SELECT w.run_id, w.holder, w.wake, w.arrival FROM treadle_limit_waiters w
        WHERE w.scope = p_scope AND w.key = p_key
        ORDER BY w.priority DESC, w.arrival LIMIT greatest(v_max - v_holders, 0);
END
$$;

-- p_holder NULL: everything run p_run_id holds, waits on or reserved (its steps' too).
CREATE FUNCTION treadle_limit_release(p_run_id text, p_holder text)
RETURNS TABLE (o_run_id text, o_holder text, o_wake text, o_arrival bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_scopes text[] := '{}';
    v_keys text[] := '{}';
    v_key record;
BEGIN
    FOR v_key IN
        SELECT DISTINCT scope, key FROM treadle_limit_holders
        WHERE (p_holder IS NULL AND run_id = p_run_id) OR holder = p_holder
        ORDER BY scope, key
    LOOP
        PERFORM treadle_limit_lock(v_key.scope, v_key.key);
        v_scopes := v_scopes || v_key.scope;
        v_keys := v_keys || v_key.key;
    END LOOP;
    DELETE FROM treadle_limit_holders
        WHERE (p_holder IS NULL AND run_id = p_run_id) OR holder = p_holder;
    DELETE FROM treadle_limit_waiters
        WHERE (p_holder IS NULL AND run_id = p_run_id) OR holder = p_holder;
    DELETE FROM treadle_limit_reservations
        WHERE (p_holder IS NULL AND run_id = p_run_id) OR holder = p_holder;
    FOR i IN 1 .. coalesce(array_length(v_scopes, 1), 0) LOOP
        RETURN QUERY SELECT * FROM treadle_limit_admissible(v_scopes[i], v_keys[i]);
    END LOOP;
END
$$;

CREATE FUNCTION treadle_limit_sweep(p_limit integer)
RETURNS TABLE (o_run_id text, o_holder text, o_wake text, o_arrival bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_key record;
    v_count integer := 0;
    v_found integer;
BEGIN
    DELETE FROM treadle_limit_holders h WHERE treadle_limit_dead(h.run_id, h.kind, h.holder);
    FOR v_key IN
        SELECT DISTINCT scope, key FROM treadle_limit_waiters ORDER BY scope, key
    LOOP
        PERFORM treadle_limit_lock(v_key.scope, v_key.key);
        RETURN QUERY SELECT * FROM treadle_limit_admissible(v_key.scope, v_key.key);
        GET DIAGNOSTICS v_found = ROW_COUNT;
        v_count := v_count + v_found;
        EXIT WHEN v_count >= p_limit;
    END LOOP;
END
$$;
