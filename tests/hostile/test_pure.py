"""Hostile input, pure parts (issue 9, defects 6 and 7): codec, projection, fencer, reasons.

No input may reach another workload's state: a rejection is bound to the message that caused it.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from gpuorch.projection import Projection
from gpuorch_fencer import core as fencer
from gpuorch_proto import ContractError, RoutingDecision, decode_event, encode
from gpuorch_proto import events as ev
from gpuorch_proto.codec import is_msgpack
from gpuorch_proto.events import message_ref
from gpuorch_router.policy import route
from tests.support.builders import NOW, make_snapshot, make_workload, snapshots

WID = "train-a-0123456789"


def _running(p: Projection, wid: str = WID) -> None:
    wl = make_workload()
    decision = RoutingDecision(workload_id=wid, decided_at=1.0, outcome="routed", cluster="alpha", summary="alpha")
    base = {"workload_id": wid, "at": 2.0}
    att = {"attempt_id": f"{wid}-a1", "epoch": 1, "cluster": "alpha", **base}
    for seq, e in enumerate(
        [
            ev.Submitted(event_id=f"{wid}.submitted", workload=wl, **base),
            ev.Routed(event_id=f"{wid}.routed.1", decision=decision, **base),
            ev.AttemptCreated(attempt_number=1, job_name="j", output_path="o", checkpoint_path="c", **att),
            ev.Running(**att),
        ],
        start=p.last_seq + 1,
    ):
        p.apply(e, seq)


# -- defect 6: a bad message naming a running workload ------------------------------------------


@pytest.mark.parametrize(
    "source",
    ["t.cmd.submit", "t.cmd.cancel", "t.evt.train-a-0123456789.running", None],
    ids=["old-shell-rejection-of-a-submit", "refused-cancel", "dead-letter", "no-source"],
)
def test_a_rejection_naming_a_running_workload_leaves_it_running(source: str | None) -> None:
    """What the shell used to publish for an invalid submit whose body named a running workload:
    a `rejected` on that workload's subject. Folded, it must change nothing of the workload."""
    p = Projection()
    _running(p)
    forged = ev.Rejected(
        event_id=f"{WID}.rejected.T_CMD.7", workload_id=WID, at=3.0, reason="invalid message",
        errors=[ev.FieldError(path="spec.image", message="not pinned")], source_subject=source, source_sequence=7,
    )  # fmt: skip
    view = p.apply(forged, p.last_seq + 1)
    assert view is not None
    assert not view.terminal and view.status == "running", view.status
    assert "rejected" not in view.times and view.reason != "invalid message"
    # and so the fencer's orphan rule keeps the running attempt's Job
    a = view.attempts[f"{WID}-a1"]
    why = fencer.orphan_reason(
        None, a.attempt_id, a.epoch, known_attempt=True, known_workload=True, age=60.0, workload_status=view.status
    )
    assert why is None


def test_the_routers_verdict_on_its_own_submit_is_terminal() -> None:
    p = Projection()
    wl = make_workload()
    decision = RoutingDecision(workload_id=WID, decided_at=1.0, outcome="rejected", summary="no cluster")
    p.apply(ev.Submitted(event_id=f"{WID}.submitted", workload_id=WID, at=1.0, workload=wl), 1)
    view = p.apply(
        ev.Rejected(event_id=f"{WID}.rejected.route1", workload_id=WID, at=1.0, reason="never", decision=decision), 2
    )
    assert view is not None and view.status == "rejected" and view.terminal and view.decision == decision


def test_a_message_record_is_rejected_and_a_later_submit_under_that_id_starts_fresh() -> None:
    p = Projection()
    ref = message_ref("GPUORCH_CMD", 9)
    assert ref == "msg-gpuorch-cmd-9"
    rec = p.apply(ev.Rejected(event_id=f"{ref}.rejected", workload_id=ref, at=1.0, reason="invalid message"), 1)
    assert rec is not None and rec.status == "rejected"
    # a refused cancel for an id whose submit comes later must not doom that workload
    p.apply(ev.Rejected(event_id=f"{WID}.rejected.cancel", workload_id=WID, at=1.0, reason="cancel: unknown"), 2)
    assert p.workloads[WID].status == "rejected"
    p.apply(ev.Submitted(event_id=f"{WID}.submitted", workload_id=WID, at=2.0, workload=make_workload()), 3)
    assert p.workloads[WID].status == "submitted" and not p.workloads[WID].terminal


