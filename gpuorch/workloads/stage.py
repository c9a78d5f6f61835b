"""The staging rules gpuorch's agent applies (`gpuorch.workloads.agent stage`, docs/storage.md).

The agent copies ``<location>/NAME@VERSION/`` from the location's store into the cluster's cache
claim; this module holds what the rules share with their tests and the dispatcher:

- ``CACHE/NAME@VERSION/.complete`` exists: a cache hit, nothing is copied. Otherwise the objects
  go to ``CACHE/NAME@VERSION.tmp/``, ``.complete`` (what was staged, from where, each object's
  size and sha256) is written inside it, and the directory is renamed into place: the final
  directory never exists without ``.complete``. Concurrent stagers serialise on
  ``CACHE/NAME@VERSION.lock``; a ``.tmp`` left by a killed stager is removed first.
- The link is simulated: the copy takes at least ``transfer_seconds(size_gb, bandwidth_mbps)``
  simulated seconds (bandwidth in MB/s, as in the cluster registry); a location the cluster has
  itself has no link.
"""

from __future__ import annotations

import re

COMPLETE = ".complete"
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*@[A-Za-z0-9][A-Za-z0-9._-]*$")  # as the contract's refs


class StageError(Exception):
    """Staging cannot succeed with these arguments (exit 2)."""


def transfer_seconds(size_gb: float, bandwidth_mbps: float) -> float:
    """Simulated seconds to move `size_gb` GB over a `bandwidth_mbps` MB/s link."""
    if bandwidth_mbps <= 0:
        raise StageError(f"--bandwidth-mbps must be > 0, got {bandwidth_mbps:g}")
    return max(0.0, size_gb) * 1000.0 / bandwidth_mbps


def check_ref(ref: str) -> None:
    """A dataset reference as the contract spells it (NAME@VERSION), safe as a path: or StageError."""
    if not _REF.match(ref) or any(part in ("", ".", "..") for part in ref.split("/")):
        raise StageError(f"--dataset {ref!r} is not NAME@VERSION (letters, digits, '.', '_', '-', '/')")
