"""Where a gpuorch installation finds its parts: one settings object, read from the environment.

Every service and the CLI take their settings from here, so that `gpuorch up` can
start them as independent processes with nothing but environment variables:

| variable              | meaning                                                        |
|-----------------------|----------------------------------------------------------------|
| GPUORCH_NATS_URL      | NATS server URL (default nats://127.0.0.1:4222)                |
| GPUORCH_PREFIX        | subject/stream prefix (default "gpuorch")                      |
| GPUORCH_KUBECONFIG    | kubeconfig with one context per cluster                        |
| GPUORCH_REGISTRY      | cluster registry file (deploy/local/clusters.yaml shape)       |
| GPUORCH_STATE_DIR     | local state: artifact stores, data locations (default .gpuorch)|
| GPUORCH_TRACE_FILE    | optional JSONL span file (tests, demo)                         |
| GPUORCH_NATS_CREDS    | this process's identity: nkey seed file (or JWT .creds)         |
| GPUORCH_NATS_TLS_CA / _CERT / _KEY | TLS: server CA, client certificate and key         |
| GPUORCH_IDENTITIES    | identities.json: client identity -> owners (router)            |

The services' tuning knobs (intervals, timeouts, concurrency, stream limits) are the fields of
`Tuning` below, each with its variable and meaning; `gpuorch settings` prints them all with the
values in force. A malformed value stops the process with the variable's name and what is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import yaml

from gpuorch_proto import ClusterRegistryEntry, MetricsSource, Names
from gpuorch_proto.credentials import registry_errors as credential_registry_errors
from gpuorch_proto.podpath import AGENT_IMAGE
from gpuorch_proto.storage import StoreConfig, StoreError, parse_url
from gpuorch_proto.subjects import valid_token

DAY = 86400.0


def _knob(env: str, default: Any, doc: str, *, positive: bool = True) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc, "positive": positive})


class SettingError(ValueError):
    """A tuning variable that cannot be used: names the variable, its value and what is wrong."""


@dataclass(frozen=True)
class Tuning:
    """Every knob a service reads, in one place: the variable, its default and what it does.

    Seconds are real seconds (the embedded clusters' time scale does not apply)."""

    router_concurrency: int = _knob("GPUORCH_ROUTER_CONCURRENCY", 64, "router: workloads decided at once (each workload's messages in order)")
    dispatch_interval: float = _knob("GPUORCH_DISPATCH_INTERVAL", 0.5, "dispatcher: seconds between observation passes")
    lost_after: float = _knob("GPUORCH_LOST_AFTER", 3.0, "dispatcher: seconds a cluster fails every call (counted from its first failed call to a failed call now) before its attempts are lost")
    probe_interval: float = _knob("GPUORCH_PROBE_INTERVAL", 0.5, "dispatcher, inventory, fencer: seconds between liveness probes (GET /version) of a cluster that is suspected or quiet, and the longest wait before a failing cluster is tried again; at most half of GPUORCH_LOST_AFTER")
    unschedulable_after: float = _knob("GPUORCH_UNSCHEDULABLE_AFTER", 60.0, "dispatcher: seconds a pod no node can take may stay pending before its attempt fails")
    requeue_factor: float = _knob("GPUORCH_REQUEUE_FACTOR", 4.0, "dispatcher: an attempt queued unplaced at its destination is requeued after this many times the router's queue-wait estimate")
    requeue_after: float = _knob("GPUORCH_REQUEUE_AFTER", 300.0, "dispatcher: seconds an attempt may always wait unplaced before it is requeued (the floor)")
    requeue_max: float = _knob("GPUORCH_REQUEUE_MAX", 86400.0, "dispatcher: seconds after which an attempt still unplaced is requeued whatever the estimate said")
    dispatcher_id: str = _knob("GPUORCH_DISPATCHER_ID", "0", "dispatcher: this instance's id (its lease in the owners bucket, its events durable and snapshot)")
    instance: str = _knob("GPUORCH_INSTANCE", "0", "router, fencer: this replica's id (its own events consumer and state snapshot; 0 keeps the plain names)")
    admission_ttl: float = _knob("GPUORCH_ADMISSION_TTL", 6.0, "router: seconds the admission leader's lease lives without renewal (renewed every third of it); another router takes admission over once it ran out")
    owner_ttl: float = _knob("GPUORCH_OWNER_TTL", 6.0, "dispatcher: seconds an instance lease lives without renewal (renewed every third of it); a dead instance's workloads are taken over once it ran out")
    reconcile_interval: float = _knob("GPUORCH_RECONCILE_INTERVAL", 1.0, "dispatcher: seconds between reconciles of owned workloads")
    dispatch_concurrency: int = _knob("GPUORCH_DISPATCH_CONCURRENCY", 64, "dispatcher: workloads handled at once (Job creates in flight)")
    kube_threads: int = _knob("GPUORCH_KUBE_THREADS", 16, "dispatcher: threads for Kubernetes API calls")
    fence_interval: float = _knob("GPUORCH_FENCE_INTERVAL", 0.5, "fencer: seconds between pursuit passes")
    orphan_grace: float = _knob("GPUORCH_ORPHAN_GRACE", 30.0, "fencer: seconds before a Job of a stale epoch is collected")
    orphan_grace_unknown: float = _knob("GPUORCH_ORPHAN_GRACE_UNKNOWN", 5.0, "fencer: seconds before a Job of an unknown attempt is collected")
    inventory_interval: float = _knob("GPUORCH_INVENTORY_INTERVAL", 1.0, "inventory: seconds between snapshot passes")
    inventory_heartbeat: float = _knob("GPUORCH_INVENTORY_HEARTBEAT", 5.0, "inventory: seconds between snapshots of an unchanged cluster")
    replicas: int = _knob("GPUORCH_REPLICAS", 1, "streams and buckets: replicas (3 or 5 on a JetStream cluster)")
    cmd_max_age: float = _knob("GPUORCH_CMD_MAX_AGE", 7 * DAY, "command stream: seconds a command is kept (never below the duplicate window)")
    cmd_max_bytes: int = _knob("GPUORCH_CMD_MAX_BYTES", 256 << 20, "command stream: byte limit")
    evt_max_bytes: int = _knob("GPUORCH_EVT_MAX_BYTES", 4 << 30, "event stream: byte limit")
    inventory_max_bytes: int = _knob("GPUORCH_INVENTORY_MAX_BYTES", 64 << 20, "inventory stream: byte limit")
    retire_finished: str = _knob("GPUORCH_RETIRE_FINISHED", "settled", "router, dispatcher, fencer: 'settled' keeps a finished workload as a compact record once none of its attempts can still run or awaits the fencer; 'never' keeps every whole view (docs/operations.md)")
    snapshot_interval: float = _knob("GPUORCH_SNAPSHOT_INTERVAL", 60.0, "router, dispatcher, fencer: seconds between state snapshots (and one at a clean stop)")
    log_level: str = _knob("GPUORCH_LOG_LEVEL", "INFO", "every service: log level")
    restart_initial: float = _knob("GPUORCH_RESTART_INITIAL", 0.5, "supervisor: seconds before the first restart of a crashed process")
    restart_factor: float = _knob("GPUORCH_RESTART_FACTOR", 2.0, "supervisor: backoff factor for every crash in a row")
    restart_max: float = _knob("GPUORCH_RESTART_MAX", 30.0, "supervisor: longest backoff, seconds")
    restart_reset: float = _knob("GPUORCH_RESTART_RESET", 60.0, "supervisor: seconds of running that reset the crash count")
    metrics_port: str = _knob("GPUORCH_METRICS_PORT", "0", "every service: /metrics port (0: any free port; off: no endpoint)")
    metrics_addr: str = _knob("GPUORCH_METRICS_ADDR", "127.0.0.1", "every service: /metrics listen address")
    trace_file: str = _knob("GPUORCH_TRACE_FILE", "", "every service: also write spans to this JSONL file (tests, demo)")
    agent_image: str = _knob("GPUORCH_AGENT_IMAGE", AGENT_IMAGE, "dispatcher: the image of gpuorch's agent in every attempt's pod (staging, checkpoint fetch, uploads: docs/storage.md)")
    web_base_path: str = _knob("GPUORCH_WEB_BASE_PATH", "", "gpuorch web: the path prefix it serves under behind a reverse proxy (e.g. /gpuorch; `--base-path` wins)")
    profile_dir: str = _knob("GPUORCH_PROFILE", "", "every service: write a cProfile of its event loop to <dir>/<service>-<pid>.prof at a clean stop (benches)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tuning:
        e = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = e.get(f.metadata["env"])
            if raw is None or raw.strip() == "":
                continue
            kind: Any = type(f.default)
            value: Any
            try:
                value = kind(raw.strip()) if kind is not str else raw.strip()
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise SettingError(f"{f.metadata['env']}={raw!r}: not {what} ({f.metadata['doc']})") from None
            if kind in (int, float) and f.metadata["positive"] and value <= 0:
                raise SettingError(f"{f.metadata['env']}={raw!r}: must be > 0 ({f.metadata['doc']})")
            values[f.name] = value
        made = cls(**values)
        if made.probe_interval > made.lost_after / 2:
            raise SettingError(
                f"GPUORCH_PROBE_INTERVAL={made.probe_interval:g}: must be at most half of GPUORCH_LOST_AFTER "
                f"({made.lost_after:g}): a healed cluster must be seen before its attempts are lost"
            )
        return made

    def to_env(self) -> dict[str, str]:
        """The knobs that differ from their defaults, as variables for a child process."""
        return {f.metadata["env"]: str(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) != f.default}

    @classmethod
    def table(cls) -> list[tuple[str, str, str]]:
        """(variable, default, meaning) for every knob: `gpuorch settings` and docs/operations.md."""
        return [(f.metadata["env"], str(f.default), f.metadata["doc"]) for f in fields(cls)]


@dataclass(frozen=True)
class Settings:
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "gpuorch"
    kubeconfig: Path | None = None
    registry: Path | None = None
    state_dir: Path = Path(".gpuorch")
    extra: dict[str, str] = field(default_factory=dict)
    nats_creds: Path | None = None  # the identity's seed file (docs/security.md)
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    identities: Path | None = None  # identities.json (who may submit as which owner)
    tuning: Tuning = field(default_factory=Tuning)
    # this process's own store credentials: GPUORCH_STORE_<NAME>_* (gpuorch_proto.storage.credential_env)
    store_env: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> Names:
        return Names(self.prefix)

    @property
    def stores_dir(self) -> Path:
        """Artifact stores of the embedded environment: one directory per store name."""
        return self.state_dir / "stores"

    @property
    def data_dir(self) -> Path:
        """Data locations of the embedded environment: one directory per location."""
        return self.state_dir / "data"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        kc = e.get("GPUORCH_KUBECONFIG")
        reg = e.get("GPUORCH_REGISTRY")

        def path(var: str) -> Path | None:
            v = e.get(var)
            return Path(v) if v else None

        return cls(
            nats_creds=path("GPUORCH_NATS_CREDS"),
            nats_tls_ca=path("GPUORCH_NATS_TLS_CA"),
            nats_tls_cert=path("GPUORCH_NATS_TLS_CERT"),
            nats_tls_key=path("GPUORCH_NATS_TLS_KEY"),
            identities=path("GPUORCH_IDENTITIES"),
            nats_url=e.get("GPUORCH_NATS_URL", cls.nats_url),
            prefix=e.get("GPUORCH_PREFIX", cls.prefix),
            kubeconfig=Path(kc) if kc else None,
            registry=Path(reg) if reg else None,
            state_dir=cls.default_state_dir(e),
            tuning=Tuning.from_env(e),
            store_env={k: v for k, v in e.items() if k.startswith("GPUORCH_STORE_")},
        )

    @staticmethod
    def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
        """GPUORCH_STATE_DIR, else `.gpuorch` (the CLI's default before anything else is read)."""
        return Path((os.environ if env is None else env).get("GPUORCH_STATE_DIR") or ".gpuorch")

    @classmethod
    def for_service(cls, service: str) -> Settings:
        """`from_env` for a service's `main`: a bad variable stops it with one clear line."""
        try:
            return cls.from_env()
        except SettingError as exc:
            raise SystemExit(f"{service}: {exc}") from None

    def to_env(self) -> dict[str, str]:
        env = {
            **self.store_env,
            **self.tuning.to_env(),
            "GPUORCH_NATS_URL": self.nats_url,
            "GPUORCH_PREFIX": self.prefix,
            "GPUORCH_STATE_DIR": str(self.state_dir.resolve()),
        }
        if self.kubeconfig:
            env["GPUORCH_KUBECONFIG"] = str(self.kubeconfig.resolve())
        if self.registry:
            env["GPUORCH_REGISTRY"] = str(self.registry.resolve())
        for var, value in (
            ("GPUORCH_NATS_CREDS", self.nats_creds), ("GPUORCH_NATS_TLS_CA", self.nats_tls_ca),
            ("GPUORCH_NATS_TLS_CERT", self.nats_tls_cert), ("GPUORCH_NATS_TLS_KEY", self.nats_tls_key),
            ("GPUORCH_IDENTITIES", self.identities),
        ):  # fmt: skip
            if value:
                env[var] = str(value.resolve())
        return env


@dataclass(frozen=True)
class Registry:
    """The cluster registry: what Kubernetes does not hold, one entry per kubeconfig context."""

    clusters: dict[str, ClusterRegistryEntry]
    time_scale: float = 1.0  # simulated seconds per real second (1.0 for real clusters)
    # artifact/checkpoint stores and data locations by URL (`stores:`, docs/storage.md); a name
    # the clusters use that is not here is a file:// directory under the state directory
    stores: dict[str, StoreConfig] = field(default_factory=dict)


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def metrics_source_problem(src: MetricsSource | None, at: str) -> str | None:
    """What is wrong with a cluster's `registry.metrics` (docs/activity.md), naming the field; None: nothing."""
    if src is None:
        return None
    if src.prometheus is None and src.exporter is None:
        return f"{at}: give prometheus (a Prometheus HTTP API URL) or exporter (dcgm-exporter through the API server), or leave metrics out"
    if src.prometheus is not None:
        u = urlsplit(src.prometheus)
        if u.scheme not in ("http", "https") or not u.netloc or u.query or u.fragment:
            return f"{at}.prometheus: {src.prometheus!r} is not a Prometheus base URL (http(s)://host:port[/path], no query)"
    for k in src.selector:
        if not _LABEL_NAME.match(k):
            return f"{at}.selector: {k!r} is not a Prometheus label name"
    return None


def load_registry(path: Path) -> Registry:
    """Read the registry part of a clusters file (`clusters: [{name, registry: {...}}]`)."""
    doc: Any = yaml.safe_load(path.read_text()) or {}
    stores: dict[str, StoreConfig] = {}
    raw_stores = doc.get("stores") or {}
    if not isinstance(raw_stores, dict):
        raise ValueError(f"{path}: stores: a mapping of store name -> {{url, endpoint, region}}")
    for sname, raw in raw_stores.items():
        at = f"stores.{sname}"
        if not valid_token(str(sname)):
            raise ValueError(f"{path}: {at}: not a store name (letters, digits, '-', '_')")
        if isinstance(raw, str):
            raw = {"url": raw}
        try:
            stores[sname] = msgspec.convert(raw, StoreConfig)
            parse_url(stores[sname].url, f"{at}.url")
        except (msgspec.ValidationError, StoreError) as exc:
            raise ValueError(f"{path}: {at}: {exc}") from exc
    entries: dict[str, ClusterRegistryEntry] = {}
    for i, c in enumerate(doc.get("clusters") or []):
        name = c.get("name")
        if not name:
            raise ValueError(f"{path}: clusters[{i}].name is missing")
        try:
            entries[name] = msgspec.convert(c.get("registry") or {}, ClusterRegistryEntry)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{path}: clusters[{i}].registry: {exc}") from exc
        metrics_problem = metrics_source_problem(entries[name].metrics, f"clusters[{i}].registry.metrics")
        if metrics_problem:
            raise ValueError(f"{path}: {metrics_problem}")
        bad = credential_registry_errors(entries[name], f"clusters[{i}].registry")
        if bad:
            raise ValueError(f"{path}: " + "; ".join(f"{e.path}: {e.message}" for e in bad))
        for sname in entries[name].store_credentials:
            if sname not in stores:
                raise ValueError(
                    f"{path}: clusters[{i}].registry.store_credentials.{sname}: no store {sname!r} in stores: "
                    "credentials are named only for stores given by URL"
                )
        if stores:  # given by URL: all of them, or a name left out would quietly be a directory here
            e = entries[name]
            named = {"artifact_stores": e.artifact_stores, "checkpoint_stores": e.checkpoint_stores,
                     "data_locations": e.data_locations, "bandwidth_mbps": list(e.bandwidth_mbps)}  # fmt: skip
            for fld, names in named.items():
                for sname in names:
                    if sname not in stores:
                        raise ValueError(
                            f"{path}: clusters[{i}].registry.{fld}: {sname!r} is not in stores: where stores are "
                            "given by URL every store and data location a cluster names must be, or it would be "
                            "a directory on the control plane's disk that no pod can reach"
                        )
    return Registry(clusters=entries, time_scale=float(doc.get("time_scale", 1.0)), stores=stores)
