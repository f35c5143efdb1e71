"""``cuda:native``: the GPU's own FP8 tensor-core instruction computes every block, mmaemu walks the chains.

* :mod:`.kernel` - the GEMM kernel, its stage plan and its decline rule (:func:`.kernel.native_decline`);
* :mod:`.wgmma`, :mod:`.mma_sync` - the instructions (inline PTX) and their simulator twins, modelled by
  :mod:`.instruction_model`; :mod:`.fragment` (accumulator registers), :mod:`.cp_async` (staging copies);
* :mod:`.probe_kernel` - the kernel of the instruction probe (:mod:`mmaemu.cuda.verdicts.probe`).

Importing this package imports nothing; its modules import ``numba.cuda``.
"""
