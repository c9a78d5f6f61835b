"""The runtime every gpuorch service shares (the imperative shell around the pure cores).

- `natsembed`: a real nats-server with JetStream as a child process (dev, demo, tests).
- `bus`: connecting to NATS and creating the streams and KV buckets of the contract.
- `shell`: consume -> decode -> handler -> publish (await acks) -> ack; rejections,
  retries, dead letters; replaying a stream; `run_service`.
- `telemetry`: OpenTelemetry tracing with W3C trace context in NATS headers.
- `logs`: structlog JSON lines.

See docs/runtime.md.
"""
