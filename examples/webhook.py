"""A checkout that waits on its payment provider's callback: a webhook (issue 13).

    python examples/webhook.py

runs it all in one process: a local World and this app's worker, ``treadle serve``'s
app on 127.0.0.1 (no auth: a demo), the workflow, and a stand-in "payment provider"
that POSTs a signed callback to the webhook's URL. It needs the serve extra and httpx
(``pip install -e '.[serve,dev]'``).

Deployed, the pieces are separate: workers run ``treadle worker examples/webhook.py``
with ``TREADLE_PUBLIC_URL`` set to where callers reach serve; ``treadle serve`` runs
with ``PAYMENT_WEBHOOK_SECRET`` in its environment; the provider gets ``hook.url``
(from the ``create_payment`` step) and signs its calls with that secret.
See docs/webhooks.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

from treadle import HmacSignature, WebhookResponse, Workflows, create_webhook, webhooksig

app = Workflows()
SECRET_ENV = "PAYMENT_WEBHOOK_SECRET"
# The stand-in provider's inbox: create_payment "sends" it the callback URL.
PROVIDER_INBOX: asyncio.Queue[str] = asyncio.Queue()


@app.step
async def create_payment(order_id: str, amount: int, callback_url: str) -> str:
    """Ask the provider to charge ``amount``; it POSTs to ``callback_url`` once paid."""
    PROVIDER_INBOX.put_nowait(callback_url)
    return f"payment for {order_id} requested"


@app.workflow
async def checkout(order_id: str = "A-1", amount: int = 1200) -> dict[str, object]:
    hook = create_webhook(
        signature=HmacSignature(header="X-Signature", secret_env=SECRET_ENV),
        respond_with=WebhookResponse(status=200, body={"received": True}),
    )
    await create_payment(order_id, amount, hook.url)
    call = await hook.request(timeout="1h")
    if call is None:
        return {"order_id": order_id, "status": "no payment within an hour"}
    event = call.body if isinstance(call.body, dict) else {}
    return {
        "order_id": order_id,
        "status": event.get("status", "unknown"),
        "paid_at": call.received_at.isoformat(),
    }


async def main() -> None:
    """The demo: serve, start a checkout, play the provider, print the outcome."""
    import httpx

    from treadle.serve import settings as serve_settings
    from treadle.serve.app import Server
    from treadle.serve.context import ServeContext

    with socket.socket() as probe:  # a free port, so the URL can be set before serving
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.setdefault("TREADLE_PUBLIC_URL", f"http://127.0.0.1:{port}")
    os.environ.setdefault(SECRET_ENV, "whsec_demo-only-secret")
    world = await app.world()
    ctx = ServeContext(
        world=world, settings=app.settings, serve=serve_settings.load(), insecure_no_auth=True
    )
    server = Server(ctx, host="127.0.0.1", port=port)
    await server.start()
    try:
        run = await app.start("checkout", "A-1", 1200)
        url = await asyncio.wait_for(PROVIDER_INBOX.get(), 30)
        print(f"the provider calls back at {url}")
        body = json.dumps({"order_id": "A-1", "status": "paid"}).encode()
        signed = webhooksig.sign_hmac(os.environ[SECRET_ENV], body)
        async with httpx.AsyncClient(timeout=10) as http:
            forged = await http.post(url, content=body, headers={"X-Signature": "sha256=00"})
            print(f"a forged call: {forged.status_code} {forged.json()['error']['code']}")
            answer = await http.post(
                url,
                content=body,
                headers={"Content-Type": "application/json", "X-Signature": signed},
            )
            print(f"the signed call: {answer.status_code} {answer.json()}")
        print(f"run {run.run_id}: {await run.result(timeout=30)}")
    finally:
        await server.stop()
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
