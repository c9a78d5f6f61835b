"""The one rule for "this cluster can resume this checkpoint" (gpuorch_proto.resume): a grid."""

from __future__ import annotations

import pytest

from gpuorch_proto import ClusterRegistryEntry
from gpuorch_proto.resume import CheckpointRef, can_resume, describe, readable_stores

CKPT = CheckpointRef(attempt_id="w-a1", cluster="east", store="ckpt", path="/stores/ckpt/w/a1/ckpt.npz", step=900)


@pytest.mark.parametrize(
    ("portable", "cluster", "readable", "ok", "says"),
    [
        pytest.param(True, "west", {"ckpt"}, True, "resumes from step 900 of w-a1 at /stores/ckpt/w/a1/ckpt.npz", id="portable-and-readable-elsewhere"),
        pytest.param(True, "west", {"scratch"}, False, "west cannot read checkpoint store 'ckpt'", id="portable-but-store-unreadable"),
        pytest.param(False, "west", {"ckpt"}, False, "checkpoint of w-a1 on east is not portable", id="not-portable-elsewhere"),
        pytest.param(False, "east", {"ckpt"}, True, "resumes from step 900", id="not-portable-same-cluster"),
        pytest.param(False, "east", set(), False, "east cannot read checkpoint store 'ckpt'", id="same-cluster-store-gone-from-registry"),
        pytest.param(True, "east", set(), False, "cannot read checkpoint store", id="portable-nothing-readable"),
    ],
)
def test_can_resume(portable: bool, cluster: str, readable: set[str], ok: bool, says: str) -> None:
    verdict = can_resume(CKPT, portable=portable, cluster=cluster, readable=readable)
    assert verdict.ok is ok
    assert says in verdict.reason


def test_readable_stores_are_artifact_and_checkpoint_stores() -> None:
    entry = ClusterRegistryEntry(artifact_stores=["scratch"], checkpoint_stores=["ckpt"])
    assert readable_stores(entry) == {"scratch", "ckpt"}
    assert can_resume(CKPT, portable=True, cluster="west", readable=readable_stores(entry)).ok
    assert not can_resume(CKPT, portable=True, cluster="west", readable=readable_stores(ClusterRegistryEntry())).ok


def test_describe_without_a_step_names_the_checkpoint() -> None:
    ref = CheckpointRef(attempt_id="w-a2", cluster="c", store="s", path="/p/ckpt.npz")
    assert describe(ref) == "the checkpoint of w-a2 at /p/ckpt.npz"
    assert describe(CKPT) == "step 900 of w-a1 at /stores/ckpt/w/a1/ckpt.npz"
