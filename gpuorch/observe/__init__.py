"""Seeing the whole path (issue 14): lifecycle timelines, the per-destination report and its
charts, Prometheus metrics, and the read-only web view.

`timeline` and `report` are pure functions over the event log (no I/O, no clock: `now` is an
argument), like `gpuorch.projection`; `plots` draws them with matplotlib; `metrics` is what each
service exports through the shared shell (`targets`: the scrape config of a running system);
`web` serves all of it from the event stream, with
its pure parts apart: `browse` (the workload list's filters, orders and pages), `dag` (a
pipeline's graph laid out) and `capacity` (capacity and queue length over time).
Importing this package imports nothing heavy: each module is imported where it is used.
"""
