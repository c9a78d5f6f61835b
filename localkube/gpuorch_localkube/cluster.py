"""LocalCluster (one cluster) and LocalClusters (every cluster of a config file, in one process)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from gpuorch_proto.kubesem import TERMINAL_POD_PHASES

from .apiserver import APIServer
from .background import BackgroundLoadManager
from .config import (
    BackgroundLoad,
    ClusterConfig,
    LocalClustersConfig,
    load_config,
    parse_background,
    parse_cluster,
    parse_config,
)
from .core import ClusterCore, node_object
from .httpserver import LoopThread
from .jobcontroller import JobController, PodGC, mark_node_lost
from .kubelet import Kubelet, claim_dir
from .objects import GPU
from .scheduler import Scheduler
from .store import Event

__all__ = ["LocalCluster", "LocalClusters", "kubeconfig_dict", "write_kubeconfig"]

log = logging.getLogger("gpuorch_localkube")
RESYNC_SECONDS = 30.0
#: A pass at least this often: the kubelet's clocks (restart back-off, grace periods) and the Job
#: controller's deadlines are looked at by passes.
TICK_SECONDS = 0.1


def kubeconfig_dict(servers: Mapping[str, str], current: str | None = None) -> dict[str, Any]:
    """One context per cluster (named like the cluster), `http://` servers, no credentials."""
    names = list(servers)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": n, "cluster": {"server": servers[n]}} for n in names],
        "users": [{"name": "localkube", "user": {}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "localkube", "namespace": "default"}} for n in names],
        "current-context": current or (names[0] if names else ""),
    }


def write_kubeconfig(path: str | Path, servers: Mapping[str, str], current: str | None = None) -> Path:
    """Write atomically (mode 0600), so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kubeconfig-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(kubeconfig_dict(servers, current), f, sort_keys=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


class LocalCluster:
    """One local cluster: API server, scheduler, Job controller, GCs, kubelet and background load.

    `config` is a ClusterConfig or a mapping in the YAML schema of one `clusters:` entry.
    `state_dir` is this cluster's directory: pod working directories and logs under `pods/`,
    `shared/` is GPUORCH_CLUSTER_DIR (persists across pods).
    """

    def __init__(
        self,
        config: ClusterConfig | Mapping[str, Any],
        state_dir: str | Path,
        *,
        time_scale: float | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ):
        if isinstance(config, ClusterConfig):
            cfg = config if time_scale is None else dataclasses.replace(config, time_scale=float(time_scale))
        else:
            cfg = parse_cluster(config, time_scale=float(time_scale) if time_scale is not None else float(config.get("time_scale", 1.0)))
        self.config = cfg
        self.state_dir = Path(state_dir).resolve()
        self.runner = LoopThread(f"localkube-{cfg.name}")  # the API and the controllers: one thread
        self._pass_due = False  # a pass is scheduled on the loop
        self.core = ClusterCore(cfg, self.state_dir, self._poke)
        self.kubelet = Kubelet(self.core)
        self.core.kubelet = self.kubelet
        self.scheduler = Scheduler(self.core)
        self.jobs = JobController(self.core)
        self.podgc = PodGC(self.core)
        self.background = BackgroundLoadManager(self.core)
        self.core.store.add_listener(self._observe)
        self._last_resync = 0.0
        self.api = APIServer(self.core, host, cfg.port if port is None else port, self.runner)
        self._tick: Any = None  # the loop's TimerHandle of the next periodic pass
        self._stopping = False
        self._started = False

    # -- identity --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def url(self) -> str:
        return self.api.url

    @property
    def port(self) -> int:
        return self.api.port

    @property
    def time_scale(self) -> float:
        return self.config.time_scale

    @property
    def partitioned(self) -> bool:
        return self._started and not self.api.serving

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if self._started:
            return self
        (self.state_dir / "pods").mkdir(parents=True, exist_ok=True)
        self.core.cluster_dir.mkdir(parents=True, exist_ok=True)
        self.core.add_configured_nodes()
        with self.core.store.lock:
            self.scheduler.resync()
        self._stopping = False
        self.runner.start()
        self.runner.call(self._periodic)
        self.api.start()
        self._started = True
        atexit.register(self._atexit)
        log.info("cluster %s serving on %s", self.name, self.url)
        return self

    def _atexit(self) -> None:
        """Safety net: an interpreter that exits without stop() must not leave pod processes behind."""
        with contextlib.suppress(Exception):
            self.stop(grace=0.5)

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving and controlling, and stop every process this cluster started.

        Processes get SIGTERM, then SIGKILL after `grace` seconds; all are reaped before returning.
        """
        if not self._started:
            return
        self._stopping = True
        self.api.stop()

        def stop_passes() -> None:
            if self._tick is not None:
                self._tick.cancel()

        self.runner.call(stop_passes)
        self.runner.stop()
        with self.core.store.lock:
            self.kubelet.shutdown(grace)
            self.core.store.closed = True
        self._started = False
        atexit.unregister(self._atexit)
        log.info("cluster %s stopped", self.name)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _poke(self) -> None:
        """A commit (any thread): schedule a pass on the loop, unless one is already due.

        It runs after the callbacks of the loop's current turn: the requests that arrived together
        are answered first and their commits share the pass, as a burst's commits do."""
        if not self._pass_due and not self._stopping:
            self._pass_due = True
            self.runner.soon(self._pass)

    def _observe(self, event: Event) -> None:
        """Every store commit (lock held): queue the work it means for each controller."""
        self.jobs.observe(event)
        self.podgc.observe(event)
        self.scheduler.observe(event)
        self.kubelet.observe(event)
        self.background.observe(event)

    def _periodic(self) -> None:
        """A pass every TICK_SECONDS (on the loop), whatever was committed."""
        self._pass()
        if not self._stopping:
            assert self.runner.loop is not None
            self._tick = self.runner.loop.call_later(TICK_SECONDS, self._periodic)

    def _pass(self) -> None:
        """One pass of the controllers on the loop, between requests (informers' resync every
        RESYNC_SECONDS); another soon if work is left, so requests are served in between."""
        self._pass_due = False
        if self._stopping:
            return
        try:
            now = time.monotonic()
            if now - self._last_resync >= RESYNC_SECONDS:
                self._last_resync = now
                self.resync()
            more = self.reconcile()
            self.api.flush_watches()  # this pass's commits, in one write per watcher
        except Exception:  # pragma: no cover - keep the cluster alive, but say it loudly
            log.exception("cluster %s: reconcile failed", self.name)
            more = False
        if more and not self._pass_due:
            self._pass_due = True
            self.runner.soon(self._pass)

    def resync(self) -> None:
        """Queue every object for the controllers that follow objects (informers' periodic resync)."""
        with self.core.store.lock:
            self.jobs.resync()
            self.podgc.resync()
            self.kubelet.resync()
            self.background.resync()

    def reconcile(self) -> bool:
        """One pass of every controller over its queued work; True when work is left for another.

        Runs on the cluster's loop (or in a test's thread): the store lock is taken per
        controller, so other threads get in between the steps; the loop's own requests are
        served between passes (the Job controller does 32 Jobs per pass).
        """
        lock = self.core.store.lock
        with lock:
            self.kubelet.sync()
        with lock:
            more = self.jobs.sync()
        with lock:
            self.podgc.sync()
        with lock:
            self.scheduler.sync()
        with lock:
            self.kubelet.sync()
        with lock:
            self.background.sync()
        return more

    # -- faults ----------------------------------------------------------------------------------

    def partition(self) -> None:
        """The API stops answering (connection refused); pods keep running, status keeps moving."""
        self.api.stop()
        log.warning("cluster %s: partitioned (API closed on port %d)", self.name, self.port)

    def heal(self) -> None:
        """Serve again on the same port, with the state as it is now."""
        self.api.start()
        log.warning("cluster %s: healed (API on %s)", self.name, self.url)

    def slow_api(self, seconds: float) -> None:
        """Delay every API response by `seconds` (0 to stop)."""
        self.api.delay = max(0.0, float(seconds))

    def lose_node(self, name: str) -> list[str]:
        """The node disappears: its processes are killed, its pods become Failed (NodeLost), then go."""
        with self.core.store.lock:
            if self.core.store.get("nodes", "", name) is None:
                raise KeyError(f"no node {name!r} in cluster {self.name}")
            self.core.store.delete("nodes", "", name)
            self.kubelet.kill_node(name)
            lost = []
            for p in self.core.store.values("pods"):
                if p["spec"].get("nodeName") == name and (p.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES:
                    meta = p["metadata"]
                    self.core.store.update("pods", meta["namespace"], meta["name"], lambda o: mark_node_lost(o, name))
                    lost.append(f"{meta['namespace']}/{meta['name']}")
        self._poke()
        log.warning("cluster %s: lost node %s (%d pods)", self.name, name, len(lost))
        return lost

    def add_node(self, name: str, group: str | None = None) -> None:
        """(Re)add a node: a configured node that was lost, or a new one shaped like node group `group`."""
        groups = {g.name: g for g in self.config.nodes}
        spec = groups.get(group) if group else self.core.node_groups.get(name)
        if spec is None:
            raise KeyError(f"unknown node {name!r} (give a node group: one of {sorted(groups)})")
        with self.core.store.lock:
            self.core.node_groups[name] = spec
            self.core.store.create("nodes", node_object(self.name, spec, name))

    def set_node_gpus(self, name: str, gpus: int) -> None:
        """Change a node's allocatable nvidia.com/gpu (capacity grows with it if needed)."""
        if gpus < 0:
            raise ValueError("gpus must be >= 0")

        def mutate(n: dict[str, Any]) -> None:
            st = n.setdefault("status", {})
            alloc, cap = st.setdefault("allocatable", {}), st.setdefault("capacity", {})
            alloc[GPU] = str(gpus)
            if int(cap.get(GPU, "0")) < gpus:
                cap[GPU] = str(gpus)

        with self.core.store.lock:
            if self.core.store.update("nodes", "", name, mutate) is None:
                raise KeyError(f"no node {name!r} in cluster {self.name}")

    def set_background(self, loads: Sequence[BackgroundLoad | Mapping[str, Any]]) -> None:
        """Replace the background load; extra queued (not yet running) jobs are withdrawn."""
        parsed = [b if isinstance(b, BackgroundLoad) else parse_background([b])[0] for b in loads]
        self.background.set_loads(parsed)

    # -- introspection ---------------------------------------------------------------------------

    def pod_pids(self, namespace: str, name: str) -> dict[str, int]:
        """Live process ids of a pod's containers (container name -> pid)."""
        with self.core.store.lock:
            pod = self.core.store.get("pods", namespace, name)
            return self.kubelet.pod_pids(pod["metadata"]["uid"]) if pod else {}

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The directory that is persistentVolumeClaim `claim` of `namespace` for this cluster's pods
        (made on the first mount, kept across pods)."""
        return claim_dir(self.state_dir, namespace, claim)

    def pids(self) -> list[int]:
        """Every live container process of this cluster."""
        with self.core.store.lock:
            return self.kubelet.all_pids()

    def nodes(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.core.store.list("nodes")]

    def write_kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(path, {self.name: self.url})

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "partitioned": self.partitioned,
            "slow_api_seconds": self.api.delay,
            "time_scale": self.time_scale,
            "nodes": self.nodes(),
            "processes": len(self.pids()),
        }


class LocalClusters:
    """Every cluster of a config (path, mapping or LocalClustersConfig), each on its own port."""

    def __init__(self, config: LocalClustersConfig | Mapping[str, Any] | str | Path, state_dir: str | Path):
        if isinstance(config, str | Path):
            cfg = load_config(config)
        elif isinstance(config, LocalClustersConfig):
            cfg = config
        else:
            cfg = parse_config(config)
        self.config = cfg
        self.state_dir = Path(state_dir).resolve()
        self.clusters: dict[str, LocalCluster] = {c.name: LocalCluster(c, self.state_dir / c.name) for c in cfg.clusters}

    def __getitem__(self, name: str) -> LocalCluster:
        return self.clusters[name]

    def __iter__(self) -> Iterator[LocalCluster]:
        return iter(self.clusters.values())

    def __len__(self) -> int:
        return len(self.clusters)

    @property
    def names(self) -> list[str]:
        return list(self.clusters)

    @property
    def urls(self) -> dict[str, str]:
        return {n: c.url for n, c in self.clusters.items()}

    def start(self) -> LocalClusters:
        started: list[LocalCluster] = []
        try:
            for c in self.clusters.values():
                started.append(c.start())
        except BaseException:
            for c in started:
                c.stop()
            raise
        return self

    def stop(self, grace: float = 2.0) -> None:
        threads = [threading.Thread(target=c.stop, args=(grace,)) for c in self.clusters.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def __enter__(self) -> LocalClusters:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def kubeconfig(self) -> dict[str, Any]:
        return kubeconfig_dict(self.urls)

    def write_kubeconfig(self, path: str | Path, current: str | None = None) -> Path:
        return write_kubeconfig(path, self.urls, current)
