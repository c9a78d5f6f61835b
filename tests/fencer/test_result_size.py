"""The size of a promoted result is on record: the fencer measures what it published (issue 13)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from gpuorch_fencer.service import publish_dir, tree_bytes
from gpuorch_proto import decode_event
from gpuorch_proto import events as ev


def test_result_bytes_count_the_published_regular_files_only(tmp_path: Path) -> None:
    src = tmp_path / "attempts" / "w-a1"
    (src / "sub").mkdir(parents=True)
    (src / "model.bin").write_bytes(b"x" * 1500)
    (src / "sub" / "metrics.json").write_bytes(b"{}" * 10)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 999)
    os.symlink(secret, src / "link")  # not published, so not counted
    dst = tmp_path / "result"
    publish_dir(str(src), str(dst))
    assert tree_bytes(str(dst)) == 1500 + 20
    assert tree_bytes(str(tmp_path / "missing")) == 0


def test_promoted_without_result_bytes_still_decodes() -> None:
    """EVOLUTION rule 1: a `promoted` from before the field decodes, with 0 (not measured)."""
    new = ev.Promoted(workload_id="w", at=1.0, attempt_id="w-a1", epoch=1, cluster="c", output_path="/o", result_path="/r", result_bytes=7)
    old = msgspec.json.decode(msgspec.json.encode(new))
    del old["result_bytes"]
    e = decode_event(msgspec.json.encode(old))
    assert isinstance(e, ev.Promoted) and e.result_bytes == 0
    inp = msgspec.json.decode(b'{"stage":"prep","workload_id":"p--prep","attempt_id":"p--prep-a1","result_path":"/r"}', type=ev.StageInput)
    assert inp.size_bytes == 0
