"""Local-cluster API benchmark: Job creates/s with 0 / 1,000 / 10,000 pods pending, list and watch latency.

For each backlog level a fresh local cluster (``python -m gpuorch_localkube serve``, its own
process, so the client here does not share its interpreter) gets 4 nodes x 8 GPUs, then the
backlog: Jobs whose pods ask for 16 GPUs, more than any node has, so every pod stays Pending
(unschedulable, not suspended: the scheduler keeps them in its queue and the Job controller keeps
them counted). Then, from the official ``kubernetes`` client with ``THREADS`` threads (one pooled
connection each), ``creates`` single-pod Jobs of the same unschedulable shape are POSTed, each
response read in full (``_preload_content=False``: the bench measures the server, not the
client's model deserialisation), and timed:

* ``creates/s``: creates over the wall time of the burst, and its ratio to the same burst at 0
  pending, measured in the same run;
* ``controller lag``: after the last create returned, until every created Job has its pod
  (the Job controller is decoupled from requests, so this is where a slow reconcile shows);
* ``list`` latency (median of 20): pods of one Job by label selector (what gpuorch's dispatcher
  and fencer ask), and every Job of the namespace;
* ``watch`` latency (median of 20): a Job created while a watch on its namespace is open, from the
  POST to the ``ADDED`` event on the watch.

``--followers N`` measures the load the end-to-end system puts on a cluster instead: N Jobs shaped
like the dispatcher's (its labels, environment and security context, 1 GPU, ``sleep``) on 5 nodes
x 8 GPUs, so 40 run as processes and the rest stay Pending, POSTed by 4 client threads while the
services' five informers follow the cluster (``gpuorch.informer``: the dispatcher's Jobs and pods,
the fencer's Jobs, inventory's nodes and every pod; list, then 4-second watches with bookmarks).
Figure: the server's CPU per Job (its pods' processes included) until every Job's status and every
pod's scheduling reached the informers.

``python -m gpuorch.dev.bench.localkube [--levels 0,1000,10000] [--creates 2000] [--threads 16]
[--followers N]`` runs it alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from gpuorch.dev.bench.rows import Row

NAMESPACE = "bench"
THREADS = 16
BACKLOG_JOB_PODS = 1000  # a 10,000-pod backlog is 10 Jobs of parallelism 1,000




def cluster_config(path: Path, nodes: int = 4, time_scale: float = 1, history: int = 50_000) -> Path:
    cfg = {
        "time_scale": time_scale,
        "clusters": [{
            "name": "bench",
            "watch_history": history,
            "nodes": [{
                "name": "gpu", "count": nodes, "pool": "train", "cpu": "256", "memory": "2048Gi",
                "gpu": {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "count": 8},
            }],
        }],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


MANAGED = "gpuorch.io/managed=true"


def dispatcher_job(i: int, namespace: str) -> dict[str, Any]:
    """A Job shaped like the dispatcher's (gpuorch_dispatcher.core): 1 GPU, `sleep`, its labels and env."""
    wid = f"b{i}-{uuid.uuid4().hex[:10]}"
    att = f"{wid}-a1"
    labels = {"gpuorch.io/managed": "true", "gpuorch.io/workload": wid, "gpuorch.io/attempt": att,
              "gpuorch.io/epoch": "1", "gpuorch.io/queue": "default"}
    ann = {"gpuorch.io/expected-duration-seconds": "36000"}
    out = f"/tmp/bench/stores/prod/{wid}/attempts/{att}"
    env = {"GPUORCH_ATTEMPT_ID": att, "GPUORCH_CHECKPOINT_DIR": f"{out}/checkpoints", "GPUORCH_EPOCH": "1",
           "GPUORCH_OUTPUT_DIR": out, "GPUORCH_WORKERS": "1", "GPUORCH_WORKLOAD_ID": wid,
           "TRACEPARENT": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-02"}
    limits = {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"}
    secure = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": att, "namespace": namespace, "labels": labels, "annotations": ann},
        "spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": dict(labels), "annotations": dict(ann)},
                "spec": {
                    "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "main", "image": "example.org/bench/sleep@sha256:" + "be" * 32,
                        "command": ["sleep"], "args": ["100000000"],
                        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
                        "resources": {"limits": dict(limits), "requests": dict(limits)},
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, **secure},
                    }],
                    "automountServiceAccountToken": False,
                    "securityContext": dict(secure),
                },
            },
        },
    }


