"""The permission model (pure), the bundle on disk, signatures, receivers' checks, promotion paths."""

from __future__ import annotations

import json
import subprocess
import typing
from pathlib import Path

import pytest

from gpuorch.runtime.bus import redact_url
from gpuorch.runtime.natsembed import find_nats_server
from gpuorch.security import EVENT_PUBLISHERS, ROLES, durables, generate, permissions
from gpuorch.security.bundle import main as bundle_main
from gpuorch.security.bundle import new_seed, public_key_of
from gpuorch.security.identity import Unauthenticated, Verifier, cancel_refusal, sign_headers
from gpuorch.security.model import REJECTION_PUBLISHERS
from gpuorch.security.receive import trusted_snapshot
from gpuorch_fencer import core as fencer
from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, Event, Names, encode, type_tag
from gpuorch_proto import events as ev
from gpuorch_proto.inventory import QueueInfo, QueueRegistry

N = Names("gpuorch")
PK = "UPUBLICKEY"


def allowed(role: str) -> list[str]:
    return permissions(role, N, PK, clusters=["alpha"]).pub_allow  # type: ignore[arg-type]


def test_every_event_type_of_the_contract_has_exactly_one_publishing_service() -> None:
    tags = {type_tag(t) for t in typing.get_args(Event)} - {"submit", "cancel", "rejected"}
    missing = tags - set(EVENT_PUBLISHERS)
    assert not missing, f"{sorted(missing)}: a new event type needs its one publisher in gpuorch.security.model"
    for kind, owner in EVENT_PUBLISHERS.items():
        publishers = [r for r in ROLES if r != "admin" and N.evt_kind(kind) in allowed(r)]
        assert publishers == [owner], (kind, publishers)


def test_rejections_by_the_consuming_services_only_and_commands_by_clients_only() -> None:
    assert [r for r in ROLES if r != "admin" and N.evt_kind("rejected") in allowed(r)] == list(REJECTION_PUBLISHERS)
    assert [r for r in ROLES if r != "admin" and N.cmd_submit in allowed(r)] == ["client"]
    assert [r for r in ROLES if r != "admin" and N.cmd_cancel in allowed(r)] == ["router", "client"]  # pipelines' stages
    assert [r for r in ROLES if r != "admin" and N.inventory("alpha") in allowed(r)] == ["inventory"]
    assert not any(N.inventory_all in allowed(r) for r in ROLES if r != "admin")


def test_only_the_fencer_writes_fencing_state_and_only_dispatchers_leases() -> None:
    assert [r for r in ROLES if f"$KV.{N.kv_fence}.>" in allowed(r)] == ["fencer"]
    assert [r for r in ROLES if f"$KV.{N.kv_owners}.>" in allowed(r)] == ["dispatcher"]


def test_only_routers_write_the_admission_lease_and_only_its_one_key() -> None:
    on_bucket = {r: [x for x in allowed(r) if x.startswith(f"$KV.{N.kv_admission}.")] for r in ROLES if r != "admin"}
    assert {r: rules for r, rules in on_bucket.items() if rules} == {"router": [f"$KV.{N.kv_admission}.leader"]}
    assert f"$JS.API.DIRECT.GET.KV_{N.kv_admission}.>" in allowed("router"), "and reads it"
    for role in ("dispatcher", "fencer", "inventory"):  # every service waits for the bucket at start
        assert f"$JS.API.STREAM.INFO.KV_{N.kv_admission}" in allowed(role), role


@pytest.mark.parametrize("role", [r for r in ROLES if r != "admin"])
def test_no_identity_but_the_admin_may_change_the_topology(role: str) -> None:
    p = permissions(role, N, PK)  # type: ignore[arg-type]
    for rule in p.pub_allow:
        for forbidden in (".STREAM.CREATE", ".STREAM.UPDATE", ".STREAM.DELETE", ".STREAM.PURGE", ".MSG.DELETE", "$JS.API.>"):
            assert forbidden not in rule, (role, rule)
        assert rule != ">" and not rule.startswith(f"{N.prefix}.>"), (role, rule)
        # the name-less create names its consumer in the body: it could rewrite a durable
        assert rule not in (f"$JS.API.CONSUMER.CREATE.{N.stream_cmd}", f"$JS.API.CONSUMER.CREATE.{N.stream_evt}"), (role, rule)
    assert p.sub_allow == [f"_INBOX.{PK}.>"], "replies on its own inbox only"
    for d in durables(N):
        assert f"$JS.API.CONSUMER.DELETE.{d.stream}.{d.name}" in p.pub_deny or not any(
            r.startswith(f"$JS.API.CONSUMER.DELETE.{d.stream}.") for r in p.pub_allow
        )
        if d.owner != role:
            assert f"$JS.API.CONSUMER.MSG.NEXT.{d.stream}.{d.name}" not in p.pub_allow
            assert f"$JS.ACK.{d.stream}.{d.name}.>" not in p.pub_allow


