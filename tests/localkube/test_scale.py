"""Cost follows change, not backlog: the controllers' work queues, the scheduler's queue by shape,
and the label index behind list selectors. Counted in store writes (resourceVersions), not timed."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

import gpuorch_localkube.cluster as cluster_module
import gpuorch_localkube.events as events_module
from gpuorch_localkube import LocalCluster

from .helpers import LK, TIMEOUT, K8s, condition, job_body, job_pods, node_group, wait_for


def _quiet(cluster: LocalCluster) -> bool:
    """A pass of every controller writes nothing: all queued work is done."""
    before = cluster.core.store.rv
    while cluster.reconcile():
        pass
    cluster.reconcile()
    return cluster.core.store.rv == before


def _all_unschedulable(c: K8s, job: str, n: int) -> bool:
    pods = job_pods(c, job)
    return len(pods) == n and all(
        (cond := condition(p, "PodScheduled")) is not None and cond.reason == "Unschedulable" for p in pods
    )


def _writes_for_one_more_job(cluster: LocalCluster, c: K8s, name: str) -> int:
    wait_for(lambda: _quiet(cluster), what="controllers idle")
    before = cluster.core.store.rv
    c.batch.create_namespaced_job("default", job_body(name, ["true"], gpus=8), _request_timeout=TIMEOUT)
    wait_for(lambda: _all_unschedulable(c, name, 1), what=f"{name} unschedulable")
    wait_for(lambda: _quiet(cluster), what="controllers idle")
    return cluster.core.store.rv - before


def test_a_create_costs_the_same_writes_with_a_small_or_a_large_backlog(lk: LK, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_module, "RESYNC_SECONDS", 1e9, raising=False)  # no periodic resync in the test
    h = lk({"name": "c1", "nodes": [node_group(count=1, gpus=4)]})
    cluster, c = h.clusters["c1"], h.client("c1")
    scans: Counter[str] = Counter()
    values = cluster.core.store.values

    def counted(resource: str) -> Any:
        scans[resource] += 1
        return values(resource)

    monkeypatch.setattr(cluster.core.store, "values", counted)
    c.batch.create_namespaced_job("default", job_body("backlog-a", ["true"], gpus=8, parallelism=10, completions=10),
                                  _request_timeout=TIMEOUT)
    wait_for(lambda: _all_unschedulable(c, "backlog-a", 10), what="10 pending")
    small = _writes_for_one_more_job(cluster, c, "one")
    c.batch.create_namespaced_job("default", job_body("backlog-b", ["true"], gpus=8, parallelism=150, completions=150),
                                  _request_timeout=TIMEOUT)
    wait_for(lambda: _all_unschedulable(c, "backlog-b", 150), timeout=30, what="150 more pending")
    scans.clear()
    large = _writes_for_one_more_job(cluster, c, "two")
    # the Job, its pod, SuccessfulCreate, the Job's status, the pod's PodScheduled=False, FailedScheduling
    assert small == large == 6, (small, large)
    assert scans["pods"] == 0, f"controllers scanned every pod {scans['pods']} times for one new Job"


class _Clock:
    """time.time for the event recorder, moved on by hand (its repeat filter is one second)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset


def test_a_pending_pod_is_marked_unschedulable_once(lk: LK, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(events_module, "time", clock)
    h = lk({"name": "c1", "nodes": [node_group(count=1, gpus=4)]})
    cluster, c = h.clusters["c1"], h.client("c1")
    c.batch.create_namespaced_job("default", job_body("big", ["true"], gpus=8), _request_timeout=TIMEOUT)
    wait_for(lambda: _all_unschedulable(c, "big", 1), what="pending")
    wait_for(lambda: _quiet(cluster), what="controllers idle")
    for _ in range(3):
        clock.offset += 5  # past the recorder's repeat window: a re-recorded event would be written
        assert _quiet(cluster), "a pass over an unchanged backlog wrote something"
    (pod,) = job_pods(c, "big")
    events = c.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedScheduling", _request_timeout=TIMEOUT
    ).items
    assert [e.count for e in events] == [1]


def _names(c: K8s, selector: str) -> list[str]:
    items: list[Any] = c.batch.list_namespaced_job("default", label_selector=selector, _request_timeout=TIMEOUT).items
    return sorted(j.metadata.name for j in items)


def test_label_selector_lists_follow_label_changes(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=1, gpus=4)]})
    c = h.client("c1")
    for name, labels in (("a", {"app": "x", "tier": "1"}), ("b", {"app": "x", "tier": "2"}), ("c", {"app": "y"})):
        body = job_body(name, ["true"], suspend=True)
        body["metadata"]["labels"] = labels
        c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    assert _names(c, "app=x") == ["a", "b"]
    assert _names(c, "app=x,tier=2") == ["b"]
    assert _names(c, "app=x,tier!=2") == ["a"]
    assert _names(c, "app=z") == []
    c.batch.patch_namespaced_job("b", "default", {"metadata": {"labels": {"app": "y", "tier": None}}}, _request_timeout=TIMEOUT)
    assert _names(c, "app=x") == ["a"]
    assert _names(c, "app=y") == ["b", "c"]
    assert _names(c, "tier=2") == []
    c.batch.delete_namespaced_job("c", "default", _request_timeout=TIMEOUT)
    assert _names(c, "app=y") == ["b"]
