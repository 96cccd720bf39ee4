"""Authenticated, encrypted connections to the production World: NATS credentials and TLS,
Postgres TLS, and the one clear error when a server refuses them.

``Transport.from_settings(settings)`` gathers the ``TREADLE_NATS_*`` credential
and TLS settings and the ``TREADLE_DATABASE_SSL*`` settings, checking at start
that every file they name can be read (a ``SettingsError`` naming the setting
otherwise). ``NatsTransport.connect_options()`` is what nats-py's
``Client.connect`` takes (``user``/``password``, ``token``, ``nkeys_seed``,
``user_credentials``, ``tls``, ``tls_hostname``); ``PostgresTransport.dsn(url)``
puts ``sslmode``, ``sslrootcert``, ``sslcert`` and ``sslkey`` into the DSN's
query, which asyncpg reads, so every Postgres connection made from the DSN
(the pool, the live feed, ``migrate``, the operator's LISTEN) gets them.

A refused connection (a wrong password or token, a missing or untrusted
client certificate, a server certificate the CA does not vouch for, a
TLS-only server reached without TLS) is a permanent failure, not an outage:
``nats_refusal`` and ``postgres_refusal`` turn the driver's error into one
``errors.WorldAuthFailed`` that says which server refused what and which
setting to look at. Secrets never appear in it: only setting names, file
paths and the server's host.

Called by ``worlds.open_world``, ``worlds.production``, ``worlds.nats.queue``,
``worlds.postgres.sqlerrors``, the CLI (``migrate``) and the operator.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from treadle import errors

if TYPE_CHECKING:
    from treadle.settings import Settings

SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
SSL_MODES: Final[tuple[str, ...]] = get_args(SslMode)

NATS = "NATS"
POSTGRES = "PostgreSQL"


def _readable(setting: str, path: str | None) -> str | None:
    """``path`` when it names a readable file; else a ``SettingsError`` naming ``setting``."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise errors.SettingsError(
            f"{setting}={path!r} cannot be read: {exc.strerror or exc}"
        ) from None
    return path


