-- treadle local World, schema version 2.
-- Times are integer microseconds since the epoch (UTC).

CREATE TABLE treadle_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE runs (
    run_id         TEXT PRIMARY KEY,
    workflow_name  TEXT NOT NULL,
    deployment_id  TEXT NOT NULL,
    spec_version   INTEGER NOT NULL,
    status         TEXT NOT NULL,
    input          TEXT NOT NULL,
    output         TEXT,
    error          TEXT,
    attributes     TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    seq_in_band    INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    started_at     INTEGER,
    completed_at   INTEGER,
    -- child workflows (docs/children.md): the parent run and its child_created id
    parent_run_id  TEXT,
    parent_correlation_id TEXT
);
CREATE INDEX runs_by_created ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_by_status ON runs (status, created_at DESC);
CREATE INDEX runs_by_workflow ON runs (workflow_name, created_at DESC);
CREATE INDEX runs_by_deployment ON runs (deployment_id, created_at DESC);

CREATE TABLE events (
    run_id          TEXT NOT NULL,
    slot            INTEGER NOT NULL,
    type            TEXT NOT NULL,
    correlation_id  TEXT,
    in_band         INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    idempotency_key TEXT,
    data            TEXT NOT NULL,
    PRIMARY KEY (run_id, slot)
) WITHOUT ROWID;
CREATE INDEX events_by_entity ON events (run_id, correlation_id, type);
CREATE UNIQUE INDEX events_by_idempotency_key ON events (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE steps (
    run_id        TEXT NOT NULL,
    step_id       TEXT NOT NULL,
    step_name     TEXT NOT NULL,
    status        TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    inline        INTEGER NOT NULL,
    outcome_slot  INTEGER,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    started_at    INTEGER,
    completed_at  INTEGER,
    retry_after   INTEGER,
    result        TEXT,
    error         TEXT,
    PRIMARY KEY (run_id, step_id)
) WITHOUT ROWID;

-- Live hooks only: a row holds its token until hook_disposed, its payload (hook_received) or its run ends
-- (or, for a retained token, until retain_until once its run has ended).
CREATE TABLE hooks (
    token       TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    hook_id     TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    metadata    TEXT
);
CREATE INDEX hooks_by_run ON hooks (run_id, hook_id);

-- Hook token retention (issue 17 item 8): a live hook's token_retention_until (us); its
-- hooks row outlives its run's end until then. Kept beside hooks, by token.
CREATE TABLE hook_retention (
    token        TEXT PRIMARY KEY,
    retain_until INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE queue_messages (
    message_id      TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    gate_run_id     TEXT,
    idempotency_key TEXT,
    payload         TEXT NOT NULL,
    state           TEXT NOT NULL,          -- ready | leased
    available_at    INTEGER NOT NULL,
    line            INTEGER NOT NULL,       -- order among due messages; a handoff goes first
    delivery_count  INTEGER NOT NULL DEFAULT 0,
    handoffs        INTEGER NOT NULL DEFAULT 0,
    coalesced       INTEGER NOT NULL DEFAULT 0,
    lease_token     TEXT,
    lease_until     INTEGER,
    first_sent_at   INTEGER NOT NULL
);
CREATE INDEX queue_due ON queue_messages (state, available_at);
CREATE INDEX queue_by_gate ON queue_messages (gate_run_id, state);
CREATE INDEX queue_by_line ON queue_messages (line);

-- Keyed sends: a key is held for the dedupe window after its first send.
CREATE TABLE queue_keys (
    idempotency_key TEXT PRIMARY KEY,
    message_id      TEXT NOT NULL,
    sent_at         INTEGER NOT NULL
);

-- Messages past the safety limit of deliveries, kept for an operator to inspect.
CREATE TABLE queue_dead_letters (
    message_id      TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    payload         TEXT NOT NULL,
    delivery_count  INTEGER NOT NULL,
    last_error      TEXT,
    dead_at         INTEGER NOT NULL
);

-- Deployment revisions that serve runs (schema version 2; catalogue since 3;
-- promoted since 4: the order of Deployments.promote, NULL when never promoted).
CREATE TABLE deployments (
    deployment_id  TEXT PRIMARY KEY,
    created_at     INTEGER NOT NULL,
    registered     INTEGER NOT NULL,
    retired        INTEGER NOT NULL DEFAULT 0,
    catalogue      TEXT,
    promoted       INTEGER
);

-- Run attributes a filter can match (schema version 5; issue 17 item 2): one row per
-- run and key whose value is a scalar of at most 1,024 bytes as JSON, in the canonical
-- form of treadle.world.attributes.canonical. runs.list(attributes=...) finds its runs
-- here; runs.attributes keeps every value.
CREATE TABLE run_attributes (
    run_id      TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
CREATE INDEX run_attributes_by_value ON run_attributes (key, value, run_id);
-- Schedules (schema version 5, issue 17 item 3: treadle.schedules; times in microseconds).
CREATE TABLE IF NOT EXISTS schedules (
    name             TEXT PRIMARY KEY,
    spec             TEXT NOT NULL,
    paused           INTEGER NOT NULL,
    next_fire_at     INTEGER,
    last_fired_at    INTEGER,
    last_run_id      TEXT,
    previous_run_id  TEXT,
    buffered_at      INTEGER,
    skipped          INTEGER NOT NULL DEFAULT 0,
    missed           INTEGER NOT NULL DEFAULT 0,
    version          INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
-- Concurrency and rate limits (schema version 5; issue 17 item 4, ``limits.py``): the slots
-- held per (scope, key), the waiters by priority and arrival, a rate's token bucket and each
-- holder's reserved start.
CREATE TABLE limit_holders (
    scope     TEXT NOT NULL,
    key       TEXT NOT NULL,
    holder    TEXT NOT NULL,
    run_id    TEXT NOT NULL,
    kind      TEXT NOT NULL,
    since_ms  INTEGER NOT NULL,
    PRIMARY KEY (scope, key, holder)
) WITHOUT ROWID;
CREATE INDEX limit_holders_by_run ON limit_holders (run_id);
CREATE TABLE limit_waiters (
    scope     TEXT NOT NULL,
    key       TEXT NOT NULL,
    holder    TEXT NOT NULL,
    run_id    TEXT NOT NULL,
    kind      TEXT NOT NULL,
    priority  INTEGER NOT NULL,
    arrival   INTEGER NOT NULL,
    since_ms  INTEGER NOT NULL,
    max       INTEGER NOT NULL,
    wake      TEXT NOT NULL,
    PRIMARY KEY (scope, key, holder)
) WITHOUT ROWID;
CREATE INDEX limit_waiters_by_rank ON limit_waiters (scope, key, priority DESC, arrival);
CREATE INDEX limit_waiters_by_run ON limit_waiters (run_id);
CREATE TABLE limit_buckets (
    scope   TEXT NOT NULL,
    key     TEXT NOT NULL,
    tat_ms  INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE TABLE limit_reservations (
    scope   TEXT NOT NULL,
    key     TEXT NOT NULL,
    holder  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    at_ms   INTEGER NOT NULL,
    PRIMARY KEY (scope, key, holder)
) WITHOUT ROWID;
CREATE INDEX limit_reservations_by_run ON limit_reservations (run_id);
-- Step heartbeats (schema version 5; issue 17 item 5): the latest beat of each step,
-- upserted by its process at most once per throttle interval, never the log.
CREATE TABLE step_heartbeats (
    run_id   TEXT NOT NULL,
    step_id  TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    details  TEXT,
    beat_at  INTEGER NOT NULL,
    PRIMARY KEY (run_id, step_id)
);
-- Streams (issue 17 item 6, schema version 5; worlds/local/streams.py): one row per
-- stream, and its chunks by index, each with the step attempt that wrote it.
CREATE TABLE streams (
    run_id  TEXT NOT NULL,
    name    TEXT NOT NULL,
    count   INTEGER NOT NULL,
    closed  INTEGER NOT NULL,
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID;
CREATE TABLE stream_chunks (
    run_id      TEXT NOT NULL,
    name        TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    data        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (run_id, name, idx)
) WITHOUT ROWID;
CREATE UNIQUE INDEX stream_chunks_by_attempt ON stream_chunks (run_id, name, step_id, attempt, seq);
