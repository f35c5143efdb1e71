"""The package's infrastructure (the base layer, tests/test_imports.py): caches, JIT and Numba cache glue,
private folders, device facts, floating-point modes, tensor kinds and the torch operations as the GPU
computes them. Internal: nothing here is public API; it imports nothing above the base layer."""
