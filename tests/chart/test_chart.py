"""The Helm chart (DESIGN.md section 6): operator Deployment, least-privilege RBAC, CRDs.

The chart is rendered by ``render.py`` (Helm's Go-template subset the chart keeps to), so
these run without Helm; where a ``helm`` binary exists, ``helm lint`` and ``helm template``
are run too and must agree with the renderer.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from treadle_operator import permissions

from . import render

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"
CRD_TEMPLATES = CHART / "templates" / "crds"
CRD_NAMES = {
    "workflowdeployments.treadle.dev",
    "workflowruns.treadle.dev",
    "workflowsignals.treadle.dev",
    "workflowschedules.treadle.dev",
}
WORLD = {"create": True, "databaseUrl": "postgresql://u:p@db:5432/t", "natsUrl": "nats://n:4222"}


USER_ROLE = "UserClusterRole"  # how _by_kind files the users' aggregated ClusterRoles


def _by_kind(overrides: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The rendered objects by kind; the leader-election Role and binding apart, as
    ``LeaderRole`` and ``LeaderRoleBinding`` (tests/chart/test_chart_leader.py), and the
    users' aggregated ClusterRoles (``rbac.userRoles``, which grant the operator nothing)
    under ``USER_ROLE``."""
    found: dict[str, list[dict[str, Any]]] = {}
    for manifest in render.render_chart(CHART, overrides):
        if manifest.body["metadata"]["name"].endswith("-webhook"):
            continue  # the admission webhook's own objects: tests/chart/test_webhook.py
        leader = manifest.body["metadata"]["name"].endswith("-operator-leader")
        labels = manifest.body.get("metadata", {}).get("labels") or {}
        aggregated = any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in labels)
        if leader:
            kind = f"Leader{manifest.kind}"
        elif manifest.kind == "ClusterRole" and aggregated:
            kind = USER_ROLE
        else:
            kind = manifest.kind
        found.setdefault(kind, []).append(manifest.body)
    return found


def _one(overrides: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    objects = _by_kind(overrides).get(kind, [])
    assert len(objects) == 1, f"expected one {kind}, rendered {len(objects)}"
    return objects[0]


def _normalised(rules: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], ...]]:
    return sorted(
        (
            tuple(sorted(r["apiGroups"])),
            tuple(sorted(r["resources"])),
            tuple(sorted(r["verbs"])),
            tuple(sorted(r.get("resourceNames") or ())),
        )
        for r in rules
    )


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return schema


def test_default_install_renders_the_operator_its_account_and_its_rbac() -> None:
    """With default values: one operator Deployment, ServiceAccount, ClusterRole, binding."""
    kinds = _by_kind()
    for kind in ("Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert len(kinds.get(kind, [])) == 1, f"{kind}: {len(kinds.get(kind, []))} rendered"
    assert "Secret" not in kinds
    assert "Role" not in kinds and "RoleBinding" not in kinds


def test_cluster_role_grants_exactly_the_operator_permissions() -> None:
    """The ClusterRole's rules equal treadle_operator.permissions: nothing missing, no extra."""
    role = _one(None, "ClusterRole")
    expected = [rule.as_manifest() for rule in permissions.cluster_rules()]
    assert _normalised(role["rules"]) == _normalised(expected)
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
    assert "aggregationRule" not in role


def test_cluster_scope_reads_only_the_world_secrets_it_is_told() -> None:
    """Review M5: no `get` on every Secret; only the names in rbac.worldSecretNames."""
    role = _one(None, "ClusterRole")
    (secrets,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets == {
        "apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
        "resourceNames": ["treadle-world"],
    }  # fmt: skip
    names = ["orders-world", "billing-world"]
    role = _one({"rbac": {"worldSecretNames": names}}, "ClusterRole")
    expected = [rule.as_manifest() for rule in permissions.cluster_rules(tuple(names))]
    assert _normalised(role["rules"]) == _normalised(expected)


NAMESPACED = {"rbac": {"scope": "namespace", "namespaces": ["team-a", "team-b"]}}


def test_namespace_scope_renders_a_role_per_watched_namespace_and_nothing_cluster_wide() -> None:
    """Review M5: rbac.scope namespace: Roles and RoleBindings in the watched namespaces only."""
    kinds = _by_kind(NAMESPACED)
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    roles, bindings = kinds["Role"], kinds["RoleBinding"]
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    expected = [rule.as_manifest() for rule in permissions.namespace_rules()]
    account = kinds["ServiceAccount"][0]["metadata"]["name"]
    for role, binding in zip(roles, bindings, strict=True):
        assert _normalised(role["rules"]) == _normalised(expected)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": role["metadata"]["name"],
        }  # fmt: skip
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "treadle-system"}
        ]
        assert role["metadata"]["labels"]["app.kubernetes.io/instance"] == "treadle"


