"""gpuorch's agent: the program that runs in gpuorch's own image inside an attempt's pod and moves
bytes between the pod's volumes and the object stores (issue 28, docs/storage.md "gpuorch's
agent in the pod"). The pod shares no disk with the control plane: this is the only way data gets
in and out.

    python -m gpuorch.workloads.agent sync  --store S --prefix P [--checkpoint-store S2] [--interval 1]
    python -m gpuorch.workloads.agent ready
    python -m gpuorch.workloads.agent stage --store LOC --dataset NAME@VERSION --size-gb G \\
        [--bandwidth-mbps B] [--time-scale T] [--cache /gpuorch-cache]
    python -m gpuorch.workloads.agent fetch --store S --key K --to PATH
    python -m gpuorch.workloads.agent fetch-result --store S --key WID/result/manifest.json --to DIR

- ``sync`` (the native sidecar): writes ``/gpuorch/.agent-ready`` once its store clients are built
  (``ready`` is its startupProbe); then every interval uploads the checkpoints under
  ``/gpuorch/checkpoints`` to ``<S2 or S>/<P>/checkpoints/<rel>``, the outputs under
  ``/gpuorch/out`` to ``<S>/<P>/<rel>`` and the program's first-step marker
  (`gpuorch.observe.progress`) once to ``<S>/<P>/.gpuorch/started.json``, and every new version of
  its progress (useful work) to ``<S>/<P>/.gpuorch/progress.json``. A file is uploaded when
  it is new or changed (size, mtime) and either unchanged across two looks or renamed into place
  (first seen with an mtime older than the previous look). ``*.tmp`` files are partial writes and
  skipped; checkpoints skip dot-files too; symlinks are never followed. On SIGTERM/SIGINT: one
  final pass uploads everything left, then the **upload record** (every output's key, size and
  sha256) is written at ``<S>/<P>/.gpuorch/upload.json``, last. An upload that fails in the final
  pass writes no record and exits 1: a cut upload is never promoted. A store that fails during the
  loop is logged and tried again at the next interval.
- ``stage``: copies ``<LOC>/<NAME@VERSION>/`` into ``<cache>/<NAME@VERSION>/`` with
  the rules of `gpuorch.workloads.stage` (``.complete`` written inside a ``.tmp`` directory, then
  renamed; ``flock`` on ``.lock``; a hit when ``.complete`` exists; a stale ``.tmp`` removed),
  checking each file's size against the listing and recording its sha256 in ``.complete``; a
  ``SHA256SUMS`` object (``<hex>  <relpath>`` lines) must name every file, with its digest. The
  simulated link: at least ``transfer_seconds(size_gb, bandwidth) / time_scale`` real seconds.
- ``fetch``: one object (a checkpoint) to a file, atomically (temporary name, then rename).
- ``fetch-result``: a result manifest's objects into a directory, each checked against the
  manifest's size and sha256; the directory appears whole or not at all.

Each prints one JSON line of what it did and exits 0; 2 when retrying will not help (bad
arguments, a store the Job does not name, a missing object, a checksum mismatch), with one line
on stderr naming the store and key; 1 on I/O errors worth a retry.

The termination message (``/dev/termination-log``, which the kubelet creates and reports in the
container's status): ``stage`` writes its result there as compact JSON (`stage_message`: no list
of objects, the location's store name in ``store``, under 4 KiB), which is how the dispatcher
learns the staging throughput per (location, cluster) without reading the pod's disk; a failure
writes its one-line reason. Nothing is written when the file does not exist (not in a pod).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from gpuorch.objectstore import Store, StoreUnavailable, open_store
from gpuorch.observe.progress import marker_path, work_path
from gpuorch.workloads.stage import COMPLETE, StageError, check_ref, transfer_seconds
from gpuorch_proto import podpath
from gpuorch_proto.storage import (
    CHECKPOINTS,
    MARKER,
    META_DIR,
    PROGRESS,
    UPLOAD_RECORD,
    ObjectInfo,
    StoreError,
    UploadedObject,
    UploadRecord,
    config_from_env,
    decode_manifest,
)
from gpuorch_proto.subjects import valid_token

PROG = "gpuorch.workloads.agent"
EXIT_OK, EXIT_RETRY, EXIT_PERMANENT = 0, 1, 2
#: Objects moved at once (stage, fetch-result, a sync pass).
CONCURRENCY = 8
SHA256SUMS = "SHA256SUMS"
#: A file first seen with an mtime this much older than the previous look was renamed into place
#: (a coarse file system clock may stamp a write a little before the look that missed it).
RENAME_MARGIN_NS = 50_000_000
_record_encoder = msgspec.json.Encoder()
T = TypeVar("T")


class Permanent(Exception):
    """Retrying will not help (exit 2): the message names the store and key."""


class Retry(Exception):
    """An I/O problem that a retry may not see again (exit 1)."""


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _emit(doc: Mapping[str, Any]) -> None:
    print(json.dumps(doc, sort_keys=True), flush=True)


#: what of `stage`'s result its termination message carries (never the objects' list)
STAGE_MESSAGE_KEYS = (
    "dataset", "cache_hit", "source", "size_gb", "bytes", "files", "bandwidth_mbps", "time_scale",
    "real_seconds", "simulated_seconds", "staged_at", "verified_by",
)  # fmt: skip
#: dropped, in this order, while the message is over the limit
_DROPPABLE = ("source", "verified_by")


def stage_message(result: Mapping[str, Any], store: str, limit: int = podpath.TERMINATION_MESSAGE_LIMIT) -> bytes:
    """`stage`'s result as its termination message: compact JSON of `STAGE_MESSAGE_KEYS` and the
    location's store name, at most `limit` bytes (the long strings dropped first; b"" if it
    still does not fit)."""
    doc = {k: result[k] for k in STAGE_MESSAGE_KEYS if k in result}
    doc["store"] = store
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    for key in _DROPPABLE:
        if len(data) <= limit:
            break
        doc.pop(key, None)
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return data if len(data) <= limit else b""


def _terminate_with(data: bytes, env: Mapping[str, str]) -> None:
    """Write the container's termination message, if there is one to write (the kubelet made the
    file: outside a pod nothing is created). Never fails the command."""
    if not data:
        return
    path = podpath.local(podpath.TERMINATION_LOG, env)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    except OSError:
        return  # not in a pod (or the pod says elsewhere)
    try:
        os.write(fd, data[: podpath.TERMINATION_MESSAGE_LIMIT])
    except OSError as exc:
        _say(f"termination message not written to {path}: {exc}")
    finally:
        os.close(fd)


# --- pure rules -----------------------------------------------------------------------------------


class Look(NamedTuple):
    """A file as one look saw it (`ino`: its inode; a rename into place gives a new one)."""

    size: int
    mtime_ns: int
    ino: int = 0


def due(now: Look, previous: Look | None, uploaded: Look | None, previous_look_at_ns: int | None, look_at_ns: int | None = None) -> bool:
    """Is a file ready to upload at this look? Only when it is new or changed since its upload,
    and complete: unchanged since the previous look; or renamed into place: absent at the
    previous look yet last written well before it, or another file (inode) than at the previous
    look and not written for a margin before this look. The last rule is what uploads a
    checkpoint that the program replaces (write, then rename) more often than the agent looks:
    with "unchanged across two looks" alone it would never be stable, and never uploaded
    until the program ended."""
    if now == uploaded:
        return False
    if now == previous:
        return True
    if previous is None:
        return previous_look_at_ns is not None and now.mtime_ns < previous_look_at_ns - RENAME_MARGIN_NS
    replaced = now.ino != previous.ino and now.ino != 0
    return replaced and look_at_ns is not None and now.mtime_ns < look_at_ns - RENAME_MARGIN_NS


def wanted(rel: str, kind: str) -> bool:
    """Which files of a tree are uploaded: never partial writes (``*.tmp``); for checkpoints no
    dot-files either (`latest_checkpoint`'s rule); for outputs never gpuorch's own names
    (``.gpuorch/``, and ``checkpoints/``, which the attempt's checkpoints use)."""
    parts = rel.split("/")
    if parts[-1].endswith(".tmp"):
        return False
    if kind == "checkpoint":
        return not any(p.startswith(".") for p in parts)
    return parts[0] not in (META_DIR, CHECKPOINTS)


def safe_key(key: str) -> bool:
    """A relative key that stays inside the directory it is written under."""
    parts = key.split("/")
    return bool(key) and not key.startswith("/") and all(p not in ("", ".", "..") for p in parts) and "\\" not in key


def ids_from_prefix(prefix: str) -> tuple[str, str] | None:
    """(workload, attempt) of an attempt prefix ``[...]/<wid>/attempts/<att>``, or None."""
    parts = [p for p in prefix.strip("/").split("/") if p]
    if len(parts) >= 3 and parts[-2] == "attempts" and valid_token(parts[-3]) and valid_token(parts[-1]):
        return parts[-3], parts[-1]
    return None


def parse_sha256sums(text: str, at: str) -> dict[str, str]:
    """``sha256sum`` output (``<hex>  <relpath>``, or ``<hex> *<relpath>``): relpath -> digest."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, name = line.partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name
        digest = digest.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not safe_key(name):
            raise Permanent(f"{at}: line {n} is not '<sha256>  <relpath>': {line[:200]!r}")
        out[name.removeprefix("./")] = digest
    return out


def checksum_problems(digests: Mapping[str, str], sums: Mapping[str, str]) -> list[str]:
    """What does not agree between the files' digests and a SHA256SUMS (empty: all agree)."""
    problems = [f"{k}: sha256 {digests[k]}, SHA256SUMS says {sums[k]}" for k in sorted(digests) if k in sums and digests[k] != sums[k]]
    problems += [f"{k}: not in SHA256SUMS" for k in sorted(digests) if k not in sums]
    problems += [f"{k}: in SHA256SUMS, not in the dataset" for k in sorted(sums) if k not in digests]
    return problems


# --- local files ------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def scan(root: Path) -> dict[str, Look]:
    """Regular files under `root` by relative path; symlinks (to files or directories) are
    neither listed nor followed."""
    out: dict[str, Look] = {}
    if not root.is_dir():
        return out
    for here, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(here) / name
            try:
                st = path.lstat()
            except OSError:
                continue  # gone since the walk saw it
            if stat.S_ISREG(st.st_mode):
                out[path.relative_to(root).as_posix()] = Look(st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _look(path: Path) -> Look:
    st = path.lstat()
    return Look(st.st_size, st.st_mtime_ns, st.st_ino)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _missing(exc: BaseException) -> bool:
    """Did the store say the object is not there (not a failure to reach it)?"""
    from obstore.exceptions import NotFoundError

    return isinstance(exc.__cause__, (NotFoundError, FileNotFoundError))


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


async def _bounded(items: Sequence[T], work: Callable[[T], Awaitable[Any]]) -> list[Any]:
    """`work` on every item, CONCURRENCY at a time; the first error is raised after all settle."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(item: T) -> Any:
        async with gate:
            return await work(item)

    results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _store(name: str, env: Mapping[str, str]) -> Store:
    return open_store(name, config_from_env(name, env), env)


# --- sync ---------------------------------------------------------------------------------------------


@dataclass
class Tree:
    """One local directory the sidecar mirrors into a store."""

    kind: str  # "checkpoint" | "output"
    root: Path
    store: Store
    base: str  # key prefix in the store
    previous: dict[str, Look] = field(default_factory=dict)
    previous_at_ns: int | None = None
    uploaded: dict[str, tuple[Look, str]] = field(default_factory=dict)  # rel -> (look, sha256)

    def key(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    async def upload(self, rel: str, look: Look) -> bool:
        """Upload one file as it is now, if it is still as `look` saw it (else the next look
        decides again). True when uploaded."""
        path = self.root / rel
        digest = await asyncio.to_thread(sha256_file, path)
        if await asyncio.to_thread(_look, path) != look:
            return False
        await self.store.put_file(self.key(rel), path)
        if await asyncio.to_thread(_look, path) != look:
            return False  # written while uploading: the next look uploads it again
        self.uploaded[rel] = (look, digest)
        return True

    async def step(self, *, final: bool) -> tuple[int, list[str]]:
        """One look: upload what is due (everything changed, when `final`). (uploaded, errors)."""
        at = time.time_ns()
        now = await asyncio.to_thread(scan, self.root)
        now = {rel: look for rel, look in now.items() if wanted(rel, self.kind)}
        todo = [
            (rel, look)
            for rel, look in sorted(now.items())
            if (look != self.uploaded.get(rel, (None,))[0] if final else due(look, self.previous.get(rel), self.uploaded.get(rel, (None,))[0], self.previous_at_ns, at))
        ]  # fmt: skip
        errors: list[str] = []
        done = 0

        async def one(item: tuple[str, Look]) -> None:
            nonlocal done
            rel, look = item
            try:
                for _ in range(3 if final else 1):
                    if await self.upload(rel, look):
                        done += 1
                        return
                    look = await asyncio.to_thread(_look, self.root / rel)
                if final:
                    errors.append(f"{self.store.url_of(self.key(rel))}: {rel} kept changing while it was uploaded")
            except FileNotFoundError:
                if final and (self.root / rel).exists():
                    errors.append(f"{self.store.url_of(self.key(rel))}: {rel} could not be read")
            except (StoreUnavailable, OSError) as exc:
                errors.append(str(exc) if isinstance(exc, StoreUnavailable) else f"{self.root / rel}: {exc}")

        await _bounded(todo, one)
        self.previous, self.previous_at_ns = now, at
        return done, errors

    def objects(self) -> list[UploadedObject]:
        """What is uploaded of what is there now."""
        present = {rel for rel, look in self.previous.items() if self.uploaded.get(rel, (None,))[0] == look}
        return [UploadedObject(rel, self.uploaded[rel][0].size, self.uploaded[rel][1]) for rel in sorted(present)]


class Sidecar:
    def __init__(self, args: argparse.Namespace, env: Mapping[str, str]) -> None:
        self.prefix = args.prefix.strip("/")
        if not safe_key(self.prefix):
            raise Permanent(f"--prefix {args.prefix!r} is not a key prefix (<workload>/attempts/<attempt>)")
        ids = ids_from_prefix(self.prefix)
        wid = env.get("GPUORCH_WORKLOAD_ID") or (ids[0] if ids else None)
        att = env.get("GPUORCH_ATTEMPT_ID") or (ids[1] if ids else None)
        if not wid or not att:
            raise Permanent(f"no workload/attempt id: set GPUORCH_WORKLOAD_ID and GPUORCH_ATTEMPT_ID, or --prefix <wid>/attempts/<att> (got {args.prefix!r})")
        self.workload_id, self.attempt_id = wid, att
        if args.interval <= 0:
            raise Permanent(f"--interval must be > 0, got {args.interval:g}")
        self.interval = float(args.interval)
        self.store = _store(args.store, env)
        ckpt_store = _store(args.checkpoint_store, env) if args.checkpoint_store else self.store
        out = podpath.local(podpath.OUT, env)
        self.outputs = Tree("output", out, self.store, self.prefix)
        self.checkpoints = Tree("checkpoint", podpath.local(podpath.CHECKPOINTS, env), ckpt_store, f"{self.prefix}/{CHECKPOINTS}")
        self.marker = marker_path(out)
        self.marker_sent = False
        self.work = work_path(out)
        self.work_sent: bytes | None = None  # the progress document last uploaded
        self.ready = podpath.local(podpath.AGENT_READY, env)

    async def send_marker(self) -> None:
        if self.marker_sent:
            return
        try:
            data = await asyncio.to_thread(self.marker.read_bytes)
        except FileNotFoundError:
            return
        await self.store.put(f"{self.prefix}/{MARKER}", data)
        self.marker_sent = True

    async def send_progress(self) -> None:
        """The program's progress (useful work), each new version: it replaces it whole (rename)."""
        try:
            data = await asyncio.to_thread(self.work.read_bytes)
        except FileNotFoundError:
            return
        if data == self.work_sent:
            return
        await self.store.put(f"{self.prefix}/{PROGRESS}", data)
        self.work_sent = data

    async def look(self, *, final: bool) -> list[str]:
        errors: list[str] = []
        try:
            await self.send_marker()
        except (StoreUnavailable, OSError) as exc:
            errors.append(f"marker: {exc}")
        try:
            await self.send_progress()
        except (StoreUnavailable, OSError) as exc:  # a measurement: never what keeps outputs from a result
            _say(f"progress not uploaded (tried again at the next look): {exc}")
        for tree in (self.checkpoints, self.outputs):
            _, errs = await tree.step(final=final)
            errors += errs
        return errors

    async def run(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        _atomic_write(self.ready, f"{os.getpid()}\n".encode())
        while not stop.is_set():
            try:
                for e in await self.look(final=False):
                    _say(f"will retry: {e}")
            except Exception as exc:  # never crash the sidecar over one look: try again at the next
                _say(f"will retry: {type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
        errors = await self.look(final=True)
        if errors:
            for e in errors:
                _say(f"final upload failed: {e}")
            _say(f"no upload record written for {self.store.url_of(self.prefix)}: the upload is incomplete")
            return EXIT_RETRY
        objects = self.outputs.objects()
        record = UploadRecord(workload_id=self.workload_id, attempt_id=self.attempt_id, objects=objects, completed_at=time.time())
        key = f"{self.prefix}/{UPLOAD_RECORD}"
        try:
            await self.store.put(key, _record_encoder.encode(record))
        except StoreUnavailable as exc:
            _say(f"upload record not written: {exc}")
            return EXIT_RETRY
        _emit({
            "record": self.store.url_of(key), "outputs": len(objects), "bytes": sum(o.size for o in objects),
            "checkpoints": len(self.checkpoints.uploaded), "marker": self.marker_sent,
            "workload_id": self.workload_id, "attempt_id": self.attempt_id,
        })  # fmt: skip
        return EXIT_OK


async def sync(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    podpath.local(podpath.AGENT_READY, env).unlink(missing_ok=True)  # a previous run's
    return await Sidecar(args, env).run()


def ready(env: Mapping[str, str]) -> int:
    path = podpath.local(podpath.AGENT_READY, env)
    if path.is_file():
        _emit({"ready": True})
        return EXIT_OK
    print(f"{PROG}: not ready: {path} does not exist", file=sys.stderr)
    return EXIT_RETRY


# --- stage --------------------------------------------------------------------------------------------


def _hit(final: Path, pod_path: str) -> dict[str, Any]:
    try:
        doc = json.loads((final / COMPLETE).read_text())
    except (OSError, ValueError):
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    doc.pop("objects", None)
    return {**doc, "cache_hit": True, "path": pod_path, "real_seconds": 0.0, "simulated_seconds": 0.0}


async def stage(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    ref = args.dataset
    try:
        check_ref(ref)
        if args.time_scale <= 0:
            raise StageError(f"--time-scale must be > 0, got {args.time_scale:g}")
        # no bandwidth: the location is the cluster's own (no link to simulate)
        simulated = 0.0 if args.bandwidth_mbps is None else transfer_seconds(args.size_gb, args.bandwidth_mbps)
    except StageError as exc:
        raise Permanent(str(exc)) from None
    cache = podpath.local(args.cache, env)
    final = cache / ref
    pod_path = f"{args.cache.rstrip('/')}/{ref}"
    if (final / COMPLETE).is_file():
        return _staged(_hit(final, pod_path), args.store, env)
    store = _store(args.store, env)
    source = store.url_of(ref) + "/"
    listing = [o for o in await store.list(ref) if o.key != COMPLETE]
    if not listing:
        raise Permanent(f"dataset {ref} not found at {source} (store {args.store})")
    for o in listing:
        if not safe_key(o.key):
            raise Permanent(f"dataset {ref} at {source}: object {o.key!r} is not a relative path")
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f"{ref}.lock"):
        if (final / COMPLETE).is_file():  # another stager finished while this one waited
            return _staged(_hit(final, pod_path), args.store, env)
        clock = time.monotonic
        started = clock()
        tmp = cache / f"{ref}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # left by a stager that was killed

        async def get(o: ObjectInfo) -> tuple[str, str]:
            path = tmp / o.key
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                size, digest = await store.get_file_sha256(f"{ref}/{o.key}", path)
            except StoreUnavailable as exc:
                if _missing(exc):
                    raise Retry(f"{store.url_of(f'{ref}/{o.key}')} was listed but is gone (store {args.store})") from None
                raise
            if size != o.size:
                raise Retry(f"{store.url_of(f'{ref}/{o.key}')}: {size} bytes downloaded, the listing says {o.size}")
            return o.key, digest

        digests = dict(await _bounded(listing, get))
        verified = None
        if SHA256SUMS in digests:
            sums = parse_sha256sums((tmp / SHA256SUMS).read_text(errors="replace"), store.url_of(f"{ref}/{SHA256SUMS}"))
            problems = checksum_problems({k: v for k, v in digests.items() if k != SHA256SUMS}, sums)
            if problems:
                shutil.rmtree(tmp, ignore_errors=True)
                more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
                raise Permanent(f"dataset {ref} at {source} does not match its SHA256SUMS: " + "; ".join(problems[:3]) + more)
            verified = SHA256SUMS
        link = simulated / args.time_scale
        elapsed = clock() - started
        if elapsed < link:
            await asyncio.sleep(link - elapsed)
        real = clock() - started
        sizes = {o.key: o.size for o in listing}
        result: dict[str, Any] = {
            "dataset": ref, "cache_hit": False, "path": pod_path, "source": source, "size_gb": args.size_gb,
            "bandwidth_mbps": args.bandwidth_mbps, "time_scale": args.time_scale, "files": len(listing),
            "bytes": sum(sizes.values()), "real_seconds": round(real, 3),
            "simulated_seconds": round(max(simulated, elapsed * args.time_scale), 3), "staged_at": time.time(),
            "verified_by": verified,
        }  # fmt: skip
        objects = {k: {"size": sizes[k], "sha256": digests[k]} for k in sorted(digests)}
        _atomic_write(tmp / COMPLETE, json.dumps({**result, "objects": objects}, sort_keys=True).encode())
        if final.exists():  # a directory without .complete: not ours to trust
            shutil.rmtree(final)
        os.rename(tmp, final)
    return _staged(result, args.store, env)


def _staged(result: dict[str, Any], store: str, env: Mapping[str, str]) -> int:
    _emit(result)
    _terminate_with(stage_message(result, store), env)
    return EXIT_OK


# --- fetch --------------------------------------------------------------------------------------------


async def _download(store: Store, key: str, dest: Path) -> int:
    """An object into `dest` (whose directory exists); Permanent when there is none."""
    try:
        return await store.get_file(key, dest)
    except StoreUnavailable as exc:
        dest.unlink(missing_ok=True)
        if _missing(exc):
            raise Permanent(f"no object {store.url_of(key)} (store {store.name})") from None
        raise


async def fetch(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    key = args.key.strip("/")
    if not safe_key(key):
        raise Permanent(f"--key {args.key!r} is not an object key")
    store = _store(args.store, env)
    dest = podpath.local(args.to, env)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    size = await _download(store, key, tmp)
    digest = await asyncio.to_thread(sha256_file, tmp)
    os.replace(tmp, dest)
    _emit({"fetched": store.url_of(key), "to": args.to, "bytes": size, "sha256": digest})
    return EXIT_OK


async def fetch_result(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    key = args.key.strip("/")
    if not safe_key(key):
        raise Permanent(f"--key {args.key!r} is not an object key")
    store = _store(args.store, env)
    url = store.url_of(key)
    data = await store.get(key)
    if data is None:
        raise Permanent(f"no result manifest at {url} (store {args.store})")
    try:
        manifest = decode_manifest(data, url)
    except StoreError as exc:
        raise Permanent(str(exc)) from None
    prefix = manifest.prefix.strip("/")
    for o in manifest.objects:
        if not safe_key(o.key) or not safe_key(prefix):
            raise Permanent(f"{url}: names {prefix}/{o.key!r}, not a key inside the store")
    dest = podpath.local(args.to, env)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()

    async def get(o: Any) -> None:
        path = tmp / o.key
        path.parent.mkdir(parents=True, exist_ok=True)
        size = await _download(store, f"{prefix}/{o.key}", path)
        digest = await asyncio.to_thread(sha256_file, path)
        if (size, digest) != (o.size, o.sha256):
            raise Permanent(
                f"{store.url_of(f'{prefix}/{o.key}')} is {size} bytes sha256 {digest}, the manifest {url} says "
                f"{o.size} bytes sha256 {o.sha256}: refused"
            )

    try:
        await _bounded(manifest.objects, get)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dest.exists():
        shutil.rmtree(dest)
    os.rename(tmp, dest)
    _emit({
        "manifest": url, "workload_id": manifest.workload_id, "attempt_id": manifest.attempt_id,
        "objects": len(manifest.objects), "bytes": manifest.total_bytes, "to": args.to,
    })  # fmt: skip
    return EXIT_OK


# --- command line -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sync", help="the sidecar: upload checkpoints, outputs, the marker; the record at SIGTERM")
    s.add_argument("--store", required=True, help="the attempt's store (env GPUORCH_STORE_<NAME>_URL...)")
    s.add_argument("--prefix", required=True, help="the attempt's prefix: <workload>/attempts/<attempt>")
    s.add_argument("--checkpoint-store", default=None, help="the store of checkpoints (default --store)")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between looks")
    sub.add_parser("ready", help="the sidecar's startupProbe: exit 0 once it is ready")
    g = sub.add_parser("stage", help="stage a dataset from a data location into the cluster's cache")
    g.add_argument("--store", required=True, help="the data location's store")
    g.add_argument("--dataset", required=True, help="NAME@VERSION")
    g.add_argument("--size-gb", required=True, type=float, help="declared dataset size (drives link time)")
    g.add_argument(
        "--bandwidth-mbps", type=float, default=None,
        help="the simulated link's bandwidth, MB/s (omitted: the cluster's own location, no link)",
    )  # fmt: skip
    g.add_argument(
        "--time-scale", type=float, default=float(os.environ.get("GPUORCH_TIME_SCALE", "1") or 1),
        help="simulated seconds per real second (default $GPUORCH_TIME_SCALE or 1)",
    )  # fmt: skip
    g.add_argument("--cache", default=podpath.CACHE, help=f"the cache, a pod path (default {podpath.CACHE})")
    f = sub.add_parser("fetch", help="download one object (a checkpoint) atomically")
    f.add_argument("--store", required=True)
    f.add_argument("--key", required=True)
    f.add_argument("--to", required=True, help="a pod path")
    r = sub.add_parser("fetch-result", help="download a result manifest's objects, checked")
    r.add_argument("--store", required=True)
    r.add_argument("--key", required=True, help="<workload>/result/manifest.json")
    r.add_argument("--to", required=True, help="a pod directory")
    return p


async def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if args.command == "sync":
        return await sync(args, env)
    if args.command == "stage":
        return await stage(args, env)
    if args.command == "fetch":
        return await fetch(args, env)
    return await fetch_result(args, env)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    environ = os.environ if env is None else env
    if args.command == "ready":
        return ready(environ)
    try:
        return asyncio.run(_run(args, environ))
    except (Permanent, StoreError) as exc:
        return _failed(f"{args.command}: {exc}", EXIT_PERMANENT, environ)
    except (Retry, StoreUnavailable) as exc:
        return _failed(f"{args.command}: {exc}", EXIT_RETRY, environ)
    except OSError as exc:
        return _failed(f"{args.command}: I/O error: {exc}", EXIT_RETRY, environ)


def _failed(reason: str, code: int, env: Mapping[str, str]) -> int:
    """Say why on stderr and in the termination message (the pod's status shows it)."""
    _say(reason)
    _terminate_with(f"{PROG}: {reason}".encode(errors="replace"), env)
    return code


def _exit(code: int) -> None:
    """Exit with `code`, skipping the interpreter's finalisation: after a failed streamed upload
    obstore's runtime sometimes aborts while Python shuts down (SIGABRT, exit 134 instead of 1,
    seen with obstore 0.12.1 and a file:// store). The exit code is the agent's answer to the
    kubelet, so nothing may change it after the work is done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
