"""The orphan collector judges the informers' caches of managed Jobs (no list per round): a Job
of a stale epoch, of an unknown workload past its grace, is pursued; a current one, one already
going, one of a cluster that does not answer, is left; a Job confirmed gone is not judged again
while the cache may still hold it; each version of a Job is read once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from gpuorch.config import Settings
from gpuorch.informer import Change
from gpuorch_fencer import service
from gpuorch_fencer.service import Fencer, Records, SeenJob
from gpuorch_proto import FenceRecord, encode
from gpuorch_proto import events as ev
from gpuorch_proto.k8s import LABEL_ATTEMPT, LABEL_EPOCH, LABEL_MANAGED, LABEL_WORKLOAD, NAMESPACE

OLD = "2020-01-01T00:00:00Z"


class Bucket:
    """A KV bucket in memory: revisions and compare-and-set as JetStream's."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self.rev = 0

    async def get(self, key: str) -> Any:
        if key not in self.data:
            raise KeyNotFoundError
        value, rev = self.data[key]
        return type("Entry", (), {"value": value, "revision": rev})()

    async def create(self, key: str, value: bytes) -> int:
        return await self.update(key, value, last=0)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.data.get(key, (b"", 0))[1] != last:
            raise KeyWrongLastSequenceError
        self.rev += 1
        self.data[key] = (value, self.rev)
        return self.rev


class Jobs:
    """What the collector reads of a jobs informer; its changes are never known one by one, so
    every round judges every Job (`TrackedJobs` knows them)."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.complete_at: float | None = 0.0

    def items(self) -> list[dict[str, Any]]:
        return list(self.jobs.values())

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.jobs.get(name)

    def by_index(self, value: str) -> list[dict[str, Any]]:
        return [j for j in self.jobs.values() if j["metadata"]["labels"].get(LABEL_WORKLOAD) == value]

    def changes_since(self, generation: int) -> tuple[int, list[Change] | None]:
        return 0, None


class TrackedJobs(Jobs):
    """As the real informer: each `put` is a change, `changes_since` lists them."""

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0
        self.log: list[tuple[int, Change]] = []

    def put(self, j: dict[str, Any]) -> None:
        meta = j["metadata"]
        self.jobs[meta["name"]] = j
        self.generation += 1
        self.log.append((self.generation, Change((meta["namespace"], meta["name"]), meta["labels"])))

    def changes_since(self, generation: int) -> tuple[int, list[Change] | None]:
        return self.generation, [c for g, c in self.log if g > generation]


class Group:
    """What the collector reads of a cluster's informers."""

    def __init__(self) -> None:
        self.failing, self.synced, self.jobs = False, True, Jobs()

    def __getitem__(self, name: str) -> Jobs:
        assert name == "jobs"
        return self.jobs


class Js:
    async def get_last_msg(self, stream: str, subject: str) -> Any:
        raise NotFoundError


def job(name: str, wid: str, aid: str, epoch: int, rv: str = "1", **meta: Any) -> dict[str, Any]:
    labels = {LABEL_MANAGED: "true", LABEL_WORKLOAD: wid, LABEL_ATTEMPT: aid, LABEL_EPOCH: str(epoch)}
    return {"metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": rv, "labels": labels,
                         "creationTimestamp": OLD, **meta}}


def created(wid: str, aid: str, epoch: int) -> ev.AttemptCreated:
    return ev.AttemptCreated(
        workload_id=wid, at=1.0, attempt_id=aid, epoch=epoch, cluster="east", attempt_number=epoch, job_name=aid,
        output_path="/s", checkpoint_path="/c",
    )


@pytest.fixture
def fencer() -> tuple[Fencer, Group, Bucket]:
    f = Fencer(Settings())
    group, bucket = Group(), Bucket()
    f.informers = {"east": group}  # type: ignore[dict-item]
    f.records, f.js = Records(bucket), Js()
    for seq, e in enumerate([created("w1", "a1", 1), created("w1", "a2", 2), created("w2", "b1", 1)], start=1):
        f.follower.projection.apply(e, seq)
    bucket.data["w1"] = (encode(FenceRecord(epoch=2, current_attempt="a2")), 1)
    bucket.data["w2"] = (encode(FenceRecord(epoch=1, current_attempt="b1")), 2)
    bucket.rev = 2
    return f, group, bucket


async def test_stale_and_unknown_jobs_are_pursued_current_and_going_ones_left(fencer: tuple[Fencer, Group, Bucket]) -> None:
    f, group, _ = fencer
    group.jobs.jobs = {
        "a1": job("a1", "w1", "a1", 1),  # epoch 1 < the record's 2
        "a2": job("a2", "w1", "a2", 2),  # current
        "b1": job("b1", "w2", "b1", 1, deletionTimestamp=OLD),  # already going
        "x1": job("x1", "nobody", "x1", 1),  # no event of its workload in the log, long past the grace
    }
    await f.collect_once()
    reasons = {aid: p.orphan_reason or "" for aid, p in f.pursuits.items()}
    assert sorted(reasons) == ["a1", "x1"]
    assert reasons["a1"] == "stale epoch 1 < 2"
    assert reasons["x1"].startswith("unknown workload: no event of it in the log (attempt x1,")


