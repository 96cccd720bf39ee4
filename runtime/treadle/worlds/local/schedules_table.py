"""The local World's schedules table, as created by schema.sql and by upgrade 5."""

SCHEMA = """CREATE TABLE IF NOT EXISTS schedules (
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
)"""
