"""The stager init container: copy once, then cache hits; concurrent runs; the simulated link."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuorch.workloads.dataset import make_dataset
from gpuorch.workloads.stage import COMPLETE, StageError, stage, transfer_seconds


def run_stager(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuorch.workloads.stage", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "GPUORCH_TIME_SCALE"},
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    loc = tmp_path / "primary-nfs"
    make_dataset(loc, "imagenet@v3", samples=64, features=4)
    return loc


def cli(source: Path, cache: Path, *extra: str) -> list[str]:
    return ["--dataset", "imagenet@v3", "--source", str(source), "--cache", str(cache), *extra]


def test_copies_once_then_hits_the_cache(source: Path, tmp_path: Path):
    cache = tmp_path / "cluster" / "cache"
    # the copy takes real time too (shown when slower than the link): 0.36 s of link, far above it
    args = cli(source, cache, "--size-gb", "1350", "--bandwidth-mbps", "125", "--time-scale", "3e4")
    first = run_stager(*args)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout.strip())
    assert len(first.stdout.strip().splitlines()) == 1
    assert summary["cache_hit"] is False and summary["files"] == 2
    assert summary["simulated_seconds"] == pytest.approx(1350 * 1000 / 125, rel=1e-3)
    staged = cache / "imagenet@v3"
    assert (staged / "data.npz").read_bytes() == (source / "imagenet@v3" / "data.npz").read_bytes()
    marker = json.loads((staged / COMPLETE).read_text())
    assert marker["dataset"] == "imagenet@v3" and marker["source"] == str(source / "imagenet@v3")
    assert not (cache / "imagenet@v3.tmp").exists()

    (source / "imagenet@v3" / "data.npz").write_bytes(b"changed after staging")
    second = run_stager(*args)
    assert second.returncode == 0, second.stderr
    hit = json.loads(second.stdout)
    assert hit["cache_hit"] is True and hit["simulated_seconds"] == 0
    assert (staged / "data.npz").read_bytes() != b"changed after staging"  # not copied again


def test_the_link_is_simulated_by_sleeping_the_remainder(source: Path, tmp_path: Path):
    now = [100.0]
    slept: list[float] = []

    def clock() -> float:
        now[0] += 0.5  # each reading: half a real second of copying
        return now[0]

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    r = stage("imagenet@v3", source, tmp_path / "c", size_gb=1350, bandwidth_mbps=125, time_scale=3600, clock=clock, sleep=sleep)
    assert transfer_seconds(1350, 125) == 10800
    assert slept == [pytest.approx(3.0 - 0.5)]  # 10800 simulated s at 3600x = 3 real s
    assert r.simulated_seconds == 10800  # the copy itself (0.5 s = 1800 simulated) was faster than the link
    assert r.real_seconds == pytest.approx(3.5)  # the clock is read once more after sleeping


def test_a_copy_slower_than_the_link_reports_its_own_time(source: Path, tmp_path: Path):
    now = [0.0]

    def clock() -> float:
        now[0] += 10.0
        return now[0]

    r = stage("imagenet@v3", source, tmp_path / "c", size_gb=1, bandwidth_mbps=1000, time_scale=2, clock=clock, sleep=lambda s: None)
    assert r.simulated_seconds == 20.0  # 10 real s at 2x, more than the 1 s link


def test_concurrent_stagers_copy_once(source: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    # 0.4 real seconds of link each: the second waits on the lock, then finds .complete
    args = cli(source, cache, "--size-gb", "1", "--bandwidth-mbps", "1000", "--time-scale", "2.5")
    env = {k: v for k, v in os.environ.items() if k != "GPUORCH_TIME_SCALE"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "gpuorch.workloads.stage", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    hits = sorted(json.loads(o)["cache_hit"] for o, _ in outs)
    assert hits == [False, True, True]
    assert sorted(p.name for p in cache.iterdir()) == ["imagenet@v3", "imagenet@v3.lock"]


def test_leftover_tmp_from_a_killed_stager_is_replaced(source: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    (cache / "imagenet@v3.tmp").mkdir(parents=True)
    (cache / "imagenet@v3.tmp" / "partial").write_text("half a file")
    (cache / "imagenet@v3").mkdir()  # a final directory without .complete is not trusted
    r = stage("imagenet@v3", source, cache, size_gb=0, bandwidth_mbps=1)
    assert not r.cache_hit
    assert sorted(p.name for p in (cache / "imagenet@v3").iterdir()) == [COMPLETE, "data.npz", "dataset.json"]


def test_missing_source_or_bad_arguments_exit_2(source: Path, tmp_path: Path):
    missing = run_stager(*cli(tmp_path / "nowhere", tmp_path / "c", "--size-gb", "1", "--bandwidth-mbps", "1"))
    assert missing.returncode == 2 and "not found" in missing.stderr
    bad = run_stager(*cli(source, tmp_path / "c", "--size-gb", "1", "--bandwidth-mbps", "0"))
    assert bad.returncode == 2 and "bandwidth" in bad.stderr
    for ref in ("imagenet", "../etc@v1", "a/../b@v1"):
        with pytest.raises(StageError, match="NAME@VERSION"):
            stage(ref, source, tmp_path / "c", size_gb=1, bandwidth_mbps=1)
    assert not (tmp_path / "c").exists()


def test_ensure_dataset_is_idempotent(tmp_path: Path):
    from gpuorch.workloads.stage import ensure_dataset

    d = ensure_dataset(tmp_path / "loc", "imagenet@v3", seed=1)
    first = (d / "data.npz").read_bytes()
    (d / "data.npz").touch()
    mtime = (d / "data.npz").stat().st_mtime_ns
    assert ensure_dataset(tmp_path / "loc", "imagenet@v3", seed=2) == d
    assert (d / "data.npz").stat().st_mtime_ns == mtime and (d / "data.npz").read_bytes() == first
    assert json.loads((d / "dataset.json").read_text())["ref"] == "imagenet@v3"
