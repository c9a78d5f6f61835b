"""`python -m gpuorch.dev.security_mutants.launch MODULE [ARG ...]`: run `python -m MODULE ARG ...`
with the mutant `GPUORCH_SECURITY_MUTANT` names applied in this process first (test-only).

The runner starts pytest this way (the `tests` process: it writes the server config), and the
embedded system starts each service this way while the variable is set
(`gpuorch.system.service_argv`). Each process says on stderr what it patched, so a service's log
shows its mutant.
"""

from __future__ import annotations

import os
import runpy
import sys

from gpuorch.system import SECURITY_MUTANT_ENV

from .mutants import applied, process_of


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m gpuorch.dev.security_mutants.launch MODULE [ARG ...]")
    module, *args = argv
    name = os.environ.get(SECURITY_MUTANT_ENV) or None
    process = process_of(module)
    with applied(name, process) as patched:
        print(
            f"security mutant {name}: {', '.join(patched) or 'nothing'} patched in {process}",
            file=sys.stderr,
            flush=True,
        )
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
