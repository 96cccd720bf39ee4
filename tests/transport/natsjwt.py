"""Decentralized NATS auth for the ``.creds`` test: an operator, an account and a user JWT.

nats-server's operator mode trusts an operator key; the operator signs an
account JWT (JetStream on), the account signs a user JWT carrying the user's
publish/subscribe permissions, and a ``.creds`` file holds the user JWT and the
user's NKey seed, as ``nsc`` would write it. Built here with ``nkeys`` (JWTs are
ed25519-signed ``header.claims`` in base64url), so the test needs no ``nsc``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": nats,
    }
    claims["jti"] = (
        base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest())
        .decode()
        .rstrip("=")
    )
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = issuer.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64(signature)}"


@dataclass(frozen=True)
class Decentralized:
    config: str  # the server config's operator/resolver part
    creds: Path  # the user's .creds file


def make(directory: Path, *, publish: list[str], subscribe: list[str]) -> Decentralized:
    """An operator, one account with JetStream, and a user with these permissions."""
    operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)  # JetStream needs a system account
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    op_pub = operator.public_key.decode()
    acc_pub = account.public_key.decode()
    operator_jwt = _jwt(operator, op_pub, "treadle-test", {"type": "operator", "version": 2})
    unlimited = {
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": True, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    }  # fmt: skip
    account_jwt = _jwt(
        operator, acc_pub, "TREADLE", {"limits": unlimited, "type": "account", "version": 2}
    )
    sys_pub = system.public_key.decode()
    system_jwt = _jwt(operator, sys_pub, "SYS", {"type": "account", "version": 2})
    user_jwt = _jwt(
        account,
        user.public_key.decode(),
        "worker",
        {
            "pub": {"allow": publish},
            "sub": {"allow": subscribe},
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": 2,
        },
    )
    creds = directory / "worker.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    creds.chmod(0o600)
    config = (
        f"operator: {json.dumps(operator_jwt)}\n"
        f"system_account: {sys_pub}\n"
        "resolver: MEMORY\n"
        f"resolver_preload: {{ {acc_pub}: {json.dumps(account_jwt)}, "
        f"{sys_pub}: {json.dumps(system_jwt)} }}\n"
    )
    return Decentralized(config=config, creds=creds)