# -- defect 7: the envelope is checked, JSON is JSON --------------------------------------------


@pytest.mark.parametrize("version", [0, -1, 2, 99])
def test_a_schema_version_this_build_does_not_read_is_refused(version: int) -> None:
    body = {"type": "cancel", "schema_version": version, "workload_id": WID}
    for data in (json.dumps(body).encode(), msgspec.msgpack.encode(body)):
        with pytest.raises(ContractError) as err:
            decode_event(data)
        assert [(e.path, e.message) for e in err.value.errors] == [
            ("schema_version", f"schema_version {version} not supported; this build reads 1")
        ]


def test_a_future_version_is_refused_for_its_version_not_its_shape() -> None:
    with pytest.raises(ContractError) as err:
        decode_event(json.dumps({"type": "submit", "schema_version": 2, "workload": {"v2": True}}).encode())
    assert [e.path for e in err.value.errors] == ["schema_version"]


@pytest.mark.parametrize(
    ("data", "what"),
    [(b"[1, 2]", "an array"), (b"[]", "an array"), (b' ["submit"]', "an array"), (b'"submit"', "a string"),
     (b"42", "a number"), (b"null", "null")],
)  # fmt: skip
def test_json_that_is_not_an_object_is_decoded_as_json_and_refused(data: bytes, what: str) -> None:
    assert not is_msgpack(data)
    with pytest.raises(ContractError) as err:
        decode_event(data)
    [e] = err.value.errors
    assert e.path == "$" and e.message.startswith("expected an object") and e.message.endswith(f"got {what}"), e


def test_msgpack_without_a_content_type_still_decodes() -> None:
    cancel = ev.Cancel(workload_id=WID, at=1.0)
    assert decode_event(encode(cancel, "msgpack")) == cancel
    assert decode_event(encode(cancel, "msgpack"), content_type="application/msgpack") == cancel


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"type": "cancel", "workload_id": "Not.A.Token"}, "workload_id"),
        ({"type": "submit", "workload_id": "has spaces", "workload": {}}, "workload_id"),
        ({"type": "submit", "workload_id": "msg-gpuorch-cmd-3"}, "workload_id"),
    ],
)
def test_command_ids_must_be_able_to_name_a_workload(body: dict, path: str) -> None:
    if body["type"] == "submit":
        body["workload"] = msgspec.to_builtins(make_workload())
    with pytest.raises(ContractError) as err:
        decode_event(json.dumps(body).encode())
    assert [e.path for e in err.value.errors] == [path]


def test_the_message_record_prefix_is_reserved_for_workload_names() -> None:
    body = {"type": "submit", "workload": msgspec.to_builtins(make_workload())}
    body["workload"]["metadata"]["name"] = "msg-gpuorch-cmd"
    with pytest.raises(ContractError) as err:
        decode_event(json.dumps(body).encode())
    assert [e.path for e in err.value.errors] == ["metadata.name"]


# -- defect 7: "unreachable: unreachable:" ---------------------------------------------------------


@pytest.mark.parametrize("error", ["unreachable: ConnectTimeoutError: timed out", "dial tcp: i/o timeout", None])
def test_an_unreachable_cluster_is_called_unreachable_once(error: str | None) -> None:
    world = snapshots(make_snapshot("primary", reachable=False, error=error, observed_at=NOW - 900))
    decision = route(make_workload(), "w", world, NOW)
    [check] = [c for v in decision.verdicts for c in v.checks if c.code == "CLUSTER_UNREACHABLE"]
    assert check.message.startswith("unreachable") and check.message.count("unreachable") == 1, check.message
    assert (error or "").split("unreachable: ")[-1] in check.message
