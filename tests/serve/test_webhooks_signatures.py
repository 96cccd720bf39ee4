"""Webhook signature schemes and options, checked without a server, plus the one
serve-side misconfiguration: a signature whose secret serve does not hold (issue 13
item 1)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from treadle import HmacSignature, StripeSignature, WebhookResponse, errors, webhooksig

from .conftest import StartServe
from .webhookharness import SECRET_ENV, SERVE_LIMIT, log_of, register, waiting

BODY = b'{"id": "evt_1"}'
NOW = 1_700_000_000.0


def _verify(scheme: HmacSignature | StripeSignature, header: str | None, secret: str = "s") -> None:
    headers = {} if header is None else {scheme.header.lower(): header}
    webhooksig.verify(scheme, headers, BODY, secret, now=NOW, token="hk_x", run_id="wrun_x")


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha512"])
def test_an_hmac_signature_verifies_with_each_algorithm_and_its_prefix(algorithm: str) -> None:
    scheme = HmacSignature(
        header="X-Hub-Signature", secret_env="E", algorithm=algorithm, prefix=f"{algorithm}="
    )
    good = webhooksig.sign_hmac("s", BODY, algorithm=algorithm, prefix=f"{algorithm}=")
    _verify(scheme, good)
    _verify(scheme, good.upper().replace(algorithm.upper() + "=", f"{algorithm}="))  # hex case
    with pytest.raises(errors.WebhookSignatureInvalid, match="does not match"):
        _verify(scheme, good, secret="other")


def test_a_stripe_signature_refuses_a_future_timestamp_and_takes_any_matching_v1() -> None:
    scheme = StripeSignature(secret_env="E", tolerance_seconds=60)
    now = int(NOW)
    _verify(scheme, webhooksig.sign_stripe("s", BODY, now - 59))
    with pytest.raises(errors.WebhookSignatureInvalid, match="outside the tolerance of 60 s"):
        _verify(scheme, webhooksig.sign_stripe("s", BODY, now + 120))
    old, new = (webhooksig.sign_stripe(k, BODY, now) for k in ("old", "s"))
    _verify(scheme, f"{new},{old.split(',')[1]}")
    with pytest.raises(errors.WebhookSignatureInvalid, match="is missing"):
        _verify(scheme, None)


def test_a_refusal_names_the_run_and_not_the_whole_token() -> None:
    with pytest.raises(errors.WebhookSignatureInvalid) as caught:
        webhooksig.verify(
            HmacSignature(secret_env="E"), {}, BODY, "s", now=NOW,
            token="hk_0123456789abcdef0123456789abcdef", run_id="wrun_R",
        )  # fmt: skip
    assert "wrun_R" in str(caught.value) and "0123456789abcdef" not in str(caught.value)
    assert isinstance(caught.value, errors.HookSignatureInvalid)


def test_webhook_options_refuse_what_cannot_work() -> None:
    """A secret_env that is no variable name (a secret pasted in), a non-2xx response,
    a header with a newline: each a ValidationError naming the field."""
    with pytest.raises(ValidationError, match="secret_env"):
        HmacSignature(secret_env="whsec abc/def")
    with pytest.raises(ValidationError, match="status"):
        WebhookResponse(status=500)
    with pytest.raises(ValidationError, match="header"):
        WebhookResponse(headers={"X-A": "one\r\nSet-Cookie: x"})


async def test_a_signature_secret_serve_lacks_is_500_and_records_nothing(
    start_serve: StartServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook names SECRET_ENV; serve's environment has none: 500
    ``signature_secret_missing`` naming the variable (never a stack trace), nothing
    recorded, and the run still waits (a fixed deployment takes the retry)."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    served = await start_serve(**SERVE_LIMIT)
    flows = register(served.app)
    run = await served.app.start("callback", "hmac")
    url = await flows.urls.get()
    before = await waiting(served.world, run.run_id)
    answer = await served.anonymous.post(url, content=BODY, headers={"X-Signature": "sha256=00"})
    assert answer.status_code == 500, answer.text
    err = answer.json()["error"]
    assert err["code"] == "signature_secret_missing" and SECRET_ENV in err["message"]
    assert await log_of(served.world, run.run_id) == before
    monkeypatch.setenv(SECRET_ENV, "now-set")
    signed = webhooksig.sign_hmac("now-set", BODY)
    answer = await served.anonymous.post(url, content=BODY, headers={"X-Signature": signed})
    assert answer.status_code == 202, answer.text
    assert (await run.result(timeout=20))["request"]["text"] == BODY.decode()