def test_namespace_scope_starts_the_operator_with_those_namespaces() -> None:
    (container,) = _one(NAMESPACED, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["operator", "--namespace", "team-a", "--namespace", "team-b"]


def test_world_hosts_reach_the_operator_as_its_allowlist() -> None:
    """Review L6: worldHosts becomes TREADLE_OPERATOR_WORLD_HOSTS; unset by default."""
    (container,) = _one(None, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert all(e["name"] != "TREADLE_OPERATOR_WORLD_HOSTS" for e in container["env"])
    overrides = {"worldHosts": ["db.internal", "nats.internal:4222"]}
    (container,) = _one(overrides, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "TREADLE_OPERATOR_WORLD_HOSTS", "value": "db.internal,nats.internal:4222,"} in (
        container["env"]
    )


def test_binding_gives_the_role_to_the_operator_service_account() -> None:
    """The binding names the rendered ClusterRole and the account the operator pod runs as."""
    kinds = _by_kind()
    role, binding = kinds["ClusterRole"][0], kinds["ClusterRoleBinding"][0]
    account, deployment = kinds["ServiceAccount"][0], kinds["Deployment"][0]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": "treadle-system",
        }
    ]
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )


def test_an_existing_service_account_is_used_and_not_created() -> None:
    """serviceAccount.create=false renders no ServiceAccount and binds the one named."""
    overrides = {"serviceAccount": {"create": False, "name": "platform-operator"}}
    kinds = _by_kind(overrides)
    assert "ServiceAccount" not in kinds
    assert kinds["ClusterRoleBinding"][0]["subjects"][0]["name"] == "platform-operator"
    pod = kinds["Deployment"][0]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-operator"


