"""The services run against a nats-server started with the production config the command
generates (`python -m gpuorch.security`): the embedded system, the tests and production share
one permission model."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuorch.client import Client
from gpuorch.runtime.natsembed import find_nats_server
from gpuorch.system import System
from tests.e2e.workloads import train

pytestmark = pytest.mark.e2e
CLUSTERS = Path(__file__).parent.parent / "e2e" / "clusters.yaml"


async def test_the_services_run_against_the_generated_production_config(tmp_path: Path) -> None:
    auth = tmp_path / "auth"
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gpuorch.security", "--out", str(auth), "--registry", str(CLUSTERS),
         "--client", "client=*", "--client", "ci=tests", "--listen", "0.0.0.0:4222", "--store-dir", str(tmp_path / "js")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["config"] == str(auth / "nats-server.conf")
    checked = await asyncio.to_thread(subprocess.run, [find_nats_server(), "-t", "-c", str(auth / "nats-server.conf")], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    system = System(state_dir=tmp_path, clusters_file=CLUSTERS, generated_auth=False)  # the command's config as it is
    await asyncio.to_thread(system.start)
    try:
        assert system.auth_dir.joinpath("nats-server.conf").read_text() == (auth / "nats-server.conf").read_text()
        async with Client(system.nats_url, system.settings.names, creds=system.creds("ci")) as ci:
            wid = await ci.submit(train("production", steps=2))
            assert (await ci.wait(wid, timeout=120)).status == "completed"
    finally:
        await asyncio.to_thread(system.stop)
