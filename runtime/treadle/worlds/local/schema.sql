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
    completed_at   INTEGER
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

-- Live hooks only: a row holds its token until hook_disposed, its payload (hook_received) or its run ends.
CREATE TABLE hooks (
    token       TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    hook_id     TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    metadata    TEXT
);
CREATE INDEX hooks_by_run ON hooks (run_id, hook_id);

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