def test_operator_deployment_runs_treadle_operator_locked_down() -> None:
    """One replica of `treadle operator`, image and log level from values, no privileges."""
    overrides = {
        "image": {"repository": "registry.example/treadle", "tag": "42"},
        "logLevel": "DEBUG",
    }
    deployment = _one(overrides, "Deployment")
    assert deployment["metadata"]["namespace"] == "treadle-system"
    assert deployment["spec"]["replicas"] == 1
    # Leader election makes an overlap safe (test_chart_leader.py): a standby first.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/treadle:42"
    assert container["args"] == ["operator"]
    assert {"name": "TREADLE_LOG_LEVEL", "value": "DEBUG"} in container["env"]
    assert container["resources"] == render.chart_values(CHART)["resources"]
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_image_tag_defaults_to_the_chart_app_version() -> None:
    """An empty image.tag means the appVersion of Chart.yaml."""
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    (container,) = _one(None, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"treadle:{app_version}"


def test_world_secret_is_rendered_only_when_asked() -> None:
    """world.create renders a Secret with database-url and nats-url; off by default."""
    assert "Secret" not in _by_kind()
    secret = _one({"world": {**WORLD, "secretName": "orders-world"}}, "Secret")
    assert secret["metadata"]["name"] == "orders-world"
    assert secret["metadata"]["namespace"] == "treadle-system"
    assert secret["stringData"] == {
        "database-url": WORLD["databaseUrl"],
        "nats-url": WORLD["natsUrl"],
    }


def _crd_templates() -> list[Path]:
    found = sorted(CRD_TEMPLATES.glob("*.yaml")) if CRD_TEMPLATES.is_dir() else []
    if not found:
        pytest.skip(f"no CRD templates yet: `treadle crds` has not written {CRD_TEMPLATES}")
    return found


@pytest.mark.parametrize("keep", [True, False])
def test_crds_follow_install_and_keep(keep: bool) -> None:
    """crds.install renders both CRDs (none when false); crds.keep adds the keep policy."""
    _crd_templates()
    installed = _by_kind({"crds": {"install": True, "keep": keep}})
    crds = {crd["metadata"]["name"]: crd for crd in installed["CustomResourceDefinition"]}
    assert set(crds) == CRD_NAMES
    for crd in crds.values():
        annotations = crd["metadata"].get("annotations") or {}
        assert (annotations.get("helm.sh/resource-policy") == "keep") is keep
    skipped = _by_kind({"crds": {"install": False, "keep": keep}})
    assert "CustomResourceDefinition" not in skipped


def test_default_values_validate_against_the_schema() -> None:
    """values.yaml as shipped, and with a World secret asked for, meet values.schema.json."""
    jsonschema.validate(render.chart_values(CHART), _schema())
    jsonschema.validate(render.chart_values(CHART, {"world": WORLD}), _schema())


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"replicas": 2}, "replicas"),
        ({"crds": {"install": "yes"}}, "install"),
        ({"logLevel": "LOUD"}, "LOUD"),
        ({"image": {"pullPolicy": "Sometimes"}}, "Sometimes"),
        ({"world": {"create": True, "natsUrl": "nats://n:4222"}}, "databaseUrl"),
        ({"serviceAccount": {"create": False}}, "name"),
        ({"rbac": {"scope": "namespaces"}}, "namespaces"),
        ({"rbac": {"scope": "namespace"}}, "namespaces"),
        ({"rbac": {"worldSecretNames": []}}, "worldSecretNames"),
        ({"extraEnv": [{"value": "1"}]}, "name"),
        ({"extraEnv": [{"name": "A", "value": 1}]}, "value"),
        ({"extraEnv": [{"name": "A", "valu": "1"}]}, "valu"),
        ({"priorityClassName": "High Priority"}, "priorityClassName"),
        ({"rbac": {"userRoles": "yes"}}, "userRoles"),
    ],
    ids=[
        "unknown-key",
        "install-not-bool",
        "log-level",
        "pull-policy",
        "world-url",
        "no-sa",
        "scope",
        "no-namespaces",
        "no-secret-names",
        "extra-env-no-name",
        "extra-env-value-type",
        "extra-env-unknown-key",
        "priority-class",
        "user-roles-not-bool",
    ],
)
def test_schema_rejects_bad_values(overrides: dict[str, Any], names: str) -> None:
    """A wrong value is refused by values.schema.json, and the error names it."""
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(render.chart_values(CHART, overrides), _schema())
    assert names in str(refused.value.message) + str(list(refused.value.path))


def test_renderer_follows_go_template_semantics() -> None:
    """Trimming, emptiness, range/else, default, quote, define/include and nindent as in Helm."""
    source = (
        'a:{{- " b" }}\n'
        "{{- if .x }} yes{{ else }} no{{ end }}\n"
        "{{ range .l }}[{{ . }}]{{ else }}none{{ end }}{{ range .missing }}x{{ else }}-{{ end }}\n"
        '{{ default "d" .missing }} {{ .n | quote }} {{ true | quote }} {{ .n | default "d" }}\n'
        '{{- define "p" }}P={{ . }}{{ end }}\n'
        '{{ include "p" .n | nindent 2 }}\n'
        "{{/* gone */ -}}\n   end"
    )
    dot = {"x": 0, "l": [1, "z"], "n": "v"}
    rendered = render.render_template(source, dot)
    assert rendered == 'a: b no\n[1][z]-\nd "v" "true" v\n\n  P=v\nend'
    # `$` is the top-level context inside a range; eq compares.
    source = '{{ range .l }}{{ . }}/{{ $.n }}{{ include "p" $.n }} {{ end }}'
    source += '{{ if eq .n "v" }}eq{{ end }}'
    source += '{{- define "p" }}P={{ . }}{{ end }}'
    assert render.render_template(source, dot) == "1/vP=v z/vP=v eq"


def test_renderer_refuses_what_is_outside_the_subset(tmp_path: Path) -> None:
    """A template using an unsupported function fails with its file and line, not silently."""
    shutil.copytree(CHART, tmp_path / "chart")
    extra = tmp_path / "chart" / "templates" / "extra.yaml"
    extra.write_text("kind: ConfigMap\ndata:\n  a: {{ .Values.logLevel | upper }}\n")
    with pytest.raises(render.TemplateError, match=r"templates/extra.yaml:3: 'upper'"):
        render.render_chart(tmp_path / "chart")


