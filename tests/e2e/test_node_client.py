"""A non-Python client that follows only docs/contract.md: examples/node-client (Node, nats.js)
submits a workload, follows it, cancels it once it runs, and sees it end `cancelled`; and submits
with the idempotency key in each form the contract documents."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import events as ev
from gpuorch_proto import workload_id_for
from tests.e2e.workloads import train
from tests.support.node import node_client_dir
from tests.support.wait import assert_eventually

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


def run_node(system: System, doc: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`node client.mjs <doc> <args>` as the embedded system's client identity: its exit and the
    JSON lines it printed."""
    s = system.settings
    env = {**os.environ, "NATS_URL": s.nats_url, "GPUORCH_PREFIX": system.prefix, "TIMEOUT_S": "60"}
    if creds := getattr(s, "nats_creds", None):
        env["GPUORCH_NATS_CREDS"] = str(creds)
    p = subprocess.run(["node", "client.mjs", str(doc), *args], cwd=node_client_dir(), env=env,
                       capture_output=True, text=True, timeout=90)  # fmt: skip
    return p, [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]


@pytest.mark.parametrize("key_in", ["header", "body", "both"])
async def test_node_client_submits_with_every_documented_key_form_and_a_resend_is_the_same_workload(
    system: System, tmp_path: Path, key_in: str
) -> None:
    """docs/contract.md: the idempotency key is the `Nats-Msg-Id` header, `idempotency_key` in the
    body, or both (the same); every form, signed as docs/security.md says, names the workload the
    docs' rule derives, and the same submit sent again names it again: never a second workload."""
    doc = tmp_path / "workload.json"
    doc.write_text(json.dumps(msgspec.to_builtins(train(name=f"key-{key_in}", steps=400))))
    p, lines = run_node(system, doc, "--key", key_in, "--cancel-after", "submitted", "--resend")
    assert p.returncode == 0, f"node client exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    published = lines[0]
    key, wid = published["idempotency_key"], published["workload_id"]
    assert wid == workload_id_for(key, f"key-{key_in}")
    [again] = [ln for ln in lines if "republished" in ln]
    # with the header JetStream drops the copy; with the body's key only the router is the one to
    # recognise it, so the copy is stored, and handled
    assert again["duplicate"] is (key_in != "body"), again
    admin = system.settings_as("admin")
    async with Client(admin.nats_url, admin.names, creds=admin.nats_creds) as c:
        if not again["duplicate"]:

            async def handled() -> bool:
                info = await c.js.consumer_info(admin.names.stream_cmd, admin.names.durable("router", "submit"))
                assert info.ack_floor.stream_seq >= again["seq"], info.ack_floor
                return True

            await assert_eventually(handled, timeout=30)
        events = [e for _, e in await c.events(wid)]
        refused = [e for _, e in await c.events(again["record"])]
    submitted = [e for e in events if isinstance(e, ev.Submitted)]
    assert len(submitted) == 1 and submitted[0].idempotency_key == key, submitted
    assert refused == [], refused  # the copy is not refused either: it is the same workload
    assert lines[-1]["result"] == "cancelled"


def test_node_client_with_two_different_keys_gets_a_rejection_naming_both(system: System, tmp_path: Path) -> None:
    """A `Nats-Msg-Id` and a body `idempotency_key` that differ: which workload is meant? Refused,
    saying so, and neither key's workload is created."""
    doc = tmp_path / "workload.json"
    doc.write_text(json.dumps(msgspec.to_builtins(train(name="key-conflict", steps=400))))
    p, lines = run_node(system, doc, "--key", "conflict")
    assert p.returncode == 0, f"node client exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    key = lines[0]["idempotency_key"]
    [record] = [ln for ln in lines if ln.get("type") == "rejected"]
    assert record["schema_ok"], record
    assert "Nats-Msg-Id" in record["reason"] and "idempotency_key" in record["reason"], record
    assert key in record["reason"] and f"{key}-other" in record["reason"], record
    assert [e["path"] for e in record["errors"]] == ["idempotency_key"], record
    assert lines[-1]["result"] == "rejected"
    assert "submitted" not in [ln.get("type") for ln in lines]
