"""Retry is not resume (DESIGN §7): one rule for "this cluster can resume this checkpoint".

The dispatcher finds a workload's latest valid checkpoint (a complete file in an earlier attempt's
checkpoint directory) and tells the router where it is in its ``route-requested``
(:class:`CheckpointRef`). Both then ask :func:`can_resume` about a cluster: the router to prefer a
cluster that saves the work done (its estimate and explanation say "resumes from ..." or
"restarts from scratch"), the dispatcher's ``choose_mode`` to start the attempt it creates as a
resume or a retry. Same data version and image are given: both are immutable in a workload's spec.

Pure: no I/O. The facts are the cluster's registry entry (``artifact_stores`` and
``checkpoint_stores``: the stores it can read) and the workload's ``spec.checkpoint.portable``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

import msgspec

from .inventory import ClusterRegistryEntry

__all__ = ["CheckpointRef", "ResumeVerdict", "can_resume", "describe", "readable_stores"]


class CheckpointRef(msgspec.Struct, frozen=True, kw_only=True):
    """Where a workload's latest valid checkpoint lies, and how much work it holds."""

    attempt_id: str  # the attempt that wrote it
    cluster: str  # where that attempt ran
    store: str  # the artifact store holding it (spec.checkpoint.store, else spec.output.store)
    path: str  # the checkpoint file, as the dispatcher reads it
    step: int | None = None  # the training step it holds, when known
    run_seconds: float = 0.0  # simulated seconds of run it holds (0: not known)


class ResumeVerdict(NamedTuple):
    ok: bool
    reason: str


def readable_stores(entry: ClusterRegistryEntry) -> frozenset[str]:
    """The stores a cluster can read checkpoints from: its artifact and checkpoint stores."""
    return frozenset(entry.artifact_stores) | frozenset(entry.checkpoint_stores)


def describe(ckpt: CheckpointRef) -> str:
    """'step 900 of a1 at <path>' (or 'the checkpoint of a1 at <path>' without a step)."""
    what = f"step {ckpt.step}" if ckpt.step is not None else "the checkpoint"
    return f"{what} of {ckpt.attempt_id} at {ckpt.path}"


def can_resume(ckpt: CheckpointRef, *, portable: bool, cluster: str, readable: Collection[str]) -> ResumeVerdict:
    """Can an attempt on `cluster` (which reads the stores `readable`) resume from `ckpt`?

    A checkpoint that is not portable (``spec.checkpoint.portable: false``) is resumed only on the
    cluster that wrote it; any checkpoint only where its store is readable.
    """
    if not portable and ckpt.cluster != cluster:
        return ResumeVerdict(
            False,
            f"checkpoint of {ckpt.attempt_id} on {ckpt.cluster} is not portable (spec.checkpoint.portable=false)",
        )
    if ckpt.store not in readable:
        return ResumeVerdict(False, f"{cluster} cannot read checkpoint store {ckpt.store!r}")
    return ResumeVerdict(True, f"resumes from {describe(ckpt)}")