def job_body(name: str, pods: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job whose pods ask for 16 GPUs on 8-GPU nodes: created, never schedulable."""
    labels = {"gpuorch.io/workload": name, **(labels or {})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"gpuorch.io/pool": "train"},
                    "containers": [{
                        "name": "main", "image": "localkube/sleep", "command": ["sleep", "3600"],
                        "resources": {"limits": {"nvidia.com/gpu": "16", "cpu": "1", "memory": "1Gi"}},
                    }],
                },
            },
        },
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_with_children(pid: int) -> float:
    """CPU of a process and its live direct children (the pods' processes), as the end-to-end bench counts it."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                rest = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(entry.name) == pid or int(rest[1]) == pid:
                total += (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextlib.contextmanager
def serve(root: Path, config: Path | None = None) -> Iterator[tuple[str, int]]:
    """One local cluster in its own process; yields its URL and pid."""
    state = root / f"state-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    config = config or cluster_config(root / "clusters.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuorch_localkube", "serve", "--config", str(config),
         "--state-dir", str(state), "--log-level", "WARNING", "--grace", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("localkube ready"):
                break
        else:
            raise RuntimeError("localkube exited before it was ready")
        url = json.loads((state / "admin.json").read_text())["clusters"]["bench"]
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
        yield str(url), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _client(url: str, threads: int) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    cfg.connection_pool_maxsize = threads + 4
    return client.ApiClient(cfg)


def _count_pods(core: Any, selector: str | None = None) -> int:
    resp = core.list_namespaced_pod(NAMESPACE, label_selector=selector, _preload_content=False)
    return len(json.loads(resp.data)["items"])


def _wait_pods(core: Any, want: int, timeout: float, selector: str | None = None) -> float:
    """Seconds until the namespace holds `want` pods (a bench polling, not a test waiting)."""
    t0 = time.perf_counter()
    while _count_pods(core, selector) < want:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{want} pods not created within {timeout:.0f}s")
        time.sleep(0.2)
    return time.perf_counter() - t0


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def measure(url: str, pid: int, backlog: int, creates: int, threads: int, timeout: float) -> dict[str, float]:
    from kubernetes import client, watch

    api = _client(url, threads)
    batch: Any = client.BatchV1Api(api)
    core: Any = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    t0 = time.perf_counter()
    left, i = backlog, 0
    while left > 0:
        n = min(BACKLOG_JOB_PODS, left)
        batch.create_namespaced_job(NAMESPACE, job_body(f"backlog-{i}", n, {"bench": "backlog"}), _preload_content=False)
        left, i = left - n, i + 1
    if backlog:
        _wait_pods(core, backlog, timeout, selector="bench=backlog")
    setup = time.perf_counter() - t0

    def one(k: int) -> float:
        s = time.perf_counter()
        resp = batch.create_namespaced_job(NAMESPACE, job_body(f"c-{k}", 1, {"bench": "create"}), _preload_content=False)
        resp.read()
        return time.perf_counter() - s

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(min(threads, creates))))  # warm the connections
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        lat = sorted(pool.map(one, range(threads, creates + threads)))
        wall = time.perf_counter() - t0
    # the burst's pods only (a label selector list): listing every pod of a 10,000 backlog every
    # 0.2 s cost the server more than the burst itself and was counted as its CPU
    lag = _wait_pods(core, creates + min(threads, creates), timeout, selector="bench=create")
    cpu = cpu_seconds(pid) - cpu0  # the server's CPU for the burst and the controllers catching up
    print(f"# localkube {backlog} pending: {creates / wall:.1f} creates/s, controller lag {lag:.2f}s", file=sys.stderr)

    list_one, list_jobs = [], []
    for k in range(20):
        s = time.perf_counter()
        core.list_namespaced_pod(NAMESPACE, label_selector=f"gpuorch.io/workload=c-{threads + k}", _preload_content=False).read()
        list_one.append(time.perf_counter() - s)
        s = time.perf_counter()
        batch.list_namespaced_job(NAMESPACE, _preload_content=False).read()
        list_jobs.append(time.perf_counter() - s)

    watch_lat: list[float] = []
    for k in range(20):
        name = f"w-{k}"
        rv = json.loads(batch.list_namespaced_job(NAMESPACE, limit=1, _preload_content=False).data)["metadata"]["resourceVersion"]
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        stream = w.stream(batch.list_namespaced_job, NAMESPACE, resource_version=rv, timeout_seconds=30,
                          label_selector=f"gpuorch.io/workload={name}")
        sent = [0.0]

        def post(n: str = name, sent: list[float] = sent) -> None:
            sent[0] = time.perf_counter()
            batch.create_namespaced_job(NAMESPACE, job_body(n, 1, {"bench": "watch"}), _preload_content=False).read()

        poster = threading.Timer(0.05, post)
        poster.start()
        for event in stream:
            if event["type"] == "ADDED" and event["object"].metadata.name == name:
                watch_lat.append(time.perf_counter() - sent[0])
                break
        w.stop()
        poster.join()
    api.close()
    return {
        "setup_s": setup,
        "rate": creates / wall,
        "cpu_ms": cpu / creates * 1000,
        "share": cpu / (wall + lag),
        "p50_ms": _median_ms(lat),
        "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000,
        "lag_s": lag,
        "list_one_ms": _median_ms(list_one),
        "list_jobs_ms": _median_ms(list_jobs),
        "jobs_listed": float(backlog // BACKLOG_JOB_PODS + creates + threads),
        "watch_ms": _median_ms(watch_lat),
    }


def measure_followers(url: str, pid: int, creates: int, threads: int = 4, timeout: float = 600) -> dict[str, float]:
    """`creates` dispatcher-shaped Jobs while the services' five informers follow the cluster."""
    from kubernetes import client

    from gpuorch.informer import Informer

    ns = "gpuorch"
    clients = [_client(url, 4) for _ in range(4)]  # the creator, then the dispatcher's, the fencer's and inventory's
    batch: list[Any] = [client.BatchV1Api(c) for c in clients]
    core: list[Any] = [client.CoreV1Api(c) for c in clients]
    core[0].create_namespace({"metadata": {"name": ns}})
    informers = [
        Informer("bench", batch[1].list_namespaced_job, namespace=ns, label_selector=MANAGED),
        Informer("bench", core[1].list_namespaced_pod, namespace=ns, label_selector=MANAGED),
        Informer("bench", batch[2].list_namespaced_job, namespace=ns, label_selector=MANAGED),
        Informer("bench", core[3].list_node),
        Informer("bench", core[3].list_pod_for_all_namespaces),
    ]
    for inf in informers:
        inf.start()
    for inf in informers:
        inf.synced.wait(30)
    bodies = [dispatcher_job(i, ns) for i in range(creates)]

    def one(body: dict[str, Any]) -> None:
        batch[0].create_namespaced_job(ns, body, _preload_content=False).read()

    def settled() -> bool:
        jobs = informers[2].items()
        pods = informers[4].items()
        placed = sum(1 for p in pods if any(c.get("type") == "PodScheduled" for c in (p.get("status") or {}).get("conditions") or ()))
        return len(jobs) >= creates and all((j.get("status") or {}).get("active") for j in jobs) and placed >= creates

    cpu0, t0 = cpu_with_children(pid), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, bodies))
    wall = time.perf_counter() - t0
    deadline = time.monotonic() + timeout
    while not settled():
        if time.monotonic() > deadline:
            raise TimeoutError("the informers did not see every Job active and every pod placed")
        time.sleep(0.1)
    lag = time.perf_counter() - t0 - wall
    cpu = cpu_with_children(pid) - cpu0
    for inf in informers:
        inf.stop()
    for c in clients:
        c.close()
    print(f"# localkube followers: {creates} creates, {1000 * cpu / creates:.2f} ms server CPU each", file=sys.stderr)
    return {"rate": creates / wall, "cpu_ms": 1000 * cpu / creates, "lag_s": lag,
            "watches": float(sum(i.watches for i in informers)), "lists": float(sum(i.lists for i in informers))}


