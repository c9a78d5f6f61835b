"""The kubelet of a local cluster: runs each bound pod's containers as local process groups.

Every container is a process started in its own session (so its own process group). A waiter
thread per process observes the exit without reaping it (`waitid(WNOWAIT)`), kills whatever is
left in the group (as a container runtime kills the container's cgroup), then reaps it. The
controller loop only ever reads `Popen.returncode`.

Filesystems: each container gets a private root directory (`$GPUORCH_POD_ROOT`, under the pod's
directory) holding only the volumes it mounts, as symlinks at their mountPath (`<root>/gpuorch`
-> the pod's emptyDir). emptyDir and secret volumes live under the pod's directory and go away
when the pod ends; a persistentVolumeClaim is a directory per claim (`claim_dir`) that outlives
its pods. Native sidecars (init containers with `restartPolicy: Always`) run beside the main
containers and are stopped, SIGTERM then SIGKILL, once those have exited; `startupProbe.exec`
gates the next container.

Termination messages as the kubelet writes them: before a container starts, the file its
`terminationMessagePath` names (default ``/dev/termination-log``) is created empty in its private
root; when it exits, up to `MESSAGE_LIMIT` bytes of it are its terminated state's ``message``
(and its ``lastState``'s once it restarts). With `terminationMessagePolicy: FallbackToLogsOnError`
a failed container that wrote none gets the tail of its log instead.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dcgm import GPU_REPORT_ENV, gpu_containers, report_path
from .objects import GPU, pod_requests, set_condition
from .quantity import parse_quantity
from .secrets import SecretNotFound, secret_key_value
from .util import rfc3339

if TYPE_CHECKING:
    from .api import ClusterAPI, ObjectStore
    from .store import Event

__all__ = ["Kubelet", "PodRun", "claim_dir"]

log = logging.getLogger("gpuorch_localkube.kubelet")

_BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT", "USER")
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


#: the env variable that names a container's private root (gpuorch_proto.podpath.POD_ROOT: a Job
#: sets it to "", the kubelet here to the root where it mounts the container's volumes)
POD_ROOT = "GPUORCH_POD_ROOT"
#: exec probes here start a fresh process (often a Python interpreter) rather than exec into a
#: running container: their timeout is at least this many seconds
MIN_PROBE_TIMEOUT = 5.0
MOUNT_RETRY_SECONDS = 1.0
#: Kubernetes keeps at most this many bytes of a container's termination message
MESSAGE_LIMIT = 4096
#: FallbackToLogsOnError: the last lines of the log, at most this many bytes (the kubelet's figures)
LOG_MESSAGE_LINES, LOG_MESSAGE_LIMIT = 80, 2048
DEFAULT_MESSAGE_PATH = "/dev/termination-log"


class EnvError(Exception):
    """A container's environment cannot be built (CreateContainerConfigError)."""


class MountError(Exception):
    """A pod's volume cannot be set up (the kubelet's FailedMount): the pod does not start."""


def claim_dir(state_dir: Path, namespace: str, claim: str) -> Path:
    """The directory that is persistentVolumeClaim `claim` of `namespace` in the cluster whose
    state directory is `state_dir` (kept across pods; not under the directory pods share)."""
    return Path(state_dir, "claims", namespace, claim)


@dataclass
class ProbeRun:
    """One run of an exec probe; `result` (exit code, output) is set by its waiter thread."""

    proc: subprocess.Popen[bytes] | None
    deadline: float
    result: tuple[int, str] | None = None
    timed_out: bool = False


