"""The admission webhook's certificates: a CA of the operator's own, kept where replicas share it.

``webhook.AdmissionServer`` calls ``Certificates.ensure`` at start and every
``webhook.CHECK_SECONDS``, and ``keep_ca_bundle`` after it:

- ``Certificates`` keeps a self-signed CA and a serving certificate for the webhook
  Service's names (``TREADLE_OPERATOR_WEBHOOK_HOSTS``) in a Secret
  (``TREADLE_OPERATOR_WEBHOOK_SECRET`` in the operator's namespace). The first replica
  that finds none makes them (with ``cryptography``: kopf's generator needs
  ``certbuilder``) and creates the Secret; the others read it; a lost create or update
  race re-reads. The serving certificate lasts ``CERT_DAYS`` and is renewed
  ``RENEW_BEFORE`` its end (or when the names change) under the same CA (``CA_DAYS``), so
  a renewal keeps the caBundle. Without a Secret name the pair lives in memory (one
  replica, a new CA per start).
- ``keep_ca_bundle`` patches the CA into every webhook of the ValidatingWebhookConfiguration
  the chart made (``TREADLE_OPERATOR_WEBHOOK_CONFIG``) when it differs, as kopf's managed
  configurations do, but never creates one: RBAC get and patch on that one name.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
from dataclasses import dataclass
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from treadle_operator.errors import WebhookUnavailable

log = logging.getLogger("treadle.operator.webhook")

CA_DAYS = 3650
CERT_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)
_KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
_JSON_PATCH: dict[str, Any] = {"_content_type": "application/json-patch+json"}
_MERGE: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


@dataclass(frozen=True)
class Material:
    """A CA and a serving certificate signed by it, PEM."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def secret_data(self) -> dict[str, str]:
        values = (self.ca_cert, self.ca_key, self.cert, self.key)
        return {k: base64.b64encode(v).decode() for k, v in zip(_KEYS, values, strict=True)}

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> Material | None:
        if not data or any(k not in data for k in _KEYS):
            return None
        try:
            ca_cert, ca_key, cert, key = (base64.b64decode(data[k]) for k in _KEYS)
        except ValueError:
            return None
        return cls(ca_cert, ca_key, cert, key)


