"""Developer tools, kept together: the deterministic simulation (`dst`), real-process chaos,
benchmarks, security mutants. The top layer (.importlinter, *layers*): nothing else of gpuorch,
not even the CLI, imports them (`gpuorch demo` is `gpuorch.demo`, a CLI command)."""
