"""A Secret's data as the operator reads it: decoded key by key, only when used.

``Kube.secret`` returns a ``SecretData``: a read-only ``Mapping[str, str]`` over
the Secret's raw bytes. A key is base64-decoded and UTF-8-decoded only when it is
read, so a binary key the operator never uses (a keystore, an image) is never a
problem; a key it does use whose value is not UTF-8 text raises
``WorldSecretUnreadable`` naming the Secret and the key (the WorkflowDeployment
gets a condition saying so, review R9). ``resource_version`` is the Secret's,
and ``checksum`` digests the raw values of chosen keys: the worker Deployments'
``treadle.dev/world-secret-checksum`` annotation, which rolls the workers when
a key they read changes. Called by ``kube`` (reads) and ``worlds`` (URLs, keys).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Iterator, Mapping

from treadle_operator.errors import WorldSecretUnreadable


class SecretData(Mapping[str, str]):
    """The data of Secret ``where`` (``namespace/name``), decoded on access."""

    def __init__(
        self, where: str, raw: Mapping[str, str], resource_version: str | None = None
    ) -> None:
        self.where = where
        self.resource_version = resource_version
        self._raw = dict(raw)  # key -> base64, as the API server sends it
        self._decoded: dict[str, str] = {}

    def raw(self, key: str) -> bytes:
        """The key's bytes (``KeyError`` when absent)."""
        try:
            return base64.b64decode(self._raw[key], validate=True)
        except (binascii.Error, ValueError):
            raise WorldSecretUnreadable(
                f"Secret {self.where} key {key} is not valid base64"
            ) from None

    def __getitem__(self, key: str) -> str:
        if key not in self._decoded:
            value = self.raw(key)
            try:
                self._decoded[key] = value.decode("utf-8")
            except UnicodeDecodeError:
                raise WorldSecretUnreadable(
                    f"Secret {self.where} key {key} is not UTF-8 text ({len(value)} bytes); "
                    "the operator reads it as text"
                ) from None
        return self._decoded[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:  # never the values
        return f"SecretData({self.where}, keys={sorted(self._raw)})"

    def checksum(self, keys: Iterable[str]) -> str:
        """sha256 over the named keys' raw values (absent keys count as absent), hex."""
        digest = hashlib.sha256()
        for key in sorted(set(keys)):
            if key in self._raw:
                digest.update(f"{len(key)}:{key}=".encode())
                value = self.raw(key)
                digest.update(f"{len(value)}:".encode() + value)
        return digest.hexdigest()


def from_strings(where: str, data: Mapping[str, str]) -> SecretData:
    """A ``SecretData`` from plain text values (tests, and ``stringData``-like input)."""
    return SecretData(where, {k: base64.b64encode(v.encode()).decode() for k, v in data.items()})