async def test_a_cluster_that_does_not_answer_is_skipped(fencer: tuple[Fencer, Group, Bucket]) -> None:
    f, group, _ = fencer
    group.jobs.jobs = {"a1": job("a1", "w1", "a1", 1)}
    group.failing = True
    await f.collect_once()
    assert f.pursuits == {}
    group.failing, group.synced = False, False
    await f.collect_once()
    assert f.pursuits == {}, "nor judged before its first list"
    group.synced = True
    await f.collect_once()
    assert set(f.pursuits) == {"a1"}


async def test_a_job_confirmed_gone_is_not_judged_again_until_the_cache_is_complete_past_then(
    fencer: tuple[Fencer, Group, Bucket],
) -> None:
    f, group, _ = fencer
    group.jobs.jobs = {"a1": job("a1", "w1", "a1", 1)}
    f.gone[("east", NAMESPACE, "a1")] = 100.0  # its pursuit was confirmed at 100
    group.jobs.complete_at = 99.0  # the cache may not have seen its deletion yet
    await f.collect_once()
    assert f.pursuits == {}
    group.jobs.complete_at = 101.0  # complete since: a Job of that name now is a new one
    await f.collect_once()
    assert set(f.pursuits) == {"a1"} and f.gone == {}


async def test_each_version_of_a_job_is_read_once_and_the_record_once(
    fencer: tuple[Fencer, Group, Bucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    f, group, bucket = fencer
    reads: list[str] = []
    of = SeenJob.of
    monkeypatch.setattr(service.SeenJob, "of", staticmethod(lambda c, j: reads.append(j["metadata"]["name"]) or of(c, j)))
    gets: list[str] = []
    get = bucket.get

    async def counted(key: str) -> Any:
        gets.append(key)
        return await get(key)

    monkeypatch.setattr(bucket, "get", counted)
    group.jobs.jobs = {"a2": job("a2", "w1", "a2", 2), "b1": job("b1", "w2", "b1", 1)}
    for _ in range(3):
        await f.collect_once()
    assert sorted(reads) == ["a2", "b1"] and sorted(gets) == ["w1", "w2"]
    group.jobs.jobs["b1"] = job("b1", "w2", "b1", 1, rv="2")
    await f.collect_once()
    assert sorted(reads) == ["a2", "b1", "b1"], "its new version"
    assert f.pursuits == {}


async def test_between_full_rounds_only_what_changed_is_judged(
    fencer: tuple[Fencer, Group, Bucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a controller's work queue: a Job that changed, the Jobs of a workload whose events were
    folded, and a Job whose grace ends; every FULL_COLLECT_EVERY rounds, every Job."""
    f, group, _ = fencer
    group.jobs = tracked = TrackedJobs()
    clock = [2_000_000_000.0]
    monkeypatch.setattr(service.time, "time", lambda: clock[0])
    judged: list[str] = []
    judge = f.judge

    async def counted(cluster: str, job: SeenJob, now: float) -> None:
        judged.append(job.name)
        await judge(cluster, job, now)

    monkeypatch.setattr(f, "judge", counted)
    tracked.put(job("a2", "w1", "a2", 2))  # current: left alone
    tracked.put(job("b1", "w2", "b1", 1))  # current: left alone
    await f.collect_once()  # the first round judges everything
    assert sorted(judged) == ["a2", "b1"] and f.pursuits == {}
    judged.clear()
    await f.collect_once()
    assert judged == [], "nothing changed: nothing judged"
    tracked.put(job("a1", "w1", "a1", 1))  # a stale epoch appears
    await f.collect_once()
    assert judged == ["a1"] and set(f.pursuits) == {"a1"}
    judged.clear()
    f.follower.projection.apply(ev.Completed(workload_id="w2", at=3.0, attempt_id="b1", result_path="/r"), 10)  # type: ignore[call-arg]
    f.judge_dirty.add("w2")  # (what on_event does for every event it folds)
    await f.collect_once()
    assert judged == ["b1"] and f.pursuits["b1"].orphan_reason == "workload completed"
    judged.clear()
    made = datetime.fromtimestamp(clock[0] - 1, tz=UTC).isoformat().replace("+00:00", "Z")
    tracked.put(job("w1x", "w1", "w1-a9", 2, creationTimestamp=made))  # an attempt not (yet) on record
    await f.collect_once()
    assert judged == ["w1x"] and "w1-a9" not in f.pursuits, "within its grace"
    judged.clear()
    await f.collect_once()
    assert judged == [], "not before its grace ends"
    clock[0] += f.orphan_grace
    await f.collect_once()
    assert judged == ["w1x"] and "w1-a9" in f.pursuits, "judged again when its grace ended"
    judged.clear()
    while f.rounds % service.FULL_COLLECT_EVERY != 0:
        await f.collect_once()
    await f.collect_once()
    assert sorted(judged) == ["a1", "a2", "b1", "w1x"], "the resync round judges every Job"
