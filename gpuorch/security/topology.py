"""`python -m gpuorch.security.topology`: create (or update) the streams and buckets as the admin
identity, then exit. The deployment runs it as a Job before the services start (they may not
create streams themselves); `gpuorch up` does the same in-process. Settings from the
environment (`GPUORCH_NATS_URL`, `GPUORCH_NATS_CREDS` = the admin's seed, `GPUORCH_PREFIX`,
`GPUORCH_REPLICAS`, TLS variables)."""

from __future__ import annotations

import asyncio
import sys

from gpuorch.config import Settings
from gpuorch.runtime import bus
from gpuorch.runtime.logs import configure_logging


async def run(settings: Settings) -> None:
    nc = await bus.connect_as(settings, "gpuorch-admin-topology")
    try:
        await bus.ensure_topology(nc.jetstream(), settings.names)
    finally:
        await nc.close()


def main() -> int:
    configure_logging("topology")
    asyncio.run(run(Settings.from_env()))
    print("topology ready", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
