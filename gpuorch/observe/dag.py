"""A pipeline's stages laid out as a graph for the web view to draw as SVG (pure: no I/O).

Stages go in columns by depth (the longest chain of dependencies before them, so every edge
points right); a column taller than `per_column` stages (a sweep's trials) wraps into several.
Each node carries its workload's status and the colour of that status (`colour`), each edge a
cubic curve from the right side of a stage to the left side of the one that depends on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuorch_proto.events import PipelineChild

NODE_W, NODE_H = 170.0, 40.0
GAP_X, GAP_Y = 60.0, 12.0
MARGIN = 10.0
PER_COLUMN = 25

# the stage's state as the list colours it: done, running, failed, waiting
COLOURS = {
    "completed": "#a5d6a7", "failed": "#ef9a9a", "rejected": "#ef9a9a", "cancelled": "#bcaaa4",
    "running": "#90caf9", "admitted": "#90caf9", "promoting": "#80cbc4", "dispatched": "#bbdefb",
    "routed": "#e3f2fd", "lost": "#ffcc80", "retrying": "#ffcc80", "held": "#fff59d", "blocked": "#cfd8dc",
    "waiting": "#eceff1", "released": "#e3f2fd", "ready": "#e3f2fd", "submitted": "#f5f5f5",
}  # fmt: skip
UNKNOWN = "#f5f5f5"  # announced by the pipeline, no event of its own yet


def colour(status: str) -> str:
    return COLOURS.get(status, UNKNOWN)


@dataclass(frozen=True)
class Node:
    stage: str
    workload_id: str
    status: str
    depth: int
    x: float
    y: float
    depends_on: tuple[str, ...]

    @property
    def colour(self) -> str:
        return colour(self.status)


@dataclass(frozen=True)
class Edge:
    src: str  # stage names
    dst: str
    path: str  # SVG path data


@dataclass(frozen=True)
class Layout:
    nodes: list[Node]
    edges: list[Edge]
    width: float
    height: float
    depth: int  # columns of stages (before wrapping)


def depths(children: Sequence[PipelineChild]) -> dict[str, int]:
    """Each stage's depth: 0 without dependencies, else one more than its deepest dependency.
    A dependency that names no stage is left out; stages on a cycle (never in a validated
    pipeline) go one column past the rest, so the layout still ends."""
    names = {c.stage for c in children}
    deps = {c.stage: [d for d in c.depends_on if d in names and d != c.stage] for c in children}
    depth: dict[str, int] = {}
    left = dict(deps)
    while left:
        ready = [s for s, ds in left.items() if all(d in depth for d in ds)]
        if not ready:  # a cycle
            after = max(depth.values(), default=-1) + 1
            for s in left:
                depth[s] = after
            break
        for s in ready:
            depth[s] = max((depth[d] + 1 for d in left[s]), default=0)
            del left[s]
    return depth


def layout(children: Sequence[PipelineChild], status: Mapping[str, str], *, per_column: int = PER_COLUMN) -> Layout:
    """The graph of `children` (in declared order within a column), each stage with the status of
    its workload (`status` by workload id; a stage without one shows as "pending")."""
    d = depths(children)
    columns: dict[int, list[PipelineChild]] = {}
    for c in children:
        columns.setdefault(d[c.stage], []).append(c)
    placed: dict[str, Node] = {}
    nodes: list[Node] = []
    x = MARGIN
    height = 0.0
    for depth in sorted(columns):
        stages = columns[depth]
        wraps = max(1, math.ceil(len(stages) / per_column))
        for i, c in enumerate(stages):
            col, row = divmod(i, per_column)
            n = Node(c.stage, c.workload_id, status.get(c.workload_id, "pending"), depth,
                     x + col * (NODE_W + GAP_Y), MARGIN + row * (NODE_H + GAP_Y), tuple(c.depends_on))  # fmt: skip
            placed[c.stage] = n
            nodes.append(n)
            height = max(height, n.y + NODE_H + MARGIN)
        x += wraps * (NODE_W + GAP_Y) - GAP_Y + GAP_X
    edges = []
    for n in nodes:
        for dep in n.depends_on:
            src = placed.get(dep)
            if src is None or dep == n.stage:
                continue
            x1, y1 = src.x + NODE_W, src.y + NODE_H / 2
            x2, y2 = n.x, n.y + NODE_H / 2
            bend = max((x2 - x1) / 2, 20.0)
            edges.append(Edge(dep, n.stage, f"M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"))
    width = max(x - GAP_X + MARGIN, 2 * MARGIN)
    return Layout(nodes, edges, width, max(height, 2 * MARGIN), len(columns))
