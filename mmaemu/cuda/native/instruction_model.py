"""What one FP8 tensor-core MMA instruction computes, output by output, as mmaemu's preset models it (CPU).

An instruction with k products per output (32 for ``wgmma ... m64nNk32`` and ``mma.sync ... m16n8k32``) is the
chain of the preset's block steps (:func:`mmaemu.arith.chain.chain_early`, semantics.md b.1) over those k, from
the output's accumulator (+0 when the instruction ignores it: wgmma's ``scale-d = 0``). Zero and non-finite codes
decode to excluded terms (:mod:`mmaemu.formats`): an output whose row or column holds NaN/Inf is not modelled here
(the GEMM's NaN/Inf rule overrides it, semantics.md c.4).

Used by the CPU twins of the native kernels' instructions under numba's CUDA simulator
(:mod:`mmaemu.cuda.native.wgmma`, :mod:`mmaemu.cuda.native.mma_sync`) and as the expected side of the device probe
(:mod:`mmaemu.cuda.verdicts.probe`). Nothing here runs on a GPU.
"""

from __future__ import annotations

import numpy as np

from ...cpu.dot import dot_codes

# The operand formats of the FP8 MMA instructions (A, B): every pair.
FORMAT_PAIRS = (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2"))


def instruction_outputs(a_codes, b_codes, c32, fmt_a, fmt_b, preset):
    """fp32 [R]: output r of an instruction whose row of A is ``a_codes[r]`` and column of B ``b_codes[r]``
    (uint8 codes [R, k]), accumulator ``c32[r]``, computed with ``preset``'s block step (the instruction-level
    model, :func:`mmaemu.cpu.dot.dot_codes`)."""
    return dot_codes(np.ascontiguousarray(a_codes, dtype=np.uint8), np.ascontiguousarray(b_codes, dtype=np.uint8),
                     np.asarray(c32, dtype=np.float32), fmt_a, fmt_b, preset)
