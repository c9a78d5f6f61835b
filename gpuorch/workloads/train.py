"""A small, real training program: logistic (or linear) regression by SGD with momentum.

    python -m gpuorch.workloads.train --input imagenet@v3 --steps 400 --checkpoint-every 50

What it takes from gpuorch (the dispatcher sets these in the pod):

| variable                  | use                                                                |
|---------------------------|--------------------------------------------------------------------|
| GPUORCH_INPUT_<NAME>      | directory holding the staged input (``data.npz`` with X and y);    |
|                           | absent: deterministic synthetic data from ``--seed``               |
| GPUORCH_OUTPUT_DIR        | the attempt's output directory: the only place outputs are written |
| GPUORCH_CHECKPOINT_DIR    | where ``ckpt.npz`` is written every ``--checkpoint-every`` steps    |
| GPUORCH_RESUME_FROM       | a checkpoint file (or a directory holding ``ckpt.npz``) to resume  |
| GPUORCH_TIME_SCALE        | simulated seconds per real second (default 1)                      |
| GPUORCH_ATTEMPT_ID        | recorded in metrics.json                                           |
| GPUORCH_EPOCH             | recorded in metrics.json                                           |

After its first step it writes ``.<attempt>.progress.json`` next to ``$GPUORCH_OUTPUT_DIR`` (the
time and the step, `gpuorch.observe.progress`): the dispatcher reports it as ``compute-started``, the end of
the attempt's start-up in its timeline. While it steps it keeps its progress (steps, samples,
compute vs input-wait seconds) next to it, and on a local cluster it tells the cluster's GPU
metrics what it computed (`gpuorch.workloads.meter`; docs/activity.md). ``--input-wait-seconds``
makes each step wait for its input first (a data-bound job); ``--device cpu`` computes without
the GPUs it was given (a CPU stage that asks for a GPU).

Determinism: the minibatch of step t is drawn from ``default_rng([seed, t])`` and the checkpoint
holds the weights, the momentum buffer and the step, so a run resumed from step k ends with
exactly the weights of an uninterrupted run. A checkpoint records the data fingerprint: resuming
on different data is refused.

Each step may sleep ``--step-seconds`` simulated seconds (divided by the time scale) computing, and
``--input-wait-seconds`` before it waiting, so a one hour run takes a few real seconds.
``--fail-at-step N --exit-code C`` exits with C right after
step N completes (after its checkpoint, if one is due): a run resumed from step >= N never
reaches it, a retry from scratch fails again.

Exit codes: 0 success; 2 bad input or arguments (permanent: retrying will not help); C for an
injected failure; 143 after SIGTERM (a checkpoint is written first when a directory is set).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from gpuorch.observe.progress import write_marker
from gpuorch.workloads.meter import Meter

from .dataset import (
    Dataset,
    DatasetError,
    FloatArray,
    _atomic_npz,
    _atomic_text,
    input_env_var,
    load_dataset,
    synthesize,
)

CHECKPOINT = "ckpt.npz"
EXIT_BAD_INPUT = 2
EXIT_TERMINATED = 143


class UsageError(Exception):
    """Bad arguments, environment or checkpoint: exit 2 with the message."""


@dataclass
class State:
    w: FloatArray
    b: float
    vw: FloatArray  # momentum buffers
    vb: float
    step: int


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuorch.workloads.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default="imagenet", help="input NAME or NAME@VERSION (env GPUORCH_INPUT_<NAME>)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--step-seconds", type=float, default=0.0, help="simulated seconds of compute per step")
    p.add_argument("--input-wait-seconds", type=float, default=0.0,
                   help="simulated seconds per step spent waiting for input (a slow reader): the device idles")
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu",
                   help="where it computes: cpu leaves any GPUs it was given idle (a CPU stage)")
    p.add_argument("--gpu-memory-mib", type=int, default=2048, help="device memory it holds while it runs (device gpu)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--l2", type=float, default=1e-4)
    p.add_argument("--task", choices=["logistic", "linear"], default="logistic")
    p.add_argument("--seed", type=int, default=0, help="batches, and synthetic data when no input is given")
    p.add_argument("--samples", type=int, default=2048, help="synthetic data only")
    p.add_argument("--features", type=int, default=16, help="synthetic data only")
    p.add_argument("--output-dir", type=Path, default=None, help="default $GPUORCH_OUTPUT_DIR")
    p.add_argument("--fail-at-step", type=int, default=None, help="inject a failure after this step")
    p.add_argument("--exit-code", type=int, default=1, help="exit code of the injected failure")
    return p


def _time_scale(env: Mapping[str, str]) -> float:
    raw = env.get("GPUORCH_TIME_SCALE", "1") or "1"
    try:
        scale = float(raw)
    except ValueError as exc:
        raise UsageError(f"GPUORCH_TIME_SCALE={raw!r} is not a number") from exc
    if scale <= 0:
        raise UsageError(f"GPUORCH_TIME_SCALE={raw!r} must be > 0")
    return scale


def _load_input(args: argparse.Namespace, env: Mapping[str, str]) -> Dataset:
    var = input_env_var(args.input)
    directory = env.get(var)
    if directory:
        return load_dataset(Path(directory), expected_ref=args.input)
    X, y = synthesize(args.seed, args.samples, args.features, args.task)
    return Dataset(X=X, y=y, source=f"synthesized(seed={args.seed})", ref=None)


def _forward(task: str, X: FloatArray, w: FloatArray, b: float) -> FloatArray:
    z = X @ w + b
    return 1.0 / (1.0 + np.exp(-np.clip(z, -500, 500))) if task == "logistic" else z


def loss_and_accuracy(task: str, data: Dataset, w: FloatArray, b: float, l2: float) -> tuple[float, float | None]:
    p = _forward(task, data.X, w, b)
    if task == "logistic":
        eps = 1e-12
        loss = -np.mean(data.y * np.log(p + eps) + (1 - data.y) * np.log(1 - p + eps))
        acc: float | None = float(np.mean((p > 0.5) == (data.y > 0.5)))
    else:
        loss = 0.5 * np.mean((p - data.y) ** 2)
        acc = None
    return float(loss + 0.5 * l2 * float(w @ w)), acc


def sgd_step(task: str, data: Dataset, s: State, args: argparse.Namespace) -> None:
    """One SGD-with-momentum step; the batch depends only on (seed, step)."""
    rng = np.random.default_rng([args.seed, s.step])
    idx = rng.integers(0, data.X.shape[0], size=min(args.batch_size, data.X.shape[0]))
    Xb, yb = data.X[idx], data.y[idx]
    err = _forward(task, Xb, s.w, s.b) - yb  # d(loss)/dz for BCE with sigmoid, and for 0.5*MSE
    gw = Xb.T @ err / len(idx) + args.l2 * s.w
    gb = float(np.mean(err))
    s.vw = args.momentum * s.vw + gw
    s.vb = args.momentum * s.vb + gb
    s.w = s.w - args.lr * s.vw
    s.b = s.b - args.lr * s.vb
    s.step += 1


def save_checkpoint(directory: Path, s: State, data: Dataset, args: argparse.Namespace) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT
    _atomic_npz(
        path,
        w=s.w,
        b=np.float64(s.b),
        vw=s.vw,
        vb=np.float64(s.vb),
        step=np.int64(s.step),
        seed=np.int64(args.seed),
        fingerprint=np.str_(data.fingerprint),
        task=np.str_(args.task),
    )
    return path


def load_checkpoint(path: Path, data: Dataset, args: argparse.Namespace) -> State:
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise UsageError(f"GPUORCH_RESUME_FROM: checkpoint {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as ck:
            s = State(
                w=np.asarray(ck["w"], dtype=np.float64),
                b=float(ck["b"]),
                vw=np.asarray(ck["vw"], dtype=np.float64),
                vb=float(ck["vb"]),
                step=int(ck["step"]),
            )
            fingerprint, task, seed = str(ck["fingerprint"]), str(ck["task"]), int(ck["seed"])
    except (OSError, KeyError, ValueError) as exc:
        raise UsageError(f"GPUORCH_RESUME_FROM: {path} is not a usable checkpoint: {exc}") from exc
    if fingerprint != data.fingerprint:
        raise UsageError(
            f"checkpoint {path} was written for data {fingerprint}, the input is {data.fingerprint}: "
            "resume needs the same data version"
        )
    if task != args.task or seed != args.seed or s.w.shape != (data.X.shape[1],):
        raise UsageError(f"checkpoint {path} is for task={task} seed={seed} w{s.w.shape}: incompatible run")
    return s


class _Terminate:
    requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if (args.steps < 0 or args.checkpoint_every < 1 or args.batch_size < 1 or args.step_seconds < 0
            or args.input_wait_seconds < 0 or args.gpu_memory_mib < 0):
        raise UsageError("--steps >= 0, --checkpoint-every >= 1, --batch-size >= 1, --step-seconds >= 0, "
                         "--input-wait-seconds >= 0 and --gpu-memory-mib >= 0")
    out_raw = env.get("GPUORCH_OUTPUT_DIR") or (str(args.output_dir) if args.output_dir else "")
    if not out_raw:
        raise UsageError("no output directory: set GPUORCH_OUTPUT_DIR (or --output-dir)")
    output = Path(out_raw)
    ckpt_dir = Path(env["GPUORCH_CHECKPOINT_DIR"]) if env.get("GPUORCH_CHECKPOINT_DIR") else None
    scale = _time_scale(env)
    data = _load_input(args, env)
    print(f"input {args.input}: {data.source} samples={data.X.shape[0]} features={data.X.shape[1]}", flush=True)

    resume = env.get("GPUORCH_RESUME_FROM")
    resumed_from: int | None = None
    if resume:
        s = load_checkpoint(Path(resume), data, args)
        resumed_from = s.step
        print(f"resumed step={s.step}", flush=True)
    else:
        d = data.X.shape[1]
        s = State(w=np.zeros(d), b=0.0, vw=np.zeros(d), vb=0.0, step=0)

    term = _Terminate()
    previous = signal.signal(signal.SIGTERM, term)
    print(f"training step={s.step} steps={args.steps}", flush=True)  # from here SIGTERM checkpoints
    started = time.monotonic()
    first_step = True
    meter = Meter(output, env, device=args.device, batch=min(args.batch_size, data.X.shape[0]),
                  fb_used_mib=args.gpu_memory_mib, step=s.step)
    try:
        while s.step < args.steps:
            if args.input_wait_seconds:
                with meter.waiting():  # the next batch is read slowly: the device has nothing to do
                    time.sleep(args.input_wait_seconds / scale)
            with meter.computing():
                sgd_step(args.task, data, s, args)
                if args.step_seconds:
                    time.sleep(args.step_seconds / scale)
            meter.step_done(s.step)
            if first_step:  # useful compute has started: tell gpuorch through the attempt's own marker
                write_marker(output, attempt_id=env.get("GPUORCH_ATTEMPT_ID"), step=s.step)
                first_step = False
            if ckpt_dir is not None and (s.step % args.checkpoint_every == 0 or term.requested):
                save_checkpoint(ckpt_dir, s, data, args)
                print(f"checkpoint step={s.step}", flush=True)
            if term.requested:
                print(f"terminated at step={s.step}", file=sys.stderr, flush=True)
                return EXIT_TERMINATED
            if args.fail_at_step is not None and s.step == args.fail_at_step:
                print(f"injected failure at step={s.step} exit_code={args.exit_code}", file=sys.stderr, flush=True)
                return int(args.exit_code)
    finally:
        signal.signal(signal.SIGTERM, previous)
        meter.finish()

    loss, acc = loss_and_accuracy(args.task, data, s.w, s.b, args.l2)
    epoch_raw = env.get("GPUORCH_EPOCH")
    metrics: dict[str, Any] = {
        "loss": loss,
        "accuracy": acc,
        "steps": s.step,
        "resumed_from_step": resumed_from,
        "attempt_id": env.get("GPUORCH_ATTEMPT_ID"),
        "epoch": int(epoch_raw) if epoch_raw and epoch_raw.lstrip("-").isdigit() else epoch_raw,
        "input": {"name": args.input, "ref": data.ref, "source": data.source, "fingerprint": data.fingerprint},
        "task": args.task,
        "time_scale": scale,
        "real_seconds": round(time.monotonic() - started, 3),
        "simulated_seconds": round((args.steps - (resumed_from or 0)) * (args.step_seconds + args.input_wait_seconds), 3),
        "work": meter.summary(),  # its own account of compute vs input wait, steps and samples
    }
    output.mkdir(parents=True, exist_ok=True)
    _atomic_npz(output / "model.npz", w=s.w, b=np.float64(s.b), step=np.int64(s.step))
    _atomic_text(output / "metrics.json", json.dumps(metrics, sort_keys=True, indent=2) + "\n")
    print(json.dumps({"done": True, "steps": s.step, "loss": loss, "accuracy": acc}), flush=True)
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args, os.environ if env is None else env)
    except (UsageError, DatasetError) as exc:
        print(f"train: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
