"""Settings, read from the environment and validated at start.

The engine's knobs keep seed 003's names (``WORKFLOW_*``); treadle's own
connection settings are ``TREADLE_*``. A bad value is a ``SettingsError``
naming the variable and what it accepts; ``treadle settings`` lists them all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from treadle import errors, limits, redaction, specsettings
from treadle.world import constants


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True, case_sensitive=True)

    WORKFLOW_SPEC_VERSION: int | None = Field(
        default=None,
        description="Run format minted for new runs: 8 or 9 (unset: 9 on a World with the "
        "in-band fence, 8 on one without; 9 on a World without it mints 8, with a warning). "
        "Existing runs keep their own format.",
        json_schema_extra={"allowed": "8, 9 or unset; any other value is refused"},
    )
    WORKFLOW_MAX_QUEUE_DELIVERIES: int = Field(
        default=48, ge=1, description="Orchestrator deliveries of one message before the run fails."
    )
    WORKFLOW_REPLAY_DIVERGENCE_MAX_RETRIES: int = Field(
        default=3, ge=0, le=100, description="Cold replays in place before CorruptedEventLog."
    )
    # Spec 8 runs only (seed 000): inline step message ownership.
    WORKFLOW_INLINE_OWNERSHIP: bool = Field(
        default=True,
        description="Spec 8: a wake defers to the delivery running an inline step (0: the "
        "immediate re-queue of earlier releases; stamping continues).",
        json_schema_extra={"allowed": "1 or 0 (true or false)"},
    )
    WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS: float = Field(
        default=860.0,
        description="Spec 8: how long a wake defers to the owner of an inline step "
        "(clamped to 1..900; 900 is the longest single delayed message).",
        json_schema_extra={
            "allowed": "1..900 seconds; outside is clamped (with a warning), not a number refused"
        },
    )
    WORKFLOW_OPEN_WAIT_CLOCK_SKEW_MS: int = Field(
        default=1000,
        ge=0,
        le=600_000,
        description="Spec 8: a wait due within the inline window plus this keeps new steps "
        "out of the inline batch (queued instead).",
    )
    WORKFLOW_MAX_INLINE_STEPS: int = Field(
        default=3, description="Steps the orchestrator runs inline at once (clamped to 0..16)."
    )
    WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS: int = Field(
        default=2000, ge=0, description="Tail poll while bodies run, without a live feed."
    )
    WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS: int = Field(
        default=10000,
        ge=0,
        description="Tail poll with a live feed (doubles per clean poll up to 2x; never below "
        "the no-feed poll).",
    )
    WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS: int = Field(
        default=5000,
        ge=0,
        description="One tail read's deadline (3 attempts, each twice as long; then the "
        "delivery is redelivered); 0 turns it off.",
    )
    WORKFLOW_ORCHESTRATOR_LINGER_MS: int = Field(
        default=30000,
        ge=0,
        description="Stay live after a pass while a hook or background step is open.",
    )
    WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS: int = Field(
        default=60000,
        ge=0,
        description="No inline step starts this close to the inline window's end.",
    )
    WORKFLOW_V2_TIMEOUT_MS: int = Field(
        default=300000, ge=1000, description="An orchestrator delivery's inline window."
    )
    WORKFLOW_TURBO: bool = Field(default=True, description="First-delivery fast path.")
    # Issue 15 item 1 (run-ahead, seed 003 "Run-ahead"; orchestrator.runahead).
    WORKFLOW_RUN_AHEAD_DEPTH: int = Field(
        default=10,
        description="Spec 9: inline step outcomes handed to the workflow before their write "
        "commits, at most this many unconfirmed at once (clamped to 0..16; 0 turns it off).",
    )
    WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS: float = Field(
        default=82800, gt=0, description="Longest timer hop; long sleeps go in hops."
    )
    WORKFLOW_NEAR_ELAPSED_WAIT_THRESHOLD_SECONDS: float = Field(
        default=5, ge=0, description="Near-due re-arm window (at least 5 s)."
    )
    WORKFLOW_STEP_RETRY_DELAY_SECONDS: float = Field(
        default=1.0, ge=0, description="Retry delay of a failed step without retry_after."
    )
    # Issue 15 item 2: optimistic starts (docs/turbo.md, orchestrator/turbo.py).
    WORKFLOW_OPTIMISTIC_INLINE_START: bool = Field(
        default=True,
        description="Under turbo, an all-inline boundary's bodies (max_retries above 0) "
        "start before their step_started commits, until the first hook or wait (0/false: "
        "each waits for its start; the skipped load stays). 0 also wins over "
        "WORKFLOW_OPTIMISTIC_BACKGROUND_START.",
    )
    WORKFLOW_OPTIMISTIC_BACKGROUND_START: bool = Field(
        default=False,
        description="Opt-in: a background step's plain first delivery (max_retries above "
        "0) starts its body while its step_started is in flight; the outcome is written "
        "only once the start committed. A refused start discards the outcome (the body "
        "ran anyway: after a cancel, or twice under a throttled start).",
    )

    TREADLE_WORLD: str = Field(
        default="local:.treadle",
        description="The World: local:PATH, postgres (with TREADLE_DATABASE_URL and "
        "TREADLE_NATS_URL), or memory (in-memory, for tests).",
    )
    TREADLE_DEPLOYMENT_ID: str = Field(
        default="local", min_length=1, description="The deployment revision runs are pinned to."
    )
    TREADLE_QUEUE_LEASE_SECONDS: float = Field(
        default=30.0,
        gt=0,
        description="How long a delivery holds its message without a heartbeat before it is "
        "redelivered (a dead worker's deliveries come back after this).",
    )
    TREADLE_MAX_VALUE_DEPTH: int = Field(
        default=limits.DEFAULT_MAX_DEPTH,
        ge=1,
        le=limits.MAX_MAX_DEPTH,
        description="Deepest nesting of lists and objects in a value crossing the log "
        "(inputs, step arguments and results, hook payloads, outputs); refused before a write.",
    )
    TREADLE_MAX_VALUE_BYTES: int = Field(
        default=limits.DEFAULT_MAX_VALUE_BYTES,
        ge=1024,
        le=limits.MAX_MAX_VALUE_BYTES,
        description="Largest value crossing the log, in bytes of JSON (4 MiB); refused "
        "before a write.",
    )
    TREADLE_MAX_HOOK_TOKEN_BYTES: int = Field(
        default=limits.DEFAULT_MAX_HOOK_TOKEN_BYTES,
        ge=1,
        le=limits.MAX_MAX_HOOK_TOKEN_BYTES,
        description="Longest hook token, in bytes of UTF-8.",
    )
    TREADLE_HOOK_TOKEN_NAMESPACE: str | None = Field(
        default=None,
        description="Hook tokens are stored as NAMESPACE/token, so deployments sharing a "
        "World cannot take each other's tokens (set it alike on workers and clients).",
    )
    TREADLE_HOOK_KEY: SecretStr | None = Field(
        default=None,
        description="Key of hook signatures (treadle.hook_signature) checked by resume_hook "
        "for hooks created with require_signature=True (never logged).",
    )
    TREADLE_HOOK_KEY_FILE: str | None = Field(
        default=None, description="A file holding TREADLE_HOOK_KEY (a mounted secret)."
    )
    # Webhooks (issue 13 item 1: treadle.sdk.webhooks, treadle.serve.webhooks).
    TREADLE_PUBLIC_URL: str | None = Field(
        default=None,
        description="Where callers reach treadle serve (https://host[:port][/prefix]): "
        "create_webhook() URLs are this + /hooks/<run id>.<token> (set it on workers).",
    )
    TREADLE_WEBHOOK_MAX_BODY_BYTES: int = Field(
        default=1024 * 1024,
        ge=1,
        le=limits.MAX_MAX_VALUE_BYTES,
        description="Largest webhook call body treadle serve takes (413 above, from "
        "Content-Length or while it streams, before anything is recorded).",
    )
    TREADLE_QUEUE_MAX_FAILED_DELIVERIES: int = Field(
        default=64,
        ge=1,
        description="A queue message whose handler raises on this delivery or a later one "
        "(handoffs not counted) moves to the dead letters (treadle dead-letters) instead of "
        "being retried; keep it above WORKFLOW_MAX_QUEUE_DELIVERIES, so a run fails first.",
    )
    # Issue 15 item 3 (recovery in milliseconds): worker identity and liveness.
    TREADLE_WORKER_ID: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="This worker's stable identity (the operator sets the pod name). A worker "
        "starting with an identity releases at once every delivery its previous incarnation "
        "held (restart in place); unset: a random id per process, so no such release.",
    )
    TREADLE_WORKER_LIVENESS_SECONDS: float = Field(
        default=3.0,
        gt=0,
        le=3600,
        description="A worker whose heartbeat (one write a second) is older than this is taken "
        "for dead: a survivor redelivers what it held at once, without waiting out "
        "TREADLE_QUEUE_LEASE_SECONDS; a worker that cannot write its own heartbeat this long "
        "(a step body blocking its event loop, too) treats what it holds as lost.",
    )
    TREADLE_DATABASE_URL: SecretStr | None = Field(
        default=None, description="PostgreSQL DSN of the postgres World (never logged)."
    )
    TREADLE_NATS_URL: SecretStr | None = Field(
        default=None, description="NATS URL of the postgres World's queue (never logged)."
    )
    TREADLE_DATABASE_STATEMENT_TIMEOUT_MS: int = Field(
        default=60_000,
        ge=0,
        description="The postgres World's deadline for any one statement (the server cancels "
        "it; the client gives up 5 s later); 0 turns it off.",
    )
    # Capacity of one cluster (issue 15 item 6; docs/scaling.md).
    TREADLE_NATS_STREAM_REPLICAS: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the NATS queue's stream and run lease bucket (at most the "
        "JetStream cluster's size; 3 survives a server loss). Where set, an existing "
        "stream with another count is updated in place, with a warning; where unset, a "
        "new stream gets 1 and an existing one keeps its count.",
    )
    TREADLE_DATABASE_POOL_SIZE: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="Connections one process keeps to PostgreSQL for storage calls (the "
        "change feed's LISTEN connection is one more); processes x this must stay under "
        "the server's max_connections.",
    )
    TREADLE_DATABASE_URL_FILE: str | None = Field(
        default=None,
        description="A file holding TREADLE_DATABASE_URL (a mounted secret); read at start.",
    )
    TREADLE_NATS_URL_FILE: str | None = Field(
        default=None,
        description="A file holding TREADLE_NATS_URL (a mounted secret); read at start.",
    )

    TREADLE_PAYLOAD_KEY: SecretStr | None = Field(
        default=None,
        description="Encrypt values at rest (AES-256-GCM): <key id>:<base64 32-byte key>, "
        "comma separated; the first encrypts, all decrypt (rotation). `treadle payload-key` "
        "makes one. Never logged.",
    )
    TREADLE_PAYLOAD_KEY_FILE: str | None = Field(
        default=None,
        description="A file holding TREADLE_PAYLOAD_KEY (a mounted secret), one key a line.",
    )
    # Observability (treadle.telemetry, treadle.metrics; docs/observability.md).
    TREADLE_LOG_FORMAT: Literal["text", "json"] = Field(
        default="text",
        description="json: one JSON object per log line (time, level, logger, message, "
        "run_id, step, trace_id, span_id).",
    )
    # Issue 17 item 4: concurrency and rate limits (docs/limits.md).
    TREADLE_LIMIT_SWEEP_SECONDS: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="How often a worker serving limited workflows or steps drops dead slot "
        "holders and wakes the waiters they held back (the backstop for a wake lost to a "
        "crash between a holder's end and its release).",
    )
    # Issue 15 item 4 (pg): Run.result on the feed; prepared statements on the postgres World.
    # Issue 17 item 3 (sc): schedules in the World (docs/schedules.md).
    TREADLE_SCHEDULES_ENABLED: bool = Field(
        default=True,
        description="Whether a worker (orchestrator or all role) runs the schedules' firing "
        "loop; every worker may run it, a firing happens once (docs/schedules.md).",
    )
    TREADLE_SCHEDULES_RESCAN_SECONDS: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="The longest the firing loop sleeps before reading the schedules again: "
        "how soon a schedule changed by another process (the CLI, another pod) is seen. A "
        "change made through this process's app wakes it at once.",
    )
    TREADLE_RESULT_POLL_SECONDS: float = Field(
        default=1.0,
        gt=0,
        description="How often Run.result reads the run when the World's live feed failed or "
        "cannot be set up (logged); with a working feed it waits on the feed, no poll.",
    )
    TREADLE_DATABASE_STATEMENT_CACHE_SIZE: int = Field(
        default=100,
        ge=0,
        description="Prepared statements the postgres World keeps per connection (each call "
        "one round trip); 0 turns them off for a pooler that cannot hold them (PgBouncer in "
        "transaction mode without max_prepared_statements), at a second round trip a call.",
    )
    TREADLE_DATABASE_GROUP_WRITES: bool = Field(
        default=True,
        description="true (default): the postgres World writes the out-of-band writes of one "
        "run that queue behind one in flight (a fan-out's step starts and outcomes) in one "
        "statement; false: each alone, each waiting for the run's row in turn.",
    )
    TREADLE_WORKER_METRICS_PORT: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="`treadle worker` serves Prometheus /metrics on this port (unset: off; "
        "--metrics-port wins).",
    )
    # Issue 17 item 9 (at): the determinism linter when a worker loads an app.
    TREADLE_LINT_ON_LOAD: bool = Field(
        default=True,
        description="`treadle worker` (roles all and orchestrator) lints the source files "
        "of its app's workflows when it starts (treadle lint's rules, docs/lint.md) and logs "
        "each finding as a warning on treadle.lint; never fails the start. 0 turns it off.",
        json_schema_extra={"allowed": "1 or 0 (true or false)"},
    )
    # Issue 15 item 4 (hp): fan-out width not capped by a fixed worker concurrency of 32.
    TREADLE_WORKER_CONCURRENCY: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Deliveries a worker runs at once (step messages and orchestrator "
        "deliveries). Unset: derived from the process's CPUs and its step bodies: 256 per "
        "CPU (32 to 1,024) when every step is async, twice the default executor's threads "
        "(at least 32) when any is sync (treadle.orchestrator.concurrency). "
        "`treadle worker --concurrency N` wins.",
    )
    # Issue 15 item 5 (fd): warm replay sessions (treadle.orchestrator.warm, docs/warm.md).
    TREADLE_WARM_RUNS: int = Field(
        default=1000,
        ge=0,
        description="Suspended spec 9 runs whose live replay a worker keeps for their next "
        "delivery, which then reads only the log after it instead of loading and replaying "
        "the whole log (a sticky cache); least recently kept evicted first; 0 turns it off.",
    )
    TREADLE_WARM_EVENTS: int = Field(
        default=50_000,
        ge=0,
        description="Events all of a worker's warm sessions may hold together (the log "
        "events each kept replay holds); past it the least recently kept are evicted.",
    )

    def payload_keys(self) -> str | None:
        """``TREADLE_PAYLOAD_KEY``, or the whole file ``TREADLE_PAYLOAD_KEY_FILE`` names."""
        value = self.TREADLE_PAYLOAD_KEY
        if value is not None and value.get_secret_value().strip():
            return value.get_secret_value()
        path = self.TREADLE_PAYLOAD_KEY_FILE
        if not path:
            return None
        try:
            with open(path) as secret:
                text = secret.read().strip()
        except OSError as exc:
            raise errors.SettingsError(
                f"TREADLE_PAYLOAD_KEY_FILE={path!r} cannot be read: {exc.strerror}"
            ) from None
        if not text:
            raise errors.SettingsError(f"TREADLE_PAYLOAD_KEY_FILE={path!r} is empty")
        return text

    # Authenticated, encrypted transport (treadle.worlds.transport; docs/security-transport.md).
    TREADLE_NATS_USER: str | None = Field(default=None, description="NATS user name.")
    TREADLE_NATS_PASSWORD: SecretStr | None = Field(
        default=None, description="NATS password of TREADLE_NATS_USER (never logged)."
    )
    TREADLE_NATS_PASSWORD_FILE: str | None = Field(
        default=None, description="A file holding TREADLE_NATS_PASSWORD; read at start."
    )
    TREADLE_NATS_TOKEN: SecretStr | None = Field(
        default=None, description="NATS authentication token (never logged)."
    )
    TREADLE_NATS_TOKEN_FILE: str | None = Field(
        default=None, description="A file holding TREADLE_NATS_TOKEN; read at start."
    )
    TREADLE_NATS_NKEY_FILE: str | None = Field(
        default=None, description="A file holding the NATS user's NKey seed (SU...)."
    )
    TREADLE_NATS_CREDS_FILE: str | None = Field(
        default=None, description="A NATS .creds file (user JWT and NKey seed)."
    )
    TREADLE_NATS_TLS_CA: str | None = Field(
        default=None, description="CA bundle (PEM) that signs the NATS server's certificate."
    )
    TREADLE_NATS_TLS_CERT: str | None = Field(
        default=None, description="Client certificate (PEM) for NATS mutual TLS."
    )
    TREADLE_NATS_TLS_KEY: str | None = Field(
        default=None, description="Key (PEM) of TREADLE_NATS_TLS_CERT."
    )
    TREADLE_NATS_TLS_SERVER_NAME: str | None = Field(
        default=None, description="Name the NATS server's certificate must carry (SNI)."
    )
    TREADLE_DATABASE_SSLMODE: str | None = Field(
        default=None,
        description="libpq sslmode for PostgreSQL: disable, allow, prefer, require, "
        "verify-ca or verify-full (unset: the DSN's, else prefer).",
    )
    TREADLE_DATABASE_SSLROOTCERT: str | None = Field(
        default=None, description="CA bundle (PEM) that signs the PostgreSQL server's certificate."
    )
    TREADLE_DATABASE_SSLCERT: str | None = Field(
        default=None, description="Client certificate (PEM) for PostgreSQL."
    )
    TREADLE_DATABASE_SSLKEY: str | None = Field(
        default=None, description="Key (PEM) of TREADLE_DATABASE_SSLCERT."
    )
    # Issue 17 item 5: step heartbeats (docs/timeouts.md, orchestrator/steptimeouts.py).
    WORKFLOW_STEP_HEARTBEAT_THROTTLE_SECONDS: float = Field(
        default=30.0,
        gt=0,
        description="Longest interval between two stored heartbeats of one step attempt "
        "(each attempt stores at most one per min(this, 0.8 x its heartbeat_timeout)).",
    )
    # Issue 17 item 6: streams (docs/streams.md).
    TREADLE_MAX_STREAM_CHUNK_BYTES: int = Field(
        default=256 * 1024,
        ge=16,
        le=limits.MAX_MAX_VALUE_BYTES,
        description="Largest stream chunk, in bytes of stored JSON (256 KiB); a bigger "
        "one is refused at writer.write(), nothing recorded.",
    )
    TREADLE_STREAM_FLUSH_DELAY_MS: int = Field(
        default=0,
        ge=0,
        le=60_000,
        description="How long a stream writer gathers chunks before it writes them to the "
        "World (0: at once; chunks written while a write is in flight go in the next one).",
    )
    TREADLE_STREAM_BUFFER_CHUNKS: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Chunks a stream writer holds unwritten before writer.write() waits "
        "for the World (back pressure); also the most chunks in one write.",
    )
    TREADLE_STREAM_POLL_SECONDS: float = Field(
        default=1.0,
        gt=0,
        description="How often run.stream() reads again without a notification (another "
        "process's writes on the local World, a lost LISTEN connection on Postgres).",
    )

    def secret_url(self, name: str) -> str | None:
        """``NAME``, or the first line of the file ``NAME_FILE`` names (never logged): the
        URLs, and the NATS password and token."""
        value = getattr(self, name)
        if isinstance(value, SecretStr) and value.get_secret_value():
            return _readable(name, value.get_secret_value())
        path = getattr(self, f"{name}_FILE")
        if not path:
            return None
        try:
            with open(path) as secret:
                text = secret.readline().strip()
        except OSError as exc:
            raise errors.SettingsError(
                f"{name}_FILE={redaction.shown(path)} cannot be read: {exc.strerror}"
            ) from None
        if not text:
            raise errors.SettingsError(f"{name}_FILE={redaction.shown(path)} is empty")
        return _readable(name, text)

    @field_validator("TREADLE_HOOK_TOKEN_NAMESPACE")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        from treadle import hooktokens

        return hooktokens.check_namespace(value)

    @field_validator("WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS", mode="before")
    @classmethod
    def _clamp_lease(cls, value: object) -> float:
        return specsettings.lease_seconds(value)

    @field_validator("TREADLE_PUBLIC_URL")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")) or any(c in value for c in "?# "):
            raise ValueError("must be an http:// or https:// URL without a query or fragment")
        return value.rstrip("/")

    @field_validator("WORKFLOW_MAX_INLINE_STEPS", "WORKFLOW_RUN_AHEAD_DEPTH")
    @classmethod
    def _clamp_inline(cls, value: int) -> int:
        return min(max(value, 0), 16)

    @field_validator("WORKFLOW_SPEC_VERSION", mode="before")
    @classmethod
    def _known_spec(cls, value: object) -> int | None:
        return specsettings.spec_version(value)

    @property
    def spec_version(self) -> int:
        """The requested format, or 9: NOT what a World mints (``specversions.mint``, which
        also reads the World's fence) and never the format of an existing run (its record).
        Kept for callers of earlier releases; nothing in treadle reads it."""
        return self.WORKFLOW_SPEC_VERSION or constants.SPEC_VERSION_SINGLE_ORCHESTRATOR


def _readable(name: str, url: str) -> str:
    """A URL setting's value, refused (naming only the setting) when it cannot be read."""
    if name.endswith("_URL") and "://" in url:
        return redaction.require_readable(url, name)
    return url


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from ``environ`` (default: the process environment) and overrides."""
    source = dict(os.environ if environ is None else environ)
    values: dict[str, Any] = {k: v for k, v in source.items() if k in Settings.model_fields}
    values = {k: (None if v.strip() == "" else v.strip()) for k, v in values.items()}
    values = {k: v for k, v in values.items() if v is not None}
    values.update(overrides)
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}={redaction.shown(e.get('input'))}: {e['msg']}"
            for e in exc.errors()
        )
        raise errors.SettingsError(f"bad setting: {problems}") from None
