"""gpuorch's versioned contract (v1): workload, snapshots, decisions, commands and events.

Pure data: msgspec Structs, subject names and codecs. See proto/EVOLUTION.md for the rules.
"""

from . import k8s
from .codec import (
    ContractError,
    decode_admission_lease,
    decode_event,
    decode_fence,
    decode_instance_lease,
    decode_owner,
    decode_snapshot,
    encode,
    idempotency_key,
    key_conflict,
    load_workload_yaml,
    workload_from_obj,
    workload_id_for,
    workload_to_builtins,
)
from .events import EVENT_TYPES, TERMINAL_TYPES, Base, Event, FieldError, event_id, type_tag
from .inventory import (
    ClusterRegistryEntry,
    ClusterSnapshot,
    ExporterRef,
    MetricsSource,
    NodeInfo,
    QueueInfo,
    RequestShape,
    ShapeWait,
    Taint,
)
from .routing import Check, ClusterVerdict, Estimate, RoutingDecision
from .state import (
    ADMISSION_LEADER_KEY,
    INSTANCE_KEY_PREFIX,
    AdmissionLease,
    FenceRecord,
    InstanceLease,
    OwnerRecord,
    instance_key,
)
from .subjects import Names, kv_buckets, streams
from .workload import SCHEMA_VERSION, Workload

__all__ = [
    "ADMISSION_LEADER_KEY",
    "EVENT_TYPES",
    "INSTANCE_KEY_PREFIX",
    "SCHEMA_VERSION",
    "TERMINAL_TYPES",
    "AdmissionLease",
    "Base",
    "Check",
    "ClusterRegistryEntry",
    "ClusterSnapshot",
    "ClusterVerdict",
    "ContractError",
    "Estimate",
    "Event",
    "ExporterRef",
    "FenceRecord",
    "FieldError",
    "InstanceLease",
    "MetricsSource",
    "Names",
    "NodeInfo",
    "OwnerRecord",
    "QueueInfo",
    "RequestShape",
    "RoutingDecision",
    "ShapeWait",
    "Taint",
    "Workload",
    "decode_admission_lease",
    "decode_event",
    "decode_fence",
    "decode_instance_lease",
    "decode_owner",
    "decode_snapshot",
    "encode",
    "event_id",
    "idempotency_key",
    "instance_key",
    "k8s",
    "key_conflict",
    "kv_buckets",
    "load_workload_yaml",
    "streams",
    "type_tag",
    "workload_from_obj",
    "workload_id_for",
    "workload_to_builtins",
]
