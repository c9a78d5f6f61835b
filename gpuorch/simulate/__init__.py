"""Trace-replay simulation of routing quality (`gpuorch simulate`, docs/simulation.md).

`trace` reads job traces (ITP CSV and other mappings), `generator` adds the seeded attributes a
trace lacks, `world` loads the clusters file, `model` runs one cluster (strict-FIFO admission by
whole GPUs and one-node shapes, staging, caches, what inventory would observe), `policies` are the
compared placement rules (gpuorch's is the router's own `core.decide` through a `RoutingMemo`, the fast path whose records equal the reference `decision.route`), `engine`
replays arrivals, `report` and `plots` present the comparison, `whatif` compares two fleets, `progress`
formats a long replay's progress line. All but `cli` and `plots` are pure.
"""
