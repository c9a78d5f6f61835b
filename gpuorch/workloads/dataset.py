"""Versioned example datasets: ``<location>/<name>@<version>/data.npz`` with ``X`` and ``y``.

    python -m gpuorch.workloads.dataset --location .gpuorch/data/primary-nfs --dataset imagenet@v3

A data location is a directory (one per location in the embedded environment); the stager
(gpuorch's agent, ``gpuorch.workloads.agent stage``) copies ``NAME@VERSION/`` from it into a cluster's cache, and the dispatcher
points ``GPUORCH_INPUT_<NAME>`` at the staged copy (``input_env_var``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Task = Literal["logistic", "linear"]
DATA_FILE = "data.npz"
META_FILE = "dataset.json"

FloatArray = npt.NDArray[np.float64]


class DatasetError(ValueError):
    """The input is missing or malformed (the trainer exits 2: retrying will not help)."""


@dataclass(frozen=True)
class Dataset:
    X: FloatArray
    y: FloatArray
    source: str  # directory it was read from, or "synthesized(seed=...)"
    ref: str | None = None  # name@version when known

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.X).tobytes())
        h.update(np.ascontiguousarray(self.y).tobytes())
        return h.hexdigest()[:16]


def input_env_var(name: str) -> str:
    """``imagenet``, ``imagenet@v3`` or ``org/imagenet@v3`` → ``GPUORCH_INPUT_IMAGENET``.

    The last path component of the name, non-alphanumerics as ``_``, upper case: the same rule
    the dispatcher uses when it sets the variable.
    """
    base = name.split("@", 1)[0].rsplit("/", 1)[-1]
    return "GPUORCH_INPUT_" + re.sub(r"[^A-Za-z0-9]", "_", base).upper()


def synthesize(
    seed: int = 0, samples: int = 2048, features: int = 16, task: Task = "logistic"
) -> tuple[FloatArray, FloatArray]:
    """Deterministic data: a random linear model plus noise (labels thresholded for logistic)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((samples, features))
    w = rng.standard_normal(features)
    z = X @ w + 0.5 * rng.standard_normal(samples)
    y = (z > 0).astype(np.float64) if task == "logistic" else z
    return X, y


def make_dataset(
    location: Path,
    ref: str,
    *,
    samples: int = 2048,
    features: int = 16,
    seed: int = 0,
    task: Task = "logistic",
) -> Path:
    """Write ``location/ref/data.npz`` (and ``dataset.json``) atomically; returns the directory."""
    if "@" not in ref:
        raise DatasetError(f"{ref!r} is not NAME@VERSION")
    out = location / ref
    out.mkdir(parents=True, exist_ok=True)
    X, y = synthesize(seed, samples, features, task)
    _atomic_npz(out / DATA_FILE, X=X, y=y)
    meta = {"ref": ref, "samples": samples, "features": features, "seed": seed, "task": task}
    _atomic_text(out / META_FILE, json.dumps(meta, sort_keys=True) + "\n")
    return out


def load_dataset(directory: Path, expected_ref: str | None = None) -> Dataset:
    """Read and check ``directory/data.npz``; DatasetError says what is wrong."""
    path = directory / DATA_FILE
    if not directory.is_dir():
        raise DatasetError(f"input directory {directory} does not exist")
    if not path.is_file():
        raise DatasetError(f"{path} is missing (expected {DATA_FILE} with arrays X and y)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "X" not in npz.files or "y" not in npz.files:
                raise DatasetError(f"{path} must hold arrays X and y, found {sorted(npz.files)}")
            X = np.asarray(npz["X"], dtype=np.float64)
            y = np.asarray(npz["y"], dtype=np.float64)
    except DatasetError:
        raise
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path} is not a readable .npz file: {exc}") from exc
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise DatasetError(f"{path}: X must be a non-empty 2-D array, got shape {X.shape}")
    if y.shape != (X.shape[0],):
        raise DatasetError(f"{path}: y must have shape ({X.shape[0]},), got {y.shape}")
    if not (np.isfinite(X).all() and np.isfinite(y).all()):
        raise DatasetError(f"{path}: X and y must be finite (found NaN or inf)")
    ref = None
    meta_path = directory / META_FILE
    if meta_path.is_file():
        try:
            ref = json.loads(meta_path.read_text()).get("ref")
        except ValueError:
            ref = None
    if expected_ref and "@" in expected_ref and ref and ref != expected_ref:
        raise DatasetError(f"input {directory} holds {ref}, but {expected_ref} was requested")
    return Dataset(X=X, y=y, source=str(directory), ref=ref or expected_ref)


def _atomic_npz(path: Path, **arrays: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; outputs are read by promotion and people
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuorch.workloads.dataset", description=__doc__.split("\n\n")[0])
    p.add_argument("--location", required=True, type=Path, help="data location directory")
    p.add_argument("--dataset", required=True, help="NAME@VERSION")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", choices=["logistic", "linear"], default="logistic")
    a = p.parse_args(argv)
    try:
        out = make_dataset(a.location, a.dataset, samples=a.samples, features=a.features, seed=a.seed, task=a.task)
    except DatasetError as exc:
        p.error(str(exc))
    print(json.dumps({"dataset": a.dataset, "path": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
