"""``cuda:offset``: the formulation of :mod:`mmaemu.arith.offset` on a register tile per thread.

* :mod:`.kernel` - the decode and GEMM kernels and their decline rule (:func:`.kernel.offset_decline`);
* :mod:`.ptx` - the inline PTX bodies of the packed primitives it calls (exact CPU twins in :mod:`mmaemu.arith`).

Importing this package imports nothing; its modules import ``numba.cuda``.
"""
