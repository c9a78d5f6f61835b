"""Developer tools, kept together: the deterministic simulation (`dst`), real-process chaos,
benchmarks and the demo. Nothing in the control plane imports them."""
