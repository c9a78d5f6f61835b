"""Stage a versioned dataset into a cluster's cache: the init container the dispatcher runs.

    python -m gpuorch.workloads.stage --dataset imagenet@v3 --source DATA_LOCATION_DIR \\
        --cache CLUSTER_CACHE_DIR --size-gb 1350 --bandwidth-mbps 125 [--time-scale 3600]

- ``CACHE/NAME@VERSION/.complete`` exists: cache hit, nothing is copied.
- Otherwise ``SOURCE/NAME@VERSION/`` is copied to ``CACHE/NAME@VERSION.tmp/``, ``.complete``
  (JSON: what was staged, from where, how long it took) is written inside it, and the directory
  is renamed to ``CACHE/NAME@VERSION``: the final directory never exists without ``.complete``.
- The link is simulated: the copy takes at least ``size_gb * 1000 / bandwidth_mbps`` simulated
  seconds (bandwidth in MB/s, as in the cluster registry), i.e. that divided by the time scale in
  real seconds; the stager sleeps for whatever the real copy did not take.
- Concurrent stagers of one dataset into one cache serialise on ``CACHE/NAME@VERSION.lock``
  (``flock``); the second one finds ``.complete`` and reports a hit. A ``.tmp`` left by a killed
  stager is removed and the copy starts again.

It prints one JSON line (``{"dataset": ..., "cache_hit": ..., "simulated_seconds": ...}``) and
exits 0; 2 on bad arguments or a missing source (retrying will not help), 1 on I/O errors.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

COMPLETE = ".complete"
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*@[A-Za-z0-9][A-Za-z0-9._-]*$")  # as the contract's refs


class StageError(Exception):
    """Staging cannot succeed with these arguments (exit 2)."""


@dataclass(frozen=True)
class StageResult:
    dataset: str
    cache_hit: bool
    path: str
    source: str | None = None
    size_gb: float = 0.0
    bandwidth_mbps: float = 0.0
    time_scale: float = 1.0
    files: int = 0
    bytes: int = 0
    real_seconds: float = 0.0
    simulated_seconds: float = 0.0
    staged_at: float = 0.0


def transfer_seconds(size_gb: float, bandwidth_mbps: float) -> float:
    """Simulated seconds to move `size_gb` GB over a `bandwidth_mbps` MB/s link."""
    if bandwidth_mbps <= 0:
        raise StageError(f"--bandwidth-mbps must be > 0, got {bandwidth_mbps:g}")
    return max(0.0, size_gb) * 1000.0 / bandwidth_mbps


def cached(cache: Path, ref: str) -> bool:
    return (cache / ref / COMPLETE).is_file()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _read_complete(path: Path) -> StageResult:
    try:
        doc = json.loads((path / COMPLETE).read_text())
        fields = {k: doc[k] for k in StageResult.__dataclass_fields__ if k in doc}
        prior = StageResult(**fields)
    except (OSError, ValueError, TypeError):
        prior = StageResult(dataset=path.name, cache_hit=True, path=str(path))
    return StageResult(
        **{**asdict(prior), "cache_hit": True, "path": str(path), "real_seconds": 0.0, "simulated_seconds": 0.0}
    )


def stage(
    ref: str,
    source: Path,
    cache: Path,
    *,
    size_gb: float,
    bandwidth_mbps: float,
    time_scale: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> StageResult:
    """Stage `ref` from `source/ref/` into `cache/ref/` (see the module docstring)."""
    if not _REF.match(ref) or any(part in ("", ".", "..") for part in ref.split("/")):
        raise StageError(f"--dataset {ref!r} is not NAME@VERSION (letters, digits, '.', '_', '-', '/')")
    if time_scale <= 0:
        raise StageError(f"--time-scale must be > 0, got {time_scale:g}")
    simulated = transfer_seconds(size_gb, bandwidth_mbps)
    final = cache / ref
    if cached(cache, ref):
        return _read_complete(final)
    origin = source / ref
    if not origin.is_dir():
        raise StageError(f"dataset {ref} not found at {origin} (data location {source})")
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f"{ref}.lock"):
        if cached(cache, ref):  # another stager finished while we waited for the lock
            return _read_complete(final)
        started = clock()
        tmp = cache / f"{ref}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # left by a stager that was killed
        shutil.copytree(origin, tmp)
        files = [p for p in tmp.rglob("*") if p.is_file()]
        link = simulated / time_scale
        elapsed = clock() - started
        if elapsed < link:
            sleep(link - elapsed)
        real = clock() - started
        result = StageResult(
            dataset=ref,
            cache_hit=False,
            path=str(final),
            source=str(origin),
            size_gb=size_gb,
            bandwidth_mbps=bandwidth_mbps,
            time_scale=time_scale,
            files=len(files),
            bytes=sum(p.stat().st_size for p in files),
            real_seconds=round(real, 3),
            simulated_seconds=round(max(simulated, elapsed * time_scale), 3),  # a slow disk shows
            staged_at=wall(),
        )
        marker = tmp / COMPLETE
        with open(marker, "w") as f:
            json.dump(asdict(result), f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # a directory without .complete: not ours to trust
            shutil.rmtree(final)
        os.rename(tmp, final)
        return result


def ensure_dataset(location: Path, ref: str, *, seed: int = 0, samples: int = 2048, features: int = 16) -> Path:
    """Make sure data location `location` holds `ref` (a small synthetic ``data.npz``); idempotent.

    Used to prepare the embedded environment's data locations. An existing ``ref/data.npz`` is
    left as it is (versions are immutable). Needs numpy (imported here, not by the stager).
    """
    from gpuorch.workloads.dataset import DATA_FILE, make_dataset

    directory = location / ref
    if (directory / DATA_FILE).is_file():
        return directory
    return make_dataset(location, ref, seed=seed, samples=samples, features=features)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuorch.workloads.stage", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="NAME@VERSION")
    p.add_argument("--source", required=True, type=Path, help="data location directory holding NAME@VERSION/")
    p.add_argument("--cache", required=True, type=Path, help="the cluster's cache directory")
    p.add_argument("--size-gb", required=True, type=float, help="declared dataset size (drives link time)")
    p.add_argument("--bandwidth-mbps", required=True, type=float, help="link bandwidth, MB/s")
    p.add_argument(
        "--time-scale",
        type=float,
        default=float(os.environ.get("GPUORCH_TIME_SCALE", "1") or 1),
        help="simulated seconds per real second (default $GPUORCH_TIME_SCALE or 1)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = stage(
            args.dataset,
            args.source,
            args.cache,
            size_gb=args.size_gb,
            bandwidth_mbps=args.bandwidth_mbps,
            time_scale=args.time_scale,
        )
    except StageError as exc:
        print(f"gpuorch.workloads.stage: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gpuorch.workloads.stage: I/O error staging {args.dataset}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(result), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
