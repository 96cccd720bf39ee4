"""The World Secret's optional transport keys: NATS credentials and TLS, Postgres TLS.

Besides ``database-url`` and ``nats-url``, the Secret a WorkflowDeployment names
may hold these keys (``SECRET_KEYS``; all optional, documented in
``docs/security-transport.md``)::

    nats-user, nats-password, nats-token, nats-tls-server-name, database-sslmode
        -> the worker's TREADLE_* variable, from the Secret (secretKeyRef)
    nats-creds, nats-nkey-seed, nats-tls-ca, nats-tls-cert, nats-tls-key,
    database-sslrootcert, database-sslcert, database-sslkey
        -> a file in the Secret volume mounted at MOUNT_PATH, and the TREADLE_*
           variable naming that file

For worker pods, ``worker_env`` and ``worker_volume`` turn the keys present in
the Secret into env entries and a read-only Secret volume: secret values are
never copied into the pod spec. For the operator's own connection,
``operator_transport`` writes the file keys to private files (a 0700
directory, 0600 files, named by a digest of the content) and returns the
``Transport`` the worker would build from the same keys.

Called by ``manifests`` (pod spec) and ``worlds`` (the operator's connection).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

from treadle import errors as treadle_errors
from treadle.worlds.transport import NatsTransport, PostgresTransport, Transport
from treadle_operator.errors import WorldSecretMissing

Kind = Literal["env", "file"]

# Secret key -> (the worker's setting, how it gets there).
SECRET_KEYS: Final[dict[str, tuple[str, Kind]]] = {
    "nats-user": ("TREADLE_NATS_USER", "env"),
    "nats-password": ("TREADLE_NATS_PASSWORD", "env"),
    "nats-token": ("TREADLE_NATS_TOKEN", "env"),
    "nats-tls-server-name": ("TREADLE_NATS_TLS_SERVER_NAME", "env"),
    "nats-creds": ("TREADLE_NATS_CREDS_FILE", "file"),
    "nats-nkey-seed": ("TREADLE_NATS_NKEY_FILE", "file"),
    "nats-tls-ca": ("TREADLE_NATS_TLS_CA", "file"),
    "nats-tls-cert": ("TREADLE_NATS_TLS_CERT", "file"),
    "nats-tls-key": ("TREADLE_NATS_TLS_KEY", "file"),
    "database-sslmode": ("TREADLE_DATABASE_SSLMODE", "env"),
    "database-sslrootcert": ("TREADLE_DATABASE_SSLROOTCERT", "file"),
    "database-sslcert": ("TREADLE_DATABASE_SSLCERT", "file"),
    "database-sslkey": ("TREADLE_DATABASE_SSLKEY", "file"),
}
VOLUME: Final = "treadle-world-files"
MOUNT_PATH: Final = "/var/run/treadle/world"
# Owner and group may read (the pod's fsGroup owns Secret volume files): no one else.
FILE_MODE: Final = 0o440


def present(data: Mapping[str, str]) -> frozenset[str]:
    """The transport keys a Secret's data holds (non-empty)."""
    return frozenset(k for k in SECRET_KEYS if data.get(k))


def worker_env(secret: str, keys: Iterable[str]) -> list[dict[str, Any]]:
    """Env entries for the transport keys in ``keys``, in ``SECRET_KEYS`` order."""
    chosen = set(keys)
    entries: list[dict[str, Any]] = []
    for key, (setting, kind) in SECRET_KEYS.items():
        if key not in chosen:
            continue
        if kind == "env":
            ref = {"secretKeyRef": {"name": secret, "key": key}}
            entries.append({"name": setting, "valueFrom": ref})
        else:
            entries.append({"name": setting, "value": f"{MOUNT_PATH}/{key}"})
    return entries


def worker_volume(secret: str, keys: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The Secret volume with the file keys in ``keys``, and its read-only mount; ``None``
    when there is no file key."""
    files = [k for k, (_, kind) in SECRET_KEYS.items() if kind == "file" and k in set(keys)]
    if not files:
        return None
    volume = {
        "name": VOLUME,
        "secret": {
            "secretName": secret,
            "defaultMode": FILE_MODE,
            "items": [{"key": k, "path": k} for k in files],
        },
    }
    mount = {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}
    return volume, mount


def _private_dir() -> Path:
    directory = Path(tempfile.gettempdir()) / f"treadle-operator-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.is_symlink() or (directory.stat().st_mode & 0o077):
        raise WorldSecretMissing(f"{directory} is not a private directory; refusing to use it")
    return directory


def _materialize(key: str, value: str) -> str:
    """``value`` in a 0600 file of the operator's private directory; its path."""
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    path = _private_dir() / f"{digest}-{key}"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(value)
    return str(path)


def operator_transport(where: str, data: Mapping[str, str]) -> Transport:
    """The transport the Secret's keys describe, for the operator's own connection."""
    values: dict[str, str | None] = {}
    for key, (setting, kind) in SECRET_KEYS.items():
        value = data.get(key) or None
        if value is not None and kind == "file":
            value = _materialize(key, value)
        elif value is not None:
            value = value.strip()
        values[setting] = value
    nats = NatsTransport(
        user=values["TREADLE_NATS_USER"],
        password=values["TREADLE_NATS_PASSWORD"],
        token=values["TREADLE_NATS_TOKEN"],
        nkey_seed_file=values["TREADLE_NATS_NKEY_FILE"],
        creds_file=values["TREADLE_NATS_CREDS_FILE"],
        tls_ca=values["TREADLE_NATS_TLS_CA"],
        tls_cert=values["TREADLE_NATS_TLS_CERT"],
        tls_key=values["TREADLE_NATS_TLS_KEY"],
        tls_server_name=values["TREADLE_NATS_TLS_SERVER_NAME"],
    )
    postgres = PostgresTransport(
        sslmode=values["TREADLE_DATABASE_SSLMODE"],
        sslrootcert=values["TREADLE_DATABASE_SSLROOTCERT"],
        sslcert=values["TREADLE_DATABASE_SSLCERT"],
        sslkey=values["TREADLE_DATABASE_SSLKEY"],
    )
    try:
        return Transport(nats.check(), postgres.check())
    except treadle_errors.SettingsError as exc:
        raise WorldSecretMissing(
            f"Secret {where}: its transport keys cannot be used ({exc}; keys: "
            f"{', '.join(sorted(present(data)))})"
        ) from None
