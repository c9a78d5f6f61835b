"""A dcgm-exporter for the local clusters: every node's GPUs in NVIDIA dcgm-exporter's text
format, with its pod attribution (docs/local-clusters.md, *GPU metrics*; docs/activity.md).

A real cluster runs NVIDIA's dcgm-exporter as a DaemonSet (the GPU Operator names its Service
`nvidia-dcgm-exporter` in `gpu-operator`, port `gpu-metrics` 9400); DCGM measures each device
and the exporter labels a device held by a pod with the pod's `namespace`, `pod` and
`container` (the kubelet's pod-resources API tells it who holds which device). A local cluster
has no devices: a program that computes "on its GPUs" tells the cluster what it did, in the file
the kubelet names in its environment (`GPU_REPORT_ENV`, a file in the pod's private directory):

    {"busy_seconds": 12.5, "busy_since": 1767225600.1 | null, "fb_used_mib": 2048, "at": 1767225600.2}

`busy_seconds` is the time the program has computed so far (cumulative, its own clock),
`busy_since` the start of the compute phase it is in now (null between phases), `fb_used_mib` the
device memory it holds. A program that writes nothing (a CPU program given a GPU) leaves its
devices idle, as a real device would be.

Like dcgm-exporter, values are *collected* at most once per `collect_interval` and every scrape
in between gets the last collection (`Exporter.scrape`). A device's activity at a collection is
the share of the time since the previous collection its holder computed:
``(busy(now) - busy(previous)) / (now - previous)``, with ``busy(t) = busy_seconds + (t -
busy_since)`` while the holder is in a compute phase. So over any window the average of the
collected values is the holder's compute time over wall time, with nothing invented.
At the first collection that sees a holder, "previous" is its container's start (busy 0 then).

Series (each a gauge, as dcgm-exporter's default and DCP counter files declare them):

| series | value |
|---|---|
| `DCGM_FI_DEV_GPU_UTIL` | activity in percent (integer 0-100) |
| `DCGM_FI_PROF_GR_ENGINE_ACTIVE` | activity as a ratio (0-1) |
| `DCGM_FI_DEV_FB_USED` / `DCGM_FI_DEV_FB_FREE` | device memory used / free, MiB |

Labels: `gpu` (the index on the node), `UUID`, `pci_bus_id`, `device` (`nvidia<i>`), `modelName`,
`Hostname` (the node), and for a held device `container`, `namespace`, `pod` (dcgm-exporter's
`pod`, `namespace` and `container` attributes, `internal/pkg/transformation/const.go`). A device
nobody holds has no attribution labels.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .objects import GPU
from .quantity import parse_quantity
from .util import parse_rfc3339

#: the variable the kubelet sets in a container that holds GPUs: where its program may report
GPU_REPORT_ENV = "GPUORCH_GPU_REPORT"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
#: (series, help) in the order the endpoint lists them; the help texts are dcgm-exporter's
SERIES = (
    (GPU_UTIL, "GPU utilization (in %)."),
    (GR_ENGINE_ACTIVE, "Ratio of time the graphics engine is active."),
    (FB_USED, "Framebuffer memory used (in MiB)."),
    (FB_FREE, "Framebuffer memory free (in MiB)."),
)


@dataclass(frozen=True)
class DcgmConfig:
    """Where the cluster serves its exporter: the API server's service proxy path
    ``/api/v1/namespaces/<namespace>/services/<service>:<port>/proxy/metrics`` (the port by
    number or by `port_name`), and how often values are collected (real seconds)."""

    namespace: str = "gpu-operator"
    service: str = "nvidia-dcgm-exporter"
    port: int = 9400
    port_name: str = "gpu-metrics"
    collect_interval: float = 1.0

    def proxies(self, namespace: str, service: str) -> bool:
        """Does ``services/<service>`` in `namespace` name this exporter? (``name``, ``name:port``,
        ``name:port-name``, with an optional ``http:`` scheme, as the API server accepts them.)"""
        if namespace != self.namespace:
            return False
        parts = service.split(":")
        if parts[0] in ("http", "https") and len(parts) > 1:
            parts = parts[1:]
        if parts[0] != self.service or len(parts) > 2:
            return False
        return len(parts) == 1 or parts[1] in ("", str(self.port), self.port_name)

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/services/{self.service}:{self.port_name}/proxy/metrics"


def report_path(state_dir: Path, namespace: str, pod: str, uid: str, container: str) -> Path:
    """The device report of `container` in its pod's directory (kept with the pod's logs)."""
    return state_dir / "pods" / namespace / f"{pod}-{uid[:8]}" / "devices" / f"{container}.json"


def gpu_containers(spec: Mapping[str, Any]) -> list[str]:
    """The regular containers that ask for GPUs (limits or requests): who a device is attributed to."""
    out = []
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        if any(parse_quantity(str((res.get(k) or {}).get(GPU, "0"))) > 0 for k in ("limits", "requests")):
            out.append(str(c["name"]))
    return out


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    uid: str
    container: str
    alive: bool  # the container runs now (a stale `busy_since` of one that stopped counts nothing)
    report: Path
    started: float | None = None  # when the container started (its status' startedAt), if it runs


@dataclass(frozen=True)
class Device:
    node: str
    index: int
    model: str
    memory_mib: int
    holder: Holder | None

    def labels(self, cluster: str) -> dict[str, str]:
        uid = uuid.uuid5(uuid.NAMESPACE_URL, f"localkube://{cluster}/{self.node}/gpu/{self.index}")
        out = {
            "gpu": str(self.index), "UUID": f"GPU-{uid}", "pci_bus_id": f"00000000:{0x10 + self.index:02X}:00.0",
            "device": f"nvidia{self.index}", "modelName": self.model, "Hostname": self.node,
        }  # fmt: skip
        if self.holder is not None:
            out.update(container=self.holder.container, namespace=self.holder.namespace, pod=self.holder.pod)
        return out


def devices(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], state_dir: Path) -> list[Device]:
    """Every GPU of every node, with the pod holding it: a pod bound to the node, not finished,
    whose kubelet gave it devices (the `gpuorch.io/gpu-ids` annotation). Pure over the objects."""
    held: dict[tuple[str, int], Holder] = {}
    for p in pods:
        meta, spec, status = p["metadata"], p.get("spec") or {}, p.get("status") or {}
        ids = (meta.get("annotations") or {}).get("gpuorch.io/gpu-ids")
        if not ids or not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        names = gpu_containers(spec) or [str(c["name"]) for c in (spec.get("containers") or [])[:1]]
        if not names:
            continue
        container = names[0]
        running = {s.get("name"): (s.get("state") or {}).get("running") for s in status.get("containerStatuses") or []}
        state = running.get(container)
        h = Holder(
            namespace=str(meta["namespace"]), pod=str(meta["name"]), uid=str(meta["uid"]), container=container,
            alive=state is not None,
            report=report_path(state_dir, str(meta["namespace"]), str(meta["name"]), str(meta["uid"]), container),
            started=_started(state),
        )  # fmt: skip
        for i in ids.split(","):
            if i.strip().isdigit():
                held[(str(spec["nodeName"]), int(i))] = h
    out = []
    for n in nodes:
        name = str(n["metadata"]["name"])
        labels = n["metadata"].get("labels") or {}
        count = int(parse_quantity(str(((n.get("status") or {}).get("capacity") or {}).get(GPU, "0"))))
        model = str(labels.get("nvidia.com/gpu.product", ""))
        raw_memory = str(labels.get("nvidia.com/gpu.memory", "0"))
        memory = int(raw_memory) if raw_memory.isdigit() else 0
        out += [Device(name, i, model, memory, held.get((name, i))) for i in range(count)]
    return out


def _started(running: Mapping[str, Any] | None) -> float | None:
    """A running container state's `startedAt` (RFC 3339), as epoch seconds; None if absent or bad."""
    text = (running or {}).get("startedAt")
    if not isinstance(text, str):
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


