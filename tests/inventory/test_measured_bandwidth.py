"""The snapshot's bandwidth figures from measured staging throughput (issue 28 item 4): per
(location, cluster), the median of the `kv_staged` measurements, in place of the registry's
figure for the links the registry names, once there is one."""

from __future__ import annotations

import json
import statistics
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuorch_inventory.core import (
    build_snapshot,
    measured_bandwidth,
    staging_measurement,
    unreachable_snapshot,
)
from gpuorch_proto import decode_snapshot, encode

from .builders import T0, make_node, make_registry


def entry(cluster: str, ref: str, location: str | None = None, size_gb: Any = 1.0, seconds: Any = 10.0) -> bytes:
    doc: dict[str, Any] = {"cluster": cluster, "ref": ref, "at": T0}
    if location is not None:
        doc.update(location=location, bytes=1000, size_gb=size_gb, simulated_seconds=seconds)
    return json.dumps(doc).encode()


def snap(registry: Any, entries: dict[str, bytes], cluster: str = "east") -> Any:
    return build_snapshot(
        cluster, [make_node("gpu-0")], [], registry, now=T0, observed_at=T0, time_scale=1.0,
        measured=measured_bandwidth(entries, cluster),
    )  # fmt: skip


def test_throughput_is_size_over_the_simulated_seconds() -> None:
    assert staging_measurement(entry("east", "a@1", "s3-eu", 2.0, 10.0)) == ("east", "s3-eu", 200.0)


def test_the_median_per_location_of_this_clusters_measurements() -> None:
    entries = {
        "k1": entry("east", "a@1", "s3-eu", 1.0, 10.0),  # 100 MB/s
        "k2": entry("east", "b@1", "s3-eu", 1.0, 5.0),  # 200
        "k3": entry("east", "c@1", "s3-eu", 1.0, 2.0),  # 500
        "k4": entry("east", "d@1", "s3-us", 3.0, 10.0),  # 300
        "k5": entry("east", "e@1", "s3-us", 1.0, 10.0),  # 100: the median of two is their mean
        "k6": entry("west", "a@1", "s3-eu", 1.0, 1.0),  # another cluster's
        "k7": entry("east", "f@1"),  # a cache hit: staged, no measurement
    }
    assert measured_bandwidth(entries, "east") == {"s3-eu": 200.0, "s3-us": 200.0}
    assert measured_bandwidth(entries, "west") == {"s3-eu": 1000.0}
    assert measured_bandwidth(entries, "north") == {}


def test_malformed_values_are_no_measurement() -> None:
    bad = [
        b"", b"not json", b"[]", b'"x"', entry("east", "a@1", "", 1.0, 1.0),
        entry("east", "a@1", "s3", 0, 1.0), entry("east", "a@1", "s3", 1.0, 0), entry("east", "a@1", "s3", -1.0, 1.0),
        entry("east", "a@1", "s3", "1", 1.0), entry("east", "a@1", "s3", True, 1.0), entry("east", "a@1", "s3", 1.0, None),
        entry("east", "a@1", "s3", 1e9, 1e-9),  # faster than believable
        b'{"cluster": "east", "location": "s3", "size_gb": NaN, "simulated_seconds": 1}',
        b'{"cluster": 5, "location": "s3", "size_gb": 1, "simulated_seconds": 1}',
    ]  # fmt: skip
    for value in bad:
        assert staging_measurement(value) is None, value
    assert measured_bandwidth({str(i): v for i, v in enumerate(bad)}, "east") == {}


def test_a_measured_figure_replaces_the_registrys_and_says_so() -> None:
    registry = make_registry(bandwidth_mbps={"s3-eu": 1000.0, "s3-us": 50.0}, data_locations=["nfs-east"])
    entries = {"k1": entry("east", "a@1", "s3-eu", 1.0, 4.0), "k2": entry("east", "b@1", "s3-eu", 1.0, 4.0)}
    s = snap(registry, entries)
    assert s.registry.bandwidth_mbps == {"s3-eu": 250.0, "s3-us": 50.0}  # no measurement from s3-us: the registry's
    assert s.registry.bandwidth_measured == {"s3-eu": 250.0}
    assert set(s.registry.datasets_cached) == set()  # (staged refs come from `staged`, not this)
    # the contract carries it
    assert decode_snapshot(encode(s)).registry.bandwidth_measured == {"s3-eu": 250.0}
    # an unreachable cluster keeps its last figures
    gone = unreachable_snapshot(s, "east", registry, T0 + 5, "unreachable")
    assert gone.registry.bandwidth_mbps == {"s3-eu": 250.0, "s3-us": 50.0} and gone.registry.bandwidth_measured == {"s3-eu": 250.0}


def test_no_history_keeps_the_registry_entry_as_it_is() -> None:
    registry = make_registry(bandwidth_mbps={"s3-eu": 1000.0})
    s = snap(registry, {"k1": entry("east", "a@1")})
    assert s.registry == registry and s.registry.bandwidth_measured == {}


def test_a_location_without_a_registry_link_gets_no_figure() -> None:
    """The cluster's own location (staged without a link) or a store it reads in place: a figure
    would turn a read in place into a copy for the router."""
    registry = make_registry(bandwidth_mbps={"s3-eu": 1000.0, "nfs-east": 900.0}, data_locations=["nfs-east"], artifact_stores=["prod"])
    entries = {"k1": entry("east", "a@1", "nfs-east", 1.0, 1.0), "k2": entry("east", "b@1", "prod", 1.0, 1.0)}
    s = snap(registry, entries)
    assert s.registry.bandwidth_mbps == {"s3-eu": 1000.0, "nfs-east": 900.0} and s.registry.bandwidth_measured == {}


measurement = st.tuples(
    st.sampled_from(["east", "west"]),
    st.sampled_from(["s3-eu", "s3-us", "gcs"]),
    st.floats(min_value=0.001, max_value=10_000),
    st.floats(min_value=0.001, max_value=1e6),
)


@given(st.lists(measurement, max_size=30), st.dictionaries(st.sampled_from(["s3-eu", "s3-us", "gcs", "az"]), st.floats(1, 1e4), max_size=4))
def test_each_linked_location_gets_the_median_of_its_measurements_or_keeps_the_registrys(
    ms: list[tuple[str, str, float, float]], links: dict[str, float]
) -> None:
    entries = {f"k{i}": entry(c, f"d{i}@1", loc, gb, secs) for i, (c, loc, gb, secs) in enumerate(ms)}
    registry = make_registry(bandwidth_mbps=links)
    s = snap(registry, entries)
    for loc, figure in links.items():
        xs = [gb * 1000 / secs for c, loc2, gb, secs in ms if c == "east" and loc2 == loc and 0 < gb * 1000 / secs <= 1e7]
        if xs:
            assert s.registry.bandwidth_mbps[loc] == statistics.median(xs)
            assert s.registry.bandwidth_measured[loc] == statistics.median(xs)
        else:
            assert s.registry.bandwidth_mbps[loc] == figure and loc not in s.registry.bandwidth_measured
    assert set(s.registry.bandwidth_mbps) == set(links)
    assert set(s.registry.bandwidth_measured) <= set(links)
