"""The built-in trace mappings (`*.yaml`), read by `gpuorch.simulate.mapping.load_mapping`: data, no code."""