def run_followers(creates: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-lk-") as tmp:
        config = cluster_config(Path(tmp) / "followers.yaml", nodes=5, time_scale=600, history=5000)
        with serve(Path(tmp), config) as (url, pid):
            f = measure_followers(url, pid, creates)
    case = f"{creates:,} with followers"
    return [
        Row("localkube", case, "Job creates (4 threads, 5 informers following)", f["rate"], "creates/s"),
        Row("localkube", case, "server CPU per Job (API, controllers, watches, pod processes)", f["cpu_ms"], "ms"),
        Row("localkube", case, "until the informers saw every Job active and every pod placed", f["lag_s"], "s after the burst"),
        Row("localkube", case, "watch calls / lists by the informers", f["watches"], f"watches ({f['lists']:.0f} lists)"),
    ]


def run(quick: bool = False, levels: list[int] | None = None, creates: int | None = None, threads: int = THREADS) -> list[Row]:
    levels = levels if levels is not None else ([0, 1000] if quick else [0, 1000, 10_000])
    creates = creates if creates is not None else (300 if quick else 2000)
    rows: list[Row] = []
    base: float | None = None
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-lk-") as tmp:
        for level in levels:
            with serve(Path(tmp)) as (url, pid):
                f = measure(url, pid, level, creates, threads, timeout=600)
            print(f"# localkube {level} pending: {f}", file=sys.stderr)
            base = f["rate"] if base is None else base
            case = f"{level:,} pending"
            rows += [
                Row("localkube", case, f"Job creates ({threads} threads)", f["rate"], "creates/s"),
                Row("localkube", case, "ratio to the first level", f["rate"] / base, "x"),
                Row("localkube", case, "server CPU per create (API + controllers)", f["cpu_ms"], "ms"),
                Row("localkube", case, "creates per server CPU-second", 1000 / f["cpu_ms"], "creates/s"),
                Row("localkube", case, "server's share of a core in the burst", f["share"], "cores"),
                Row("localkube", case, "create latency p50", f["p50_ms"], "ms"),
                Row("localkube", case, "create latency p99", f["p99_ms"], "ms"),
                Row("localkube", case, "controller lag after the burst", f["lag_s"], "s"),
                Row("localkube", case, "list pods of one Job (label selector)", f["list_one_ms"], "ms"),
                Row("localkube", case, f"list all {f['jobs_listed']:,.0f} Jobs", f["list_jobs_ms"], "ms"),
                Row("localkube", case, "watch: POST -> ADDED", f["watch_ms"], "ms"),
                Row("localkube", case, "backlog setup", f["setup_s"], "s"),
            ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.localkube", description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="0,1000,10000", help="pending pods before each burst, comma-separated")
    ap.add_argument("--creates", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--followers", type=int, default=0, help="instead: N dispatcher-shaped Jobs with the services' informers")
    args = ap.parse_args(argv)
    rows = run_followers(args.followers) if args.followers else run(
        levels=[int(x) for x in args.levels.split(",")], creates=args.creates, threads=args.threads)
    for r in rows:
        print(f"{r.case:>16}  {r.metric:<40} {r.value:>12,.2f} {r.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
