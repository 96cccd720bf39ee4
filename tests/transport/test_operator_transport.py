"""The operator passes the World Secret's transport keys on, and uses them itself.

Worker pods get each optional key by reference (``secretKeyRef``) or as a file
of a read-only Secret volume, never by value; every variable they get is a
setting the worker reads. The operator's own connection, built from the same
Secret data, opens the locked-down servers as the ``operator`` NATS user and the
``treadle_operator`` Postgres role (which needs a client certificate).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from treadle import settings
from treadle.worlds.production import PostgresNatsWorld
from treadle.worlds.transport import Transport
from treadle_operator import manifests, transport
from treadle_operator.errors import WorldSecretMissing
from treadle_operator.models import WorkflowDeploymentSpec

from .certs import Pki
from .securenats import OPERATOR_PASSWORD, SecureNats
from .securepg import OPERATOR_PASSWORD as PG_OPERATOR_PASSWORD
from .securepg import SecurePostgres

ALL_KEYS = frozenset(transport.SECRET_KEYS) - {"nats-token", "nats-nkey-seed", "nats-creds"}


def deployment(keys: frozenset[str]) -> dict[str, object]:
    spec = WorkflowDeploymentSpec.model_validate(
        {"image": "img:1", "module": "app", "world": {"secretName": "w"}}
    )
    return manifests.worker_deployment(
        owner="o", owner_uid="u", namespace="ns", revision="o-1", image="img:1",
        module="app", spec=spec, role="steps", replicas=1, transport_keys=keys,
    )  # fmt: skip


def test_worker_pods_get_the_transport_keys_by_reference_and_as_mounted_files() -> None:
    made = deployment(ALL_KEYS)
    pod = made["spec"]["template"]["spec"]  # type: ignore[index]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["TREADLE_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "w",
        "key": "nats-password",
    }
    assert env["TREADLE_DATABASE_SSLMODE"]["valueFrom"]["secretKeyRef"]["key"] == (
        "database-sslmode"
    )
    assert env["TREADLE_NATS_TLS_CA"] == {
        "name": "TREADLE_NATS_TLS_CA",
        "value": "/var/run/treadle/world/nats-tls-ca",
    }
    assert env["TREADLE_DATABASE_SSLKEY"]["value"] == "/var/run/treadle/world/database-sslkey"
    # Every variable is a setting the worker reads; no value from the Secret is inline.
    assert set(env) <= set(settings.Settings.model_fields)
    (volume,) = [v for v in pod["volumes"] if "secret" in v]  # beside the /tmp emptyDir
    assert volume["secret"]["secretName"] == "w"
    assert volume["secret"]["defaultMode"] == 0o440
    files = {i["key"] for i in volume["secret"]["items"]}
    assert files == {
        "database-url", "nats-url",  # the URLs are files too (TREADLE_*_URL_FILE, R9)
        "nats-tls-ca", "nats-tls-cert", "nats-tls-key",
        "database-sslrootcert", "database-sslcert", "database-sslkey",
    }  # fmt: skip
    assert {
        "name": "treadle-world-files",
        "mountPath": "/var/run/treadle/world",
        "readOnly": True,
    } in container["volumeMounts"]


def test_a_secret_without_transport_keys_mounts_only_the_urls() -> None:
    pod = deployment(frozenset())["spec"]["template"]["spec"]  # type: ignore[index]
    # The restricted pod's /tmp (podsecurity) and the World Secret's URL files (R9); no
    # transport file among them.
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "treadle-world-files"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert {i["key"] for i in volume["secret"]["items"]} == {"database-url", "nats-url"}
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == [
        "tmp",
        "treadle-world-files",
    ]


def secret_data(secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki) -> dict[str, str]:
    """A World Secret's data, as ``Kube.secret`` returns it (decoded values)."""
    return {
        "database-url": secure_pg.dsn("treadle_operator", PG_OPERATOR_PASSWORD),
        "nats-url": secure_nats.url,
        "nats-user": "operator",
        "nats-password": OPERATOR_PASSWORD,
        "nats-tls-ca": pki.ca.read_text(),
        "nats-tls-cert": pki.client_cert.read_text(),
        "nats-tls-key": pki.client_key.read_text(),
        "database-sslmode": "verify-full",
        "database-sslrootcert": pki.ca.read_text(),
        "database-sslcert": pki.client_cert.read_text(),
        "database-sslkey": pki.client_key.read_text(),
    }


async def test_the_operator_connects_with_the_secrets_transport_keys(
    secure_pg: SecurePostgres, secure_nats: SecureNats, pki: Pki
) -> None:
    data = secret_data(secure_pg, secure_nats, pki)
    made = transport.operator_transport("ns/w", data)
    assert made.postgres.sslcert is not None and made.nats.tls_key is not None
    for path in (made.postgres.sslkey, made.nats.tls_key):
        assert path is not None
        assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(path).parent.stat().st_mode) == 0o700
    world = await PostgresNatsWorld.connect(
        made.postgres.dsn(data["database-url"]),
        data["nats-url"],
        deployment_id="treadle-operator",
        transport=Transport(nats=made.nats),
    )
    try:
        await world.runs.list(limit=1)
    finally:
        await world.close()


def test_unusable_transport_keys_are_one_error_naming_the_keys_not_the_values() -> None:
    data = {"nats-user": "operator", "nats-password": "hunter2", "database-sslmode": "yes"}
    with pytest.raises(WorldSecretMissing) as caught:
        transport.operator_transport("ns/w", data)
    message = str(caught.value)
    assert "TREADLE_DATABASE_SSLMODE must be one of" in message
    assert "database-sslmode, nats-password, nats-user" in message
    assert "hunter2" not in message


def test_the_charts_world_secret_carries_the_transport_keys() -> None:
    """``world.transport`` values land in the Secret the chart makes, keys unchanged."""
    import jsonschema
    import yaml

    from ..chart import render

    chart = Path(__file__).resolve().parents[2] / "charts" / "treadle"
    world = {
        "create": True,
        "secretName": "treadle-world",
        "databaseUrl": "postgresql://u@db:5432/t",
        "natsUrl": "tls://nats:4222",
        "transport": {
            "nats-creds": "-----BEGIN NATS USER JWT-----\nx\n",
            "database-sslmode": "verify-full",
        },
    }
    made = [m.body for m in render.render_chart(chart, {"world": world}) if m.kind == "Secret"]
    assert made[0]["stringData"]["nats-creds"] == "-----BEGIN NATS USER JWT-----\nx\n"
    assert made[0]["stringData"]["database-sslmode"] == "verify-full"
    schema = yaml.safe_load((chart / "values.schema.json").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text())
    jsonschema.validate({**values, "world": world}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {**values, "world": {**world, "transport": {"nats-pasword": "x"}}}, schema
        )
