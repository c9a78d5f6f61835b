"""The size of a promoted result is on record: its manifest's total (issues 13, 28)."""

from __future__ import annotations

import msgspec

from gpuorch_fencer import core
from gpuorch_proto import FenceRecord, decode_event
from gpuorch_proto import events as ev
from gpuorch_proto.storage import ObjectInfo, UploadedObject, UploadRecord, manifest_for


def test_result_bytes_are_the_manifests_total_of_what_the_upload_record_names() -> None:
    """The fencer measures nothing itself: the size is the manifest's, built from the upload
    record and checked against the store's listing (gpuorch's own files are not outputs)."""
    listing = [ObjectInfo("model.bin", 1500), ObjectInfo("sub/metrics.json", 20), ObjectInfo(".gpuorch/upload.json", 300),
               ObjectInfo("stray.tmp", 999)]  # fmt: skip
    record = UploadRecord(workload_id="w", attempt_id="w-a1", completed_at=1.0,
                          objects=[UploadedObject("model.bin", 1500, "a" * 64), UploadedObject("sub/metrics.json", 20, "b" * 64)])  # fmt: skip
    m = manifest_for("w", "w-a1", 1, "prod", listing, record, 2.0)
    assert not isinstance(m, str)
    e = ev.PromoteRequested(workload_id="w", at=1.0, attempt_id="w-a1", epoch=1, cluster="c", output_path="file:///s/prod/w/attempts/w-a1")
    d = core.on_promote_requested(FenceRecord(epoch=1, current_attempt="w-a1"), e, 3.0, "file:///s/prod/w/result/manifest.json", m)
    promoted = d.events[0]
    assert isinstance(promoted, ev.Promoted) and promoted.result_bytes == 1500 + 20
    assert d.promote is not None and d.promote.manifest == m


def test_promoted_without_result_bytes_still_decodes() -> None:
    """EVOLUTION rule 1: a `promoted` from before the field decodes, with 0 (not measured)."""
    new = ev.Promoted(workload_id="w", at=1.0, attempt_id="w-a1", epoch=1, cluster="c", output_path="/o", result_path="/r", result_bytes=7)
    old = msgspec.json.decode(msgspec.json.encode(new))
    del old["result_bytes"]
    e = decode_event(msgspec.json.encode(old))
    assert isinstance(e, ev.Promoted) and e.result_bytes == 0
    inp = msgspec.json.decode(b'{"stage":"prep","workload_id":"p--prep","attempt_id":"p--prep-a1","result_path":"/r"}', type=ev.StageInput)
    assert inp.size_bytes == 0
