"""A small synchronous JSON client for the test control plane's API server.

The control plane (``cluster.py``) bootstraps with it before any async client
exists (CRDs, the fake Node), and tests use it for short API reads inside
``wait_for``. It speaks plain HTTPS with the admin bearer token; the server's
certificate is self-signed, so it is not verified (loopback only).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
REQUEST_SECONDS = 30.0


class ApiError(Exception):
    """The API server answered with an error status; ``status`` and ``body`` say which."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Rest:
    """``server`` is ``https://127.0.0.1:PORT``; ``token`` the admin bearer token."""

    server: str
    token: str
    _tls: ssl.SSLContext = field(default_factory=ssl._create_unverified_context, repr=False)

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._tls, timeout=REQUEST_SECONDS) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as error:
            raise ApiError(
                method, path, error.code, error.read().decode(errors="replace")
            ) from None
        return json.loads(raw) if raw.strip().startswith(b"{") else raw.decode()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def find(self, path: str) -> Any:
        """The object at ``path``, or None when the server answers 404."""
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        """An RFC 7386 merge patch: lists are replaced whole, ``None`` removes a key."""
        return self.request("PATCH", path, body, content_type=MERGE_PATCH)

    def delete(self, path: str, body: Any = None) -> Any:
        """Deletes ``path``; a 404 (already gone) is not an error."""
        try:
            return self.request("DELETE", path, body)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
