-- treadle Postgres World, migration 0012: hook force-claim and token retention
-- (issue 17 item 8; seed 003 "Force-claim", "Terminal hook disposal"). The rules are
-- storagerules' (claim_decision, holder_expired), as the local and memory Worlds apply
-- them; nothing of 0001..0011's functions is replaced.
--
-- Token retention: treadle_hooks.retained_until holds a hook_created's
-- token_retention_until (set by a trigger on the event's insert). Once the hook's run
-- has ended its row is kept until then (a BEFORE DELETE trigger keeps the terminal
-- event's sweep and any hook_received from taking it: a resume is HookNotFound, TRD06,
-- and another run's hook_created is a hook_conflict naming the ended run). A row whose
-- run ended and whose retention passed is dropped by the next insert of its token.
--
-- Force-claim: treadle_append_claim(same arguments as treadle_append) writes a
-- hook_created with "force": after locking the creator's run (the order every append
-- takes), it locks the token's row; another run's live or retained hook is taken:
-- hook_disposed {force_claimed_by} is appended to the holder's log (out-of-band,
-- through treadle_append, so it is folded and notified), and the creation is appended
-- with claimed_from, returned in o_data. All in the one statement's transaction: a
-- refusal of the creation (the fence, a second creation) rolls the disposal back.

ALTER TABLE treadle_hooks ADD COLUMN retained_until timestamptz;

CREATE FUNCTION treadle_hooks_keep_retained() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.retained_until > now() AND EXISTS (
        SELECT 1 FROM treadle_runs r WHERE r.run_id = OLD.run_id
            AND r.status IN ('completed', 'failed', 'cancelled')) THEN
        RETURN NULL;  -- the run ended: its retained token stays reserved
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER treadle_hooks_keep_retained BEFORE DELETE ON treadle_hooks
    FOR EACH ROW WHEN (OLD.retained_until IS NOT NULL)
    EXECUTE FUNCTION treadle_hooks_keep_retained();

CREATE FUNCTION treadle_hooks_free_expired() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM treadle_hooks h USING treadle_runs r
    WHERE h.token = NEW.token AND r.run_id = h.run_id
        AND r.status IN ('completed', 'failed', 'cancelled')
        AND (h.retained_until IS NULL OR h.retained_until <= now());
    RETURN NEW;
END
$$;

CREATE TRIGGER treadle_hooks_free_expired BEFORE INSERT ON treadle_hooks
    FOR EACH ROW EXECUTE FUNCTION treadle_hooks_free_expired();

CREATE FUNCTION treadle_hooks_retention() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE treadle_hooks SET retained_until = (NEW.data ->> 'token_retention_until')::timestamptz
    WHERE run_id = NEW.run_id AND hook_id = NEW.correlation_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER treadle_hooks_retention AFTER INSERT ON treadle_events
    FOR EACH ROW WHEN (NEW.type = 'hook_created'
        AND NEW.data ->> 'token_retention_until' IS NOT NULL)
    EXECUTE FUNCTION treadle_hooks_retention();

CREATE FUNCTION treadle_append_claim(
    p_run_id text, p_events jsonb[], p_in_band boolean, p_expected bigint, p_event_count bigint,
    p_occurred_at timestamptz, p_idempotency_key text, p_batch boolean, p_report_limit integer
)
RETURNS TABLE (
    o_kind text, o_item integer, o_slot bigint, o_created_at timestamptz, o_in_band boolean,
    o_data jsonb, o_code text, o_message text, o_detail jsonb
)
LANGUAGE plpgsql AS $$
DECLARE
    v_event jsonb := p_events[1];
    v_token text := p_events[1] ->> 'token';
    v_status treadle_run_status;
    v_holder text;
    v_hook text;
    v_claimed boolean := false;
BEGIN
    SELECT r.status INTO v_status FROM treadle_runs r WHERE r.run_id = p_run_id FOR UPDATE;
    IF FOUND AND v_status NOT IN ('completed', 'failed', 'cancelled') AND NOT EXISTS (
        SELECT 1 FROM treadle_events e WHERE e.run_id = p_run_id
            AND e.correlation_id = v_event ->> 'correlation_id'
            AND e.type IN ('hook_created', 'hook_conflict')) THEN
        SELECT h.run_id, h.hook_id INTO v_holder, v_hook
        FROM treadle_hooks h JOIN treadle_runs r ON r.run_id = h.run_id
        WHERE h.token = v_token AND h.run_id <> p_run_id
            AND (r.status NOT IN ('completed', 'failed', 'cancelled') OR h.retained_until > now())
        FOR UPDATE OF h;
        IF FOUND THEN
            UPDATE treadle_hooks SET retained_until = NULL WHERE token = v_token;
            PERFORM * FROM treadle_append(v_holder, ARRAY[jsonb_build_object(
                'type', 'hook_disposed', 'correlation_id', v_hook,
                'force_claimed_by', p_run_id)], false, NULL, NULL, NULL, NULL, false, 0);
            v_event := v_event || jsonb_build_object('claimed_from', v_holder);
            v_claimed := true;
        END IF;
    END IF;
    RETURN QUERY SELECT a.o_kind, a.o_item, a.o_slot, a.o_created_at, a.o_in_band,
        CASE WHEN a.o_kind = 'event' AND v_claimed THEN v_event ELSE a.o_data END,
        a.o_code, a.o_message, a.o_detail
    FROM treadle_append(p_run_id, ARRAY[v_event], p_in_band, p_expected, p_event_count,
        p_occurred_at, p_idempotency_key, p_batch, p_report_limit) a;
END
$$;
