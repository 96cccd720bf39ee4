"""kopf, as the operator runs it, logs in with the harness's kubeconfig and handles events.

``KopfRunner`` reads KUBECONFIG (token, insecure-skip-tls-verify) like a
developer's ``kopf run``; a create handler's patch reaches the API server.
"""

from __future__ import annotations

from pathlib import Path

from kopf.testing import KopfRunner

from .harness import WIDGET_GROUP, Kube, wait_for
from .widget_operator import SEEN

OPERATOR = Path(__file__).with_name("widget_operator.py")


def test_kopf_handler_annotates_a_new_widget(
    kube_env: Kube, namespace: str, widget_crd: str
) -> None:
    path = f"/apis/{WIDGET_GROUP}/v1/namespaces/{namespace}/widgets"
    args = ["run", "--standalone", f"--namespace={namespace}", str(OPERATOR)]
    with KopfRunner(args) as runner:
        widget = {"apiVersion": f"{WIDGET_GROUP}/v1", "kind": "Widget",
                  "metadata": {"name": "w"}, "spec": {"size": 3}}  # fmt: skip
        kube_env.rest.create(path, widget)

        def seen() -> str | None:
            annotations = kube_env.rest.get(f"{path}/w")["metadata"].get("annotations") or {}
            return annotations.get(SEEN)

        assert wait_for(seen, what="kopf's annotation") == "3"
    assert runner.exception is None, runner.output
    assert runner.exit_code == 0
