"""The supervisor of the embedded system: restarts a process that died, and records it.

`gpuorch up` starts `python -m gpuorch.supervisor --state DIR --clusters FILE` detached (its own
session, log in `<state>/logs/supervisor.log`). The supervisor starts the whole system
(`System.start()`: nats, localkube, the four services) as its own children, writes
`<state>/system.json` (with its own pid under `supervisor`), and then watches them:

- a service (`inventory`, `router`, `dispatcher`, `fencer`) or `nats` that exits without being
  asked to is started again after a capped exponential backoff (`gpuorch.backoff`, pure); nats
  comes back on its old port with its old store, so clients reconnect and JetStream keeps
  its streams;
- `localkube` is watched but not restarted: its clusters live in its memory on ports chosen at
  start, so a new one would be other clusters behind the same names with every Job gone, and a
  kubeconfig the running services never read. Its exit is recorded (`restarted: false`) and
  logged as an error; `gpuorch down` + `gpuorch up` is the way back;
- `gpuorch restart SERVICE` drops a request file into `<state>/supervisor/requests/`; the
  supervisor stops that service (SIGTERM, then SIGKILL after 15 s), starts it again at once,
  and answers with a result file once the new process is ready.

Every restart (and every exit not followed by one) is one JSON line in `<state>/restarts.jsonl`
(service, kind `crash` or `requested`, old and new pid, exit code or signal, how long it ran,
backoff, consecutive crashes, time) and one `supervisor.restarted` log line. SIGTERM (what
`gpuorch down` sends) stops the supervision first, then every process, then the supervisor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpuorch.backoff import BackoffPolicy, RestartDecision, decide_restart
from gpuorch.config import Tuning
from gpuorch.system import SERVICES, Proc, StartError, System

log = structlog.get_logger("gpuorch.supervisor")

RESTARTS = "restarts.jsonl"
REQUESTS = Path("supervisor") / "requests"
PID_FILE = "supervisor.pid"
RESTARTABLE = (*SERVICES, "nats")
NOT_RESTARTED_WHY = {
    "localkube": "the local clusters live in its memory: a new one would have lost every Job "
                 "and serve other ports; run `gpuorch down` and `gpuorch up`",
}
STOP_GRACE = 15.0  # s between SIGTERM and SIGKILL of a service asked to restart
READY_TIMEOUT = 90.0  # s a restarted process has to say it is ready


class SupervisorError(RuntimeError):
    pass


def policy_from_env(env: dict[str, str] | None = None) -> BackoffPolicy:
    t = Tuning.from_env(env)
    return BackoffPolicy(initial=t.restart_initial, factor=t.restart_factor, cap=t.restart_max, healthy_after=t.restart_reset)


def exit_status(returncode: int | None) -> tuple[int | None, str | None]:
    """(exit code, signal name) of a Popen return code (negative: killed by that signal)."""
    if returncode is None or returncode >= 0:
        return returncode, None
    try:
        return None, signal.Signals(-returncode).name
    except ValueError:
        return None, f"signal {-returncode}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


@dataclass
class Track:
    """The supervisor's view of one process name."""

    started_at: float  # monotonic: when the current process started
    crashes: int = 0  # consecutive crashes (the backoff's history)
    pending: RestartDecision | None = None  # crashed, waiting for its backoff
    exited: dict[str, Any] | None = None  # how the last process ended (for the record)
    stopping_until: float | None = None  # asked to restart: SIGTERM sent, SIGKILL after this
    requests: list[str] = field(default_factory=list)  # restart requests being served
    waiting_ready: float | None = None  # deadline for the new process to be ready
    gone: bool = False  # exited and not restarted (localkube)