def _helm(*argv: str) -> subprocess.CompletedProcess[str]:
    helm = shutil.which("helm")
    if helm is None:
        pytest.skip("helm is not installed: the chart is checked by tests/chart/render.py only")
    return subprocess.run([helm, *argv], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"world": WORLD},
        {"crds": {"install": False}},
        {"serviceAccount": {"create": False, "name": "x"}},
        NAMESPACED,
        {"worldHosts": ["db.internal"]},
        {"extraEnv": [{"name": "A", "value": "1"}], "priorityClassName": "high"},
        {"rbac": {"userRoles": False}},
        {"serve": {"enabled": True, "auth": {"secretName": "serve-tokens"}}},
    ],
    ids=[
        "defaults",
        "world-secret",
        "no-crds",
        "own-account",
        "namespaced",
        "world-hosts",
        "extra-env",
        "no-user-roles",
        "serve",
    ],
)
def test_helm_lint_and_template_agree_with_the_renderer(
    overrides: dict[str, Any], tmp_path: Path
) -> None:
    """Where helm exists: lint passes and `helm template` renders what render.py renders."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(overrides))
    lint = _helm("lint", "--strict", str(CHART), "-f", str(values))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = _helm(
        "template", "treadle", str(CHART), "--namespace", "treadle-system", "-f", str(values)
    )
    assert rendered.returncode == 0, rendered.stderr
    by_helm = [body for body in yaml.safe_load_all(rendered.stdout) if body]
    ours = [manifest.body for manifest in render.render_chart(CHART, overrides)]

    def key(body: dict[str, Any]) -> tuple[str, str]:
        return body["kind"], body["metadata"]["name"]

    assert sorted(by_helm, key=key) == sorted(ours, key=key)


def test_extra_env_follows_the_charts_own_operator_variables() -> None:
    """Review R13: extraEnv tunes the TREADLE_OPERATOR_* intervals (values and valueFrom)."""
    extra = [
        {"name": "TREADLE_OPERATOR_RECONCILE_SECONDS", "value": "10"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    (container,) = _one({"extraEnv": extra}, "Deployment")["spec"]["template"]["spec"]["containers"]
    (plain,) = _one(None, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "TREADLE_LOG_LEVEL", "value": "INFO"} in plain["env"]
    assert container["env"] == [*plain["env"], *extra], "extraEnv comes last, so it wins"


def test_priority_class_name_reaches_the_operator_pod_only_when_set() -> None:
    """Review R13: priorityClassName."""
    pod = _one({"priorityClassName": "platform-critical"}, "Deployment")["spec"]["template"]
    assert pod["spec"]["priorityClassName"] == "platform-critical"
    assert "priorityClassName" not in _one(None, "Deployment")["spec"]["template"]["spec"]


def test_user_roles_aggregate_into_view_and_edit_with_the_userroles_rules() -> None:
    """Review section 1 (user-facing RBAC): view and edit ClusterRoles for the CRDs, labelled
    for the built-in roles' aggregation, bound to nobody, in either rbac.scope."""
    from treadle_operator import userroles

    for overrides in (None, NAMESPACED):
        kinds = _by_kind(overrides)
        roles = {r["metadata"]["name"]: r for r in kinds[USER_ROLE]}
        assert sorted(roles) == ["treadle-edit", "treadle-view"]
        view, edit = roles["treadle-view"], roles["treadle-edit"]
        assert view["metadata"]["labels"][userroles.VIEW_LABEL] == "true"
        assert edit["metadata"]["labels"][userroles.EDIT_LABEL] == "true"
        assert _normalised(view["rules"]) == _normalised(
            [r.as_manifest() for r in userroles.VIEW_RULES]
        )
        assert _normalised(edit["rules"]) == _normalised(
            [r.as_manifest() for r in userroles.EDIT_RULES]
        )
        assert not any("/status" in res for r in edit["rules"] for res in r["resources"])
        for binding in [*kinds.get("ClusterRoleBinding", []), *kinds.get("RoleBinding", [])]:
            assert binding["roleRef"]["name"] not in roles
    assert USER_ROLE not in _by_kind({"rbac": {"userRoles": False}})
