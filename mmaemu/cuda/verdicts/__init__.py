"""What a kernel must show on a device before it computes there: :mod:`.probe` (the instruction probe of
``cuda:native``) and :mod:`.selftest` (the GEMM and epilogue cases of every kernel, the verdict cache).

Importing this package imports nothing.
"""
