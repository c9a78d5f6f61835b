"""Every contract type survives JSON and msgpack; old readers skip fields they do not know."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuorch_proto as proto
from gpuorch_proto import (
    EVENT_TYPES,
    ClusterSnapshot,
    ContractError,
    Event,
    FenceRecord,
    InstanceLease,
    OwnerRecord,
    RoutingDecision,
    Workload,
    decode_event,
    decode_fence,
    decode_instance_lease,
    decode_owner,
    decode_snapshot,
    encode,
    type_tag,
)
from gpuorch_proto.events import Submit, Submitted
from tests.proto.strategies import extra_field_values, for_type

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JSON_EVENT = msgspec.json.Decoder(Event)
MSGPACK_EVENT = msgspec.msgpack.Decoder(Event)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: type_tag(c))
def test_every_event_type_round_trips_through_the_union(cls: type[proto.Base]) -> None:
    @FAST
    @given(for_type(cls))
    def check(evt: proto.Base) -> None:
        for data, decoder in ((encode(evt, "json"), JSON_EVENT), (encode(evt, "msgpack"), MSGPACK_EVENT)):
            back = decoder.decode(data)
            assert type(back) is cls
            assert back == evt

    check()


OTHERS: list[tuple[type[msgspec.Struct], Any]] = [
    (ClusterSnapshot, decode_snapshot),
    (FenceRecord, decode_fence),
    (OwnerRecord, decode_owner),
    (InstanceLease, decode_instance_lease),
    (RoutingDecision, msgspec.json.Decoder(RoutingDecision).decode),
    (Workload, msgspec.json.Decoder(Workload).decode),
    (proto.ClusterRegistryEntry, msgspec.json.Decoder(proto.ClusterRegistryEntry).decode),
]


@pytest.mark.parametrize(("cls", "json_decode"), OTHERS, ids=lambda v: getattr(v, "__name__", ""))
def test_records_round_trip_through_json_and_msgpack(cls: type[msgspec.Struct], json_decode: Any) -> None:
    mp = msgspec.msgpack.Decoder(cls)

    @FAST
    @given(for_type(cls))
    def check(obj: msgspec.Struct) -> None:
        assert json_decode(encode(obj, "json")) == obj
        assert mp.decode(encode(obj, "msgpack")) == obj

    check()


def test_the_union_covers_every_event_type_once() -> None:
    tags = [type_tag(c) for c in EVENT_TYPES]
    assert len(tags) == len(set(tags)), "a tag is used twice"
    assert {"submit", "cancel", "rejected", "submitted", "routed", "promoted", "completed"} <= set(tags)


# -- schema evolution: old readers skip new fields ----------------------------------------------------


class SubmittedV2(Submitted, frozen=True, kw_only=True, tag="submitted"):
    """What a v2 writer might send: the v1 event plus new, defaulted fields."""

    priority_class: str = "batch"
    lineage: list[str] = []


def test_a_v1_reader_decodes_a_v2_event_and_skips_the_new_fields(valid_workload: Workload) -> None:
    v2 = SubmittedV2(
        event_id="w-1.submitted",
        workload_id="w-1",
        at=5.0,
        workload=valid_workload,
        priority_class="interactive",
        lineage=["w-0"],
    )
    for fmt in ("json", "msgpack"):
        data = encode(v2, fmt)  # type: ignore[arg-type]
        assert b"priority_class" in data
        old = decode_event(data)
        assert type(old) is Submitted
        assert old == Submitted(event_id="w-1.submitted", workload_id="w-1", at=5.0, workload=valid_workload)


def test_unknown_fields_are_skipped_at_every_level_between_services(valid_workload: Workload) -> None:
    """Lenient for peers: a newer version's fields, at any depth of an event, are skipped; a
    submit's envelope too. The workload document of a submit is what a person wrote: strict."""
    sub = msgspec.to_builtins(Submit(workload=valid_workload, idempotency_key="k"))
    sub["trace_hint"] = {"a": 1}
    evt = msgspec.to_builtins(Submitted(event_id="w-1.submitted", workload_id="w-1", at=5.0, workload=valid_workload))
    for doc in (sub, evt):
        doc["workload"]["status"] = "from the future"
        doc["workload"]["spec"]["resources"]["interconnect"] = "nvlink"
        doc["workload"]["metadata"]["annotations"] = {"x": "y"}
    for data in (msgspec.json.encode(evt), msgspec.msgpack.encode(evt)):
        assert decode_event(data) == Submitted(event_id="w-1.submitted", workload_id="w-1", at=5.0, workload=valid_workload)
    for data in (msgspec.json.encode(sub), msgspec.msgpack.encode(sub)):
        with pytest.raises(ContractError) as err:
            decode_event(data)
        paths = {e.path for e in err.value.errors}
        assert paths == {"status", "spec.resources.interconnect", "metadata.annotations"}, err.value.errors
    del sub["workload"]["status"], sub["workload"]["spec"]["resources"]["interconnect"], sub["workload"]["metadata"]["annotations"]
    assert decode_event(msgspec.json.encode(sub)) == Submit(workload=valid_workload, idempotency_key="k")


def test_a_typo_in_a_submitted_document_is_an_error_with_a_suggestion(valid_workload: Workload) -> None:
    doc = msgspec.to_builtins(Submit(workload=valid_workload, idempotency_key="k"))
    doc["workload"]["spec"]["resouces"] = doc["workload"]["spec"].pop("resources")
    with pytest.raises(ContractError) as err:
        decode_event(msgspec.json.encode(doc))
    assert [(e.path, e.message) for e in err.value.errors] == [("spec.resouces", "unknown field; did you mean spec.resources?")]


@pytest.mark.parametrize(
    "cls", [c for c in EVENT_TYPES if c is not Submit and c is not Submitted], ids=type_tag
)
def test_new_top_level_fields_never_break_old_readers(cls: type[proto.Base]) -> None:
    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(for_type(cls), st.from_regex(r"\Ax_[a-z]{1,8}\Z"), extra_field_values())
    def check(evt: proto.Base, name: str, value: Any) -> None:
        doc = msgspec.to_builtins(evt)
        doc[name] = value
        assert JSON_EVENT.decode(msgspec.json.encode(doc)) == evt
        assert MSGPACK_EVENT.decode(msgspec.msgpack.encode(doc)) == evt

    check()
