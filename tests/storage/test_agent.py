"""gpuorch's agent (gpuorch.workloads.agent) as the pod runs it: a real subprocess with the pod's
root in GPUORCH_POD_ROOT and a store's env as `pod_store_env` gives it, against a local directory
(file://) and a real S3 server (SeaweedFS). Conditions are waited for by polling the store."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuorch.dev.seaweed import REGION, SeaweedS3
from gpuorch.objectstore import Store, open_store
from gpuorch.observe.progress import write_marker
from gpuorch.workloads.agent import (
    Look,
    checksum_problems,
    due,
    ids_from_prefix,
    parse_sha256sums,
    safe_key,
    stage_message,
    wanted,
)
from gpuorch.workloads.stage import COMPLETE, transfer_seconds
from gpuorch_proto import podpath
from gpuorch_proto.storage import (
    MARKER,
    UPLOAD_RECORD,
    Manifest,
    StoreConfig,
    decode_upload_record,
    manifest_for,
    manifest_key,
    pod_store_env,
)

REPO = Path(__file__).resolve().parents[2]
AGENT = [sys.executable, "-m", "gpuorch.workloads.agent"]
PREFIX = "w1/attempts/a1"


@dataclass
class Pod:
    """One pod's root and the env its agent gets; `store` is the test's own client of the store."""

    root: Path
    env: dict[str, str]
    store: Store

    def path(self, pod_path: str) -> Path:
        return podpath.local(pod_path, self.env)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AGENT, *args], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
        env = {**self.env, **(extra or {})}
        return subprocess.Popen([*AGENT, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pod_env(root: Path, name: str, config: StoreConfig, credentials: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")}
    env[podpath.POD_ROOT] = str(root)
    env.update({str(e["name"]): str(e["value"]) for e in pod_store_env(name, config, None) if "value" in e})
    env.update(credentials)
    return env


@pytest.fixture(params=["file", "s3"])
def pod(request: pytest.FixtureRequest, tmp_path: Path) -> Pod:
    root = tmp_path / "pod"
    root.mkdir()
    if request.param == "s3":
        server: SeaweedS3 = request.getfixturevalue("s3")
        config = StoreConfig(url=f"s3://gpuorch/agent-{tmp_path.name}", endpoint=server.endpoint, region=REGION)
        creds = server.env("prod")
    else:
        config = StoreConfig(url=(tmp_path / "store").resolve().as_uri())
        creds = {}
    return Pod(root, pod_env(root, "prod", config, creds), open_store("prod", config, creds))


async def eventually(what: str, check: Callable[[], Awaitable[bool]], within: float = 60.0) -> None:
    """Poll `check` until it holds; fail naming `what` when it has not within `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"not within {within:g}s: {what}"
        await asyncio.sleep(0.05)


def place(path: Path, data: bytes) -> None:
    """Write as programs do: a temporary name, then rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)


# --- sync -------------------------------------------------------------------------------------------


async def test_sync_uploads_checkpoints_and_the_marker_while_running_and_outputs_then_the_record_at_sigterm(
    pod: Pod, procs: list[subprocess.Popen[str]]
) -> None:
    assert pod.run("ready").returncode == 1  # the probe fails until the sidecar is up
    agent = pod.start("sync", "--store", "prod", "--prefix", PREFIX, "--interval", "0.2")
    procs.append(agent)

    async def is_ready() -> bool:
        return (await asyncio.to_thread(pod.run, "ready")).returncode == 0

    await eventually("the ready file", is_ready)

    ckpt, out = pod.path(podpath.CHECKPOINTS), pod.path(podpath.OUT)
    place(ckpt / "ckpt-1.npz", b"checkpoint one" * 1000)
    (ckpt / "ckpt-2.npz.tmp").write_bytes(b"half a checkpoint")  # partial: never uploaded
    write_marker(out, attempt_id="a1", step=1)

    async def checkpoint_there() -> bool:
        return await pod.store.get(f"{PREFIX}/checkpoints/ckpt-1.npz") == b"checkpoint one" * 1000

    async def marker_there() -> bool:
        return await pod.store.get(f"{PREFIX}/{MARKER}") is not None

    await eventually("the checkpoint uploaded while the program runs", checkpoint_there)
    await eventually("the first-step marker uploaded", marker_there)
    assert json.loads(await pod.store.get(f"{PREFIX}/{MARKER}") or b"{}")["attempt_id"] == "a1"

    outputs = {"model.bin": os.urandom(300_000), "sub/metrics.json": b'{"loss": 0.1}\n'}
    for rel, data in outputs.items():
        place(out / rel, data)
    (out / "scratch.tmp").write_bytes(b"partial")
    (out / "link").symlink_to(pod.root / "gpuorch" / "checkpoints" / "ckpt-1.npz")  # never followed
    place(ckpt / "ckpt-2.npz", b"checkpoint two")
    assert await pod.store.get(f"{PREFIX}/{UPLOAD_RECORD}") is None  # only at the end

    code, stdout, stderr = stop(agent)
    assert code == 0, stderr
    said = json.loads(stdout.strip().splitlines()[-1])
    assert said["outputs"] == 2 and said["record"].endswith(f"{PREFIX}/{UPLOAD_RECORD}")

    raw = await pod.store.get(f"{PREFIX}/{UPLOAD_RECORD}")
    assert raw is not None
    record = decode_upload_record(raw, "record")
    assert (record.workload_id, record.attempt_id) == ("w1", "a1")  # parsed from the prefix
    assert {(o.key, o.size, o.sha256) for o in record.objects} == {(k, len(v), sha(v)) for k, v in outputs.items()}
    for rel, data in outputs.items():
        assert await pod.store.get(f"{PREFIX}/{rel}") == data
    listing = await pod.store.list(PREFIX)
    keys = {o.key for o in listing}
    assert "checkpoints/ckpt-2.npz" in keys  # the last checkpoint, in the final pass
    assert not {"link", "scratch.tmp", "checkpoints/ckpt-2.npz.tmp"} & keys
    # what the fencer will build from it: every recorded object is there with its size
    assert isinstance(manifest_for("w1", "a1", 1, "prod", listing, record, now=1.0), Manifest)


async def test_a_killed_agent_leaves_no_upload_record(pod: Pod, procs: list[subprocess.Popen[str]]) -> None:
    ids = {"GPUORCH_WORKLOAD_ID": "w1", "GPUORCH_ATTEMPT_ID": "a1"}
    agent = pod.start("sync", "--store", "prod", "--prefix", PREFIX, "--interval", "0.2", extra=ids)
    procs.append(agent)
    place(pod.path(podpath.OUT) / "model.bin", b"weights")

    async def uploaded() -> bool:
        return await pod.store.get(f"{PREFIX}/model.bin") == b"weights"

    await eventually("the output uploaded while running", uploaded)
    code, _, _ = stop(agent, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert await pod.store.get(f"{PREFIX}/{UPLOAD_RECORD}") is None
    assert manifest_for("w1", "a1", 1, "prod", await pod.store.list(PREFIX), None, now=1.0) == (
        "no upload record: the attempt's upload did not complete (nothing is published)"
    )


async def test_a_store_failing_during_the_loop_is_retried_and_one_failing_at_the_end_writes_no_record(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A file:// store whose key is blocked by a directory refuses the put: the loop logs and
    goes on; once unblocked the next look uploads. Blocked at SIGTERM: exit 1 and no record."""
    root, store_dir = tmp_path / "pod", tmp_path / "store"
    config = StoreConfig(url=store_dir.resolve().as_uri())
    pod = Pod(root, pod_env(root, "prod", config, {}), open_store("prod", config, {}))
    blocker = store_dir / PREFIX / "model.bin"
    (blocker / "in-the-way").parent.mkdir(parents=True)
    (blocker / "in-the-way").write_text("x")
    agent = pod.start("sync", "--store", "prod", "--prefix", PREFIX, "--interval", "0.1")
    procs.append(agent)
    place(pod.path(podpath.OUT) / "model.bin", b"weights")
    place(pod.path(podpath.OUT) / "other.bin", b"other")

    async def other_there() -> bool:
        return await pod.store.get(f"{PREFIX}/other.bin") == b"other"

    await eventually("the other output uploaded while model.bin is refused", other_there)
    assert agent.poll() is None  # still running
    code, _, stderr = stop(agent)
    assert code == 1, stderr
    assert "final upload failed" in stderr and "model.bin" in stderr and "no upload record" in stderr
    assert await pod.store.get(f"{PREFIX}/{UPLOAD_RECORD}") is None

    # the same store, unblocked while a sidecar runs: retried at the next look, then the record
    agent = pod.start("sync", "--store", "prod", "--prefix", PREFIX, "--interval", "0.1")
    procs.append(agent)
    (blocker / "in-the-way").unlink()
    blocker.rmdir()

    async def model_there() -> bool:
        return await pod.store.get(f"{PREFIX}/model.bin") == b"weights"

    await eventually("model.bin uploaded once the store takes it", model_there)
    code, _, stderr = stop(agent)
    assert code == 0, stderr
    raw = await pod.store.get(f"{PREFIX}/{UPLOAD_RECORD}")
    assert raw is not None and {o.key for o in decode_upload_record(raw, "r").objects} == {"model.bin", "other.bin"}


def test_sync_without_the_stores_env_is_a_permanent_error(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")}, podpath.POD_ROOT: str(tmp_path)}
    r = subprocess.run([*AGENT, "sync", "--store", "prod", "--prefix", PREFIX], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "GPUORCH_STORE_PROD_URL is not set" in r.stderr


# --- stage ------------------------------------------------------------------------------------------


async def put_dataset(store: Store, ref: str, files: dict[str, bytes], sums: str | None = None) -> None:
    for rel, data in files.items():
        await store.put(f"{ref}/{rel}", data)
    if sums is not None:
        await store.put(f"{ref}/SHA256SUMS", sums.encode())


def stage_args(ref: str) -> list[str]:
    return ["stage", "--store", "prod", "--dataset", ref, "--size-gb", "0.01", "--bandwidth-mbps", "100", "--time-scale", "1"]


async def test_stage_copies_a_dataset_once_verified_then_hits_the_cache(pod: Pod) -> None:
    files = {"data.npz": os.urandom(50_000), "sub/labels.txt": b"cat\ndog\n"}
    sums = "".join(f"{sha(v)}  {k}\n" for k, v in files.items())
    await put_dataset(pod.store, "imagenet@v3", files, sums)
    stale = pod.path(podpath.CACHE) / "imagenet@v3.tmp"
    (stale / "junk").parent.mkdir(parents=True)
    (stale / "junk").write_text("left by a killed stager")

    r = pod.run(*stage_args("imagenet@v3"))
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    assert said["cache_hit"] is False and said["files"] == 3 and said["verified_by"] == "SHA256SUMS"
    assert said["path"] == "/gpuorch-cache/imagenet@v3" and said["source"] == pod.store.url_of("imagenet@v3") + "/"
    assert said["simulated_seconds"] == pytest.approx(transfer_seconds(0.01, 100))
    final = pod.path(podpath.CACHE) / "imagenet@v3"
    for rel, data in files.items():
        assert (final / rel).read_bytes() == data
    complete = json.loads((final / COMPLETE).read_text())
    assert {k: v["sha256"] for k, v in complete["objects"].items() if k != "SHA256SUMS"} == {k: sha(v) for k, v in files.items()}
    assert not stale.exists() and not (final / "junk").exists()

    again = pod.run(*stage_args("imagenet@v3"))
    assert again.returncode == 0, again.stderr
    hit = json.loads(again.stdout)
    assert hit["cache_hit"] is True and hit["simulated_seconds"] == 0 and hit["dataset"] == "imagenet@v3"


async def test_stage_refuses_a_dataset_that_does_not_match_its_sha256sums(pod: Pod) -> None:
    files = {"data.npz": b"the real bytes"}
    await put_dataset(pod.store, "bad@v1", files, f"{sha(b'other bytes')}  data.npz\n")
    r = pod.run(*stage_args("bad@v1"))
    assert r.returncode == 2, r.stderr
    assert "does not match its SHA256SUMS" in r.stderr and "data.npz" in r.stderr and pod.store.url_of("bad@v1") in r.stderr
    cache = pod.path(podpath.CACHE)
    assert not (cache / "bad@v1").exists() and not (cache / "bad@v1.tmp").exists()


def test_stage_of_a_missing_dataset_names_where_it_looked(pod: Pod) -> None:
    r = pod.run(*stage_args("nothing@v9"))
    assert r.returncode == 2
    assert f"dataset nothing@v9 not found at {pod.store.url_of('nothing@v9')}/" in r.stderr


def termination_log(pod: Pod) -> Path:
    """The container's termination message file, empty, as the kubelet creates it."""
    path = pod.path(podpath.TERMINATION_LOG)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


async def test_stage_writes_its_record_to_the_termination_message_a_hit_and_a_failure_too(pod: Pod) -> None:
    files = {"part-0": os.urandom(30_000), "part-1": os.urandom(20_000)}
    await put_dataset(pod.store, "mnist@v2", files)
    log = termination_log(pod)

    r = pod.run(*stage_args("mnist@v2"))
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    message = log.read_bytes()
    assert len(message) < podpath.TERMINATION_MESSAGE_LIMIT and b" " not in message, "compact JSON"
    doc = json.loads(message)
    assert doc == {**{k: said[k] for k in ("dataset", "cache_hit", "source", "size_gb", "bytes", "files",
                                           "bandwidth_mbps", "time_scale", "real_seconds", "simulated_seconds",
                                           "staged_at", "verified_by")}, "store": "prod"}  # fmt: skip
    assert doc["cache_hit"] is False and doc["bytes"] == 50_000 and doc["dataset"] == "mnist@v2"
    assert doc["simulated_seconds"] == pytest.approx(transfer_seconds(0.01, 100))
    assert "objects" not in doc

    log.write_bytes(b"")  # a new container: a new file
    again = pod.run(*stage_args("mnist@v2"))
    assert again.returncode == 0, again.stderr
    hit = json.loads(log.read_bytes())
    assert hit["cache_hit"] is True and hit["store"] == "prod" and hit["simulated_seconds"] == 0 and "objects" not in hit

    log.write_bytes(b"")
    missing = pod.run(*stage_args("nothing@v1"))
    assert missing.returncode == 2
    assert log.read_text().startswith("gpuorch.workloads.agent: stage: dataset nothing@v1 not found at ")


def test_outside_a_pod_no_termination_message_is_created(pod: Pod) -> None:
    r = pod.run(*stage_args("nothing@v1"))
    assert r.returncode == 2
    assert not pod.path(podpath.TERMINATION_LOG).parent.exists()


def test_the_stage_message_fits_the_limit_by_dropping_the_long_strings() -> None:
    result = {"dataset": "d@1", "cache_hit": False, "source": "s3://b/" + "x" * 5000, "bytes": 10, "objects": {"a": 1}}
    small = json.loads(stage_message(result, "loc"))
    assert small == {"dataset": "d@1", "cache_hit": False, "bytes": 10, "store": "loc"}
    assert json.loads(stage_message({**result, "source": "s3://b/p"}, "loc"))["source"] == "s3://b/p"
    assert stage_message(result, "n" * 5000) == b"", "nothing rather than a cut JSON document"


def test_stage_bad_arguments_are_permanent(pod: Pod) -> None:
    r = pod.run("stage", "--store", "prod", "--dataset", "../etc@v1", "--size-gb", "1", "--bandwidth-mbps", "1")
    assert r.returncode == 2 and "is not NAME@VERSION" in r.stderr


# --- fetch, fetch-result ----------------------------------------------------------------------------


async def test_fetch_downloads_a_checkpoint_atomically_and_a_missing_one_is_permanent(pod: Pod) -> None:
    data = os.urandom(200_000)
    key = "w1/attempts/a0/checkpoints/ckpt-3.npz"
    await pod.store.put(key, data)
    r = pod.run("fetch", "--store", "prod", "--key", key, "--to", "/gpuorch/resume/ckpt-3.npz")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sha256"] == sha(data)
    resume = pod.path(podpath.RESUME)
    assert (resume / "ckpt-3.npz").read_bytes() == data and sorted(p.name for p in resume.iterdir()) == ["ckpt-3.npz"]

    gone = pod.run("fetch", "--store", "prod", "--key", "w1/attempts/a0/checkpoints/ckpt-9.npz", "--to", "/gpuorch/resume/ckpt-9.npz")
    assert gone.returncode == 2
    assert f"no object {pod.store.url_of('w1/attempts/a0/checkpoints/ckpt-9.npz')}" in gone.stderr
    assert sorted(p.name for p in resume.iterdir()) == ["ckpt-3.npz"]  # nothing partial left


async def publish(store: Store, outputs: dict[str, bytes]) -> None:
    """What an attempt's agent and the fencer leave: outputs, the record, the manifest."""
    from gpuorch_proto.storage import UploadedObject, UploadRecord

    prefix = "w2/attempts/b1"
    for rel, data in outputs.items():
        await store.put(f"{prefix}/{rel}", data)
    record = UploadRecord(workload_id="w2", attempt_id="b1", objects=[UploadedObject(k, len(v), sha(v)) for k, v in outputs.items()], completed_at=1.0)  # fmt: skip
    manifest = manifest_for("w2", "b1", 3, "prod", await store.list(prefix), record, now=2.0)
    assert isinstance(manifest, Manifest), manifest
    import msgspec

    assert await store.put(manifest_key("w2"), msgspec.json.encode(manifest), create_only=True)


async def test_fetch_result_round_trip_checked_and_a_tampered_object_refused(pod: Pod) -> None:
    outputs = {"model.npz": os.urandom(120_000), "eval/metrics.json": b'{"acc": 0.9}'}
    await publish(pod.store, outputs)
    r = pod.run("fetch-result", "--store", "prod", "--key", manifest_key("w2"), "--to", "/gpuorch/inputs/train")
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    assert (said["attempt_id"], said["objects"]) == ("b1", 2)
    got = pod.path(podpath.INPUTS) / "train"
    assert {p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()} == outputs

    # an object changed after publication (same size, other bytes): refused, nothing delivered
    await pod.store.put("w2/attempts/b1/model.npz", os.urandom(120_000))
    bad = pod.run("fetch-result", "--store", "prod", "--key", manifest_key("w2"), "--to", "/gpuorch/inputs/again")
    assert bad.returncode == 2
    assert "model.npz" in bad.stderr and "refused" in bad.stderr and pod.store.url_of(manifest_key("w2")) in bad.stderr
    assert sorted(p.name for p in pod.path(podpath.INPUTS).iterdir()) == ["train"]


def test_fetch_result_without_a_manifest_is_permanent(pod: Pod) -> None:
    r = pod.run("fetch-result", "--store", "prod", "--key", manifest_key("w3"), "--to", "/gpuorch/inputs/x")
    assert r.returncode == 2 and f"no result manifest at {pod.store.url_of(manifest_key('w3'))}" in r.stderr


# --- the pure rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "previous", "uploaded", "previous_at", "expected"),
    [
        pytest.param(Look(10, 5_000_000_000), None, None, None, False, id="first-look-waits-for-a-second"),
        pytest.param(Look(10, 5_000_000_000), Look(10, 5_000_000_000), None, 6, True, id="unchanged-across-two-looks"),
        pytest.param(Look(20, 7_000_000_000), Look(10, 5_000_000_000), None, 6, False, id="still-growing"),
        pytest.param(Look(10, 5_000_000_000), Look(10, 5_000_000_000), Look(10, 5_000_000_000), 6, False, id="already-uploaded"),
        pytest.param(Look(10, 5_000_000_000), None, None, 6_000_000_000, True, id="renamed-into-place-old-mtime"),
        pytest.param(Look(10, 5_990_000_000), None, None, 6_000_000_000, False, id="written-around-the-look-waits"),
        pytest.param(Look(11, 8_000_000_000), Look(11, 8_000_000_000), Look(10, 5_000_000_000), 9, True, id="changed-since-upload"),
        # a checkpoint replaced by a rename more often than the agent looks: another inode, quiet since
        pytest.param(Look(10, 9_000_000_000, 2), Look(10, 8_500_000_000, 1), None, 8_000_000_000, True, id="replaced-by-a-rename"),
        pytest.param(Look(10, 9_990_000_000, 2), Look(10, 8_500_000_000, 1), None, 8_000_000_000, False, id="replaced-just-now-waits"),
        pytest.param(Look(12, 9_000_000_000, 1), Look(10, 8_500_000_000, 1), None, 8_000_000_000, False, id="written-in-place-waits"),
    ],
)
def test_when_a_file_is_due(now: Look, previous: Look | None, uploaded: Look | None, previous_at: int | None, expected: bool) -> None:
    assert due(now, previous, uploaded, previous_at, 10_000_000_000) is expected


def test_which_files_are_uploaded_and_which_keys_are_safe() -> None:
    assert wanted("ckpt-1.npz", "checkpoint") and not wanted(".ckpt-1.npz.x", "checkpoint")
    assert not wanted("ckpt-2.tmp", "checkpoint") and not wanted("sub/.hidden/c", "checkpoint")
    assert wanted("model.npz", "output") and wanted(".hydra/config.yaml", "output")
    assert not wanted("a.tmp", "output") and not wanted(".gpuorch/upload.json", "output")
    assert not wanted("checkpoints/ckpt-1", "output")
    assert safe_key("a/b.txt") and not safe_key("../x") and not safe_key("/abs") and not safe_key("a//b") and not safe_key("")
    assert ids_from_prefix("w1/attempts/a1") == ("w1", "a1")
    assert ids_from_prefix("team/w1/attempts/a1/") == ("w1", "a1")
    assert ids_from_prefix("w1/a1") is None


def test_sha256sums_parsed_and_compared() -> None:
    a, b = sha(b"a"), sha(b"b")
    assert parse_sha256sums(f"{a}  x.bin\n{b} *sub/y.bin\n# comment\n\n", "S") == {"x.bin": a, "sub/y.bin": b}
    with pytest.raises(Exception, match=r"S: line 1 is not '<sha256>  <relpath>'"):
        parse_sha256sums("nothex  x.bin\n", "S")
    with pytest.raises(Exception, match="line 1"):
        parse_sha256sums(f"{a}  ../escape\n", "S")
    assert checksum_problems({"x": a}, {"x": a}) == []
    assert checksum_problems({"x": a, "extra": b}, {"x": b, "gone": a}) == [
        f"x: sha256 {a}, SHA256SUMS says {b}",
        "extra: not in SHA256SUMS",
        "gone: in SHA256SUMS, not in the dataset",
    ]


async def test_concurrent_stagers_copy_once(pod: Pod, procs: list[subprocess.Popen[str]]) -> None:
    """Three stagers at once (three pods of one cluster): one copies, the others wait on the lock
    and find `.complete`; 1 GB at 1000 MB/s at 2.5x is 0.4 real seconds of link each."""
    await put_dataset(pod.store, "shared@v1", {"data.npz": os.urandom(20_000)}, None)
    args = ["stage", "--store", "prod", "--dataset", "shared@v1", "--size-gb", "1", "--bandwidth-mbps", "1000", "--time-scale", "2.5"]
    procs.extend(pod.start(*args) for _ in range(3))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sorted(json.loads(o)["cache_hit"] for o, _ in outs) == [False, True, True]
    cache = pod.path(podpath.CACHE)
    assert sorted(p.name for p in cache.iterdir()) == ["shared@v1", "shared@v1.lock"]


async def test_the_link_is_simulated_and_a_slower_copy_reports_its_own_time(pod: Pod) -> None:
    await put_dataset(pod.store, "link@v1", {"data.npz": os.urandom(10_000)}, None)
    # 1350 GB at 125 MB/s = 10,800 simulated s; at 3e4x that is 0.36 real s, far above the copy
    r = pod.run("stage", "--store", "prod", "--dataset", "link@v1", "--size-gb", "1350", "--bandwidth-mbps", "125", "--time-scale", "3e4")
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    assert said["simulated_seconds"] == pytest.approx(transfer_seconds(1350, 125), rel=1e-3)
    assert said["real_seconds"] >= 10_800 / 3e4
    # a link of a millisecond at 1x: the copy itself takes longer, and that is what is reported
    # 8 MB to hash and write cannot take under a millisecond (10 kB could, and did, on a fast disk)
    await put_dataset(pod.store, "slow@v1", {"data.npz": os.urandom(8_000_000)}, None)
    r = pod.run("stage", "--store", "prod", "--dataset", "slow@v1", "--size-gb", "0.000001", "--bandwidth-mbps", "1", "--time-scale", "1")
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    assert said["simulated_seconds"] > transfer_seconds(0.000001, 1) and said["simulated_seconds"] == pytest.approx(said["real_seconds"], abs=0.01)
    # the cluster's own location: no link at all, only the copy's own time
    await put_dataset(pod.store, "local@v1", {"data.npz": b"x"}, None)
    r = pod.run("stage", "--store", "prod", "--dataset", "local@v1", "--size-gb", "1350", "--time-scale", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["simulated_seconds"] < 60, "no 10,800 s link for a location the cluster has"


def test_a_zero_bandwidth_is_a_permanent_error(pod: Pod) -> None:
    r = pod.run("stage", "--store", "prod", "--dataset", "any@v1", "--size-gb", "1", "--bandwidth-mbps", "0")
    assert r.returncode == 2 and "--bandwidth-mbps must be > 0" in r.stderr, r.stderr
    assert not pod.path(podpath.CACHE).exists() or not any(pod.path(podpath.CACHE).iterdir())