def _expand(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR_REF.sub(sub, text)


def _make_writable(d: Path) -> None:
    """Secret volumes are read-only directories: let their owner remove them."""
    for sub in [d, *d.rglob("*")]:
        if sub.is_dir() and not sub.is_symlink():
            with contextlib.suppress(OSError):
                sub.chmod(0o755)


def message_file(root: Path | None, spec: dict[str, Any]) -> Path | None:
    """Where a container's termination message is, under its private root (None: nowhere, as for
    a path that is not absolute or climbs out with "..")."""
    path = str(spec.get("terminationMessagePath") or DEFAULT_MESSAGE_PATH)
    parts = [p for p in path.split("/") if p]
    if root is None or not path.startswith("/") or not parts or any(p in (".", "..") for p in parts):
        return None
    return root.joinpath(*parts)


def _prepare_message(path: Path | None) -> None:
    """A fresh, empty termination message file for a container about to start (a restarted
    container does not report its previous run's)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))


def read_message(path: Path | None, limit: int = MESSAGE_LIMIT) -> str:
    """The first `limit` bytes of a termination message file ("" when there is none, it is not a
    regular file or a symlink: the container wrote it, it is not trusted)."""
    if path is None:
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        data = os.read(fd, limit)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _log_tail(path: Path) -> str:
    """FallbackToLogsOnError: the log's last LOG_MESSAGE_LINES lines, at most LOG_MESSAGE_LIMIT bytes."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_MESSAGE_LIMIT))
            data = f.read(LOG_MESSAGE_LIMIT)
    except OSError:
        return ""
    return b"".join(data.splitlines(keepends=True)[-LOG_MESSAGE_LINES:]).decode("utf-8", errors="replace")


def _exit_info(returncode: int) -> tuple[int, int | None]:
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


@dataclass
class ContainerRun:
    name: str
    spec: dict[str, Any]
    init: bool
    log_path: Path
    restart_count: int = 0
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    done: bool = False
    exit_code: int | None = None
    next_restart: float | None = None
    root: Path | None = None  # the container's private root ($GPUORCH_POD_ROOT)
    env: dict[str, str] | None = None  # the environment it was last started with (its probes get it)
    started_ok: bool = True  # its startupProbe succeeded (or it has none)
    probe: ProbeRun | None = None
    next_probe: float = 0.0
    probe_failures: int = 0
    kill_message: str | None = None  # why the kubelet killed it (the terminated state's message)

    @property
    def sidecar(self) -> bool:
        return self.init and self.spec.get("restartPolicy") == "Always"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def status(self, pod_ready: bool) -> dict[str, Any]:
        started = "running" in self.state and self.started_ok
        st: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image") or "",
            "imageID": "",
            "ready": bool(started if self.sidecar else (pod_ready and started and not self.init)),
            "restartCount": self.restart_count,
            "started": started,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.proc is not None:
            st["containerID"] = f"localkube://{self.proc.pid}"
        return st


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    dir: Path
    restart_policy: str
    init: list[ContainerRun]
    main: list[ContainerRun]
    gpu_ids: list[int]
    start_time: str
    stage: str = "init"  # init -> main -> (stopping: the sidecars) -> done
    init_index: int = 0
    mounted: bool = False
    mount_error: str | None = None
    next_mount: float = 0.0
    final_phase: str | None = None  # decided by the main containers, set once the sidecars are gone
    stop_started: float | None = None
    stop_killed: bool = False
    sidecars_termed: bool = False  # on deletion: SIGTERM sent to the sidecars
    phase: str = "Pending"
    reason: str | None = None
    message: str | None = None
    config_error: str | None = None
    term_started: float | None = None
    killed_hard: bool = False
    written: Any = None  # what the last status write was computed from

    def containers(self) -> list[ContainerRun]:
        return self.init + self.main

    def live(self) -> list[ContainerRun]:
        return [c for c in self.containers() if c.alive]

    def pids(self) -> dict[str, int]:
        return {c.name: c.proc.pid for c in self.containers() if c.proc is not None and c.alive}


class Kubelet:
    """All nodes' kubelets of one cluster (they share one process table)."""

    def __init__(self, core: ClusterAPI):
        self.core = core
        self.runs: dict[str, PodRun] = {}
        self.dirty: set[str] = set()  # pod uids
        self._exits: deque[str] = deque()  # pod uids whose process exited (appended by the waiter threads)
        self._busy: set[str] = set()  # runs with a clock running: a restart back-off, a grace period, a start to do
        self._sleep = shutil.which("sleep")

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def _store(self) -> ObjectStore:
        return self.core.store

    def used_gpu_ids(self, node: str) -> set[int]:
        return {i for r in self.runs.values() if r.node == node and r.stage != "done" for i in r.gpu_ids}

    def pod_pids(self, uid: str) -> dict[str, int]:
        run = self.runs.get(uid)
        return run.pids() if run else {}

    def all_pids(self) -> list[int]:
        return [c.proc.pid for r in self.runs.values() for c in r.containers() if c.proc is not None and c.alive]

    def has_processes(self, uid: str) -> bool:
        run = self.runs.get(uid)
        return bool(run and run.live())

    def _signal(self, c: ContainerRun, sig: int) -> None:
        if c.proc is None or c.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c.proc.pid, sig)

    def _waiter(self, proc: subprocess.Popen[bytes], uid: str) -> None:
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what is left of the container
        except ChildProcessError:
            pass
        proc.wait()
        self._exits.append(uid)
        self.core.wake()

    # -- the sync loop ---------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Pods bound to a node (or that had a run here) are this kubelet's business."""
        if event.resource == "pods":
            obj = event.obj
            if obj["spec"].get("nodeName") or obj["metadata"]["uid"] in self.runs:
                self.dirty.add(obj["metadata"]["uid"])

    def resync(self) -> None:
        self.dirty.update(p["metadata"]["uid"] for p in self._store.values("pods"))

    def sync(self) -> None:
        """Admit the bound pods that events pointed at, advance the runs that something happened
        to (an event for their pod, a process exit, a clock running), finish deletions.

        A run whose containers are all running and that nothing happened to is not looked at: a
        pass costs what changed, not the number of running pods.
        """
        store = self._store
        now = time.monotonic()
        todo, self.dirty = self.dirty, set()
        while self._exits:
            todo.add(self._exits.popleft())
        for uid in sorted(todo):
            pod = store.by_uid("pods", uid)
            if pod is None:
                continue
            spec, meta = pod["spec"], pod["metadata"]
            node = spec.get("nodeName")
            node_obj = store.get("nodes", "", node) if node else None
            if (
                node_obj is not None
                and uid not in self.runs
                and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
                and not meta.get("deletionTimestamp")
            ):
                self._admit(pod, node_obj)
        for uid in sorted((todo | self._busy) & self.runs.keys()):
            run = self.runs[uid]
            self._busy.discard(uid)
            found = store.by_uid("pods", uid)
            if found is None:
                # the object is gone (force delete, node controller): make sure the processes are too
                for c in run.live():
                    self._signal(c, signal.SIGKILL)
                self._kill_probes(run)
                if not run.live():
                    self._release(run)
                else:
                    self._busy.add(uid)
                continue
            pod = found
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(run, pod, now)
                if uid in self.runs:
                    self._busy.add(uid)  # the grace period runs
                continue
            self._advance(run, pod, now)
            self._write_status(run)
            if run.stage == "done" and not run.live():
                self._release(run)
                todo.add(uid)
            elif run.stage != "main" or any(
                c.next_restart is not None or (c.proc is None and not c.done) or (c.alive and not c.started_ok)
                for c in run.containers()
            ):
                self._busy.add(uid)
        for uid in sorted(todo):
            pod = store.by_uid("pods", uid)
            if pod is not None and pod["metadata"].get("deletionTimestamp") and uid not in self.runs:
                self.core.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])

    def next_deadline(self) -> float | None:
        """Monotonic time of the next restart or hard kill (so the loop wakes up for it)."""
        times = [c.next_restart for r in self.runs.values() for c in r.containers() if c.next_restart]
        for r in self.runs.values():
            if r.term_started is not None and not r.killed_hard:
                times.append(r.term_started + 0.05)
        return min(times) if times else None

    # -- admission and start ---------------------------------------------------------------------

    def _admit(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid, ns, name, node_name = meta["uid"], meta["namespace"], meta["name"], spec["nodeName"]
        pod_dir = self.core.state_dir / "pods" / ns / f"{name}-{uid[:8]}"
        (pod_dir / "work").mkdir(parents=True, exist_ok=True)
        (pod_dir / "logs").mkdir(parents=True, exist_ok=True)

        def mk(c: dict[str, Any], init: bool) -> ContainerRun:
            return ContainerRun(name=c["name"], spec=c, init=init, log_path=pod_dir / "logs" / f"{c['name']}.log")

        run = PodRun(
            uid=uid,
            namespace=ns,
            name=name,
            node=node_name,
            dir=pod_dir,
            restart_policy=spec.get("restartPolicy", "Always"),
            init=[mk(c, True) for c in spec.get("initContainers") or []],
            main=[mk(c, False) for c in spec.get("containers") or []],
            gpu_ids=[],
            start_time=rfc3339(),
        )
        for c in run.init:
            c.state = {"waiting": {"reason": "PodInitializing"}} if c is not run.init[0] else c.state
        if run.init:
            for c in run.main:
                c.state = {"waiting": {"reason": "PodInitializing"}}
        self.runs[uid] = run
        want = int(pod_requests(pod).get(GPU, 0))
        if want:
            capacity = int(parse_quantity(((node.get("status") or {}).get("capacity") or {}).get(GPU, "0")))
            used = self.used_gpu_ids(node_name)
            free = [i for i in range(capacity) if i not in used]
            if len(free) < want:
                run.stage, run.phase = "done", "Failed"
                run.reason = "UnexpectedAdmissionError"
                run.message = (
                    f"Allocate failed due to requested number of devices unavailable for {GPU}. "
                    f"Requested: {want}, Available: {len(free)}, which is unexpected"
                )
                for c in run.containers():
                    c.state = {"terminated": {"exitCode": 1, "reason": "UnexpectedAdmissionError", "finishedAt": rfc3339()}}
                    c.done = True
                self._write_status(run)
                return
            run.gpu_ids = free[:want]
        self._write_status(run)

    def _env(self, run: PodRun, pod: dict[str, Any], c: ContainerRun) -> dict[str, str]:
        env: dict[str, str] = {k: os.environ[k] for k in _BASE_ENV_KEYS if k in os.environ}
        env.setdefault("PATH", os.defpath)
        meta, spec = pod["metadata"], pod["spec"]
        cfg = self.core.config
        env["PYTHONUNBUFFERED"] = "1"
        env["HOSTNAME"] = spec.get("hostname") or meta["name"]
        env["GPUORCH_TIME_SCALE"] = f"{cfg.time_scale:g}"
        env["GPUORCH_CLUSTER"] = cfg.name
        env["GPUORCH_NODE"] = run.node
        env["GPUORCH_CLUSTER_DIR"] = str(self.core.cluster_dir)
        env["GPUORCH_POD_DIR"] = str(run.dir / "work")
        if c.root is not None:  # before the container's env: its "$(GPUORCH_POD_ROOT)/..." expand to it
            env[POD_ROOT] = str(c.root)
        node = self._store.get("nodes", "", run.node)
        if run.gpu_ids and c.name in gpu_containers(spec):  # where its program may say what it did on them
            env[GPU_REPORT_ENV] = str(report_path(self.core.state_dir, run.namespace, run.name, run.uid, c.name))
            Path(env[GPU_REPORT_ENV]).parent.mkdir(parents=True, exist_ok=True)
        if run.gpu_ids:
            ids = ",".join(str(i) for i in run.gpu_ids)
            env["NVIDIA_VISIBLE_DEVICES"] = ids
            env["CUDA_VISIBLE_DEVICES"] = ids
            if node is not None:
                labels = node["metadata"].get("labels") or {}
                env["GPUORCH_GPU_PRODUCT"] = labels.get("nvidia.com/gpu.product", "")
                env["GPUORCH_GPU_MEMORY_MIB"] = labels.get("nvidia.com/gpu.memory", "")
        for e in c.spec.get("env") or []:
            name = e["name"]
            if name == POD_ROOT and c.root is not None:
                continue  # the Job says "" (a real node's root); here the kubelet gives the private root
            if "valueFrom" in e and e["valueFrom"] is not None:
                value = self._value_from(e["valueFrom"], pod, c)
                if value is None:
                    continue
                env[name] = value
            else:
                env[name] = _expand(str(e.get("value") or ""), env)
        return env

    def _value_from(self, src: dict[str, Any], pod: dict[str, Any], c: ContainerRun) -> str | None:
        meta, spec = pod["metadata"], pod["spec"]
        if src.get("fieldRef"):
            path = str(src["fieldRef"].get("fieldPath", ""))
            m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
            if m:
                return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
            simple = {
                "metadata.name": meta.get("name"),
                "metadata.namespace": meta.get("namespace"),
                "metadata.uid": meta.get("uid"),
                "spec.nodeName": spec.get("nodeName"),
                "spec.serviceAccountName": spec.get("serviceAccountName"),
                "status.hostIP": "127.0.0.1",
                "status.hostIPs": "127.0.0.1",
                "status.podIP": "127.0.0.1",
                "status.podIPs": "127.0.0.1",
            }
            if path in simple:
                return str(simple[path] or "")
            if path in ("metadata.labels", "metadata.annotations"):
                items = meta.get(path.split(".")[1]) or {}
                return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
            raise EnvError(f'unsupported fieldPath "{path}"')
        if src.get("resourceFieldRef"):
            ref = src["resourceFieldRef"]
            kind, _, res = str(ref.get("resource", "")).partition(".")
            target = c.spec
            if ref.get("containerName"):
                target = next((x for x in spec.get("containers") or [] if x.get("name") == ref["containerName"]), c.spec)
            value = ((target.get("resources") or {}).get(kind) or {}).get(res)
            if value is None:
                return "0"
            divisor = parse_quantity(ref.get("divisor") or "1")
            q = parse_quantity(value) / divisor
            return str(-(-q.numerator // q.denominator))
        if src.get("secretKeyRef"):  # read from the Secret now, into this process's env only
            ref = src["secretKeyRef"]
            ns, name = meta["namespace"], str(ref.get("name", ""))
            try:
                return secret_key_value(self._store.get("secrets", ns, name), ns, name, str(ref.get("key", "")))
            except SecretNotFound as exc:
                if ref.get("optional"):
                    return None
                raise EnvError(str(exc)) from None
        for ref_key, what in (("configMapKeyRef", "configmap"),):
            if src.get(ref_key):
                ref = src[ref_key]
                if ref.get("optional"):
                    return None
                raise EnvError(f'{what} "{ref.get("name", "")}" not found')
        raise EnvError("unsupported valueFrom")

    def _start(self, run: PodRun, pod: dict[str, Any], c: ContainerRun) -> None:
        c.next_restart = None
        try:
            env = self._env(run, pod, c)
        except EnvError as e:
            run.config_error = str(e)
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            return
        run.config_error = None
        c.env = env
        c.kill_message = None
        c.started_ok = not c.spec.get("startupProbe")
        c.probe_failures = 0
        if c.probe is not None:
            self._kill_probe(c)
        argv = [_expand(a, env) for a in (c.spec.get("command") or [])] + [
            _expand(a, env) for a in (c.spec.get("args") or [])
        ]
        now = rfc3339()
        node = pod["spec"].get("nodeName")
        record = self.core.events.record
        if not argv:
            self._exited(run, c, 128, None, "StartError", "localkube runs commands, not images: the container has no command or args", now)
            record(pod, "Warning", "Failed", f"Error: container {c.name} has no command or args (localkube runs commands, not images)",
                   "kubelet", node)
            return
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        elif argv[0] == "sleep" and self._sleep:
            argv[0] = self._sleep
        _prepare_message(message_file(c.root, c.spec))
        logf = open(c.log_path, "ab")
        try:
            proc = subprocess.Popen(
                argv,
                cwd=run.dir / "work",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            self._exited(run, c, 128, None, "StartError", f"failed to start container process: {e}", now)
            record(pod, "Warning", "Failed", f"Error: failed to start container {c.name}: {e}", "kubelet", node)
            return
        finally:
            logf.close()
        if c.spec.get("image"):
            record(pod, "Normal", "Pulled", f'Container image "{c.spec["image"]}" already present on machine', "kubelet", node)
        record(pod, "Normal", "Created", f"Created container: {c.name}", "kubelet", node)
        record(pod, "Normal", "Started", f"Started container {c.name}", "kubelet", node)
        c.proc = proc
        c.started_at = now
        c.state = {"running": {"startedAt": now}}
        c.next_probe = time.monotonic() + float((c.spec.get("startupProbe") or {}).get("initialDelaySeconds") or 0)
        threading.Thread(target=self._waiter, args=(proc, run.uid), name=f"wait-{proc.pid}", daemon=True).start()
        log.debug("started %s/%s[%s] pid %d: %s", run.namespace, run.name, c.name, proc.pid, argv)

    def _exited(
        self, run: PodRun, c: ContainerRun, code: int, sig: int | None, reason: str | None, message: str | None, finished: str
    ) -> None:
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": c.started_at or finished,
            "finishedAt": finished,
        }
        if sig is not None:
            term["signal"] = sig
        if message:
            term["message"] = message
        if c.proc is not None:
            term["containerID"] = f"localkube://{c.proc.pid}"
        c.exit_code = code
        restart = run.term_started is None and run.stage in ("init", "main") and (
            c.sidecar
            or (run.restart_policy == "Always" and not c.init)
            or (run.restart_policy in ("OnFailure", "Always") and code != 0)
        )
        if restart:
            delay = min(0.1 * 2**c.restart_count, 5.0)
            c.last_state = {"terminated": term}
            c.restart_count += 1
            c.next_restart = time.monotonic() + delay
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff" if code != 0 else "Completed",
                    "message": f"back-off {delay:g}s restarting failed container={c.name} pod={run.name}_{run.namespace}",
                }
            }
        else:
            c.state = {"terminated": term}
            c.done = True

    # -- the state machine -----------------------------------------------------------------------

    def _collect_exits(self, run: PodRun) -> None:
        for c in run.containers():
            if c.proc is not None and c.proc.returncode is not None and "running" in c.state:
                code, sig = _exit_info(c.proc.returncode)
                if c.probe is not None:
                    self._kill_probe(c)
                self._exited(run, c, code, sig, None, self._message(c, code), rfc3339())

    def _message(self, c: ContainerRun, code: int) -> str | None:
        """The terminated state's message: what the container wrote to its termination message
        file; else why the kubelet killed it; else (FallbackToLogsOnError, a failure) its log's tail."""
        written = read_message(message_file(c.root, c.spec))
        if written:
            return written
        if c.kill_message:
            return c.kill_message
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            return _log_tail(c.log_path) or None
        return None

    def _advance(self, run: PodRun, pod: dict[str, Any], now: float) -> None:
        if run.stage == "done":
            return
        if not run.mounted and not self._mount(run, pod, now):
            return
        self._collect_exits(run)
        for c in run.containers():
            if c.alive and not c.started_ok:
                self._probe(run, pod, c, now)
        if run.stage == "stopping":
            self._stop_sidecars(run, pod, now)
            return
        for c in run.init[: run.init_index]:  # native sidecars that exited: restarted (restartPolicy Always)
            if c.sidecar and not c.alive and c.next_restart is not None and now >= c.next_restart:
                self._start(run, pod, c)
        if run.stage == "init":
            while run.init_index < len(run.init):
                c = run.init[run.init_index]
                if c.sidecar:
                    if (c.proc is None and c.next_restart is None) or (c.next_restart is not None and now >= c.next_restart):
                        self._start(run, pod, c)
                    if c.alive and c.started_ok:  # started: the next one may start, it keeps running
                        run.init_index += 1
                        continue
                    return
                if c.done:
                    if c.exit_code != 0:
                        self._finish(run, pod, "Failed", now)
                        return
                    run.init_index += 1
                    continue
                if c.proc is None or (c.next_restart is not None and now >= c.next_restart):
                    self._start(run, pod, c)
                    if c.done and c.exit_code != 0:
                        continue
                return
            run.stage = "main"
            for c in run.main:
                self._start(run, pod, c)
        if run.stage == "main":
            for c in run.main:
                if not c.done and not c.alive and (
                    (c.next_restart is not None and now >= c.next_restart) or (c.proc is None and c.next_restart is None)
                ):
                    self._start(run, pod, c)
            if all(c.done for c in run.main):
                self._finish(run, pod, "Succeeded" if all(c.exit_code == 0 for c in run.main) else "Failed", now)
            elif any("running" in c.state for c in run.main) or any(c.restart_count for c in run.main):
                run.phase = "Running"

    def _finish(self, run: PodRun, pod: dict[str, Any], phase: str, now: float) -> None:
        """The main containers decided `phase`; it is the pod's once its sidecars have stopped
        (SIGTERM now, in reverse order of the spec; SIGKILL after terminationGracePeriodSeconds)."""
        for c in run.init:
            if c.sidecar and not c.alive and not c.done:  # waiting for a restart (or never started): not any more
                c.next_restart = None
                c.done = True
                if c.last_state and "waiting" in c.state:
                    c.state = c.last_state
        live = [c for c in reversed(run.init) if c.sidecar and c.alive]
        if not live:
            run.stage, run.phase = "done", phase
            return
        run.stage, run.final_phase, run.stop_started = "stopping", phase, now
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        for c in live:
            self.core.events.record(pod, "Normal", "Killing", f"Stopping container {c.name}", "kubelet", pod["spec"].get("nodeName"))
            self._signal(c, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        run.stop_killed = grace == 0

    def _stop_sidecars(self, run: PodRun, pod: dict[str, Any], now: float) -> None:
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        if not run.stop_killed and run.stop_started is not None and now >= run.stop_started + grace:
            for c in run.live():
                self._signal(c, signal.SIGKILL)
            run.stop_killed = True
        if not run.live():
            run.stage, run.phase = "done", run.final_phase or "Failed"

    # -- volumes ---------------------------------------------------------------------------------

    def _mount(self, run: PodRun, pod: dict[str, Any], now: float) -> bool:
        """Set up the pod's volumes and each container's private root; False (the pod waits, the
        containers in ContainerCreating with the reason, a FailedMount event) if one cannot be."""
        if now < run.next_mount:
            return False
        try:
            volumes = {str(v.get("name")): self._volume(run, pod, v) for v in pod["spec"].get("volumes") or []}
            for c in run.containers():
                c.root = run.dir / "roots" / c.name
                c.root.mkdir(parents=True, exist_ok=True)
                for m in c.spec.get("volumeMounts") or []:
                    name = str(m.get("name"))
                    if name not in volumes:
                        raise MountError(f'container "{c.name}" mounts volume "{name}", which the pod does not declare')
                    src = volumes[name]
                    if m.get("subPath"):
                        src = src / str(m["subPath"])
                        src.mkdir(parents=True, exist_ok=True)
                    target = c.root / str(m.get("mountPath", "")).strip("/")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if not target.is_symlink():
                        target.symlink_to(src, target_is_directory=True)
        except (MountError, OSError) as e:
            msg = str(e)
            run.next_mount = now + MOUNT_RETRY_SECONDS
            if msg != run.mount_error:
                self.core.events.record(pod, "Warning", "FailedMount", msg, "kubelet", pod["spec"].get("nodeName"))
            run.mount_error = msg
            for c in run.containers():
                c.state = {"waiting": {"reason": "ContainerCreating", "message": msg}}
            return False
        run.mounted, run.mount_error = True, None
        for c in run.containers():
            first = c is (run.init[0] if run.init else None) or (not run.init and not c.init)
            c.state = {"waiting": {"reason": "ContainerCreating" if first else "PodInitializing"}}
        return True

    def _volume(self, run: PodRun, pod: dict[str, Any], v: dict[str, Any]) -> Path:
        name, ns = str(v.get("name")), pod["metadata"]["namespace"]
        if v.get("emptyDir") is not None:
            d = run.dir / "volumes" / name
            d.mkdir(parents=True, exist_ok=True)
            return d
        if v.get("persistentVolumeClaim") is not None:
            d = claim_dir(self.core.state_dir, ns, str(v["persistentVolumeClaim"].get("claimName", "")))
            d.mkdir(parents=True, exist_ok=True)
            return d
        if v.get("secret") is not None:
            return self._secret_volume(run, ns, name, v["secret"])
        kinds = [k for k in v if k != "name"]
        raise MountError(f'MountVolume.SetUp failed for volume "{name}" : volume type {kinds} is not supported on gpuorch local clusters')

    def _secret_volume(self, run: PodRun, ns: str, name: str, src: dict[str, Any]) -> Path:
        """The Secret's keys as files (decoded), read when the pod starts; read-only."""
        secret_name = str(src.get("secretName", ""))
        optional = bool(src.get("optional"))
        secret = self._store.get("secrets", ns, secret_name)
        if secret is None and not optional:
            raise MountError(f'MountVolume.SetUp failed for volume "{name}" : secret "{secret_name}" not found')
        data: dict[str, str] = (secret or {}).get("data") or {}
        items = src.get("items")
        wanted = [(str(i["key"]), str(i.get("path") or i["key"]), i.get("mode")) for i in items] if items else [(k, k, None) for k in data]
        d = run.dir / "volumes" / name
        if d.exists():
            _make_writable(d)
            shutil.rmtree(d)
        d.mkdir(parents=True)
        default_mode = int(src.get("defaultMode") or 0o644)
        for key, rel, mode in wanted:
            if key not in data:
                if optional:
                    continue
                raise MountError(f'MountVolume.SetUp failed for volume "{name}" : couldn\'t find key {key} in Secret {ns}/{secret_name}')
            f = d / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(base64.b64decode(data[key]))
            f.chmod(int(mode) if mode is not None else default_mode)
        for sub in [d, *(x for x in d.rglob("*") if x.is_dir())]:
            sub.chmod(0o555)
        return d

    def _release(self, run: PodRun) -> None:
        """The run is over (no process left): forget it, remove its roots and ephemeral volumes
        (emptyDir, secret); claims stay. Logs and the work directory stay with the pod's directory."""
        self.runs.pop(run.uid, None)
        for sub in ("roots", "volumes"):
            d = run.dir / sub
            if d.exists():
                _make_writable(d)
                shutil.rmtree(d, ignore_errors=True)

    # -- probes ----------------------------------------------------------------------------------

    def _probe(self, run: PodRun, pod: dict[str, Any], c: ContainerRun, now: float) -> None:
        """Advance `c`'s startupProbe: start a run when due, read a finished one. After
        failureThreshold failures in a row the container is killed (a sidecar is then restarted,
        a main container is restarted or not by the pod's restartPolicy)."""
        spec = c.spec.get("startupProbe") or {}
        pr = c.probe
        node = pod["spec"].get("nodeName")
        if pr is not None:
            if pr.result is None:
                if now >= pr.deadline and not pr.timed_out and pr.proc is not None:
                    pr.timed_out = True
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pr.proc.pid, signal.SIGKILL)
                return
            c.probe = None
            code, output = pr.result
            if code == 0 and not pr.timed_out:
                c.started_ok = True
                return
            c.probe_failures += 1
            timeout = max(float(spec.get("timeoutSeconds") or 1), MIN_PROBE_TIMEOUT)
            why = f"command timed out after {timeout:g}s" if pr.timed_out else f"exit code {code}: {output.strip()[-500:]}"
            self.core.events.record(pod, "Warning", "Unhealthy", f"Startup probe failed ({c.name}): {why}", "kubelet", node)
            threshold = int(spec.get("failureThreshold") or 3)
            if c.probe_failures >= threshold:
                c.kill_message = f"startup probe failed {c.probe_failures} times (failureThreshold {threshold}); last: {why}"
                self.core.events.record(
                    pod, "Normal", "Killing", f"Container {c.name} failed startup probe, will be restarted", "kubelet", node
                )
                self._signal(c, signal.SIGKILL)
            return
        if now < c.next_probe:
            return
        env = c.env or {}
        argv = [_expand(a, env) for a in ((spec.get("exec") or {}).get("command") or [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        c.next_probe = now + float(spec.get("periodSeconds") or 10)
        timeout = max(float(spec.get("timeoutSeconds") or 1), MIN_PROBE_TIMEOUT)
        try:
            proc = subprocess.Popen(
                argv, cwd=run.dir / "work", env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except (OSError, ValueError, IndexError) as e:
            c.probe = ProbeRun(proc=None, deadline=now, result=(128, f"cannot run the probe: {e}"))
            return
        c.probe = pr = ProbeRun(proc=proc, deadline=now + timeout)
        threading.Thread(target=self._probe_waiter, args=(pr, run.uid), name=f"probe-{proc.pid}", daemon=True).start()

    def _probe_waiter(self, pr: ProbeRun, uid: str) -> None:
        assert pr.proc is not None
        out, _ = pr.proc.communicate()
        pr.result = (pr.proc.returncode, out.decode(errors="replace"))
        self._exits.append(uid)
        self.core.wake()

    def _kill_probe(self, c: ContainerRun) -> None:
        pr, c.probe = c.probe, None
        if pr is not None and pr.proc is not None and pr.result is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pr.proc.pid, signal.SIGKILL)

    def _kill_probes(self, run: PodRun) -> None:
        for c in run.containers():
            self._kill_probe(c)

    def _terminate(self, run: PodRun, pod: dict[str, Any], now: float) -> None:
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        grace = 30 if grace is None else int(grace)
        node = pod["spec"].get("nodeName")
        if run.term_started is None:
            run.term_started = now
            self._kill_probes(run)
            for c in run.live():
                if not c.sidecar:  # the sidecars once the others are gone (they serve them to the end)
                    self.core.events.record(pod, "Normal", "Killing", f"Stopping container {c.name}", "kubelet", node)
                    self._signal(c, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            run.killed_hard = grace == 0
        elif not run.killed_hard and now >= run.term_started + grace:
            for c in run.live():
                self._signal(c, signal.SIGKILL)
            run.killed_hard = True
        if run.killed_hard:
            for c in run.live():
                self._signal(c, signal.SIGKILL)
        self._collect_exits(run)
        if not run.sidecars_termed and not any(c.alive for c in run.containers() if not c.sidecar):
            run.sidecars_termed = True
            for c in reversed(run.init):
                if c.sidecar and c.alive and run.stage != "stopping":
                    self.core.events.record(pod, "Normal", "Killing", f"Stopping container {c.name}", "kubelet", node)
                    self._signal(c, signal.SIGTERM)
        if run.live():
            self._write_status(run)
            return
        if run.stage != "done":
            codes = [c.exit_code for c in run.main if c.exit_code is not None]
            ok = codes and len(codes) == len(run.main) and all(x == 0 for x in codes)
            run.phase = run.final_phase or ("Succeeded" if ok else "Failed")
            run.stage = "done"
        self._write_status(run)
        self._release(run)
        self.core.store.delete("pods", run.namespace, run.name)

    # -- status ----------------------------------------------------------------------------------

    def _write_status(self, run: PodRun) -> None:
        ready = run.stage == "main" and all("running" in c.state and c.started_ok for c in run.main)
        initialized = run.stage != "init" or not run.init
        signature = (
            run.phase, run.stage, run.reason, run.message, tuple(run.gpu_ids), tuple(sorted(run.pids().items())),
            repr([(c.state, c.last_state, c.restart_count, c.started_ok) for c in run.containers()]),
        )
        if signature == run.written:
            return
        run.written = signature

        def mutate(pod: dict[str, Any]) -> None:
            if pod["metadata"].get("uid") != run.uid:
                return
            st = pod.setdefault("status", {})
            st["phase"] = run.phase
            st["hostIP"] = "127.0.0.1"
            st["hostIPs"] = [{"ip": "127.0.0.1"}]
            st["podIP"] = "127.0.0.1"
            st["podIPs"] = [{"ip": "127.0.0.1"}]
            st["startTime"] = run.start_time
            if run.reason:
                st["reason"] = run.reason
            if run.message:
                st["message"] = run.message
            done = run.phase in ("Succeeded", "Failed")
            set_condition(st, "PodReadyToStartContainers", "False" if done else "True", probe=False)
            set_condition(
                st, "Initialized", "True" if initialized else "False",
                None if initialized else "ContainersNotInitialized",
                None if initialized else "containers with incomplete status: " + str([c.name for c in run.init[run.init_index:]]),
                probe=False,
            )
            not_ready = [c.name for c in run.main if "running" not in c.state or not c.started_ok]
            reason = "PodCompleted" if done else (None if ready else "ContainersNotReady")
            msg = None if ready or done else f"containers with unready status: {not_ready}"
            set_condition(st, "ContainersReady", "True" if ready else "False", reason, msg, probe=False)
            set_condition(st, "Ready", "True" if ready else "False", reason, msg, probe=False)
            order = {"PodReadyToStartContainers": 0, "Initialized": 1, "Ready": 2, "ContainersReady": 3, "PodScheduled": 4}
            st["conditions"].sort(key=lambda x: order.get(x.get("type", ""), 9))
            if run.init:
                st["initContainerStatuses"] = [c.status(False) for c in run.init]
            st["containerStatuses"] = [c.status(ready) for c in run.main]
            ann = pod["metadata"].setdefault("annotations", {})
            pids = run.pids()
            main_pid = next((c.proc.pid for c in run.main if c.proc is not None and c.alive), None)
            if main_pid is None and pids:
                main_pid = next(iter(pids.values()))
            if main_pid is not None:
                ann["gpuorch.io/pid"] = str(main_pid)
            else:
                ann.pop("gpuorch.io/pid", None)
            if run.gpu_ids:
                ann["gpuorch.io/gpu-ids"] = ",".join(str(i) for i in run.gpu_ids)
            if not ann:
                del pod["metadata"]["annotations"]

        self.core.store.update("pods", run.namespace, run.name, mutate, fields=("status", "metadata"))

    # -- faults and shutdown ---------------------------------------------------------------------

    def kill_node(self, node: str, timeout: float = 5.0) -> list[str]:
        """The node died: SIGKILL every process of its pods, wait until they are reaped."""
        uids = [uid for uid, r in self.runs.items() if r.node == node]
        for uid in uids:
            self._kill_probes(self.runs[uid])
            for c in self.runs[uid].live():
                self._signal(c, signal.SIGKILL)
        self._wait_gone([c for uid in uids for c in self.runs[uid].containers()], timeout)
        for uid in uids:
            self._release(self.runs[uid])
        return uids

    def _wait_gone(self, containers: list[ContainerRun], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for c in containers:
            if c.proc is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))

    def shutdown(self, grace: float = 2.0) -> None:
        """Stop every process (SIGTERM, then SIGKILL after `grace` seconds) and reap them."""
        containers = [c for r in self.runs.values() for c in r.containers()]
        for r in self.runs.values():
            self._kill_probes(r)
        for c in containers:
            self._signal(c, signal.SIGTERM)
        self._wait_gone(containers, grace)
        for c in containers:
            self._signal(c, signal.SIGKILL)
        self._wait_gone(containers, 5.0)
        self.runs.clear()


def log_path(core: ClusterAPI, pod: dict[str, Any], container: str) -> Path:
    meta = pod["metadata"]
    pod_dir = f"{meta['name']}-{str(meta['uid'])[:8]}"
    return Path(core.state_dir, "pods", str(meta["namespace"]), pod_dir, "logs", f"{container}.log")