def parse_hosts(setting: str) -> list[str]:
    """``TREADLE_OPERATOR_WEBHOOK_HOSTS`` as names; localhost and 127.0.0.1 when empty."""
    return [h.strip() for h in setting.split(",") if h.strip()] or ["localhost", "127.0.0.1"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


def issue(hosts: list[str], now: dt.datetime, ca: Material | None = None) -> Material:
    """A serving certificate for ``hosts``, signed by ``ca``'s CA (a new CA when ``None``)."""
    if ca is None:
        ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "treadle-operator-webhook-ca")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        ca_pem, ca_key_pem = ca_cert.public_bytes(serialization.Encoding.PEM), _pem_key(ca_key)
    else:
        ca_pem, ca_key_pem = ca.ca_cert, ca.ca_key
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
        loaded = serialization.load_pem_private_key(ca_key_pem, password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        ca_key = loaded
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = cert.public_bytes(serialization.Encoding.PEM)
    return Material(ca_pem, ca_key_pem, leaf, _pem_key(key))


def renewal(material: Material | None, hosts: list[str], now: dt.datetime) -> str | None:
    """Why ``material`` must be (re)issued for ``hosts`` now, or ``None`` when it serves."""
    if material is None:
        return "no certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(material.cert)
        ca = x509.load_pem_x509_certificate(material.ca_cert)
    except ValueError:
        return "the stored certificate does not parse"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"the serving certificate ends {cert.not_valid_after_utc:%Y-%m-%d}"
    if ca.not_valid_after_utc - now < RENEW_BEFORE:
        return f"the CA ends {ca.not_valid_after_utc:%Y-%m-%d}"
    if cert.issuer != ca.subject:
        return "the serving certificate is not the CA's"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "the serving certificate has no subject alternative names"
    if set(_san(hosts)) - set(names):
        return f"the serving certificate is not for all of {', '.join(hosts)}"
    return None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Certificates:
    """The webhook's CA and certificate: in a Secret shared by replicas, or in memory."""

    def __init__(self, core: client.CoreV1Api, namespace: str, secret: str, hosts: list[str]):
        self.core, self.namespace, self.secret, self.hosts = core, namespace, secret, hosts
        self._memory: Material | None = None

    async def ensure(self) -> Material:
        """The material to serve, issued (and stored) first when missing or due."""
        if not self.secret:
            why = renewal(self._memory, self.hosts, _now())
            if why is not None:
                self._memory = issue(self.hosts, _now(), self._memory)
            assert self._memory is not None
            return self._memory
        for _ in range(5):  # a replica racing us wins; read what it wrote
            found, version = await self._read()
            why = renewal(found, self.hosts, _now())
            if why is None:
                assert found is not None
                return found
            fresh = issue(self.hosts, _now(), _reusable_ca(found))
            log.info(
                "webhook certificate for %s (re)issued into Secret %s/%s: %s",
                ", ".join(self.hosts), self.namespace, self.secret, why,
            )  # fmt: skip
            if await self._write(fresh, version):
                return fresh
        raise WebhookUnavailable(
            f"cannot store the webhook certificate in Secret {self.namespace}/{self.secret}: "
            "it keeps changing under us"
        )

    async def _read(self) -> tuple[Material | None, str | None]:
        try:
            found = await self.core.read_namespaced_secret(self.secret, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None, None
            raise _explained(exc, f"Secret {self.namespace}/{self.secret}") from None
        return Material.from_secret_data(found.data), found.metadata.resource_version

    async def _write(self, material: Material, version: str | None) -> bool:
        """Create the Secret, or replace its data if still at ``version``; ``False`` on a race."""
        labels = {"app.kubernetes.io/part-of": "treadle"}
        meta: dict[str, Any] = {"name": self.secret, "labels": labels}
        try:
            if version is None:
                body = {"metadata": meta, "type": "Opaque", "data": material.secret_data()}
                await self.core.create_namespaced_secret(self.namespace, cast(Any, body))
            else:
                patch = {"metadata": {"resourceVersion": version}, "data": material.secret_data()}
                await self.core.patch_namespaced_secret(
                    self.secret, self.namespace, patch, **_MERGE
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise _explained(exc, f"Secret {self.namespace}/{self.secret}") from None
        return True


def _explained(exc: ApiException, what: str) -> Exception:
    """An API error of the webhook's own objects, in one line (RBAC named when forbidden)."""
    if exc.status == 403:
        return WebhookUnavailable(
            f"the operator may not use {what}: the chart's webhook Role and ClusterRole "
            "(permissions.webhook_namespace_rules, webhook_cluster_rules) grant it by name"
        )
    return WebhookUnavailable(f"{what}: {exc.status} {exc.reason}")


def _reusable_ca(found: Material | None) -> Material | None:
    """``found``'s CA, when it parses and lasts past the renewal margin (keeps the caBundle)."""
    if found is None:
        return None
    try:
        ca = x509.load_pem_x509_certificate(found.ca_cert)
        serialization.load_pem_private_key(found.ca_key, password=None)
    except (ValueError, TypeError):
        return None
    return found if ca.not_valid_after_utc - _now() > RENEW_BEFORE else None


async def keep_ca_bundle(api: client.ApiClient, name: str, ca_pem: bytes) -> bool:
    """Patch ``ca_pem`` into each webhook of configuration ``name``; ``True`` if it changed.

    A JSON patch with a ``test`` of the resourceVersion: a configuration changed
    meanwhile (a Helm upgrade) is patched on the next check instead of by index.
    """
    admission_api = client.AdmissionregistrationV1Api(api)
    bundle = base64.b64encode(ca_pem).decode()
    try:
        found = await admission_api.read_validating_webhook_configuration(name)
    except ApiException as exc:
        if exc.status != 404:
            raise _explained(exc, f"ValidatingWebhookConfiguration {name}") from None
        # Deleted (the escape hatch of docs/operator-admission.md) or not made yet: serve
        # anyway; the next check patches it once it exists.
        log.warning("ValidatingWebhookConfiguration %s not found: its caBundle waits", name)
        return False
    version = found.metadata.resource_version
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version}
    ]
    for index, hook in enumerate(found.webhooks or []):
        if hook.client_config.ca_bundle != bundle:
            ops.append(
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle}
            )
    if len(ops) == 1:
        return False
    try:
        await admission_api.patch_validating_webhook_configuration(name, ops, **_JSON_PATCH)
    except ApiException as exc:
        if exc.status in (409, 422):  # changed since read (the test op): the next check
            log.info("ValidatingWebhookConfiguration %s changed meanwhile: patched later", name)
            return False
        raise _explained(exc, f"ValidatingWebhookConfiguration {name}") from None
    log.info("caBundle of ValidatingWebhookConfiguration %s set to the operator's CA", name)
    return True