def parse_report(data: bytes | None) -> dict[str, Any] | None:
    """A program's device report, or None when there is none or it is not one."""
    if not data:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("busy_seconds"), (int, float)):
        return None
    return doc


def busy_at(report: Mapping[str, Any] | None, now: float, alive: bool = True) -> float:
    """The holder's compute seconds up to `now`: what it reported, plus the compute phase it is
    in (only while its container runs)."""
    if report is None:
        return 0.0
    busy = float(report["busy_seconds"])
    since = report.get("busy_since")
    if alive and isinstance(since, (int, float)) and now > since:
        busy += now - float(since)
    return busy


def render(cluster: str, samples: Iterable[tuple[Device, float, int]]) -> str:
    """dcgm-exporter's text format: `# HELP`, `# TYPE ... gauge`, then one line per device."""
    rows = list(samples)
    lines: list[str] = []
    for series, help_text in SERIES:
        lines += [f"# HELP {series} {help_text}", f"# TYPE {series} gauge"]
        for d, activity, fb in rows:
            value: float | int = {
                GPU_UTIL: round(100 * activity), GR_ENGINE_ACTIVE: round(activity, 6),
                FB_USED: fb, FB_FREE: max(0, d.memory_mib - fb),
            }[series]  # fmt: skip
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in d.labels(cluster).items())
            lines.append(f"{series}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exporter:
    """One cluster's exporter: collects at most once per `collect_interval`, serves the last
    collection in between (what dcgm-exporter does with its `-c` collect interval)."""

    def __init__(self, cluster: str, config: DcgmConfig, read: Callable[[Path], bytes | None] | None = None) -> None:
        self.cluster = cluster
        self.config = config
        self.read = read or _read
        self.lock = threading.Lock()
        self.last: dict[tuple[str, str], tuple[float, float, float]] = {}  # holder -> (at, busy, activity)
        self.cached: tuple[float, bytes] | None = None

    def scrape(self, current: Callable[[], list[Device]], now: float) -> bytes:
        with self.lock:
            if self.cached is not None and 0 <= now - self.cached[0] < self.config.collect_interval:
                return self.cached[1]
            text = render(self.cluster, self.collect(current(), now)).encode()
            self.cached = (now, text)
            return text

    def collect(self, devs: list[Device], now: float) -> list[tuple[Device, float, int]]:
        """Each device with its activity since the previous collection and its memory used."""
        seen: dict[tuple[str, str], tuple[float, int]] = {}
        out = []
        for d in devs:
            h = d.holder
            if h is None:
                out.append((d, 0.0, 0))
                continue
            key = (h.uid, h.container)
            if key not in seen:
                report = parse_report(self.read(h.report))
                busy = busy_at(report, now, h.alive)
                # first sight: the window since the container started (it computed nothing before),
                # so a single look (`gpuorch explain` in exporter mode) reads its share so far, not 0
                first = (h.started, 0.0, 0.0) if h.alive and h.started is not None and h.started < now else (now, busy, 0.0)
                at, before, value = self.last.get(key, first)
                if now - at > 1e-3:
                    value = min(1.0, max(0.0, (busy - before) / (now - at)))
                    self.last[key] = (now, busy, value)
                else:
                    self.last.setdefault(key, (now, busy, value))
                fb = report.get("fb_used_mib") if report is not None else 0
                fb = int(fb) if isinstance(fb, (int, float)) and math.isfinite(fb) and fb > 0 else 0
                seen[key] = (value, min(fb, d.memory_mib) if d.memory_mib else fb)
            value, fb = seen[key]
            out.append((d, value, fb))
        for key in [k for k in self.last if k not in seen]:
            del self.last[key]
        return out


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
