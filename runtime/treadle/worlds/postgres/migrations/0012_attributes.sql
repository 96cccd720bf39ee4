-- treadle Postgres World, migration 0012: searchable run attributes (issue 17 item 2,
-- docs/attributes.md).
--
-- treadle_runs.attributes (jsonb, folded from run_created and every attr_set since
-- 0001) gets a GIN index with jsonb_path_ops, so runs.list(attributes={...}) answers
-- "attributes @> '{"tier": "gold"}'" (equality on a scalar, ANDed over the keys of
-- the filter) from the index instead of a scan. Nothing else changes: no table, no
-- function.
CREATE INDEX IF NOT EXISTS treadle_runs_by_attributes
    ON treadle_runs USING gin (attributes jsonb_path_ops);
