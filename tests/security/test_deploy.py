"""deploy/: every Kubernetes manifest passes strict validation; the Dockerfile runs as non-root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"


def _is_manifest(path: Path) -> bool:
    """A Kubernetes manifest (every document has apiVersion and kind), not a clusters file."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return bool(docs) and all(isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in docs)


MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if _is_manifest(p))


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_passes_kubernetes_validate_strict(manifest: Path) -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet", str(manifest)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def _pods(doc: dict) -> list[dict]:
    spec = doc.get("spec") or {}
    if doc.get("kind") in ("Deployment", "StatefulSet", "Job"):
        return [spec["template"]["spec"]]
    return []


def test_every_pod_is_restricted_and_mounts_no_token() -> None:
    seen = 0
    for manifest in MANIFESTS:
        for doc in yaml.safe_load_all(manifest.read_text()):
            for pod in _pods(doc or {}):
                seen += 1
                name = f"{manifest.name}:{doc['metadata']['name']}"
                assert pod.get("automountServiceAccountToken") is False, name
                sc = pod["securityContext"]
                assert sc["runAsNonRoot"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault", name
                for c in pod["containers"]:
                    csc = c["securityContext"]
                    assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"], name
                    assert csc["readOnlyRootFilesystem"] is True, name
                for v in pod.get("volumes", []):
                    if "secret" in v:
                        assert v["secret"].get("defaultMode") in (0o400, 0o444), (name, v)
    assert seen >= 6
    assert {"control-plane.yaml", "destination-rbac.yaml", "nats.yaml"} <= {m.name for m in MANIFESTS}


def test_namespaces_enforce_the_restricted_pod_security_standard() -> None:
    for manifest in MANIFESTS:
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc and doc.get("kind") == "Namespace":
                assert doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted", manifest


def test_the_image_runs_as_a_non_root_user_without_credentials() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "USER 10001" in text and ".nk" not in text
