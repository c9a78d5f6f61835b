from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuorch_localkube import LocalClusters

from .helpers import Harness, pid_alive


@pytest.fixture
def lk(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Start clusters in-process on port 0 with a tmp state dir; stop them and check no process is left."""
    started: list[LocalClusters] = []

    def start(clusters: list[dict[str, Any]] | dict[str, Any], time_scale: float = 100, **top: Any) -> Harness:
        cfg = {"time_scale": time_scale, "clusters": clusters if isinstance(clusters, list) else [clusters], **top}
        n = len(started)
        lcs = LocalClusters(cfg, tmp_path / f"state{n}")
        lcs.start()
        started.append(lcs)
        return Harness(lcs, lcs.write_kubeconfig(tmp_path / f"kubeconfig{n}"))

    yield start
    for lcs in started:
        pids = [pid for c in lcs for pid in c.pids()]
        lcs.stop(grace=1.0)
        left = [pid for pid in pids if pid_alive(pid)]
        assert not left, f"processes left behind after stop(): {left}"
