"""`gpuorch logs ID`: an attempt's output, through the Kubernetes API of the cluster it ran on
(issue 32 item 1). Only that attempt's pods (its label), every worker of a gang or one of them,
any of its containers (`main`, gpuorch's `agent`, a `stage-N`); a cluster that does not answer is
said at once (bounded timeouts), never waited on.

The choice of attempt and pods is pure (`pick_attempt`, `worker_of`, `order`); `show_logs` is the
shell around the official client.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from gpuorch.kube import ClusterClient, unreachable
from gpuorch.projection import AttemptView, WorkloadView
from gpuorch_proto import k8s

#: (connect, read) seconds of each call: a lost cluster is reported, not waited on
TIMEOUT = (3.0, 15.0)
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def pick_attempt(v: WorkloadView, number: int | None) -> AttemptView | str:
    """The attempt to show: `number` (1-based, as `gpuorch get` lists them), or the latest. A
    string says why there is none."""
    if not v.attempts:
        return f"workload {v.workload_id} has no attempt yet ({v.status}{': ' + v.reason if v.reason else ''})"
    if number is None:
        return max(v.attempts.values(), key=lambda a: a.number)
    found = [a for a in v.attempts.values() if a.number == number]
    if not found:
        have = ", ".join(str(a.number) for a in sorted(v.attempts.values(), key=lambda a: a.number))
        return f"workload {v.workload_id} has no attempt {number} (it has {have})"
    return found[0]


def worker_of(pod: Mapping[str, Any]) -> int:
    """A pod's worker index in its (Indexed) Job; 0 for a one-pod attempt."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(INDEX_ANNOTATION)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def order(pods: list[Mapping[str, Any]], worker: int | None) -> list[Mapping[str, Any]] | str:
    """The pods to show, by worker then name; `worker` picks one."""
    ranked = sorted(pods, key=lambda p: (worker_of(p), str((p.get("metadata") or {}).get("name"))))
    if worker is None:
        return ranked
    chosen = [p for p in ranked if worker_of(p) == worker]
    if not chosen:
        return f"no pod of worker {worker} (workers: {sorted({worker_of(p) for p in ranked})})"
    return chosen


def show_logs(
    v: WorkloadView,
    clients: Callable[[str], ClusterClient],
    out: BinaryIO,
    *,
    attempt: int | None = None,
    worker: int | None = None,
    container: str = "main",
    since: int | None = None,
    follow: bool = False,
    err: Any = sys.stderr,
) -> int:
    """Write the chosen attempt's logs to `out`; 0, or 1 with the reason on `err`."""
    a = pick_attempt(v, attempt)
    if isinstance(a, str):
        print(a, file=err)
        return 1
    where = f"attempt {a.number} ({a.attempt_id}) on cluster {a.cluster}"
    try:
        cc = clients(a.cluster)
        listed = cc.core.list_namespaced_pod(a.namespace or k8s.NAMESPACE, label_selector=f"{k8s.LABEL_ATTEMPT}={a.attempt_id}", _request_timeout=TIMEOUT)
    except Exception as exc:
        return _failed(exc, where, a, err)
    pods = order([cc.sanitize(p) for p in listed.items], worker)
    if isinstance(pods, str):
        print(f"{where}: {pods}", file=err)
        return 1
    if not pods:
        gone = "its Job was removed once the workload ended" if v.terminal or a.status in ("succeeded", "failed", "lost") else "no pod yet"
        print(f"{where} ({a.status}): no pods: {gone}; its outputs are in the store (`gpuorch result {v.workload_id}`)", file=err)
        return 1
    for p in pods:
        name = str(p["metadata"]["name"])
        if len(pods) > 1:
            out.write(f"==> {name} (worker {worker_of(p)}) <==\n".encode())
        kw: dict[str, Any] = {"container": container, "_preload_content": False, "_request_timeout": None if follow else TIMEOUT}
        if since is not None:
            kw["since_seconds"] = since
        if follow:
            kw["follow"] = True
        try:
            resp: Any = cc.core.read_namespaced_pod_log(name, a.namespace or k8s.NAMESPACE, **kw)
            for chunk in resp.stream(65536):
                out.write(chunk)
                out.flush()
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status in (400, 404):
                print(f"{where}, pod {name}: {getattr(exc, 'body', exc)!s:.300}", file=err)
                return 1
            return _failed(exc, where, a, err)
    return 0


def _failed(exc: BaseException, where: str, a: AttemptView, err: Any) -> int:
    if unreachable(exc):
        lost = " (the attempt is lost)" if a.status == "lost" else ""
        print(f"{where}{lost}: the cluster does not answer: {type(exc).__name__}: {exc!s:.200}", file=err)
    else:
        print(f"{where}: {type(exc).__name__}: {exc!s:.300}", file=err)
    return 1
