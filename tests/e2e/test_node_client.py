"""A non-Python client that follows only docs/contract.md: examples/node-client (Node, nats.js)
submits a workload, follows it, cancels it once it runs, and sees it end `cancelled`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import msgspec
import pytest

from gpuorch.system import System
from gpuorch_proto import workload_id_for
from tests.e2e.workloads import train
from tests.support.node import node_client_dir

pytestmark = pytest.mark.e2e


def test_node_client_submits_follows_and_cancels(system: System, tmp_path: Path) -> None:
    cwd = node_client_dir()
    doc = tmp_path / "workload.json"
    doc.write_text(json.dumps(msgspec.to_builtins(train(name="node-example", steps=400))))
    s = system.settings
    env = {**os.environ, "NATS_URL": s.nats_url, "GPUORCH_PREFIX": system.prefix, "TIMEOUT_S": "60"}
    creds = getattr(s, "nats_creds", None)
    if creds:
        env["GPUORCH_NATS_CREDS"] = str(creds)
    p = subprocess.run(["node", "client.mjs", str(doc), "--cancel-after", "running"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=90)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert p.returncode == 0, f"node client exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    published = lines[0]
    # the id it derived from the docs' rule is the one the router gave the workload
    assert published["workload_id"] == workload_id_for(published["idempotency_key"], "node-example")
    assert published["workload_id"].startswith("node-example-")
    events = [ln for ln in lines if "type" in ln]
    types = [e["type"] for e in events]
    for t in ("submitted", "routed", "attempt-created", "running", "cancel-requested", "cancel-confirmed", "cancelled"):
        assert t in types, (t, types)
    assert types.index("running") < types.index("cancel-requested") < types.index("cancelled")
    assert all(e["schema_ok"] for e in events), [e for e in events if not e["schema_ok"]]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)  # stream order
    assert lines[-1]["result"] == "cancelled"
