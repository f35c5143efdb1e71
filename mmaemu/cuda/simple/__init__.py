"""``cuda:simple``, the GPU reference, and the kernels every GEMM kernel shares (the NaN/Inf rule, the epilogues,
the schedule functions the other kernels walk): :mod:`.kernels`.

Importing this package imports nothing; its modules import ``numba.cuda``.
"""
