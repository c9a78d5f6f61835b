"""deploy/ rendered by the real `kubectl kustomize` (kubectl has kustomize built in), and the
questions the deploy tests ask of what it renders: which objects, which containers, what
environment a container gets (env and envFrom ConfigMaps resolved as the kubelet does).

kubectl is /usr/bin/kubectl (1.32 here; `.ci/run` installs Debian's `kubernetes-client` where it
is missing). Under CI=1 a missing kubectl fails the test; elsewhere it skips with the command to
install it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"
# every kustomization a person applies: the control plane's overlays and the destination clusters'
KUSTOMIZATIONS = {
    "single": DEPLOY / "overlays" / "single",
    "production": DEPLOY / "overlays" / "production",
    "destination": DEPLOY / "destination",
    "destination-example": DEPLOY / "destination-example",
}
GPUORCH_IMAGE = "ghcr.io/gpuorch/gpuorch"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")


def kubectl() -> str:
    """The kubectl binary; a missing one fails under CI=1 and skips elsewhere."""
    found = shutil.which("kubectl") or "/usr/bin/kubectl"
    if Path(found).exists():
        return found
    msg = "kubectl is needed to render deploy/: apt-get install -y kubernetes-client (.ci/run does it)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@functools.cache
def kubectl_version() -> str:
    """kubectl's client version as `major.minor.0` (the schema version to validate against)."""
    out = subprocess.run([kubectl(), "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60, check=True)
    v = json.loads(out.stdout)["clientVersion"]
    return f"{v['major']}.{v['minor'].rstrip('+')}.0"


@functools.cache
def _render(path: Path) -> str:
    out = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {path.relative_to(DEPLOY.parent)} failed:\n{out.stderr}"
    return out.stdout


def render(name: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders for KUSTOMIZATIONS[name] (a fresh copy each call)."""
    return [d for d in yaml.safe_load_all(_render(KUSTOMIZATIONS[name])) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def config_map(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    """The data of the ConfigMap a reference names (kustomize has already put its hash in the name)."""
    data: dict[str, str] = one(objects, "ConfigMap", name).get("data") or {}
    return data


# what the kubelet would put into a variable that comes from the pod itself (valueFrom.fieldRef)
FIELD_VALUES = {"metadata.labels['apps.kubernetes.io/pod-index']": "0", "metadata.name": "pod-0"}


def container_env(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom ConfigMaps first, then `env`.
    Secrets are not rendered, so envFrom a Secret adds nothing; a fieldRef gets FIELD_VALUES."""
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        if "configMapRef" in src:
            env.update(config_map(objects, src["configMapRef"]["name"]))
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = (var.get("valueFrom") or {}).get("fieldRef")
        assert ref is not None, f"{container['name']}: {var['name']}: a valueFrom this test does not know: {var}"
        assert ref["fieldPath"] in FIELD_VALUES, f"{container['name']}: {var['name']}: fieldRef {ref['fieldPath']}"
        env[var["name"]] = FIELD_VALUES[ref["fieldPath"]]
    return env


def gpuorch_containers(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container running gpuorch's image."""
    return [(w, c) for w in workloads(objects) for c in pod_spec(w)["containers"] if c["image"].startswith(GPUORCH_IMAGE + ":")]
