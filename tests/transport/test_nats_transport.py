"""NATS credentials and TLS against a real locked-down nats-server (review H2, issue 16 item 3).

The server (``securenats``) requires TLS with a client certificate signed by the
test CA and has per-user permissions. Each test connects the way a worker does
(``NatsQueue.connect`` with a ``NatsTransport``) and asserts either a working
queue or the one clear ``WorldAuthFailed`` (fast: no waiting out the connect
timeout, and no secret in the message).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import nats
import pytest

from treadle import errors
from treadle.world import contract, ids, messages
from treadle.world.conformance import queue as conformance
from treadle.worlds.nats import NatsQueue
from treadle.worlds.transport import NatsTransport

from ..nats.conftest import NatsServer, nats_server
from . import natsjwt
from .certs import Pki
from .securenats import (
    INSPECTOR_PASSWORD,
    OPERATOR_PASSWORD,
    TOKEN,
    WORKER_PASSWORD,
    SecureNats,
)

__all__ = ["nats_server"]

CONNECT_TIMEOUT = 8.0


def worker(pki: Pki, **changes: object) -> NatsTransport:
    base = NatsTransport(
        user="worker",
        password=WORKER_PASSWORD,
        tls_ca=str(pki.ca),
        tls_cert=str(pki.client_cert),
        tls_key=str(pki.client_key),
    )
    return dataclasses.replace(base, **changes).check()  # type: ignore[arg-type]


async def refused(url: str, transport: NatsTransport, deployment: str) -> errors.WorldAuthFailed:
    started = time.monotonic()
    with pytest.raises(errors.WorldAuthFailed) as caught:
        await NatsQueue.connect(
            url, deployment_id=deployment, transport=transport, connect_timeout=CONNECT_TIMEOUT
        )
    # Refused at the first answer, not after nats-py's retries ran out the timeout.
    assert time.monotonic() - started < CONNECT_TIMEOUT / 2
    message = str(caught.value)
    assert caught.value.server == "NATS"
    assert "127.0.0.1" in message
    for secret in (WORKER_PASSWORD, TOKEN, "w0rker"):
        assert secret not in message
    assert "\n" not in message
    return caught.value


async def test_a_worker_sends_and_consumes_over_mutual_tls_with_its_password(
    secure_nats: SecureNats, pki: Pki
) -> None:
    """The least-privilege worker user creates the stream, bucket and consumers it needs,
    sends and receives a message: everything a worker does is inside its permissions."""
    queue = await NatsQueue.connect(
        secure_nats.url, deployment_id="mtls", transport=worker(pki), tuning=contract.QueueTuning()
    )
    try:
        got: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def handle(message: conformance.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            if not got.done():
                got.set_result(message.run_id)
            return messages.ACK

        consumer = await queue.consume({"orchestrator": handle})
        run_id = ids.new_run_id()
        await queue.send(conformance.orchestrator_message(run_id))
        assert await asyncio.wait_for(got, 20) == run_id
        await consumer.close(grace_seconds=1)
        # What the CLI does with the same user: list dead letters, read a backlog.
        assert await queue.dead_letters() == []
        assert await queue.pending("orchestrator", "mtls") == 0
    finally:
        await queue.close()
    assert "Permissions Violation" not in secure_nats.log_text()


async def test_a_wrong_password_is_one_clear_error(secure_nats: SecureNats, pki: Pki) -> None:
    failure = await refused(secure_nats.url, worker(pki, password="not-it"), "badpw")
    assert "refused treadle's credentials" in str(failure)
    assert "TREADLE_NATS_USER and TREADLE_NATS_PASSWORD" in failure.hint


async def test_no_client_certificate_is_one_clear_error(secure_nats: SecureNats, pki: Pki) -> None:
    failure = await refused(secure_nats.url, worker(pki, tls_cert=None, tls_key=None), "nocert")
    assert "TLS handshake failed" in failure.what
    assert "TREADLE_NATS_TLS_CERT" in failure.hint


async def test_a_client_certificate_from_another_ca_is_one_clear_error(
    secure_nats: SecureNats, pki: Pki
) -> None:
    transport = worker(pki, tls_cert=str(pki.other_client_cert), tls_key=str(pki.other_client_key))
    failure = await refused(secure_nats.url, transport, "othercert")
    assert "TLS handshake failed" in failure.what
    assert "TREADLE_NATS_TLS_CERT" in failure.hint


async def test_a_server_certificate_from_another_ca_is_one_clear_error(
    secure_nats: SecureNats, pki: Pki
) -> None:
    failure = await refused(secure_nats.url, worker(pki, tls_ca=str(pki.other_ca)), "wrongca")
    assert "certificate verify failed" in failure.what
    assert f"TREADLE_NATS_TLS_CA={str(pki.other_ca)!r}" in failure.hint


async def test_a_plain_connection_to_a_tls_only_server_is_one_clear_error(
    secure_nats: SecureNats,
) -> None:
    plain = NatsTransport(user="worker", password=WORKER_PASSWORD)
    failure = await refused(secure_nats.url.replace("tls://", "nats://"), plain, "plain")
    assert "requires TLS" in failure.hint and "TREADLE_NATS_TLS_CA" in failure.hint


async def test_a_wrong_server_name_is_one_clear_error(secure_nats: SecureNats, pki: Pki) -> None:
    failure = await refused(
        secure_nats.url, worker(pki, tls_server_name="nats.elsewhere.example"), "sni"
    )
    assert "nats.elsewhere.example" in failure.what
    assert "TREADLE_NATS_TLS_SERVER_NAME" in failure.hint


async def test_an_nkey_seed_file_authenticates(secure_nats: SecureNats, pki: Pki) -> None:
    transport = worker(
        pki, user=None, password=None, nkey_seed_file=str(secure_nats.nkey_seed_file)
    )
    queue = await NatsQueue.connect(secure_nats.url, deployment_id="nkey", transport=transport)
    await queue.close()


async def test_a_token_authenticates_and_a_wrong_token_is_refused(token_nats: SecureNats) -> None:
    queue = await NatsQueue.connect(
        token_nats.url, deployment_id="token", transport=NatsTransport(token=TOKEN)
    )
    await queue.close()
    failure = await refused(token_nats.url, NatsTransport(token="t0ken-guess"), "badtoken")
    assert "TREADLE_NATS_TOKEN" in failure.hint
    assert "t0ken-guess" not in str(failure)


async def test_a_tls_configured_worker_refuses_a_server_without_tls(
    token_nats: SecureNats, pki: Pki
) -> None:
    """nats-py would fall back to plaintext when the server does not ask for TLS (a
    misconfigured server, or a downgrade in the middle): treadle refuses instead."""
    log_before = len(token_nats.log_text())
    for url, tls_ca in (
        (token_nats.url, str(pki.ca)),
        (token_nats.url.replace("nats:", "tls:"), None),
    ):
        transport = NatsTransport(token=TOKEN, tls_ca=tls_ca)
        failure = await refused(url, transport, "downgrade")
        assert "did not offer TLS" in failure.what
        assert TOKEN not in str(failure)
    # The token was never sent in the clear: the server saw no client authenticate.
    assert "authentication error" not in token_nats.log_text()[log_before:]


async def test_a_tls_configured_worker_without_a_password_refuses_a_plaintext_server(
    nats_server: NatsServer, pki: Pki
) -> None:
    """No secret to guard (an open server): the connection is refused once it turns out
    to be plaintext, so no worker runs on an unencrypted queue it was told to encrypt."""
    failure = await refused(nats_server.url, NatsTransport(tls_ca=str(pki.ca)), "plain-nocred")
    assert "did not offer TLS" in failure.what


async def _violations(url: str, pki: Pki, user: str, password: str, subject: str) -> list[str]:
    """Publish ``subject`` as ``user`` with a plain nats-py client; the server's refusals."""
    seen: list[str] = []
    refused_once = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        seen.append(str(exc))
        refused_once.set()

    nc = await nats.connect(
        url,
        user=user,
        password=password,
        tls=worker(pki).tls_context(),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        await nc.publish(subject, b"{}")
        await nc.flush()
        await asyncio.wait_for(refused_once.wait(), 10)
    finally:
        await nc.close()
    return seen


@pytest.mark.parametrize(
    "subject",
    ["orders.created", "$JS.API.STREAM.DELETE.TREADLE", "$JS.API.STREAM.CREATE.EVIL"],
)
async def test_a_worker_cannot_publish_outside_treadles_subjects(
    secure_nats: SecureNats, pki: Pki, subject: str
) -> None:
    """Review H2: the worker user can publish only treadle's subjects; the server refuses
    anything else (another app's subject, deleting treadle's stream, a new stream)."""
    seen = await _violations(secure_nats.url, pki, "worker", WORKER_PASSWORD, subject)
    assert any(
        "permissions violation" in s.lower() and subject.lower() in s.lower() for s in seen
    ), seen


async def test_the_inspector_cannot_publish_treadle_messages(
    secure_nats: SecureNats, pki: Pki
) -> None:
    """A read-only user cannot forge a message onto a run's subject (review H2's attack)."""
    subject = "treadle.dep1.orch.wrun_01JVICTIM00000000000000000"
    seen = await _violations(secure_nats.url, pki, "inspector", INSPECTOR_PASSWORD, subject)
    assert any("permissions violation" in s.lower() for s in seen), seen


async def test_the_operator_user_opens_the_queue(secure_nats: SecureNats, pki: Pki) -> None:
    transport = worker(pki, user="operator", password=OPERATOR_PASSWORD)
    queue = await NatsQueue.connect(
        secure_nats.url, deployment_id="treadle-operator", transport=transport
    )
    await queue.close()


async def test_a_creds_file_authenticates_with_the_permissions_in_its_jwt(
    creds_nats: tuple[SecureNats, Path], tmp_path: Path
) -> None:
    """A ``.creds`` file (user JWT + seed) in operator mode: the worker opens the queue and
    sends; a creds file another operator signed is refused with the one clear error."""
    server, creds = creds_nats
    queue = await NatsQueue.connect(
        server.url, deployment_id="creds", transport=NatsTransport(creds_file=str(creds))
    )
    try:
        await queue.send(conformance.orchestrator_message(ids.new_run_id()))
        # The JWT's permissions hold: outside treadle's subjects the server refuses.
        seen: list[str] = []
        refused_once = asyncio.Event()

        async def on_error(exc: Exception) -> None:
            seen.append(str(exc))
            refused_once.set()

        nc = await nats.connect(server.url, user_credentials=str(creds), error_cb=on_error)
        try:
            await nc.publish("orders.created", b"{}")
            await nc.flush()
            await asyncio.wait_for(refused_once.wait(), 10)
        finally:
            await nc.close()
        assert any("permissions violation" in s.lower() for s in seen), seen
    finally:
        await queue.close()
    stranger = natsjwt.make(tmp_path, publish=[">"], subscribe=[">"])
    failure = await refused(server.url, NatsTransport(creds_file=str(stranger.creds)), "strange")
    assert "TREADLE_NATS_CREDS_FILE" in failure.hint
