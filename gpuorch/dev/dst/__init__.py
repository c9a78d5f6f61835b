"""Deterministic simulation of the whole control plane (`python -m gpuorch.dev.dst`, docs/simulation-testing.md).

One process runs the four services' real cores over a simulated JetStream, KV and clusters on a
virtual clock, every choice drawn from one seed. Pure: no NATS, no Kubernetes, no asyncio.
"""
