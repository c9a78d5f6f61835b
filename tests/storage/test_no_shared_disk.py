"""No shared disk between the control plane and the pods (issue 28).

1. No Job the dispatcher builds carries a path of the control plane's state directory: where the
   registry gives every store by URL (s3://), the state directory appears nowhere; in the embedded
   default (file:// stores under the state directory), only inside the URL of a registered store,
   which the pod reaches through gpuorch's agent like any other store, never as a path it opens.
2. No control-plane module reads or writes workload data through the local filesystem: the
   services and the modules they use call no `open`, `shutil`, `iterdir`, `glob`, `os.listdir`...
   except the few reads of their own configuration listed below, each with its reason.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuorch.config import Settings, load_registry
from gpuorch.stores import store_configs
from gpuorch_dispatcher import core
from gpuorch_proto import Workload, workload_from_obj
from gpuorch_proto import events as ev

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "example.org/train@sha256:" + "ab" * 32


def workload(**spec: Any) -> Workload:
    body: dict[str, Any] = {"image": DIGEST, "command": ["python", "train.py"], "resources": {"gpus": 2, "gpu_memory_gib": 40}}
    body.update(spec)
    return workload_from_obj({"metadata": {"name": "w", "owner": "alice"}, "spec": body})


SHAPES = {
    "plain": workload(),
    "outputs and portable checkpoints": workload(output={"store": "prod"}, checkpoint={"path": "ckpt", "portable": True, "store": "ckpts"}),
    "a dataset at the cluster's own location": workload(inputs=[{"ref": "imagenet@v3", "size_gb": 100, "locations": ["east-nfs"]}]),
    "a dataset over a link": workload(inputs=[{"ref": "imagenet@v3", "size_gb": 100, "locations": ["west-nfs"]}]),
    "a gang of workers": workload(resources={"gpus": 4, "workers": 3}),
}  # fmt: skip


def registry_file(tmp: Path, by_url: bool) -> Path:
    east = {"artifact_stores": ["prod", "ckpts", "scratch"], "data_locations": ["east-nfs"], "bandwidth_mbps": {"west-nfs": 500},
            "queues": [{"name": "default", "owners": ["*"]}], "cache_claim": "datasets"}  # fmt: skip
    doc: dict[str, Any] = {"clusters": [{"name": "east", "nodes": [], "registry": east}]}
    if by_url:
        doc["stores"] = {n: {"url": f"s3://bucket/{n}", "endpoint": "https://s3.example.org", "region": "eu-west-1"}
                         for n in ("prod", "ckpts", "scratch", "east-nfs", "west-nfs")}  # fmt: skip
        east["store_credentials"] = {"prod": "s3-prod", "ckpts": "s3-prod", "scratch": "s3-prod", "east-nfs": "lake", "west-nfs": "lake"}
    path = tmp / "clusters.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings(v)


def jobs(tmp: Path, by_url: bool) -> tuple[Path, dict[str, str], list[dict[str, Any]]]:
    """Every shape's Job, fresh and resumed, and a pipeline stage reading a dependency's result,
    as the dispatcher service builds them (its environment: `store_configs` of its settings)."""
    state = tmp / "state"
    settings = Settings(state_dir=state, registry=registry_file(tmp, by_url))
    reg = load_registry(settings.registry)  # type: ignore[arg-type]
    stores = store_configs(settings, reg)
    env = core.Environment(registry=reg.clusters, stores=stores, time_scale=600)
    ck_root = env.store_url("ckpts").rstrip("/")
    dep = ev.StageInput(stage="prep", workload_id="p--prep", attempt_id="p--prep-a1",
                        result_path=f"{env.store_url('prod').rstrip('/')}/p--prep/result/manifest.json", store="prod")  # fmt: skip
    out = []
    for w in SHAPES.values():
        out.append(core.build_job(w, "w-1", "w-1-a1", 1, "east", None, env, resume_from=None))
        ck = f"{ck_root}/w-1/attempts/w-1-a1/checkpoints/ckpt.npz"
        out.append(core.build_job(w, "w-1", "w-1-a2", 2, "east", None, env, resume_from=ck, stage_inputs=[dep]))
    return state, {n: c.url for n, c in stores.items()}, out


def test_where_every_store_is_given_by_url_no_job_names_the_state_directory(tmp_path: Path) -> None:
    state, urls, built = jobs(tmp_path, by_url=True)
    assert all(u.startswith("s3://") for u in urls.values()), urls
    for job in built:
        text = json.dumps(job)
        assert str(state) not in text and str(state.resolve()) not in text, job["metadata"]["name"]
        assert str(tmp_path) not in text, job["metadata"]["name"]
        # nothing of the control plane's disk is mounted: only the pod's own volumes
        for v in job["spec"]["template"]["spec"].get("volumes", []):
            assert set(v) & {"emptyDir", "persistentVolumeClaim", "secret"} and "hostPath" not in v, v


def test_in_the_embedded_default_the_state_directory_is_only_inside_a_registered_store_url(tmp_path: Path) -> None:
    state, urls, built = jobs(tmp_path, by_url=False)
    roots = [u.rstrip("/") + "/" for u in urls.values()]
    assert all(u.startswith("file://") for u in urls.values()), urls
    where = str(state.resolve())
    checked = 0
    for job in built:
        for s in strings(job):
            at = s.find(where)
            while at >= 0:
                url_start = s.rfind("file://", 0, at)
                assert url_start >= 0 and s[url_start:at] == "file://", f"a bare path of the state directory in {s!r}"
                url = s[url_start:]
                assert any(url.startswith(r) or url + "/" in roots for r in roots), f"{url!r} is in no registered store"
                checked += 1
                at = s.find(where, at + 1)
    assert checked > 0, "the embedded stores' URLs are there to check"


def test_the_check_above_catches_a_bare_path(tmp_path: Path) -> None:
    """The rule of the test above, applied to a Job with a host path smuggled in, fails."""
    state, _, built = jobs(tmp_path, by_url=False)
    job = built[0]
    job["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "DATA", "value": str(state.resolve() / "data")})
    bare = [s for s in strings(job) if str(state.resolve()) in s and "file://" not in s]
    assert bare == [str(state.resolve() / "data")]


# --- 2. the control plane's modules ------------------------------------------------------------

#: every module of the control plane: the four services and what they import of gpuorch to run
CONTROL_PLANE = sorted(
    [*ROOT.glob("services/*/gpuorch_*/*.py")]
    + [ROOT / "gpuorch" / m for m in ("stores.py", "projection.py", "follow.py", "informer.py", "resync.py", "invariants.py", "kube.py", "client.py")]
    + [*ROOT.glob("gpuorch/observe/*.py")]
)  # fmt: skip
#: filesystem calls that would read or write workload data on the local disk
FS_ATTRS = {"iterdir", "glob", "rglob", "read_bytes", "write_bytes", "read_text", "write_text", "open", "copytree",
            "copyfile", "copy", "copy2", "listdir", "scandir", "walk", "rmtree", "mkdir", "unlink", "rename", "replace",
            "exists", "is_file", "is_dir", "stat"}  # fmt: skip
#: the reads of the processes' own configuration and telemetry files (never workload data), by
#: (module, function): what they read
ALLOWED = {
    ("services/router/gpuorch_router/service.py", "*"): "the registry and the policy file, the seed of the process's identity",
    ("gpuorch/kube.py", "contexts"): "the kubeconfig",
    ("gpuorch/kube.py", "make_client"): "the kubeconfig",
    ("gpuorch/client.py", "signature_headers"): "the process's nkey seed",
    ("gpuorch/observe/metrics.py", "*"): "the metrics endpoint's address file (the demo's scrape list)",
    ("gpuorch/observe/plots.py", "*"): "charts the operator asked for, from the events",
    ("gpuorch/observe/progress.py", "write_marker"): "runs in the pod (the program's marker), not the control plane",
    ("gpuorch/observe/progress.py", "read_marker"): "runs in the pod (gpuorch's agent), not the control plane",
    ("gpuorch/observe/progress.py", "marker_path"): "runs in the pod",
    ("gpuorch/observe/queues.py", "read_policy"): "the admission policy file the router reads (configuration)",
    ("gpuorch/observe/targets.py", "*"): "the services' metrics address files, and the scrape config it writes (telemetry)",
}


def calls(path: Path) -> Iterator[tuple[str, int, str]]:
    """(enclosing function, line, call) of every filesystem call in the module."""
    tree = ast.parse(path.read_text(), str(path))
    stack: list[str] = []

    def visit(node: ast.AST) -> Iterator[tuple[str, int, str]]:
        named = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if named:
            stack.append(node.name)  # type: ignore[union-attr]
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                yield (stack[-1] if stack else "<module>", node.lineno, "open()")
            elif isinstance(f, ast.Attribute) and f.attr in FS_ATTRS:
                base = f.value
                mod = base.id if isinstance(base, ast.Name) else ""
                if mod in ("shutil", "os") or f.attr in {"iterdir", "glob", "rglob", "read_bytes", "write_bytes", "read_text", "write_text", "copytree"}:
                    yield (stack[-1] if stack else "<module>", node.lineno, f"{ast.unparse(f)}()")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if "shutil" in names:
                yield (stack[-1] if stack else "<module>", node.lineno, "import shutil")
        for child in ast.iter_child_nodes(node):
            yield from visit(child)
        if named:
            stack.pop()

    yield from visit(tree)


def test_no_control_plane_module_reads_workload_data_through_the_local_filesystem() -> None:
    assert len(CONTROL_PLANE) > 30, CONTROL_PLANE
    found = []
    for path in CONTROL_PLANE:
        rel = path.relative_to(ROOT).as_posix()
        for fn, line, what in calls(path):
            if (rel, fn) in ALLOWED or (rel, "*") in ALLOWED:
                continue
            found.append(f"{rel}:{line} in {fn}: {what}")
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import shutil\ndef promote(a, b):\n    shutil.copytree(a, b)\n",
        "def latest(d):\n    return sorted(d.iterdir())[-1]\n",
        "def marker(p):\n    return open(p).read()\n",
        "import os\ndef ls(d):\n    return os.listdir(d)\n",
    ],
)
def test_the_scan_finds_each_kind_of_local_read(tmp_path: Path, source: str) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert list(calls(path)), source
