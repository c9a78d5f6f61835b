"""Subject, stream and KV bucket names: built here and nowhere else.

A `Names` carries a prefix so that tests (and several installations on one
NATS account) never see each other's messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def valid_token(token: str) -> bool:
    """Workload ids and cluster names must be single, safe subject tokens."""
    return bool(_TOKEN.match(token))


@dataclass(frozen=True)
class Names:
    prefix: str = "gpuorch"

    # commands from outside
    @property
    def cmd_submit(self) -> str:
        return f"{self.prefix}.cmd.submit"

    @property
    def cmd_cancel(self) -> str:
        return f"{self.prefix}.cmd.cancel"

    @property
    def cmd_all(self) -> str:
        return f"{self.prefix}.cmd.>"

    # lifecycle events
    def evt(self, workload_id: str, kind: str) -> str:
        return f"{self.prefix}.evt.{workload_id}.{kind}"

    def evt_workload(self, workload_id: str) -> str:
        return f"{self.prefix}.evt.{workload_id}.>"

    def evt_kind(self, kind: str) -> str:
        return f"{self.prefix}.evt.*.{kind}"

    @property
    def evt_all(self) -> str:
        return f"{self.prefix}.evt.>"

    # capacity snapshots, last value per subject
    def inventory(self, cluster: str) -> str:
        return f"{self.prefix}.inventory.{cluster}"

    @property
    def inventory_all(self) -> str:
        return f"{self.prefix}.inventory.>"

    # streams
    @property
    def stream_cmd(self) -> str:
        return f"{self._up}_CMD"

    @property
    def stream_evt(self) -> str:
        return f"{self._up}_EVT"

    @property
    def stream_inventory(self) -> str:
        return f"{self._up}_INVENTORY"

    # KV buckets (compare-and-set state)
    @property
    def kv_fence(self) -> str:
        return f"{self._up}_fence"

    @property
    def kv_owners(self) -> str:
        return f"{self._up}_owners"

    @property
    def kv_admission(self) -> str:
        """The admission leader's lease, one key `leader` (gpuorch_router.lease)."""
        return f"{self._up}_admission"

    @property
    def kv_staged(self) -> str:
        return f"{self._up}_staged"

    @property
    def kv_snapshots(self) -> str:
        """State snapshots, keys `<owner>.head` / `<owner>.<slot>.<n>` (gpuorch.runtime.snapshot)."""
        return f"{self._up}_snapshots"

    def durable(self, service: str, purpose: str) -> str:
        return f"{self._up}_{service}_{purpose}".replace("-", "_")

    @property
    def _up(self) -> str:
        return self.prefix.upper().replace(".", "_").replace("-", "_")


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_msgs_per_subject: int = -1
    duplicate_window_s: float = 120.0


def streams(names: Names) -> list[StreamSpec]:
    """Every stream gpuorch needs; services create them idempotently at start."""
    return [
        StreamSpec(names.stream_cmd, [names.cmd_all], duplicate_window_s=3600.0),
        StreamSpec(names.stream_evt, [names.evt_all], duplicate_window_s=600.0),
        StreamSpec(names.stream_inventory, [names.inventory_all], max_msgs_per_subject=1),
    ]


def kv_buckets(names: Names) -> list[str]:
    return [names.kv_fence, names.kv_owners, names.kv_staged, names.kv_snapshots, names.kv_admission]
