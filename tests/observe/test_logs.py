"""`gpuorch logs`, the pure choices: which attempt, which pods, in what order."""

from __future__ import annotations

from typing import Any

from gpuorch.observe.logs import order, pick_attempt, worker_of
from gpuorch.projection import AttemptView, WorkloadView


def view(*numbers: int) -> WorkloadView:
    v = WorkloadView(workload_id="w-1")
    for n in numbers:
        v.attempts[f"w-1-a{n}"] = AttemptView(attempt_id=f"w-1-a{n}", number=n, epoch=n, cluster=f"c{n}")
    return v


def pod(name: str, index: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if index is not None:
        meta["annotations"] = {"batch.kubernetes.io/job-completion-index": index}
    return {"metadata": meta}


def test_the_latest_attempt_or_the_one_asked_for() -> None:
    v = view(1, 2, 3)
    latest = pick_attempt(v, None)
    assert isinstance(latest, AttemptView) and latest.number == 3
    first = pick_attempt(v, 1)
    assert isinstance(first, AttemptView) and first.cluster == "c1"
    assert pick_attempt(v, 9) == "workload w-1 has no attempt 9 (it has 1, 2, 3)"
    none = view()
    none.status, none.reason = "waiting", "no cluster has 8 free GPUs"
    assert pick_attempt(none, None) == "workload w-1 has no attempt yet (waiting: no cluster has 8 free GPUs)"


def test_workers_in_order_or_one_of_them() -> None:
    pods = [pod("b", "1"), pod("a", "2"), pod("c", "0")]
    assert [worker_of(p) for p in order(pods, None)] == [0, 1, 2]  # type: ignore[union-attr]
    assert [p["metadata"]["name"] for p in order(pods, 2)] == ["a"]  # type: ignore[index]
    assert order(pods, 5) == "no pod of worker 5 (workers: [0, 1, 2])"
    assert worker_of(pod("x", None)) == 0 and worker_of(pod("y", "not-a-number")) == 0