class Supervisor:
    """The thin shell: poll the children, ask `decide_restart`, start, record."""

    def __init__(self, system: System, policy: BackoffPolicy, tick: float = 0.1) -> None:
        self.system = system
        self.policy = policy
        self.tick = tick
        now = time.monotonic()
        self.tracks = {n: Track(started_at=now) for n in system.procs}
        self.requests_dir = system.state_dir / REQUESTS
        self.requests_dir.mkdir(parents=True, exist_ok=True)
        self.restarts_file = system.state_dir / RESTARTS

    # --- records ---------------------------------------------------------------------------
    def record(self, entry: dict[str, Any]) -> None:
        with open(self.restarts_file, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
        fields = {("process" if k == "service" else k): v for k, v in entry.items()}  # `service` is the logger's
        (log.info if entry.get("restarted") else log.error)(
            "supervisor.restarted" if entry.get("restarted") else "supervisor.not_restarted", **fields)

    def answer(self, req_id: str, result: dict[str, Any]) -> None:
        tmp = self.requests_dir / f"{req_id}.result.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(self.requests_dir / f"{req_id}.result.json")

    # --- one pass --------------------------------------------------------------------------
    def step(self) -> None:
        now = time.monotonic()
        self._take_requests(now)
        for name, track in self.tracks.items():
            proc = self.system.procs[name]
            if track.gone:
                continue
            if track.pending is not None:
                if now >= track.pending.restart_at:
                    self._restart(name, track, "crash", now)
                continue
            if proc.popen is None or proc.popen.poll() is None:
                if track.stopping_until is not None and now >= track.stopping_until:
                    _signal_group(proc.pid, signal.SIGKILL)
                    track.stopping_until = now + STOP_GRACE
                if track.waiting_ready is not None:
                    self._check_ready(name, track, proc, now)
                continue
            self._exited(name, track, proc, now)

    def _exited(self, name: str, track: Track, proc: Proc, now: float) -> None:
        assert proc.popen is not None
        code, sig = exit_status(proc.popen.returncode)
        track.exited = {"old_pid": proc.pid, "exit_code": code, "signal": sig, "ran_s": round(now - track.started_at, 3)}
        track.waiting_ready = None
        if track.stopping_until is not None:  # asked for: start again now, no backoff
            track.stopping_until = None
            self._restart(name, track, "requested", now)
            return
        for req in track.requests:  # died before it was ready
            self.answer(req, {"ok": False, "service": name, "error": f"{name} exited before it was ready ({sig or code})"})
        track.requests.clear()
        if name.split("-")[0] not in RESTARTABLE:  # a replica (router-1) restarts as its service does
            track.gone = True
            self.record({"at": _iso(time.time()), "service": name, "kind": "crash", "restarted": False,
                         **track.exited, "why": NOT_RESTARTED_WHY.get(name, "not restartable")})
            return
        track.pending = decide_restart(self.policy, track.crashes, track.started_at, now)
        log.warning("supervisor.exited", process=name, **track.exited, backoff_s=track.pending.delay,
                    reason=track.pending.reason)

    def _restart(self, name: str, track: Track, kind: str, now: float) -> None:
        decision, track.pending = track.pending, None
        try:
            proc = self.system.respawn(name)
        except OSError as exc:  # could not even start: count it as a crash of zero run time
            log.error("supervisor.spawn_failed", process=name, error=repr(exc))
            track.pending = decide_restart(self.policy, track.crashes, now, now)
            return
        if decision is not None:
            track.crashes = decision.crashes
        track.started_at = time.monotonic()
        track.waiting_ready = track.started_at + READY_TIMEOUT
        exited = track.exited or {}
        self.system.save()
        self.record({
            "at": _iso(time.time()), "service": name, "kind": kind, "restarted": True,
            "old_pid": exited.get("old_pid"), "new_pid": proc.pid,
            "exit_code": exited.get("exit_code"), "signal": exited.get("signal"), "ran_s": exited.get("ran_s"),
            "backoff_s": decision.delay if decision else 0.0,
            "crashes": decision.crashes if decision else track.crashes,
            "reason": decision.reason if decision else "requested: `gpuorch restart`",
        })

    def _check_ready(self, name: str, track: Track, proc: Proc, now: float) -> None:
        if self.system.is_ready(name):
            track.waiting_ready = None
            log.info("supervisor.ready", process=name, pid=proc.pid)
            if name == "nats":
                self.system.save()
            for req in track.requests:
                self.answer(req, {"ok": True, "service": name, "new_pid": proc.pid,
                                  "old_pid": (track.exited or {}).get("old_pid")})
            track.requests.clear()
        elif track.waiting_ready is not None and now >= track.waiting_ready:
            track.waiting_ready = None
            log.error("supervisor.not_ready", process=name, pid=proc.pid, timeout_s=READY_TIMEOUT)
            for req in track.requests:
                self.answer(req, {"ok": False, "service": name, "error": f"{name} not ready within {READY_TIMEOUT:g}s; see {proc.log}"})
            track.requests.clear()

    def _take_requests(self, now: float) -> None:
        for f in sorted(self.requests_dir.glob("*.request.json")):
            req_id = f.name.removesuffix(".request.json")
            try:
                service = json.loads(f.read_text())["service"]
            except (OSError, ValueError, KeyError):
                continue
            f.unlink(missing_ok=True)
            track = self.tracks.get(service)
            if service.split("-")[0] not in SERVICES or track is None:  # router-1: a replica
                self.answer(req_id, {"ok": False, "service": service, "error": f"unknown service {service!r}; one of {', '.join(SERVICES)}"})
                continue
            log.info("supervisor.restart_requested", process=service, request=req_id)
            track.requests.append(req_id)
            if track.stopping_until is not None:
                continue  # already on its way down: this request shares that restart
            if track.pending is not None:  # crashed and waiting for its backoff: no need to wait
                track.pending = None
                self._restart(service, track, "requested", now)
                continue
            track.stopping_until = now + STOP_GRACE
            _signal_group(self.system.procs[service].pid, signal.SIGTERM)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(self.tick)
        for track in self.tracks.values():
            for req in track.requests:
                self.answer(req, {"ok": False, "error": "the system is stopping"})
            track.requests.clear()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# --- used by the CLI -------------------------------------------------------------------------


def supervisor_pid(state_dir: Path) -> int | None:
    """The pid of the live supervisor of `state_dir`, else None."""
    f = state_dir / PID_FILE
    try:
        pid = int(f.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_supervisor(pid) else None


def _is_supervisor(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid file
    if b"gpuorch.supervisor" not in cmdline:
        return False
    with contextlib.suppress(OSError):  # a zombie is gone
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return False
    return True


def stop_supervisor(state_dir: Path, timeout: float = 120.0) -> bool:
    """SIGTERM the supervisor (it stops every process, then itself); True if one was running."""
    pid = supervisor_pid(state_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_supervisor(pid):
        time.sleep(0.1)
    if _is_supervisor(pid):
        os.kill(pid, signal.SIGKILL)
    return True


def request_restart(state_dir: Path, service: str, timeout: float = 120.0) -> dict[str, Any]:
    """Ask the supervisor to restart `service`; its answer once the new process is ready."""
    if supervisor_pid(state_dir) is None:
        raise SupervisorError(f"no supervisor is running for {state_dir} (is the system up? `gpuorch up`)")
    d = state_dir / REQUESTS
    d.mkdir(parents=True, exist_ok=True)
    req_id = uuid.uuid4().hex[:12]
    tmp = d / f"{req_id}.tmp"
    tmp.write_text(json.dumps({"service": service, "at": _iso(time.time())}))
    tmp.replace(d / f"{req_id}.request.json")
    result = d / f"{req_id}.result.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result.exists():
            doc: dict[str, Any] = json.loads(result.read_text())
            result.unlink(missing_ok=True)
            return doc
        if supervisor_pid(state_dir) is None:
            raise SupervisorError("the supervisor exited before answering")
        time.sleep(0.1)
    (d / f"{req_id}.request.json").unlink(missing_ok=True)
    raise SupervisorError(f"no answer from the supervisor within {timeout:g}s")


def read_restarts(state_dir: Path) -> list[dict[str, Any]]:
    f = state_dir / RESTARTS
    if not f.exists():
        return []
    out = []
    for line in f.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def status(state_dir: Path) -> dict[str, Any]:
    """Processes of the running system (pid, alive, restarts) and the supervisor."""
    doc = json.loads((state_dir / "system.json").read_text())
    restarts = read_restarts(state_dir)
    procs = {}
    for name, p in doc["procs"].items():
        mine = [r for r in restarts if r.get("service") == name]
        pid = int(p["pid"])
        procs[name] = {"pid": pid, "alive": _pid_alive(pid), "restarts": sum(1 for r in mine if r.get("restarted")),
                       "last": mine[-1] if mine else None, "log": p["log"]}
    sup = supervisor_pid(state_dir)
    return {"supervisor": {"pid": sup or (doc.get("supervisor") or {}).get("pid"), "alive": sup is not None},
            "nats_url": doc["nats_url"], "processes": procs, "restarts_file": str(state_dir / RESTARTS)}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return False
    return True


def spawn_detached(state_dir: Path, clusters_file: Path, timeout: float = 300.0, replicas: int = 1) -> System:
    """Start a supervisor in its own session (for `gpuorch up`); return once the system is up."""
    import subprocess

    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / "supervisor.log"
    offset = log_file.stat().st_size if log_file.exists() else 0
    with open(log_file, "ab") as fh:
        p = subprocess.Popen(
            [sys.executable, "-m", "gpuorch.supervisor", "--state", str(state_dir), "--clusters", str(clusters_file),
             "--replicas", str(replicas)],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            with open(log_file, "rb") as fh:
                fh.seek(offset)
                tail = "\n".join(fh.read().decode(errors="replace").splitlines()[-25:])
            raise StartError(f"the supervisor exited with {p.returncode} while starting:\n{tail}")
        try:
            s = System.load(state_dir)
        except (OSError, ValueError, KeyError):
            s = None
        if s is not None and s.supervisor_pid == p.pid:
            return s
        time.sleep(0.1)
    p.terminate()
    raise StartError(f"the system was not up within {timeout:g}s; see {log_file}")


# --- the process -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.supervisor", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--clusters", type=Path, required=True)
    ap.add_argument("--replicas", type=int, default=1, help="routers, dispatchers and fencers (each)")
    ns = ap.parse_args(argv)
    from gpuorch.runtime.logs import configure_logging

    configure_logging("supervisor", Tuning.from_env().log_level)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    state = ns.state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    pid_file = state / PID_FILE
    pid_file.write_text(str(os.getpid()))
    policy = policy_from_env()
    system = System(state_dir=state, clusters_file=ns.clusters.resolve(), supervisor_pid=os.getpid(), replicas=ns.replicas)
    try:
        try:
            system.start()
        except StartError as exc:
            log.error("supervisor.start_failed", error=str(exc))
            return 1
        log.info("supervisor.ready", pids={n: p.pid for n, p in system.procs.items()},
                 policy={"initial": policy.initial, "factor": policy.factor, "cap": policy.cap,
                         "healthy_after": policy.healthy_after})
        Supervisor(system, policy).run(stop)
        log.info("supervisor.stopping")
        return 0
    finally:
        system.stop()
        with contextlib.suppress(OSError):
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()
        log.info("supervisor.stopped")


if __name__ == "__main__":
    raise SystemExit(main())
