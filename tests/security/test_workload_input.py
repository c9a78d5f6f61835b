"""What a workload may ask for, against the running system (issue 11, item 6's rest).

One embedded system (real nats-server under the generated permissions, local clusters, the four
services) whose admission policy restricts a queue's tolerations and node selectors, and whose
registry maps a named credential to a Secret on `alpha`:

* a submit tolerating a taint its queue does not allow is refused with the path and the reason;
* a named credential reaches the pod process from a Secret created through the official client,
  as ``valueFrom.secretKeyRef``; afterwards no message of the event or command stream, and no
  service log, holds the value; a submit carrying the value itself is refused without it;
* a body over the submit limit is refused naming its size and the limit; one over the server's
  max_payload is refused by the client naming both.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import yaml
from kubernetes import client as k8s

from gpuorch.client import Client
from gpuorch.kube import make_clients
from gpuorch.runtime import bus
from gpuorch.security.bundle import MAX_PAYLOAD
from gpuorch.system import System
from gpuorch_proto import Workload, encode
from gpuorch_proto import events as ev
from gpuorch_proto.k8s import NAMESPACE
from gpuorch_proto.validate import MAX_SUBMIT_BYTES
from tests.e2e.workloads import train
from tests.support.system import result_object, running
from tests.support.wait import assert_eventually

E2E = Path(__file__).parent.parent / "e2e"
SECRET = "wandb-" + hashlib.sha256(b"gpuorch issue 11").hexdigest()[:32]  # the value; never on the bus

POLICY = {
    "queues": [
        {"name": "default"},
        {"name": "research", "allowed_taints": ["gpuorch.io/short-only"], "allowed_node_labels": ["topology.kubernetes.io/zone"]},
    ],
}


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    conf = tmp_path_factory.mktemp("conf")
    doc: dict[str, Any] = yaml.safe_load((E2E / "clusters.yaml").read_text())
    doc["admission_policy"] = "policy.yaml"
    alpha = next(c for c in doc["clusters"] if c["name"] == "alpha")["registry"]
    alpha["credentials"] = ["wandb"]
    alpha["credential_refs"] = {"wandb": {"secret": "wandb-key", "key": "token", "env": "WANDB_API_KEY"}}
    (conf / "clusters.yaml").write_text(yaml.safe_dump(doc))
    (conf / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    with running(tmp_path_factory.mktemp("input"), conf / "clusters.yaml", env_extra={"GPUORCH_LOST_AFTER": "2"}) as s:
        yield s


async def refusal(client: Client, key: str, timeout: float = 30) -> ev.Rejected:
    """The `rejected` record of the submit sent with idempotency key `key` (a failure at once
    when the router accepted it instead)."""

    async def found() -> ev.Rejected:
        events = [e for _, e in await client.events()]
        if accepted := [e for e in events if isinstance(e, ev.Submitted) and e.idempotency_key == key]:
            pytest.fail(f"the submit {key} was accepted, as workload {accepted[0].workload_id}")
        got = [e for e in events if isinstance(e, ev.Rejected) and e.idempotency_key == key]
        assert got, f"no rejection for {key} yet"
        return got[0]

    return await assert_eventually(found, timeout=timeout)


def unchecked(wl: Workload, **spec: Any) -> Workload:
    """`wl` with `spec` fields replaced, without the contract's validation (what a non-Python
    publisher could send: the router must check it, not the client)."""
    return msgspec.structs.replace(wl, spec=msgspec.structs.replace(wl.spec, **spec))


async def test_a_toleration_the_queue_does_not_allow_is_refused_with_path_and_reason(client: Client) -> None:
    tol = [{"key": "gpuorch.io/short-only", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    bad = train("tolerates", steps=1, policy_queue="research", requirements={"tolerations": tol})
    await client.submit(bad, idempotency_key="tolerates-1")
    r = await refusal(client, "tolerates-1")
    assert [(e.path, e.message) for e in r.errors] == [
        ("spec.requirements.tolerations[1]", 'queue research does not allow toleration for taint key "dedicated" (it allows: "gpuorch.io/short-only")'),
    ]
    assert r.workload_id.startswith("msg-")  # a record of the message: no workload was accepted
    # the same toleration in the default queue (every taint key allowed) is accepted and runs
    ok = await client.submit(train("tolerates-ok", steps=1, requirements={"tolerations": tol}), idempotency_key="tolerates-2")
    assert (await client.wait(ok, timeout=120)).status == "completed"


async def test_a_named_credential_reaches_the_pod_from_a_secret_and_never_the_bus(system: System, client: Client) -> None:
    alpha = make_clients(system.kubeconfig)["alpha"]
    alpha.core.create_namespaced_secret(NAMESPACE, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="wandb-key"), string_data={"token": SECRET}))
    script = (
        "import hashlib, os, pathlib; v = os.environ.get('WANDB_API_KEY', '');"
        "pathlib.Path(os.environ['GPUORCH_OUTPUT_DIR']).mkdir(parents=True, exist_ok=True);"
        "pathlib.Path(os.environ['GPUORCH_OUTPUT_DIR'], 'seen.sha256').write_text(hashlib.sha256(v.encode()).hexdigest())"
    )
    wl = train("credential", steps=1, command=[sys.executable, "-c", script], args=[], requirements={"credentials": ["wandb"]})
    wid = await client.submit(wl, idempotency_key="credential-1")
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    assert {a.cluster for a in view.attempts.values()} == {"alpha"}  # beta has no such credential
    seen = (await result_object(system, view.result_path, "seen.sha256")).decode()
    assert seen == hashlib.sha256(SECRET.encode()).hexdigest()  # the process had the value itself
    # (the Job is deleted once promoted; that it holds a secretKeyRef and no value is shown by
    # tests/dispatcher/test_core.py and tests/localkube/test_secrets.py)

    # a submit carrying the value: refused by the router, the refusal without the value
    leak = unchecked(train("leaks", steps=1), env={"WANDB_API_KEY": SECRET})
    await client.submit(leak, idempotency_key="leak-1")
    r = await refusal(client, "leak-1")
    assert [e.path for e in r.errors] == ["spec.env.WANDB_API_KEY"] and SECRET not in r.reason + repr(r.errors)

    # every message of the event stream, raw: the value is in none of them (bodies or headers)
    admin = await nats.connect(system.nats_url, **bus.auth_options(system.creds("admin")))
    try:
        js = admin.jetstream()
        names = system.settings.names
        scanned = 0
        for stream in (names.stream_evt,):
            info = await js.stream_info(stream)
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                scanned += 1
                assert SECRET.encode() not in (msg.data or b"") and SECRET not in repr(msg.headers), f"{stream} #{seq}"
        assert scanned > 20
        # the command stream has it only in the one message the leaking client sent itself
        info = await js.stream_info(names.stream_cmd)
        holding = [seq for seq in range(info.state.first_seq, info.state.last_seq + 1) if SECRET.encode() in ((await js.get_msg(names.stream_cmd, seq)).data or b"")]
        assert len(holding) == 1
    finally:
        await admin.close()
    for log in system.logs.glob("*.log"):  # nor any service's log
        assert SECRET not in log.read_text(errors="replace"), log.name


async def test_an_oversized_body_is_refused_naming_its_size_and_the_limit(client: Client) -> None:
    assert client.nc.max_payload == MAX_PAYLOAD  # the server's, from its INFO: 1 MiB
    big = unchecked(train("big", steps=1), env={f"PAD_{i}": "x" * 7000 for i in range(80)})  # about 560 KB
    size = len(encode(ev.Submit(workload=big, idempotency_key="big-1", at=time.time())))
    assert MAX_SUBMIT_BYTES < size < MAX_PAYLOAD
    await client.submit(big, idempotency_key="big-1")
    r = await refusal(client, "big-1")
    assert r.reason.startswith("submit refused: the submit body is ") and f"at most {MAX_SUBMIT_BYTES:,} bytes" in r.reason
    assert [e.path for e in r.errors] == ["$"]
    huge = unchecked(train("huge", steps=1), env={f"PAD_{i}": "x" * 7000 for i in range(200)})  # about 1.4 MB
    with pytest.raises(ValueError, match=rf"bytes: the server's max_payload is {MAX_PAYLOAD:,} bytes"):
        await client.submit(huge, idempotency_key="huge-1")
