"""``treadle serve``'s own settings (``TREADLE_SERVE_*``), read from the environment.

Kept apart from ``treadle.settings.Settings`` (the engine's and the World's) so the
serve branches add their knobs here without touching the shared file; ``load`` has
the same contract as ``treadle.settings.load``: a bad value is one ``SettingsError``
naming the variable, never its secret value. Read by ``serve.app`` (and the CLI's
``treadle serve``); the tokens are ``SecretStr`` and never logged or echoed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from treadle import errors, redaction

# A bearer token shorter than this is refused at start (a guessable token is no auth).
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class ServeSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True, case_sensitive=True)

    TREADLE_SERVE_HOST: str = Field(
        default="127.0.0.1", min_length=1, description="treadle serve: address to listen on."
    )
    TREADLE_SERVE_PORT: int = Field(
        default=8080, ge=0, le=65535, description="treadle serve: port to listen on."
    )
    TREADLE_SERVE_TOKEN: SecretStr | None = Field(
        default=None,
        description="treadle serve: bearer token of the full role (reads and actions); "
        "at least 16 characters; never logged.",
    )
    TREADLE_SERVE_TOKEN_FILE: str | None = Field(
        default=None, description="A file holding TREADLE_SERVE_TOKEN (a mounted secret)."
    )
    TREADLE_SERVE_READONLY_TOKEN: SecretStr | None = Field(
        default=None,
        description="treadle serve: bearer token of the read-only role (GET only); never logged.",
    )
    TREADLE_SERVE_READONLY_TOKEN_FILE: str | None = Field(
        default=None, description="A file holding TREADLE_SERVE_READONLY_TOKEN."
    )
    TREADLE_SERVE_TRUSTED_HEADER: str | None = Field(
        default=None,
        description="treadle serve: trust this request header (e.g. X-Forwarded-User) as the "
        "user an authenticating proxy vouches for; only behind a proxy that sets it and "
        "strips it from clients.",
    )
    TREADLE_SERVE_TRUSTED_FULL_USERS: str | None = Field(
        default=None,
        description="treadle serve: users of TREADLE_SERVE_TRUSTED_HEADER given the full role "
        "(comma separated, or * for all); the others are read-only.",
    )
    TREADLE_SERVE_CORS_ORIGINS: str | None = Field(
        default=None,
        description="treadle serve: origins allowed by CORS (comma separated); unset: closed.",
    )
    TREADLE_SERVE_MAX_BODY_BYTES: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        description="treadle serve: largest request body; a larger one is 413 before it is read.",
    )
    TREADLE_SERVE_STREAM_KEEPALIVE_SECONDS: float = Field(
        default=15.0, gt=0, description="treadle serve: an SSE comment line this often."
    )
    TREADLE_SERVE_METRICS_AUTH: bool = Field(
        default=False, description="treadle serve: /metrics needs credentials too."
    )

    @field_validator("TREADLE_SERVE_TRUSTED_HEADER")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = value.strip()
        if not name or any(not (c.isalnum() or c in "-_") for c in name):
            raise ValueError("must be a header name (letters, digits, - and _)")
        if name.lower() == "authorization":
            raise ValueError("must not be Authorization (bearer tokens use it)")
        return name

    @model_validator(mode="after")
    def _distinct_tokens(self) -> ServeSettings:
        full, read = self.full_token(), self.readonly_token()
        if full is not None and full == read:
            raise ValueError(
                "TREADLE_SERVE_TOKEN and TREADLE_SERVE_READONLY_TOKEN must differ "
                "(one token cannot hold two roles)"
            )
        return self

    def _token(self, name: str) -> str | None:
        value = getattr(self, name)
        text: str | None = None
        if isinstance(value, SecretStr) and value.get_secret_value().strip():
            text = value.get_secret_value().strip()
        else:
            path = getattr(self, f"{name}_FILE")
            if path:
                try:
                    with open(path) as secret:
                        text = secret.readline().strip()
                except OSError as exc:
                    raise ValueError(f"{name}_FILE cannot be read: {exc.strerror}") from None
                if not text:
                    raise ValueError(f"{name}_FILE is empty")
        if text is not None and len(text) < MIN_TOKEN_CHARS:
            raise ValueError(f"{name} must be at least {MIN_TOKEN_CHARS} characters")
        return text

    def full_token(self) -> str | None:
        return self._token("TREADLE_SERVE_TOKEN")

    def readonly_token(self) -> str | None:
        return self._token("TREADLE_SERVE_READONLY_TOKEN")

    @property
    def trusted_full_users(self) -> frozenset[str]:
        text = self.TREADLE_SERVE_TRUSTED_FULL_USERS or ""
        return frozenset(u.strip() for u in text.split(",") if u.strip())

    @property
    def cors_origins(self) -> list[str]:
        text = self.TREADLE_SERVE_CORS_ORIGINS or ""
        return [o.strip() for o in text.split(",") if o.strip()]

    @property
    def auth_configured(self) -> bool:
        return bool(self.full_token() or self.readonly_token() or self.TREADLE_SERVE_TRUSTED_HEADER)


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> ServeSettings:
    """Serve settings from ``environ`` (default: the process environment) and overrides."""
    source = dict(os.environ if environ is None else environ)
    values: dict[str, Any] = {
        k: v.strip() for k, v in source.items() if k in ServeSettings.model_fields
    }
    values = {k: v for k, v in values.items() if v != ""}
    values.update(overrides)
    try:
        return ServeSettings.model_validate(values)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"])
            secret = "TOKEN" in where or not where
            shown = "" if secret else f"={redaction.shown(e.get('input'))}"
            problems.append(f"{where or 'serve settings'}{shown}: {e['msg']}")
        raise errors.SettingsError(f"bad setting: {'; '.join(problems)}") from None
