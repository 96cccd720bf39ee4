-- Deployment revisions that serve runs: which exist, which is latest, which are retired.
CREATE TABLE treadle_deployments (
    deployment_id  text PRIMARY KEY,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    registered     bigserial NOT NULL,
    retired        boolean NOT NULL DEFAULT false
);
CREATE INDEX treadle_deployments_latest ON treadle_deployments (retired, registered DESC);