@dataclass(frozen=True, slots=True)
class NatsTransport:
    """How treadle authenticates to NATS and encrypts the connection (all optional)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None

    def check(self) -> NatsTransport:
        """Refuse settings that cannot work together, and unreadable files, at start."""
        _readable("TREADLE_NATS_NKEY_FILE", self.nkey_seed_file)
        _readable("TREADLE_NATS_CREDS_FILE", self.creds_file)
        _readable("TREADLE_NATS_TLS_CA", self.tls_ca)
        _readable("TREADLE_NATS_TLS_CERT", self.tls_cert)
        _readable("TREADLE_NATS_TLS_KEY", self.tls_key)
        kinds = [
            name
            for name, given in (
                ("TREADLE_NATS_USER", self.user is not None or self.password is not None),
                ("TREADLE_NATS_TOKEN", self.token is not None),
                ("TREADLE_NATS_NKEY_FILE", self.nkey_seed_file is not None),
                ("TREADLE_NATS_CREDS_FILE", self.creds_file is not None),
            )
            if given
        ]
        if len(kinds) > 1:
            raise errors.SettingsError(
                f"NATS takes one kind of credential; {' and '.join(kinds)} are both set"
            )
        if (self.user is None) != (self.password is None):
            raise errors.SettingsError(
                "TREADLE_NATS_USER and TREADLE_NATS_PASSWORD go together; only one is set"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise errors.SettingsError(
                "TREADLE_NATS_TLS_CERT and TREADLE_NATS_TLS_KEY go together; only one is set"
            )
        return self

    @property
    def uses_tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert or self.tls_server_name)

    def tls_context(self) -> ssl.SSLContext | None:
        """A verifying client context with the CA and client certificate, or ``None``."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.tls_ca)
        except (ssl.SSLError, OSError) as exc:
            raise errors.SettingsError(
                f"TREADLE_NATS_TLS_CA={self.tls_ca!r} holds no usable CA certificate: "
                f"{_ssl_reason(exc)}"
            ) from None
        if self.tls_cert and self.tls_key:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, OSError) as exc:
                raise errors.SettingsError(
                    f"TREADLE_NATS_TLS_CERT={self.tls_cert!r} and TREADLE_NATS_TLS_KEY="
                    f"{self.tls_key!r} are not a certificate and its key: {_ssl_reason(exc)}"
                ) from None
        return context

    def connect_options(
        self, *, require_tls: bool = False, tls_in_effect: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for nats-py's ``Client.connect``.

        With TLS wanted (``uses_tls`` or ``require_tls``, for a ``tls://`` URL) and
        ``tls_in_effect`` given, the password and token are handed over only when that
        says the connection is encrypted: nats-py falls back to plaintext when a server
        (or a man in the middle) does not ask for TLS, and would send them in the clear.
        The refusal (``PlaintextRefused``) ends the connection attempt.
        """
        options: dict[str, Any] = {}
        guard = tls_in_effect if (self.uses_tls or require_tls) else None
        if self.user is not None:
            options["user"] = self.user
            options["password"] = _guarded(self.password or "", guard)
        if self.token is not None:
            options["token"] = _guarded(self.token, guard)
        if self.nkey_seed_file:
            options["nkeys_seed"] = self.nkey_seed_file
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        context = self.tls_context()
        if context is not None:
            options["tls"] = context
        if self.tls_server_name:
            options["tls_hostname"] = self.tls_server_name
        return options

    def credential_setting(self) -> str:
        """The settings holding the credential in use, for an error message."""
        if self.creds_file:
            return "TREADLE_NATS_CREDS_FILE"
        if self.nkey_seed_file:
            return "TREADLE_NATS_NKEY_FILE"
        if self.token is not None:
            return "TREADLE_NATS_TOKEN"
        if self.user is not None:
            return "TREADLE_NATS_USER and TREADLE_NATS_PASSWORD"
        return "TREADLE_NATS_URL (no credential setting is set)"


class PlaintextRefused(Exception):
    """A secret was about to cross a NATS connection that TLS does not protect."""


def _guarded(secret: str, tls_in_effect: Callable[[], bool] | None) -> str | Callable[[], str]:
    if tls_in_effect is None:
        return secret

    def give() -> str:
        if not tls_in_effect():
            raise PlaintextRefused("the NATS server did not offer TLS")
        return secret

    return give


@dataclass(frozen=True, slots=True)
class PostgresTransport:
    """TLS to PostgreSQL: libpq's ``sslmode`` and certificate files (all optional)."""

    sslmode: str | None = None
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None

    def check(self) -> PostgresTransport:
        if self.sslmode is not None and self.sslmode not in SSL_MODES:
            raise errors.SettingsError(
                f"TREADLE_DATABASE_SSLMODE must be one of {', '.join(SSL_MODES)}"
            )
        _readable("TREADLE_DATABASE_SSLROOTCERT", self.sslrootcert)
        _readable("TREADLE_DATABASE_SSLCERT", self.sslcert)
        _readable("TREADLE_DATABASE_SSLKEY", self.sslkey)
        if (self.sslcert is None) != (self.sslkey is None):
            raise errors.SettingsError(
                "TREADLE_DATABASE_SSLCERT and TREADLE_DATABASE_SSLKEY go together; only one is set"
            )
        return self

    @property
    def params(self) -> dict[str, str]:
        given = {
            "sslmode": self.sslmode,
            "sslrootcert": self.sslrootcert,
            "sslcert": self.sslcert,
            "sslkey": self.sslkey,
        }
        return {k: v for k, v in given.items() if v}

    def dsn(self, url: str) -> str:
        """``url`` with these settings in its query (they replace the same DSN parameters)."""
        params = self.params
        if not params:
            return url
        if "://" not in url:
            raise errors.SettingsError(
                "TREADLE_DATABASE_SSL* settings need TREADLE_DATABASE_URL as a postgresql:// URL"
            )
        parts = urlsplit(url)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in params]
        query += list(params.items())
        return urlunsplit(parts._replace(query=urlencode(query)))


@dataclass(frozen=True, slots=True)
class Transport:
    nats: NatsTransport = field(default_factory=NatsTransport)
    postgres: PostgresTransport = field(default_factory=PostgresTransport)

    @classmethod
    def from_settings(cls, settings: Settings) -> Transport:
        """The transport settings, checked (files readable, pairs complete)."""
        nats = NatsTransport(
            user=settings.TREADLE_NATS_USER,
            password=settings.secret_url("TREADLE_NATS_PASSWORD"),
            token=settings.secret_url("TREADLE_NATS_TOKEN"),
            nkey_seed_file=settings.TREADLE_NATS_NKEY_FILE,
            creds_file=settings.TREADLE_NATS_CREDS_FILE,
            tls_ca=settings.TREADLE_NATS_TLS_CA,
            tls_cert=settings.TREADLE_NATS_TLS_CERT,
            tls_key=settings.TREADLE_NATS_TLS_KEY,
            tls_server_name=settings.TREADLE_NATS_TLS_SERVER_NAME,
        )
        postgres = PostgresTransport(
            sslmode=settings.TREADLE_DATABASE_SSLMODE,
            sslrootcert=settings.TREADLE_DATABASE_SSLROOTCERT,
            sslcert=settings.TREADLE_DATABASE_SSLCERT,
            sslkey=settings.TREADLE_DATABASE_SSLKEY,
        )
        return cls(nats.check(), postgres.check())

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Transport:
        from treadle.settings import load

        return cls.from_settings(load(os.environ if environ is None else environ))


# -- refusals ---------------------------------------------------------------------------

_NATS_AUTH_WORDS = ("authorization violation", "authentication", "user authentication expired")


def _ssl_reason(exc: BaseException) -> str:
    """An SSL error's reason without the C source location."""
    reason = getattr(exc, "reason", None)
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"certificate verify failed: {verify}"
    text = str(reason or exc)
    return text.replace("_", " ").lower() if reason else text


def nats_refusal(
    exc: BaseException, transport: NatsTransport, where: str
) -> errors.WorldAuthFailed | None:
    """The clear error for a NATS connection error that retrying cannot fix, else ``None``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        if transport.tls_ca:
            hint = (
                f"the server's certificate is not signed by TREADLE_NATS_TLS_CA="
                f"{transport.tls_ca!r}, or does not name the host "
                "(TREADLE_NATS_TLS_SERVER_NAME)"
            )
        else:
            hint = (
                "the server requires TLS and its certificate is not trusted here: set "
                "TREADLE_NATS_TLS_CA to the CA that signed it"
            )
        return errors.WorldAuthFailed(
            NATS, where, f"the TLS handshake failed ({_ssl_reason(exc)})", hint
        )
    if isinstance(exc, ssl.SSLError):
        reason = _ssl_reason(exc)
        if "certificate required" in reason or "bad certificate" in reason:
            hint = (
                "the server wants a client certificate it trusts: set TREADLE_NATS_TLS_CERT "
                "and TREADLE_NATS_TLS_KEY"
            )
        elif "unknown ca" in reason:
            hint = "the server does not trust the client certificate's CA (TREADLE_NATS_TLS_CERT)"
        else:
            hint = "check TREADLE_NATS_TLS_CA, TREADLE_NATS_TLS_CERT and TREADLE_NATS_TLS_KEY"
        return errors.WorldAuthFailed(NATS, where, f"the TLS handshake failed ({reason})", hint)
    if isinstance(exc, PlaintextRefused):
        return errors.WorldAuthFailed(
            NATS,
            where,
            "the server did not offer TLS, and treadle is configured for it (nothing secret "
            "was sent)",
            "turn TLS on in the server, or unset TREADLE_NATS_TLS_* and use a nats:// URL",
        )
    text = str(exc).lower()
    if any(word in text for word in _NATS_AUTH_WORDS) or type(exc).__name__ == "AuthorizationError":
        return errors.WorldAuthFailed(
            NATS,
            where,
            "the server refused treadle's credentials (authorization violation)",
            f"check {transport.credential_setting()}",
        )
    if "secure connection not available" in text or ("tls" in text and "required" in text):
        return errors.WorldAuthFailed(
            NATS,
            where,
            "the server and treadle disagree on TLS",
            "set TREADLE_NATS_TLS_CA (and a tls:// URL) for a TLS-only server",
        )
    return None


def postgres_refusal(exc: BaseException, where: str) -> errors.WorldAuthFailed | None:
    """The clear error for a Postgres connection refusal, else ``None``."""
    code = getattr(exc, "sqlstate", None)
    text = (getattr(exc, "message", None) or str(exc)).strip()
    if code == "28P01":
        return errors.WorldAuthFailed(
            POSTGRES, where, text, "check the user and password in TREADLE_DATABASE_URL"
        )
    if code == "28000":
        lowered = text.lower()
        if "no encryption" in lowered:
            hint = "the server accepts only TLS: set TREADLE_DATABASE_SSLMODE=verify-full"
        elif "certificate" in lowered:
            hint = "set TREADLE_DATABASE_SSLCERT and TREADLE_DATABASE_SSLKEY"
        else:
            hint = "the server's pg_hba.conf admits no such connection"
        return errors.WorldAuthFailed(POSTGRES, where, text, hint)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return errors.WorldAuthFailed(
            POSTGRES,
            where,
            f"the TLS handshake failed ({_ssl_reason(exc)})",
            "the server's certificate is not signed by TREADLE_DATABASE_SSLROOTCERT, "
            "or does not name the host (sslmode=verify-full)",
        )
    if isinstance(exc, ssl.SSLError):
        return errors.WorldAuthFailed(
            POSTGRES,
            where,
            f"the TLS handshake failed ({_ssl_reason(exc)})",
            "check TREADLE_DATABASE_SSLROOTCERT, TREADLE_DATABASE_SSLCERT and "
            "TREADLE_DATABASE_SSLKEY",
        )
    if "rejected ssl upgrade" in text.lower():
        return errors.WorldAuthFailed(
            POSTGRES,
            where,
            "the server does not offer TLS, and TREADLE_DATABASE_SSLMODE asks for it",
            "turn ssl on in the server, or set TREADLE_DATABASE_SSLMODE=disable",
        )
    if type(exc).__name__ == "ClientConfigurationError" or (
        "ssl" in text.lower() and "not support" in text.lower()
    ):
        return errors.WorldAuthFailed(
            POSTGRES, where, text, "check TREADLE_DATABASE_SSLMODE and the server's ssl setting"
        )
    return None
