"""Capacity and queue length over time per cluster, for the web view (pure: no I/O, no clock).

The web view reads every cluster's latest capacity snapshot every few seconds; `History` keeps a
bounded ring of samples of them per cluster (`KEEP`: at one snapshot every 2 s, the last hour),
one per snapshot published (a snapshot read twice is one sample). The ring starts when the web
view starts: the inventory stream keeps only each cluster's latest snapshot.

`chart` turns samples into what an inline SVG line chart needs (points in pixels, the scale and
the span): the page draws it with no script and nothing fetched from elsewhere.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpuorch_proto.inventory import ClusterSnapshot

KEEP = 1800
PALETTE = ("#1e88e5", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41", "#546e7a")


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # when the snapshot was published
    reachable: bool
    gpus: int  # allocatable
    gpus_free: int
    running_gpus: int
    pending_gpus: int
    queues: tuple[tuple[str, int], ...]  # (queue, pending jobs)

    @property
    def pending_jobs(self) -> int:
        return sum(n for _, n in self.queues)


def sample_of(sn: ClusterSnapshot) -> Sample:
    return Sample(
        at=sn.published_at, reachable=sn.reachable, gpus=sum(n.gpus_allocatable for n in sn.nodes),
        gpus_free=sum(n.gpus_free for n in sn.nodes), running_gpus=sn.running_gpus, pending_gpus=sn.pending_gpus,
        queues=tuple((q.name, q.pending_jobs) for q in sn.queues),
    )  # fmt: skip


@dataclass
class History:
    """The last `keep` samples of each cluster, oldest first."""

    keep: int = KEEP
    samples: dict[str, deque[Sample]] = field(default_factory=dict)

    def record(self, sn: ClusterSnapshot) -> bool:
        """Keep a sample of `sn` unless it is not newer than the cluster's last (read again)."""
        ring = self.samples.get(sn.cluster)
        if ring is None:
            ring = self.samples[sn.cluster] = deque(maxlen=self.keep)
        if ring and sn.published_at <= ring[-1].at:
            return False
        ring.append(sample_of(sn))
        return True

    def of(self, cluster: str) -> list[Sample]:
        return list(self.samples.get(cluster, ()))


@dataclass(frozen=True)
class Line:
    name: str
    colour: str
    points: str  # SVG polyline points, in pixels
    last: float  # the latest value


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    top: float  # the value at the top edge
    span: float  # seconds from the first sample to the last
    lines: list[Line]
    samples: int

    @property
    def ticks(self) -> list[tuple[float, float]]:
        """(value, y in pixels) for the labels of the vertical axis: 0, half, top."""
        return [(v, self.height - self.height * v / self.top) for v in (0.0, self.top / 2, self.top)]


def _top(peak: float) -> float:
    """A round value at or above `peak` for the top of the chart (1, 2, 5 x 10^k)."""
    if peak <= 1:
        return 1.0
    step = 1.0
    while True:
        for m in (1, 2, 5):
            if m * step >= peak:
                return m * step
        step *= 10


def chart(samples: Sequence[Sample], series: Iterable[tuple[str, Callable[[Sample], float]]], *, width: int = 640,
          height: int = 150) -> Chart:  # fmt: skip
    """Lines of `series` (name, value of a sample) over `samples`, time along x (the first sample
    at the left edge, the last at the right), values from 0 at the bottom to a round `top`."""
    named = list(series)
    values = [[float(f(s)) for s in samples] for _, f in named]
    top = _top(max((v for vs in values for v in vs), default=0.0))
    t0 = samples[0].at if samples else 0.0
    span = (samples[-1].at - t0) if samples else 0.0
    lines = []
    for i, ((name, _), vs) in enumerate(zip(named, values, strict=True)):
        pts = []
        for s, v in zip(samples, vs, strict=True):
            x = width * (s.at - t0) / span if span > 0 else float(width)
            pts.append(f"{x:.1f},{height - height * v / top:.1f}")
        lines.append(Line(name, PALETTE[i % len(PALETTE)], " ".join(pts), vs[-1] if vs else 0.0))
    return Chart(width, height, top, span, lines, len(samples))


def capacity_chart(samples: Sequence[Sample], **size: int) -> Chart:
    """GPUs allocatable, free, running and pending over time."""
    return chart(samples, [("GPUs", lambda s: s.gpus), ("free", lambda s: s.gpus_free),
                           ("running", lambda s: s.running_gpus), ("pending", lambda s: s.pending_gpus)], **size)  # fmt: skip


def queue_chart(samples: Sequence[Sample], **size: int) -> Chart:
    """Pending jobs over time, one line per queue the cluster has had (0 while it had not)."""
    names: list[str] = []
    for s in samples:
        for q, _ in s.queues:
            if q not in names:
                names.append(q)
    return chart(samples, [(q, lambda s, q=q: dict(s.queues).get(q, 0)) for q in names], **size)  # type: ignore[misc]
