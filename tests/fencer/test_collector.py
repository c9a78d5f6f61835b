"""The orphan collector judges the informers' caches of managed Jobs (no list per round): a Job
of a stale epoch, of an unknown workload past its grace, is pursued; a current one, one already
going, one of a cluster that does not answer, is left; a Job confirmed gone is not judged again
while the cache may still hold it; each version of a Job is read once."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from gpuorch.config import Settings
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
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.complete_at: float | None = 0.0

    def items(self) -> list[dict[str, Any]]:
        return list(self.jobs.values())


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
