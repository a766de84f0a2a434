"""deploy/k8s/ is valid Kubernetes and runs the server the way DESIGN §8 says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in _documents() if doc["kind"] == kind]


@pytest.mark.parametrize("doc", _documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_resource_validates_strictly(doc: dict[str, Any]) -> None:
    # strict: unknown fields (typos) are errors too
    kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_server_deployment_is_replicated_probed_and_unprivileged() -> None:
    (deployment,) = _by_kind("Deployment")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    refs = container["envFrom"]
    sources = {ref.get("configMapRef", ref.get("secretRef"))["name"] for ref in refs}
    assert sources == {"shardstream-server"}
    assert {d["kind"] for d in _documents()} >= {"ConfigMap", "Secret", "Service", "Job"}


def test_migration_job_runs_migrate_with_the_same_configuration() -> None:
    (job,) = _by_kind("Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["shardstream", "server", "migrate"]
    (deployment,) = _by_kind("Deployment")
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == server["envFrom"]


def test_service_targets_the_deployment_pods() -> None:
    (service,) = _by_kind("Service")
    (deployment,) = _by_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_probe_timeouts_leave_room_for_a_busy_server() -> None:
    """/readyz answers 503 with its reason once the database took READY_DEADLINE_S, so the
    readiness timeout is longer than that; Kubernetes' 1 s default is not used (probes
    went unanswered for over 1 s under a 64-connection start-up load before the health
    gate, and a restart-happy liveness probe only makes an overload worse)."""
    from shardstream.server.health_gate import READY_DEADLINE_S

    (deployment,) = _by_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert ready["timeoutSeconds"] > READY_DEADLINE_S
    assert live["timeoutSeconds"] >= 2
    assert live["failureThreshold"] * live["periodSeconds"] >= 30
