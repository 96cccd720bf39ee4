"""The local World's limit tables: schema version 5's statements (also in schema.sql)."""

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS limit_holders (scope TEXT NOT NULL, key TEXT NOT NULL, "
    "holder TEXT NOT NULL, run_id TEXT NOT NULL, kind TEXT NOT NULL, "
    "since_ms INTEGER NOT NULL, PRIMARY KEY (scope, key, holder)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS limit_holders_by_run ON limit_holders (run_id)",
    "CREATE TABLE IF NOT EXISTS limit_waiters (scope TEXT NOT NULL, key TEXT NOT NULL, "
    "holder TEXT NOT NULL, run_id TEXT NOT NULL, kind TEXT NOT NULL, "
    "priority INTEGER NOT NULL, arrival INTEGER NOT NULL, since_ms INTEGER NOT NULL, "
    "max INTEGER NOT NULL, wake TEXT NOT NULL, PRIMARY KEY (scope, key, holder)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS limit_waiters_by_rank "
    "ON limit_waiters (scope, key, priority DESC, arrival)",
    "CREATE INDEX IF NOT EXISTS limit_waiters_by_run ON limit_waiters (run_id)",
    "CREATE TABLE IF NOT EXISTS limit_buckets (scope TEXT NOT NULL, key TEXT NOT NULL, "
    "tat_ms INTEGER NOT NULL, PRIMARY KEY (scope, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS limit_reservations (scope TEXT NOT NULL, key TEXT NOT NULL, "
    "holder TEXT NOT NULL, run_id TEXT NOT NULL, at_ms INTEGER NOT NULL, "
    "PRIMARY KEY (scope, key, holder)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS limit_reservations_by_run ON limit_reservations (run_id)",
]
