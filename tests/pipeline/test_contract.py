"""The contract additions: new event types at the end of the union, old documents and readers."""

from __future__ import annotations

import msgspec

from gpuorch_proto import EVENT_TYPES, decode_event, encode, load_workload_yaml, type_tag
from gpuorch_proto import events as ev
from tests.test_layering import FORBIDDEN, _closure

NEW = ["pipeline-expanded", "stage-ready", "held", "released", "stage-blocked", "pipeline-finished"]


def test_the_new_event_types_come_last_in_the_union() -> None:
    # then the preemption events (issue 13, item 6), appended after these, then the admission
    # leader's term marker (issue 29, item 4)
    later = ["preemption-planned", "preemption-requested", "admission-term"]
    assert [type_tag(t) for t in EVENT_TYPES[-len(NEW) - len(later) :]] == [*NEW, *later]
    assert [type_tag(t) for t in EVENT_TYPES[:3]] == ["submit", "cancel", "rejected"]  # the old order stands


def test_a_held_event_round_trips_in_json_and_msgpack() -> None:
    e = ev.Held(
        event_id="w.held.1",
        workload_id="w",
        at=1.0,
        reason="held: queue research at 16 of 16 GPUs",
        holds=[
            ev.Hold(
                scope="queue",
                name="research",
                kind="gpus",
                used=16,
                limit=16,
                needs=2,
                message="queue research at 16 of 16 GPUs",
            )
        ],
        queue="research",
    )
    assert decode_event(encode(e)) == e and decode_event(encode(e, "msgpack"), "application/msgpack") == e


def test_an_old_workload_document_still_decodes_with_the_new_defaults() -> None:
    wl = load_workload_yaml(
        """
metadata: {name: old}
spec:
  image: registry.example.com/x@sha256:"""
        + "ab" * 32
        + """
  command: [run]
  stages: [{name: prep, command: [prep]}]
"""
    )
    assert wl.spec.sweep is None and wl.spec.limits.max_gpus is None and wl.spec.policy_queue is None
    assert wl.spec.stages[0].image is None and wl.spec.stages[0].requirements is None


def test_a_reader_without_the_new_fields_skips_them() -> None:
    class OldStage(msgspec.Struct, kw_only=True):  # the Stage of the previous release
        name: str
        depends_on: list[str] = []

    new = {"name": "train", "depends_on": ["prep"], "queue": "primary/train", "expected_runtime": "4h"}
    assert msgspec.json.decode(msgspec.json.encode(new), type=OldStage) == OldStage(
        name="train", depends_on=["prep"]
    )


def test_the_pipeline_core_imports_no_io() -> None:
    reached = _closure("gpuorch_router.pipeline")
    assert not {m for m in reached if m.split(".")[0] in FORBIDDEN}
    assert "gpuorch_proto.policy" in reached  # the check sees through project imports
