"""The storage bench (gpuorch.dev.bench.storage) at a tiny size, against a file:// store and the
suite's SeaweedFS: the structural facts its figures rest on, never its timings. The fencer moves
only the manifest (no object's bytes read, the manifest's bytes written); the dispatcher's lookup
finds the newest checkpoint in one listing; the agent's staged copy equals the source."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuorch.dev.bench import storage as bench
from gpuorch.dev.seaweed import SeaweedS3
from gpuorch.workloads.stage import COMPLETE
from gpuorch_proto.storage import UPLOAD_RECORD, attempt_prefix


@pytest.fixture(params=["file", "s3"])
def server(request: pytest.FixtureRequest) -> SeaweedS3 | None:
    """The suite's SeaweedFS for the s3 case (started outside any event loop: it waits with
    `asyncio.run`), None for file://."""
    return request.getfixturevalue("s3") if request.param == "s3" else None


@pytest.fixture
async def backend(server: SeaweedS3 | None, tmp_path: Path) -> AsyncIterator[bench.Backend]:
    if server is None:
        yield bench.file_backend(tmp_path / "stores")
        return
    async with bench.seaweed_backend(server, "gpuorch") as b:
        yield b


async def test_the_fencer_moves_only_the_manifest(backend: bench.Backend) -> None:
    p = await bench.promotion(backend, 20, 64 * 1024, wid=f"bench-promote-{backend.kind}")
    assert p.outcome == "created" and p.manifest is not None
    assert len(p.manifest.objects) == 20 and p.manifest.total_bytes == p.result_bytes == 20 * 64 * 1024
    c = p.counts
    assert dict(c.calls) == {"list": 1, "get": 1, "put": 1}
    assert c.keys_read == [f"{attempt_prefix(p.manifest.workload_id, p.manifest.attempt_id)}/{UPLOAD_RECORD}"]
    assert c.bytes_read == p.record_bytes  # no object's bytes: only the agent's record
    assert c.bytes_written == p.manifest_bytes  # only the manifest
    if backend.kind == "s3":
        assert p.wire is not None
        assert dict(p.wire.requests) == {"LIST": 1, "GET": 1, "PUT": 1}
        assert p.wire.received < p.result_bytes / 4  # a listing page and the record, never the objects
        assert p.manifest_bytes <= p.wire.sent < p.manifest_bytes + 8192  # the manifest and headers


async def test_the_dispatchers_lookup_finds_the_newest_checkpoint_in_one_listing(backend: bench.Backend) -> None:
    lk = await bench.lookup(backend, 50, repeat=2, wid=f"bench-lookup-{backend.kind}")
    assert lk.found == lk.expected == "step-50"  # natural order: step-50 after step-9; step-51.tmp is partial
    assert dict(lk.counts.calls) == {"list": 1} and lk.counts.listed == 50
    if backend.kind == "s3":
        assert lk.wire is not None and dict(lk.wire.requests) == {"LIST": 1}


async def test_the_agents_staged_copy_equals_the_source(backend: bench.Backend, tmp_path: Path) -> None:
    st = await bench.staging(backend, tmp_path / "work", 20, 16 * 1024, rounds=1, ref=f"bench-{backend.kind}@v1")
    assert st.nbytes == 20 * 16 * 1024
    staged = {p.relative_to(st.staged).as_posix(): p.read_bytes() for p in st.staged.rglob("*") if p.is_file()}
    assert COMPLETE in staged
    del staged[COMPLETE]
    assert staged == st.source
    assert len(st.plain_seconds) == len(st.agent_seconds) == len(st.agent_copy_seconds) == 1
