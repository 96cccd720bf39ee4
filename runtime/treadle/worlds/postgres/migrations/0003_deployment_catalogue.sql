-- The workflows a deployment's workers serve, so a start can be checked before it is recorded.
ALTER TABLE treadle_deployments ADD COLUMN catalogue jsonb;
