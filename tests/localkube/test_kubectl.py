"""Conformance with the real kubectl: a client nobody here wrote, against a running local cluster.

kubectl is /usr/bin/kubectl (1.32 here; `.ci/run` installs Debian's `kubernetes-client` where it is
missing). Every command's output is checked, and the writes that must not write (diff,
--dry-run=server) are checked against the object's resourceVersion.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuorch_localkube import LocalClusters

from .helpers import pid_alive, wait_for

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  labels: {{app: conformance}}
spec:
  backoffLimit: {backoff}
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", "echo hello from {name}"]
        resources:
          limits: {{nvidia.com/gpu: 1}}
"""

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    command: ["sleep", "30"]
    resources:
      limits: {{nvidia.com/gpu: {gpus}}}
"""


class Kubectl:
    def __init__(self, kubeconfig: Path, home: Path):
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home), "KUBECACHEDIR": str(home / "cache")}
        self.env.pop("KUBECTL_EXTERNAL_DIFF", None)
        self.dir = home

    def run(self, *args: str, ok: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([KUBECTL, *args], env=self.env, capture_output=True, text=True, timeout=30, input=stdin)
        if ok:
            assert p.returncode == 0, f"kubectl {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
        return p

    def file(self, name: str, text: str) -> str:
        path = self.dir / name
        path.write_text(text)
        return str(path)

    def jsonpath(self, kind: str, name: str, path: str) -> str:
        return self.run("get", kind, name, "-o", f"jsonpath={{{path}}}").stdout

    def wait(self, kind: str, name: str, path: str, want: str, timeout: float = 15) -> None:
        def got() -> str:  # the value when it is the one wanted ("" = not yet)
            value = self.run("get", kind, name, "-o", f"jsonpath={{{path}}}", ok=False).stdout
            return value if value == want else ""

        wait_for(got, timeout=timeout, what=f"{kind}/{name} {path} == {want!r}")


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    assert Path(KUBECTL).exists(), "kubectl is needed: apt-get install -y kubernetes-client (.ci/run does it)"
    tmp = tmp_path_factory.mktemp("kubectl")
    cfg = {"time_scale": 100, "clusters": [{"name": "conformance", "nodes": [
        {"name": "gpu", "count": 2, "gpu": {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "count": 8},
         "cpu": "32", "memory": "256Gi"}]}]}
    lcs = LocalClusters(cfg, tmp / "state")
    lcs.start()
    try:
        home = tmp / "home"
        home.mkdir()
        yield Kubectl(lcs.write_kubeconfig(tmp / "kubeconfig"), home)
    finally:
        pids = lcs["conformance"].pids()
        lcs.stop(grace=1.0)
        assert not [p for p in pids if pid_alive(p)]


def _header(out: str) -> list[str]:
    return re.split(r"\s{2,}", out.splitlines()[0].strip())


def test_version_and_server_side_tables(kubectl: Kubectl) -> None:
    v = kubectl.run("version").stdout
    assert re.search(r"Server Version: v1\.\d+\.\d+\+localkube", v), v
    nodes = kubectl.run("get", "nodes").stdout
    assert _header(nodes) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert re.search(r"^gpu-0\s+Ready\s+<none>\s+\d+s\s+v1\.37\.0\+localkube$", nodes, re.M), nodes
    wide = kubectl.run("get", "nodes", "-o", "wide").stdout
    assert _header(wide)[5:] == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
    assert "127.0.0.1" in wide
    kubectl.run("cordon", "gpu-1")
    assert re.search(r"^gpu-1\s+Ready,SchedulingDisabled", kubectl.run("get", "nodes").stdout, re.M)
    kubectl.run("uncordon", "gpu-1")
    ns = kubectl.run("get", "namespaces").stdout
    assert _header(ns) == ["NAME", "STATUS", "AGE"] and re.search(r"^default\s+Active", ns, re.M)


def test_create_get_logs_events_all_delete(kubectl: Kubectl) -> None:
    path = kubectl.file("hello.yaml", JOB.format(name="hello", backoff=0))
    out = kubectl.run("create", "-f", path)  # client-side validation on (the default): needs /openapi/v2
    assert out.stdout.strip() == "job.batch/hello created"
    kubectl.wait("job", "hello", ".status.succeeded", "1")
    jobs = kubectl.run("get", "jobs").stdout
    assert _header(jobs) == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert re.search(r"^hello\s+Complete\s+1/1\s+\d+s\s+\d+s$", jobs, re.M), jobs
    pods = kubectl.run("get", "pods", "-l", "job-name=hello").stdout
    assert _header(pods) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert re.search(r"^hello-\w{5}\s+0/1\s+Completed\s+0\s+\d+s$", pods, re.M), pods
    assert kubectl.run("logs", "job/hello").stdout == "hello from hello\n"
    events = kubectl.run("get", "events").stdout
    assert _header(events) == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    for reason, obj in (("Scheduled", "pod/hello-"), ("Started", "pod/hello-"), ("SuccessfulCreate", "job/hello"),
                        ("Completed", "job/hello")):
        assert re.search(rf"Normal\s+{reason}\s+{obj}", events), (reason, events)
    everything = kubectl.run("get", "all").stdout
    assert re.search(r"^pod/hello-\w{5}\s", everything, re.M) and re.search(r"^job\.batch/hello\s", everything, re.M), everything
    desc = kubectl.run("describe", "job", "hello").stdout
    assert re.search(r"Pods Statuses:\s+0 Active .* 1 Succeeded / 0 Failed", desc) and "SuccessfulCreate" in desc, desc
    assert kubectl.run("delete", "-f", path).stdout.strip() == 'job.batch "hello" deleted'
    gone = kubectl.run("get", "job", "hello", ok=False)
    assert gone.returncode == 1 and 'jobs.batch "hello" not found' in gone.stderr


def test_validation_and_explain(kubectl: Kubectl) -> None:
    bad = kubectl.file("bad.yaml", JOB.format(name="bad", backoff=0).replace("  backoffLimit: 0\n", "  backoffLimit: 0\n  backofLimit: 1\n"))
    out = kubectl.run("create", "-f", bad, ok=False)
    assert out.returncode == 1 and 'unknown field "backofLimit"' in out.stderr, out.stderr
    assert kubectl.run("get", "job", "bad", ok=False).returncode == 1  # nothing was created
    explain = kubectl.run("explain", "job.spec.backoffLimit").stdout
    assert re.search(r"KIND:\s+Job", explain) and re.search(r"backoffLimit\s+<integer>", explain), explain
    assert "number of retries before marking this job failed" in explain
    pods = kubectl.run("explain", "pods.spec.containers.resources").stdout
    assert re.search(r"limits\s+<map\[string\]Quantity>", pods), pods


def test_apply_diff_and_server_dry_run_change_nothing(kubectl: Kubectl) -> None:
    v1 = kubectl.file("applied.yaml", JOB.format(name="applied", backoff=0))
    v2 = kubectl.file("applied2.yaml", JOB.format(name="applied", backoff=3))
    assert kubectl.run("apply", "-f", v1).stdout.strip() == "job.batch/applied created"
    kubectl.wait("job", "applied", ".status.succeeded", "1")
    rv = kubectl.jsonpath("job", "applied", ".metadata.resourceVersion")

    same = kubectl.run("diff", "-f", v1, ok=False)
    assert same.returncode == 0 and same.stdout == "", same.stdout + same.stderr
    diff = kubectl.run("diff", "-f", v2, ok=False)
    assert diff.returncode == 1, diff.stderr  # 1: differences found
    assert re.search(r"^-  backoffLimit: 0$", diff.stdout, re.M) and re.search(r"^\+  backoffLimit: 3$", diff.stdout, re.M), diff.stdout
    dry = kubectl.run("apply", "--dry-run=server", "-f", v2).stdout.strip()
    assert dry == "job.batch/applied configured (server dry run)"
    assert kubectl.jsonpath("job", "applied", ".metadata.resourceVersion") == rv
    assert kubectl.jsonpath("job", "applied", ".spec.backoffLimit") == "0"

    new = kubectl.file("new.yaml", JOB.format(name="never-created", backoff=0))
    assert "created (server dry run)" in kubectl.run("create", "--dry-run=server", "-f", new).stdout
    assert kubectl.run("get", "job", "never-created", ok=False).returncode == 1

    assert kubectl.run("apply", "-f", v2).stdout.strip() == "job.batch/applied configured"
    assert kubectl.jsonpath("job", "applied", ".spec.backoffLimit") == "3"
    assert kubectl.jsonpath("job", "applied", ".metadata.resourceVersion") != rv
    kubectl.run("delete", "job", "applied", "--cascade=background")


def test_unschedulable_pod_shows_why_and_watch_follows(kubectl: Kubectl) -> None:
    lines: list[str] = []
    watcher = subprocess.Popen([KUBECTL, "get", "pods", "--watch"], env=kubectl.env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    reader = threading.Thread(target=lambda: lines.extend(iter(watcher.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        kubectl.run("create", "-f", kubectl.file("huge.yaml", POD.format(name="huge", gpus=64)))
        kubectl.run("create", "-f", kubectl.file("small.yaml", POD.format(name="small", gpus=1)))
        def described() -> str:  # `describe pod huge` once it shows the scheduler's event ("" = not yet)
            d = kubectl.run("describe", "pod", "huge").stdout
            return d if "FailedScheduling" in d else ""

        desc = wait_for(described, timeout=15, what="FailedScheduling in describe")
        assert re.search(r"Warning\s+FailedScheduling\s+.*default-scheduler\s+0/2 nodes are available: 2 Insufficient nvidia.com/gpu\.",
                         desc), desc
        kubectl.wait("pod", "small", ".status.phase", "Running")
        wait_for(lambda: any(re.match(r"small\s+1/1\s+Running", ln) for ln in lines), timeout=10, what="the watch shows small Running")
        assert any(re.match(r"small\s+1/1\s+Running", ln) for ln in lines), lines
        assert sum(1 for ln in lines if ln.startswith("NAME ")) == 1, lines  # one header, then rows
        assert any(re.match(r"huge\s+0/1\s+Pending", ln) for ln in lines), lines
    finally:
        watcher.terminate()
        watcher.wait(timeout=5)
    kubectl.run("delete", "pod", "huge", "small", "--grace-period=1")
    assert kubectl.run("get", "pods", ok=False).stderr.strip() == "No resources found in default namespace."


def test_protobuf_bodies_get_415(kubectl: Kubectl) -> None:
    # kubectl create job sends the Job as protobuf: a server without that codec answers 415, never 400
    out = kubectl.run("create", "job", "proto", "--image=busybox", "--", "echo", "hi", ok=False)
    assert out.returncode == 1 and "unknown format (application/vnd.kubernetes.protobuf)" in out.stderr, out.stderr
    assert kubectl.run("get", "job", "proto", ok=False).returncode == 1