def test_a_client_reads_no_command_stream_and_no_bucket() -> None:
    rules = allowed("client")
    assert not any(N.stream_cmd in r or "KV_" in r or r.startswith("$KV.") for r in rules), rules


def test_the_bundle_is_private_idempotent_and_rotates(tmp_path: Path) -> None:
    b = generate(tmp_path / "a", N, clients={"ci": ["team-a"]}, clusters=["alpha"])
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700
    for f in [b.config, *(b.creds(i) for i in b.identities)]:
        assert f.stat().st_mode & 0o777 == 0o600, f
    again = generate(tmp_path / "a", N, clients={"ci": ["team-a"]}, clusters=["alpha"])
    assert again.identities == b.identities, "an existing seed is kept"
    rotated = generate(tmp_path / "a", N, clients={"ci": ["team-a"]}, clusters=["alpha"], rotate=["router"])
    assert rotated.public_key("router") != b.public_key("router")
    assert rotated.public_key("fencer") == b.public_key("fencer")
    conf = b.config.read_text()
    for ident in b.identities:
        assert b.creds(ident).read_text().strip() not in conf, "no seed in the server config"


def test_the_production_config_passes_nats_server_t(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for f in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / f).write_text("")
    assert bundle_main(["--out", str(tmp_path / "prod"), "--registry", str(Path(__file__).parent.parent / "e2e" / "clusters.yaml"),
                        "--client", "ci=team-a,team-b", "--dispatcher-ids", "0,1"]) == 0  # fmt: skip
    listed = json.loads(capsys.readouterr().out)
    assert set(listed["identities"]) == {"admin", "router", "dispatcher", "fencer", "inventory", "ci"}
    out = subprocess.run([find_nats_server(), "-t", "-c", str(tmp_path / "prod" / "nats-server.conf")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr + out.stdout
    conf = json.loads((tmp_path / "prod" / "nats-server.conf").read_text())
    assert conf["listen"] == "0.0.0.0:4222" and "no_auth_user" not in conf
    users = conf["accounts"]["GPUORCH"]["users"]
    assert len(users) == 6 and all(u["nkey"].startswith("U") for u in users)
    inv = next(u for u in users if N.inventory("alpha") in u["permissions"]["publish"]["allow"])
    assert N.inventory("beta") in inv["permissions"]["publish"]["allow"]  # from the registry


def test_signed_commands_name_their_sender_and_nothing_else_passes() -> None:
    seed, other = new_seed(), new_seed()
    v = Verifier({"ci": {"role": "client", "public_key": public_key_of(seed), "owners": ["team-a"]},
                  "ops": {"role": "admin", "public_key": public_key_of(other), "owners": []}})  # fmt: skip
    h = sign_headers(seed, "gpuorch.cmd.submit", "k1", b"body")
    caller = v.caller("gpuorch.cmd.submit", "k1", h, b"body")
    assert caller.identity == "ci" and caller.may_submit_as("team-a") and not caller.may_submit_as("team-b")
    assert not caller.may_cancel("team-b", "w-1") and caller.may_cancel("team-a", "w-1")
    assert v.caller("gpuorch.cmd.cancel", "c", sign_headers(other, "gpuorch.cmd.cancel", "c", b"x"), b"x").may_cancel("anyone", "w-1")
    for subject, key, body, headers, why in [
        ("gpuorch.cmd.submit", "k1", b"other body", h, "does not match"),
        ("gpuorch.cmd.cancel", "k1", b"body", h, "does not match"),
        ("gpuorch.cmd.submit", "k2", b"body", h, "does not match"),
        ("gpuorch.cmd.submit", "k1", b"body", {}, "unsigned"),
        ("gpuorch.cmd.submit", None, b"body", h, "does not match"),  # the header taken off: not what was signed
        ("gpuorch.cmd.submit", "k1", b"body", sign_headers(new_seed(), "gpuorch.cmd.submit", "k1", b"body"), "unknown identity"),
        ("gpuorch.cmd.submit", "k1", b"body", {**h, "Gpuorch-Identity": public_key_of(other)}, "does not match"),
    ]:
        with pytest.raises(Unauthenticated, match=why):
            v.caller(subject, key, headers, body)
    # a submit whose key is in the body only (docs/contract.md): signed with an empty Nats-Msg-Id
    # line, the body (and so its key) under the signature; adding a header is not what was signed
    keyed = b'{"type": "submit", "idempotency_key": "k3"}'
    hb = sign_headers(seed, "gpuorch.cmd.submit", None, keyed)
    assert v.caller("gpuorch.cmd.submit", None, hb, keyed).identity == "ci"
    for key, body in [("k3", keyed), (None, keyed.replace(b"k3", b"k4"))]:
        with pytest.raises(Unauthenticated, match="does not match"):
            v.caller("gpuorch.cmd.submit", key, hb, body)


def _snap(cluster: str, **kw: object) -> ClusterSnapshot:
    return ClusterSnapshot(cluster=cluster, reachable=True, observed_at=1.0, published_at=1.0, **kw)  # type: ignore[arg-type]


def test_snapshots_are_trusted_only_for_registered_clusters_on_their_subject_with_our_registry_facts() -> None:
    reg = {"alpha": ClusterRegistryEntry(price_per_gpu_hour=3.0, artifact_stores=["prod"], datasets_cached=["mnist@v1"],
                                         queues=[QueueRegistry(name="research", owners=["team-a"])])}  # fmt: skip
    forged = _snap("alpha", queues=[QueueInfo(name="research", owners=["*"], pending_jobs=2), QueueInfo(name="vip", owners=["*"])],
                   registry=ClusterRegistryEntry(price_per_gpu_hour=0.0, artifact_stores=["prod", "secret"], datasets_cached=["mnist@v1", "coco@1"]))  # fmt: skip
    snap, why = trusted_snapshot(forged, N.inventory("alpha"), N, reg)
    assert why is None and snap is not None
    assert snap.registry.price_per_gpu_hour == 3.0 and snap.registry.artifact_stores == ["prod"]
    assert [(q.name, q.owners, q.pending_jobs) for q in snap.queues] == [("research", ["team-a"], 2)]
    assert snap.registry.datasets_cached == ["mnist@v1", "coco@1"]  # staged by gpuorch: observed
    assert trusted_snapshot(_snap("ghost"), N.inventory("ghost"), N, reg)[0] is None
    none, why = trusted_snapshot(_snap("alpha"), N.inventory("beta"), N, reg)
    assert none is None and why is not None and "snapshots go on" in why


def _promote(path: str, attempt: str = "w-1-a1", epoch: int = 1) -> ev.PromoteRequested:
    return ev.PromoteRequested(workload_id="w-1", at=1.0, attempt_id=attempt, epoch=epoch, cluster="alpha", output_path=path)


def test_promotion_only_from_the_fencers_own_records() -> None:
    good = fencer.AttemptFacts(created_epoch=1, succeeded=True)
    d = fencer.attempt_url("file:///stores/prod", "w-1", "w-1-a1")
    assert d == "file:///stores/prod/w-1/attempts/w-1-a1"
    assert fencer.promotion_problem(_promote(d), good, d) is None
    assert fencer.promotion_problem(_promote(d + "/"), good, d) is None
    for path in (d + "/../../../w-2/attempts/w-2-a1", "/etc", d + "/..", "file:///stores/prod/w-1/attempts/w-1-a2",
                 "s3://elsewhere/w-1/attempts/w-1-a1"):  # fmt: skip
        problem = fencer.promotion_problem(_promote(path), good, d)
        assert problem is not None and "is not the attempt's prefix" in problem, path
    assert "never created" in str(fencer.promotion_problem(_promote(d), fencer.AttemptFacts(None, True), d))
    assert "epoch 2" in str(fencer.promotion_problem(_promote(d), fencer.AttemptFacts(2, True), d))
    assert "not succeeded" in str(fencer.promotion_problem(_promote(d), fencer.AttemptFacts(1, False), d))
    assert "not in the registry" in str(fencer.promotion_problem(_promote(d), good, None))
    assert fencer.attempt_url("file:///stores/prod", "..", "w-1-a1") is None
    assert fencer.attempt_url("file:///stores/prod", "w-1", "../../etc") is None
    assert fencer.attempt_url("relative", "w-1", "w-1-a1") is None
    refused = fencer.on_promote_requested(None, _promote(d), 2.0, "file:///stores/prod/w-1/result/manifest.json", "unread")
    assert refused.promote is None and "no fence record" in refused.events[0].reason  # type: ignore[attr-defined]


def test_credentials_in_urls_are_never_shown() -> None:
    assert redact_url("nats://svc:s3cret@nats:4222,tls://a:b@other:4222") == "nats://***@nats:4222,tls://***@other:4222"
    assert redact_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


async def test_a_failed_connect_names_no_password() -> None:
    from gpuorch.runtime.bus import connect

    with pytest.raises((TimeoutError, ConnectionError)) as err:
        await connect("nats://svc:s3cret@127.0.0.1:1", "nobody", initial_timeout=1.0, connect_timeout=0.2)
    assert "s3cret" not in str(err.value) and "svc" not in str(err.value)


async def test_the_router_ignores_a_client_chosen_id_and_refuses_a_submit_without_a_key() -> None:
    from opentelemetry.context import Context

    from gpuorch.config import Settings
    from gpuorch.runtime.shell import Incoming, Reject
    from gpuorch_proto import workload_id_for
    from gpuorch_router.service import Router
    from tests.e2e.workloads import train

    router = Router(Settings())

    def incoming(e: ev.Submit, msg_id: str | None) -> Incoming:
        return Incoming(event=e, subject="gpuorch.cmd.submit", stream="GPUORCH_CMD", stream_seq=1, delivered=1,
                        headers={}, msg_id=msg_id, context=Context())  # fmt: skip

    wl = train("chosen", steps=1)
    with pytest.raises(Reject, match="idempotency key"):
        await router.on_command(incoming(ev.Submit(workload=wl), None))
    out = await router.on_command(incoming(ev.Submit(workload=wl, workload_id="victim-1"), "k-1"))
    assert {e.workload_id for e in out} == {workload_id_for("k-1", "chosen")}


def test_a_workload_may_not_set_what_gpuorch_or_the_gpu_runtime_owns() -> None:
    from gpuorch_proto import ContractError, workload_from_obj
    from tests.runtime.helpers import workload_obj

    for var in ("GPUORCH_OUTPUT_DIR", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "TRACEPARENT", "cuda_home"):
        doc = workload_obj()
        doc["spec"]["env"] = {var: "x", "MY_SETTING": "1"}
        with pytest.raises(ContractError) as err:
            workload_from_obj(doc)
        assert [e.path for e in err.value.errors] == [f"spec.env.{var}"], err.value.errors
    doc = workload_obj()
    doc["spec"]["env"] = {"MY_SETTING": "1"}
    workload_from_obj(doc)
    doc["spec"]["args"] = ["x"] * 2000
    with pytest.raises(ContractError, match="at most 1024"):
        workload_from_obj(doc)


def test_each_snapshot_owner_writes_only_its_own_snapshot_keys() -> None:
    for role in ROLES:
        if role == "admin":
            continue
        writes = [r for r in allowed(role) if r.startswith(f"$KV.{N.kv_snapshots}.")]
        assert writes == ([f"$KV.{N.kv_snapshots}.{role}.>"] if role in ("router", "dispatcher", "fencer") else []), role


def test_the_router_may_cancel_a_pipelines_stages_and_nothing_else() -> None:
    """docs/security.md: the role `router` cancels the stages of a pipeline it expanded
    (`<pipeline>--<stage>`, ids only its expansion makes), never any other workload; the workload
    is the one the signed body names, the refusal says why. Other roles as before."""
    router, client, admin = new_seed(), new_seed(), new_seed()
    v = Verifier({"router": {"role": "router", "public_key": public_key_of(router), "owners": []},
                  "ci": {"role": "client", "public_key": public_key_of(client), "owners": ["team-a"]},
                  "ops": {"role": "admin", "public_key": public_key_of(admin), "owners": []}})  # fmt: skip

    def refusal(seed: str, wid: str, owner: str = "team-a") -> str | None:
        body = encode(ev.Cancel(workload_id=wid, at=1.0))
        return cancel_refusal(v, "gpuorch.cmd.cancel", "c", sign_headers(seed, "gpuorch.cmd.cancel", "c", body), body, owner)

    assert refusal(router, "sweep-3f2a9c01d4--t0007") is None
    assert refusal(router, "etl-3f2a9c01d4--train-0123456789ab") is None
    for wid in ("train-3f2a9c01d4", "sweep-3f2a9c01d4"):  # a plain workload, a pipeline itself
        why = refusal(router, wid)
        assert why is not None and "'router' may not cancel workload" in why and "stages of a pipeline" in why, why
    assert refusal(client, "train-3f2a9c01d4") is None and refusal(client, "sweep-3f2a9c01d4--t0007") is None
    assert "may not cancel a workload of owner 'team-b'" in str(refusal(client, "sweep-3f2a9c01d4--t0007", "team-b"))
    assert refusal(admin, "train-3f2a9c01d4", "anyone") is None
