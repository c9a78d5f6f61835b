"""Object-store benches (issue 28, "Targets"): against a real S3 server the bench starts itself
(SeaweedFS, `gpuorch.dev.seaweed`) and, for comparison, a file:// store in a temporary directory.
Every figure comes from the code the services and the agent run, not a re-implementation:

* **promotion**: a result of N objects (default 1,000 x 1 MiB = 1,000 MiB) is put under an
  attempt's prefix with the upload record gpuorch's agent writes last (`UploadRecord` at
  `UPLOAD_RECORD`, each object's key, size and sha256); then the fencer's promotion is timed:
  `gpuorch_fencer.publish.prepare` (listing + the record) and `publish.publish` (the manifest,
  create-only), on a store wrapped by `CountingStore` (every `Store` call and the bytes it
  returned or sent). Against S3 the fencer's client also goes through `WireCounter`, a TCP relay
  in front of the server that counts HTTP requests and the bytes on the wire each way (listing
  pages included). Goal: no object's bytes through the fencer, only the manifest's.
* **lookup**: N small objects (default 10,000) under one attempt's ``checkpoints/`` prefix (put
  64 at a time); the dispatcher's own lookup (`Dispatcher.latest_checkpoint`: the store's
  listing and `gpuorch_proto.storage.latest_checkpoint`) timed (median of a few), with its store
  calls and, against S3, its HTTP requests (listing pages).
* **staging**: a dataset of N objects (default 200 x 1 MiB) staged into a cache by gpuorch's
  agent as the dispatcher's Job runs it (``python -m gpuorch.workloads.agent stage --store LOC
  --dataset REF --size-gb G --time-scale 1 --cache /gpuorch-cache``: no ``--bandwidth-mbps``, so
  no simulated link; the store reaches it as `pod_store_env` and the cluster's Secret give it, the
  pod's paths under a temporary ``GPUORCH_POD_ROOT``), against a plain obstore copy of the same
  objects in the same run (`obstore.list`, then `obstore.get_async` each into a file, the
  agent's concurrency). The agent's throughput is given twice: the whole process (interpreter
  start, store client, listing, copy, sha256 of every file, ``.complete``) and the copy as it
  reports it (``real_seconds``: from its lock to the rename). Goal: ratio >= 0.8.

``python -m gpuorch.dev.bench storage`` (or ``--only storage``) runs only this bench;
``python -m gpuorch.dev.bench.storage [--objects N] [--object-kib K] [--checkpoints N]
[--stage-objects N] [--stage-object-kib K] [--backend s3|file]`` sets the sizes. docs/performance.md
"Storage (issue 28)" has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import obstore

from gpuorch.dev.bench.rows import Row
from gpuorch.objectstore import Store, open_store
from gpuorch_proto import podpath
from gpuorch_proto.storage import (
    UPLOAD_RECORD,
    Manifest,
    ObjectInfo,
    StoreConfig,
    UploadedObject,
    UploadRecord,
    attempt_prefix,
    checkpoints_prefix,
    pod_store_env,
)

MiB = 1 << 20
BUCKET = "bench"
SECRET = "bench-store-credentials"  # the cluster's Secret the Job names (its data: `Backend.secret`)
T = TypeVar("T")


# --- counting ---------------------------------------------------------------------------------------


@dataclass
class Counts:
    """What a process asked of a store through `Store`: calls by method, bytes each way, keys read."""

    calls: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0  # object bytes returned by get / get_file
    bytes_written: int = 0  # object bytes sent by put / put_file
    listed: int = 0  # objects the listings returned
    keys_read: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.calls.values())


class CountingStore(Store):
    """A `Store` that counts what goes through it (the same client: every call is the real one)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.name, inner.url, inner.client)
        self.counts = Counts()

    def reset(self) -> None:
        self.counts = Counts()

    async def list(self, prefix: str) -> list[ObjectInfo]:
        self.counts.calls["list"] += 1
        out = await super().list(prefix)
        self.counts.listed += len(out)
        return out

    async def get(self, key: str) -> bytes | None:
        self.counts.calls["get"] += 1
        data = await super().get(key)
        self.counts.keys_read.append(key)
        self.counts.bytes_read += len(data or b"")
        return data

    async def put(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        self.counts.calls["put"] += 1
        done = await super().put(key, data, create_only=create_only)
        self.counts.bytes_written += len(data) if done else 0
        return done

    async def put_file(self, key: str, path: Path) -> None:
        self.counts.calls["put_file"] += 1
        await super().put_file(key, path)
        self.counts.bytes_written += path.stat().st_size

    async def get_file(self, key: str, path: Path) -> int:
        self.counts.calls["get_file"] += 1
        size = await super().get_file(key, path)
        self.counts.keys_read.append(key)
        self.counts.bytes_read += size
        return size

    async def copy(self, src: str, dst: str) -> None:
        self.counts.calls["copy"] += 1
        await super().copy(src, dst)

    async def delete(self, key: str) -> None:
        self.counts.calls["delete"] += 1
        await super().delete(key)


@dataclass
class Wire:
    """HTTP requests (by kind) and bytes each way, as `WireCounter` saw them."""

    requests: Counter[str] = field(default_factory=Counter)
    sent: int = 0  # client -> server (request lines, headers, bodies)
    received: int = 0  # server -> client (status, headers, bodies: listing pages, objects)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class WireCounter:
    """A TCP relay in front of an HTTP server that counts the requests through it and the bytes
    each way. Requests are delimited by their headers and ``Content-Length`` (what obstore's
    client sends; a chunked body is relayed as is and counted once). The relay forwards every
    byte unchanged, so a signed request (its ``Host`` is the relay's) stays valid."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.wire = Wire()
        self.server: asyncio.base_events.Server | None = None
        self.endpoint = ""

    def reset(self) -> Wire:
        done, self.wire = self.wire, Wire()
        return done

    async def start(self) -> WireCounter:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.endpoint = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)

    @staticmethod
    def kind(head: bytes) -> str:
        method, _, rest = head.partition(b" ")
        target = rest.split(b" ", 1)[0]
        if method == b"GET" and b"list-type=" in target:  # ListObjectsV2: one page
            return "LIST"
        return method.decode("latin-1")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return

        async def requests() -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    self.wire.requests[self.kind(head)] += 1
                    self.wire.sent += len(head)
                    up_w.write(head)
                    headers = {
                        k.strip().lower(): v.strip()
                        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
                    }
                    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                        while data := await reader.read(1 << 16):  # the rest of this connection, as is
                            self.wire.sent += len(data)
                            up_w.write(data)
                            await up_w.drain()
                        break
                    left = int(headers.get(b"content-length", b"0") or 0)
                    while left > 0:
                        data = await reader.read(min(left, 1 << 16))
                        if not data:
                            return
                        left -= len(data)
                        self.wire.sent += len(data)
                        up_w.write(data)
                        await up_w.drain()
                    await up_w.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    up_w.close()

        async def responses() -> None:
            try:
                while data := await up_r.read(1 << 16):
                    self.wire.received += len(data)
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                with contextlib.suppress(Exception):
                    writer.close()

        await asyncio.gather(requests(), responses())


# --- where the stores are -----------------------------------------------------------------------------


@dataclass
class Backend:
    """One kind of store: SeaweedFS over S3 (`endpoint`), or a directory (file://, `root`)."""

    kind: str  # "s3" | "file"
    root: Path | None = None  # file://: the stores' directory
    endpoint: str = ""  # s3: the server
    credentials: Callable[[str], dict[str, str]] | None = None  # s3: a store name's env
    secret: dict[str, str] = field(default_factory=dict)  # s3: the cluster's Secret's data
    relay: WireCounter | None = None  # s3: counts the HTTP requests of the measured clients
    bucket: str = BUCKET  # s3

    def config(self, prefix: str, *, counted: bool = False) -> StoreConfig:
        if self.kind == "file":
            assert self.root is not None
            return StoreConfig(url=(self.root / prefix).resolve().as_uri())
        from gpuorch.dev.seaweed import REGION

        endpoint = self.relay.endpoint if counted and self.relay is not None else self.endpoint
        return StoreConfig(url=f"s3://{self.bucket}/{prefix}", endpoint=endpoint, region=REGION)

    def env(self, name: str) -> dict[str, str]:
        return self.credentials(name) if self.credentials is not None else {}

    def open(self, name: str, prefix: str, *, counted: bool = False) -> Store:
        return open_store(name, self.config(prefix, counted=counted), self.env(name))

    def wire(self) -> Wire | None:
        return self.relay.reset() if self.relay is not None else None


@contextlib.asynccontextmanager
async def s3_backend(state_dir: Path) -> Any:
    """A SeaweedFS server with the bench's bucket, and a relay in front of it."""
    from gpuorch.dev.seaweed import SeaweedS3

    server = await asyncio.to_thread(SeaweedS3(state_dir, buckets=(BUCKET,)).start)
    try:
        async with seaweed_backend(server, BUCKET) as backend:
            yield backend
    finally:
        await asyncio.to_thread(server.stop)


@contextlib.asynccontextmanager
async def seaweed_backend(server: Any, bucket: str) -> Any:
    """A running SeaweedFS server (`gpuorch.dev.seaweed.SeaweedS3`) as a backend, with a relay in
    front of it for the measured clients."""
    from gpuorch.dev.seaweed import ACCESS_KEY, SECRET_KEY

    relay = await WireCounter(server.endpoint).start()
    try:
        secret = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
        yield Backend("s3", endpoint=server.endpoint, credentials=server.env, secret=secret, relay=relay, bucket=bucket)
    finally:
        await relay.stop()


def file_backend(root: Path) -> Backend:
    return Backend("file", root=root)


async def bounded(items: Sequence[T], work: Callable[[T], Awaitable[Any]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(item: T) -> None:
        async with gate:
            await work(item)

    await asyncio.gather(*(one(i) for i in items))


def payload(i: int, block: bytes) -> bytes:
    """The i-th object of a set: one random block, made distinct by its index."""
    return i.to_bytes(8, "big") + block[8:]


# --- promotion -----------------------------------------------------------------------------------------


@dataclass
class Promotion:
    objects: int
    result_bytes: int
    upload_seconds: float
    prepare_ms: float
    publish_ms: float
    outcome: str
    manifest: Manifest | None
    manifest_bytes: int
    record_bytes: int
    counts: Counts
    wire: Wire | None

    @property
    def total_ms(self) -> float:
        return self.prepare_ms + self.publish_ms


async def promotion(backend: Backend, objects: int, object_bytes: int, *, wid: str = "bench-wl", concurrency: int = 16) -> Promotion:
    """An attempt's outputs with the agent's upload record, then the fencer's promotion, counted."""
    from gpuorch_fencer import publish

    att, epoch = f"{wid}-a1", 3
    store = backend.open("results", "results")
    prefix = attempt_prefix(wid, att)
    block = os.urandom(object_bytes)
    uploaded: list[UploadedObject] = []

    async def put(i: int) -> None:
        data = payload(i, block)
        rel = f"shard-{i:05d}.bin"
        await store.put(f"{prefix}/{rel}", data)
        uploaded.append(UploadedObject(rel, len(data), hashlib.sha256(data).hexdigest()))

    t0 = time.perf_counter()
    await bounded(range(objects), put, concurrency)
    # the agent's record, last (`Sidecar.run`: every output's key, size and sha256)
    record = UploadRecord(workload_id=wid, attempt_id=att, objects=sorted(uploaded, key=lambda o: o.key), completed_at=time.time())
    raw_record = msgspec.json.Encoder().encode(record)
    await store.put(f"{prefix}/{UPLOAD_RECORD}", raw_record)
    upload_seconds = time.perf_counter() - t0

    fencer = CountingStore(backend.open("results", "results", counted=True))
    await fencer.get("bench-warm-up")  # the fencer's client is long-lived: its connection is open
    fencer.reset()
    backend.wire()
    t0 = time.perf_counter()
    manifest = await publish.prepare(fencer, wid, att, epoch, time.time())
    t1 = time.perf_counter()
    if not isinstance(manifest, Manifest):
        raise RuntimeError(f"promotion: no manifest: {manifest}")
    done = await publish.publish(fencer, wid, att, epoch, manifest)
    t2 = time.perf_counter()
    return Promotion(
        objects=objects, result_bytes=sum(o.size for o in uploaded), upload_seconds=upload_seconds,
        prepare_ms=(t1 - t0) * 1e3, publish_ms=(t2 - t1) * 1e3, outcome=done.outcome, manifest=done.manifest,
        manifest_bytes=len(publish.encode_manifest(manifest)), record_bytes=len(raw_record),
        counts=fencer.counts, wire=backend.wire(),
    )  # fmt: skip


# --- checkpoint lookup -----------------------------------------------------------------------------------


@dataclass
class Lookup:
    objects: int
    found: str | None
    expected: str
    ms: list[float]
    counts: Counts  # of one lookup
    wire: Wire | None  # of one lookup
    put_seconds: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)


def checkpoint_names(n: int) -> tuple[list[str], str]:
    """`n` names under a checkpoints prefix, and the newest complete one: ``step-2`` ..
    ``step-<n>`` by natural order (``step-10000`` after ``step-9999``) and a partial
    ``step-<n+1>.tmp`` (never the newest)."""
    names = [f"step-{i}" for i in range(2, n + 1)] + [f"step-{n + 1}.tmp"]
    return names, f"step-{n}"


async def lookup(backend: Backend, objects: int, *, repeat: int = 5, wid: str = "bench-ck", concurrency: int = 64) -> Lookup:
    """`objects` checkpoints under one attempt's prefix, then the dispatcher's lookup, timed."""
    from gpuorch.config import Settings
    from gpuorch.objectstore import Stores
    from gpuorch.projection import AttemptView
    from gpuorch_dispatcher.service import Dispatcher

    att = f"{wid}-a1"
    store = backend.open("checkpoints", "checkpoints")
    prefix = checkpoints_prefix(wid, att)
    names, expected = checkpoint_names(objects)
    t0 = time.perf_counter()
    await bounded(names, lambda n: store.put(f"{prefix}/{n}", f"checkpoint {n}\n".encode()), concurrency)
    put_seconds = time.perf_counter() - t0

    d = Dispatcher(Settings(prefix="bench"))
    d.stores = Stores({"checkpoints": backend.config("checkpoints", counted=True)}, None, backend.env("checkpoints"))
    counted = CountingStore(d.stores["checkpoints"])
    d.stores._open["checkpoints"] = counted  # the dispatcher's own client of the store, counted
    a = AttemptView(attempt_id=att, number=1, epoch=1, cluster="a", checkpoint_path=store.url_of(prefix))
    await counted.get("bench-warm-up")  # a long-lived client: its connection is open
    ms: list[float] = []
    counts, wire = Counts(), None
    found: str | None = None
    for _ in range(repeat):
        counted.reset()
        backend.wire()
        t = time.perf_counter()
        url = await d.latest_checkpoint(a)
        ms.append((time.perf_counter() - t) * 1e3)
        counts, wire = counted.counts, backend.wire()
        found = None if url is None else url.rsplit("/", 1)[-1]
    return Lookup(objects=objects, found=found, expected=expected, ms=ms, counts=counts, wire=wire, put_seconds=put_seconds)


# --- staging -----------------------------------------------------------------------------------------------


@dataclass
class Staging:
    objects: int
    nbytes: int
    plain_seconds: list[float]
    agent_seconds: list[float]  # the whole process
    agent_copy_seconds: list[float]  # as the agent reports it (`real_seconds`)
    staged: Path  # the last staged copy (the pod's cache)
    source: dict[str, bytes]  # what was put

    @staticmethod
    def rate(nbytes: int, seconds: list[float]) -> float:
        return nbytes / MiB / min(seconds)

    @property
    def plain_mbps(self) -> float:
        return self.rate(self.nbytes, self.plain_seconds)

    @property
    def agent_mbps(self) -> float:
        return self.rate(self.nbytes, self.agent_seconds)

    @property
    def agent_copy_mbps(self) -> float:
        return self.rate(self.nbytes, self.agent_copy_seconds)


def pod_env(backend: Backend, name: str, config: StoreConfig, pod_root: Path) -> dict[str, str]:
    """The env of the Job's stage container as the kubelet gives it: `pod_store_env`'s values,
    its `secretKeyRef`s resolved from the cluster's Secret, the pod's root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")}
    env[podpath.POD_ROOT] = str(pod_root)
    env["GPUORCH_WORKLOAD_ID"], env["GPUORCH_ATTEMPT_ID"] = "bench-stage", "bench-stage-a1"
    for e in pod_store_env(name, config, SECRET if backend.secret else None):
        if "value" in e:
            env[str(e["name"])] = str(e["value"])
        else:
            ref: Any = e["valueFrom"]
            key = ref["secretKeyRef"]["key"]
            if key in backend.secret:
                env[str(e["name"])] = backend.secret[key]
    return env


async def plain_copy(client: Any, ref: str, dest: Path, concurrency: int) -> int:
    """The baseline: list the dataset, then each object into a file (obstore, nothing else)."""
    listing = [o async for page in obstore.list(client, prefix=f"{ref}/", chunk_size=1000) for o in page]
    total = 0

    async def one(o: Any) -> None:
        nonlocal total
        key = str(o["path"])
        path = dest / key[len(ref) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        got = await obstore.get_async(client, key)
        with path.open("wb") as f:
            async for chunk in got:
                f.write(chunk)
                total += len(chunk)

    await bounded(listing, one, concurrency)
    return total


async def staging(backend: Backend, work: Path, objects: int, object_bytes: int, *, rounds: int = 3, ref: str = "bench-data@v1") -> Staging:
    """A dataset in a data location, staged `rounds` times each by the agent and by a plain copy."""
    from gpuorch.workloads.agent import CONCURRENCY

    name = "data"
    config = backend.config("locations/data")
    store = backend.open(name, "locations/data")
    block = os.urandom(object_bytes)
    source = {f"part-{i:05d}.bin": payload(i, block) for i in range(objects)}
    await bounded(list(source.items()), lambda kv: store.put(f"{ref}/{kv[0]}", kv[1]), 16)
    nbytes = sum(len(v) for v in source.values())
    size_gb = nbytes / 1e9
    plain: list[float] = []
    agent: list[float] = []
    agent_copy: list[float] = []
    staged = work
    repo = Path(__file__).resolve().parents[3]
    for r in range(rounds):
        dest = work / f"plain-{r}"
        await asyncio.to_thread(os.sync)  # what the setup and the previous round wrote: not timed
        t0 = time.perf_counter()
        got = await plain_copy(store.client, ref, dest, CONCURRENCY)
        plain.append(time.perf_counter() - t0)
        if got != nbytes:
            raise RuntimeError(f"plain copy: {got} bytes, {nbytes} put")
        await asyncio.to_thread(_rmtree, dest)

        root = work / f"pod-{r}"
        env = pod_env(backend, name, config, root)
        cmd = [
            sys.executable, "-m", "gpuorch.workloads.agent", "stage", "--store", name, "--dataset", ref,
            "--cache", podpath.CACHE, "--size-gb", f"{size_gb:g}", "--time-scale", "1",
        ]  # fmt: skip (as the dispatcher's Job: core.py, the cluster's own location: no --bandwidth-mbps)
        await asyncio.to_thread(os.sync)
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*cmd, env=env, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate()
        agent.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"agent stage exited {proc.returncode}: {err.decode()[-2000:]}")
        doc = json.loads(out.decode().strip().splitlines()[-1])
        if doc.get("cache_hit") or doc.get("bytes") != nbytes:
            raise RuntimeError(f"agent stage: {doc}")
        agent_copy.append(float(doc["real_seconds"]))
        staged = podpath.local(f"{podpath.CACHE}/{ref}", env)
        if r + 1 < rounds:
            await asyncio.to_thread(_rmtree, root)
    return Staging(objects, nbytes, plain, agent, agent_copy, staged, source)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --- the bench -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    objects: int = 1_000
    object_bytes: int = MiB
    checkpoints: int = 10_000
    stage_objects: int = 200
    stage_object_bytes: int = MiB

    @classmethod
    def quick(cls) -> Sizes:
        return cls(objects=100, checkpoints=2_000, stage_objects=50)


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n / 1024:,.1f} KiB"


async def measure(backend: Backend, work: Path, sizes: Sizes) -> list[Row]:
    label = "SeaweedFS S3" if backend.kind == "s3" else "file://"
    rows: list[Row] = []
    t0 = time.perf_counter()
    p = await promotion(backend, sizes.objects, sizes.object_bytes)
    case = f"{label}: promote {p.objects:,} obj, {_mib(p.result_bytes)}"
    c = p.counts
    rows += [
        Row("storage", case, "fencer: prepare + publish", p.total_ms, f"ms (prepare {p.prepare_ms:.0f}, publish {p.publish_ms:.0f})"),
        Row("storage", case, "fencer: store calls", c.requests, " ".join(f"{k} {v}" for k, v in sorted(c.calls.items()))),
        Row("storage", case, "fencer: bytes read (get)", c.bytes_read, f"B (the upload record: {p.record_bytes:,} B; {c.bytes_read / p.result_bytes:.1e} x the result)"),
        Row("storage", case, "fencer: bytes written (put)", c.bytes_written, f"B (the manifest: {p.manifest_bytes:,} B; {c.bytes_written / p.result_bytes:.1e} x the result)"),
    ]  # fmt: skip
    if p.wire is not None:
        w = p.wire
        rows += [
            Row("storage", case, "fencer: HTTP requests", w.total, " ".join(f"{k} {v}" for k, v in sorted(w.requests.items()))),
            Row("storage", case, "fencer: wire bytes in (incl. listing)", w.received, f"B ({w.received / p.result_bytes:.1e} x the result)"),
            Row("storage", case, "fencer: wire bytes out", w.sent, f"B ({w.sent / p.result_bytes:.1e} x the result)"),
        ]  # fmt: skip
    rows.append(Row("storage", case, "setup: upload (not the fencer)", p.result_bytes / MiB / p.upload_seconds, f"MB/s ({p.upload_seconds:.1f} s)"))
    print(f"# storage {label} promotion: {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    t0 = time.perf_counter()
    lk = await lookup(backend, sizes.checkpoints)
    case = f"{label}: checkpoint lookup, {lk.objects:,} obj"
    ok = "found" if lk.found == lk.expected else f"WRONG: {lk.found}, expected {lk.expected}"
    rows += [
        Row("storage", case, "dispatcher: latest_checkpoint", lk.median_ms, f"ms (median of {len(lk.ms)}, min {min(lk.ms):.0f}; {ok} {lk.found})"),
        Row("storage", case, "dispatcher: store calls", lk.counts.requests, f"({lk.counts.listed:,} objects listed)"),
    ]  # fmt: skip
    if lk.wire is not None:
        rows += [
            Row("storage", case, "dispatcher: HTTP requests (pages)", lk.wire.total, " ".join(f"{k} {v}" for k, v in sorted(lk.wire.requests.items()))),
            Row("storage", case, "dispatcher: wire bytes in", lk.wire.received, "B"),
        ]  # fmt: skip
    print(f"# storage {label} lookup: {time.perf_counter() - t0:.1f}s (puts {lk.put_seconds:.1f}s)", file=sys.stderr)

    t0 = time.perf_counter()
    st = await staging(backend, work / "stage", sizes.stage_objects, sizes.stage_object_bytes)
    case = f"{label}: stage {st.objects:,} obj, {_mib(st.nbytes)}"
    rows += [
        Row("storage", case, "plain obstore copy (baseline)", st.plain_mbps, f"MB/s (best of {len(st.plain_seconds)}: {min(st.plain_seconds):.2f} s)"),
        Row("storage", case, "agent stage, whole process", st.agent_mbps, f"MB/s ({min(st.agent_seconds):.2f} s; {st.agent_mbps / st.plain_mbps:.2f} x the baseline, goal 0.8)"),
        Row("storage", case, "agent stage, its copy (real_seconds)", st.agent_copy_mbps, f"MB/s ({min(st.agent_copy_seconds):.2f} s; {st.agent_copy_mbps / st.plain_mbps:.2f} x the baseline)"),
    ]  # fmt: skip
    print(f"# storage {label} staging: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return rows


async def _run(sizes: Sizes, backends: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-storage-") as tmp:
        work = Path(tmp)
        if "s3" in backends:
            async with s3_backend(work / "seaweed") as s3:
                rows += await measure(s3, work / "s3", sizes)
        if "file" in backends:
            rows += await measure(file_backend(work / "stores"), work / "file", sizes)
    return rows


def run(quick: bool = False, sizes: Sizes | None = None, backends: Sequence[str] = ("s3", "file")) -> list[Row]:
    _quiet()
    return asyncio.run(_run(sizes or (Sizes.quick() if quick else Sizes()), backends))


def _quiet() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def main(argv: list[str] | None = None) -> int:
    d = Sizes()
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.storage", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (100 objects, 2,000 checkpoints, 50 staged)")
    ap.add_argument("--objects", type=int, default=None, help=f"objects of the promoted result (default {d.objects:,})")
    ap.add_argument("--object-kib", type=int, default=None, help=f"size of each (default {d.object_bytes // 1024} KiB)")
    ap.add_argument("--checkpoints", type=int, default=None, help=f"objects under the checkpoints prefix (default {d.checkpoints:,})")
    ap.add_argument("--stage-objects", type=int, default=None, help=f"objects of the staged dataset (default {d.stage_objects})")
    ap.add_argument("--stage-object-kib", type=int, default=None, help=f"size of each (default {d.stage_object_bytes // 1024} KiB)")
    ap.add_argument("--backend", action="append", choices=("s3", "file"), help="s3 (SeaweedFS) and/or file (default both)")
    args = ap.parse_args(argv)
    base = Sizes.quick() if args.quick else d
    sizes = Sizes(
        objects=args.objects if args.objects is not None else base.objects,
        object_bytes=args.object_kib * 1024 if args.object_kib is not None else base.object_bytes,
        checkpoints=args.checkpoints if args.checkpoints is not None else base.checkpoints,
        stage_objects=args.stage_objects if args.stage_objects is not None else base.stage_objects,
        stage_object_bytes=args.stage_object_kib * 1024 if args.stage_object_kib is not None else base.stage_object_bytes,
    )  # fmt: skip
    from gpuorch.dev.bench.__main__ import print_table

    print_table(run(sizes=sizes, backends=args.backend or ("s3", "file")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
