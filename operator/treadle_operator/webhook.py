"""The WorkflowRun validating admission webhook: an HTTPS endpoint the operator serves.

``main.run`` calls ``serve`` when ``TREADLE_OPERATOR_WEBHOOK`` is on (the chart turns it
on), before kopf and before any leader election: every replica answers admission
reviews, leader or standby, as controller-runtime's webhook servers do, so a rollout or a
standby replica behind the webhook Service never fails a write. The answer is pure
(``admission.review``, no API call) and fast.

``AdmissionServer`` is a small aiohttp server (the one kopf's ``WebhookServer`` uses)
with one route, ``POST /validate-workflowrun``: an AdmissionReview (v1 or v1beta1) in,
the same review with ``response.allowed`` and, when refused, a 422 status whose message
lists every problem, field first. Any other path is 404 (a misconfigured URL then fails
loudly under ``failurePolicy: Fail`` instead of allowing everything). A crash in the
rules allows the write with a logged error rather than blocking every WorkflowRun, and
the operator's own finalizer updates, on a bug.

Its certificate comes from ``webhookcerts`` (a CA of its own in a Secret the replicas
share, patched into the configuration's caBundle), checked at start and every
``CHECK_SECONDS``: a renewed certificate (by this replica or another) is loaded into
the server's TLS context for new connections; the configuration's caBundle is checked
every ``TREADLE_OPERATOR_WEBHOOK_BUNDLE_CHECK_SECONDS``. docs/operator-admission.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from treadle_operator import admission
from treadle_operator.errors import WebhookUnavailable
from treadle_operator.state import State
from treadle_operator.webhookcerts import Certificates, Material, keep_ca_bundle, parse_hosts

log = logging.getLogger("treadle.operator.webhook")

PATH = "/validate-workflowrun"
CHECK_SECONDS = 600.0
RESOURCE = {"group": "treadle.dev", "resource": "workflowruns"}


def answer(review: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview to send back for ``review`` (pure: the tests call it directly)."""
    request = review.get("request")
    if not isinstance(request, dict) or "uid" not in request:
        raise ValueError("not an AdmissionReview request (no request.uid)")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    resource = request.get("resource") or {}
    ours = {k: resource.get(k) for k in RESOURCE} == RESOURCE and not request.get("subResource")
    if ours:
        operation = str(request.get("operation") or "")
        try:
            problems = admission.review(operation, request.get("oldObject"), request.get("object"))
        except Exception:
            log.exception("admission rules failed on a WorkflowRun %s: allowed", operation)
            problems = []
        if problems:
            obj = request.get("object") or {}
            meta = obj.get("metadata") or {}
            log.info(
                "refused %s of WorkflowRun %s/%s: %s",
                operation,
                request.get("namespace") or meta.get("namespace"),
                request.get("name") or meta.get("name"),
                "; ".join(problems),
            )
            response["allowed"] = False
            # No ``reason``: kubectl prints an "Invalid" status from its (absent) causes and
            # drops the message; with none it shows "... denied the request: <message>".
            response["status"] = {"code": 422, "message": "; ".join(problems)}
    return {
        "apiVersion": review.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


async def _handle(request: web.Request) -> web.Response:
    try:
        review = json.loads(await request.text())
        if not isinstance(review, dict):
            raise ValueError("not a JSON object")
        return web.json_response(answer(review))
    except ValueError as exc:
        return web.json_response({"error": f"bad admission review: {exc}"}, status=400)


class AdmissionServer:
    """The running webhook: its TLS context, certificate files and the loop that renews them."""

    def __init__(self, state: State) -> None:
        cfg = state.settings
        self.state = state
        self.hosts = parse_hosts(cfg.TREADLE_OPERATOR_WEBHOOK_HOSTS)
        self.certificates = Certificates(
            state.kube.core,
            cfg.TREADLE_OPERATOR_WEBHOOK_NAMESPACE,
            cfg.TREADLE_OPERATOR_WEBHOOK_SECRET,
            self.hosts,
        )
        self.directory = Path(tempfile.mkdtemp(prefix="treadle-webhook-"))
        self.certfile, self.keyfile = self.directory / "tls.crt", self.directory / "tls.key"
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.material: Material | None = None
        self.runner: web.AppRunner | None = None
        self.task: asyncio.Task[None] | None = None

    async def refresh(self) -> Material:
        """Bring the TLS context (and the configuration's caBundle) to the current material."""
        material = await self.certificates.ensure()
        if material != self.material:
            self.keyfile.touch(mode=0o600)
            self.keyfile.write_bytes(material.key)
            self.certfile.write_bytes(material.cert)
            self.context.load_cert_chain(self.certfile, self.keyfile)  # new handshakes use it
            self.material = material
        await self._keep_bundle()
        return material

    async def _keep_bundle(self) -> None:
        config = self.state.settings.TREADLE_OPERATOR_WEBHOOK_CONFIG
        if config and self.material is not None:
            await keep_ca_bundle(self.state.kube.api, config, self.material.ca_cert)

    async def start(self) -> None:
        cfg = self.state.settings
        await self.refresh()
        app = web.Application()
        app.add_routes([web.post(PATH, _handle)])
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(
            self.runner,
            cfg.TREADLE_OPERATOR_WEBHOOK_ADDRESS,
            cfg.TREADLE_OPERATOR_WEBHOOK_PORT,
            ssl_context=self.context,
        )
        await site.start()
        self.task = asyncio.create_task(self._keep(), name="treadle-webhook-certificates")
        log.info(
            "admission webhook serving https://%s:%s%s for %s",
            cfg.TREADLE_OPERATOR_WEBHOOK_ADDRESS,
            cfg.TREADLE_OPERATOR_WEBHOOK_PORT,
            PATH,
            ", ".join(self.hosts),
        )

    async def _keep(self) -> None:
        """The caBundle every TREADLE_OPERATOR_WEBHOOK_BUNDLE_CHECK_SECONDS (one GET: a
        configuration re-created by Helm, or put back after the escape hatch, gets it back
        within that), the certificate every CHECK_SECONDS."""
        waited, every = 0.0, self.state.settings.TREADLE_OPERATOR_WEBHOOK_BUNDLE_CHECK_SECONDS
        while True:
            await asyncio.sleep(every)
            waited += every
            try:
                if waited >= CHECK_SECONDS:
                    waited = 0.0
                    await self.refresh()
                else:
                    await self._keep_bundle()
            except Exception:  # the next check tries again; the server keeps serving
                log.exception("webhook certificate or caBundle check failed")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.runner is not None:
            await self.runner.cleanup()
        for path in (self.certfile, self.keyfile):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()


async def serve(state: State) -> AdmissionServer | None:
    """The webhook, serving (``None`` when ``TREADLE_OPERATOR_WEBHOOK`` is off)."""
    if not state.settings.TREADLE_OPERATOR_WEBHOOK:
        return None
    cfg = state.settings
    if cfg.TREADLE_OPERATOR_WEBHOOK_SECRET and not cfg.TREADLE_OPERATOR_WEBHOOK_NAMESPACE:
        raise WebhookUnavailable(
            "TREADLE_OPERATOR_WEBHOOK_SECRET needs TREADLE_OPERATOR_WEBHOOK_NAMESPACE (the "
            "operator's namespace, where that Secret lives)"
        )
    server = AdmissionServer(state)
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    return server
