"""deploy/: what every kustomization renders (`kubectl kustomize`) runs restricted and holds no
token; the Dockerfile runs as non-root. Strict schema validation of the same objects is
`tests/deploy/test_kustomize.py`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kustomize import DEPLOY, KUSTOMIZATIONS, pod_spec, render, workloads

SECRET_MODES = (0o400, 0o440, 0o444)  # owner, or the pod's group (fsGroup), may read; nobody writes


def _secret_modes(volume: dict[str, Any]) -> list[int | None]:
    if "secret" in volume:
        return [volume["secret"].get("defaultMode")]
    if "projected" in volume and any("secret" in s for s in volume["projected"]["sources"]):
        return [volume["projected"].get("defaultMode")]
    return []


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_pod_is_restricted_and_mounts_no_token(name: str) -> None:
    for w in workloads(render(name)):
        pod, where = pod_spec(w), f"{name}:{w['kind']}/{w['metadata']['name']}"
        assert pod.get("automountServiceAccountToken") is False, where
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault", where
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"], where
            assert csc["readOnlyRootFilesystem"] is True, where
        for v in pod.get("volumes", []):
            for mode in _secret_modes(v):
                assert mode in SECRET_MODES, (where, v)


def test_the_control_plane_runs_every_part() -> None:
    for overlay in ("single", "production"):
        names = {w["metadata"]["name"] for w in workloads(render(overlay))}
        assert names == {"nats", "gpuorch-topology", "gpuorch-router", "gpuorch-dispatcher", "gpuorch-fencer", "gpuorch-inventory"}


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_namespaces_enforce_the_restricted_pod_security_standard(name: str) -> None:
    namespaces = [o for o in render(name) if o["kind"] == "Namespace"]
    assert namespaces, name
    for ns in namespaces:
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted", (name, ns)


def test_the_image_runs_as_a_non_root_user_without_credentials() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "USER 10001" in text and ".nk" not in text
