"""What one FP8 tensor-core MMA instruction computes, output by output, as mmaemu's preset models it (CPU).

An instruction with k products per output (32 for ``wgmma ... m64nNk32`` and ``mma.sync ... m16n8k32``) is the
chain of the preset's block steps (:func:`mmaemu.arith.chain.chain_early`, semantics.md b.1) over those k, from
the output's accumulator (+0 when the instruction ignores it: wgmma's ``scale-d = 0``). Zero and non-finite codes
decode to excluded terms (:mod:`mmaemu.formats`): an output whose row or column holds NaN/Inf is not modelled here
(the GEMM's NaN/Inf rule overrides it, semantics.md c.4).

Used by the CPU twins of the native kernels' instructions under numba's CUDA simulator
(:mod:`mmaemu.cuda.wgmma`, :mod:`mmaemu.cuda.mma_sync`) and as the expected side of the device probe
(:mod:`mmaemu.cuda.probe`). Nothing here runs on a GPU.
"""

from __future__ import annotations

import numpy as np

from .. import formats
from .._jit import arithmetic
from ..arith.block import NO_LEAD
from ..arith.chain import chain_early, exact_to_float32
from ..arith.params import preset_params

# The operand formats of the FP8 MMA instructions (A, B): every pair.
FORMAT_PAIRS = (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2"))


@arithmetic
def _chains(sa, ea, sb, eb, c_sig, c_exp, c_lead, params, out):
    """out[r] = chain over row r of A and of B (all their k) from the exact accumulator (c_sig, c_exp, c_lead)."""
    for r in range(sa.shape[0]):
        sig, exp, lead = chain_early(sa[r], ea[r], sb[r], eb[r], 0, sa.shape[1], c_sig[r], c_exp[r], c_lead[r],
                                     params)
        out[r] = exact_to_float32(sig, exp)


def float32_parts(c32):
    """(sig, exp, lead) int64 arrays with ``c = sig * 2**exp`` exactly and ``lead = floor(log2|c|)`` (NO_LEAD for
    zero) of finite fp32 values (non-finite ones are taken as +0)."""
    c64 = np.where(np.isfinite(c32), c32, 0).astype(np.float64)
    mant, exp2 = np.frexp(c64)
    sig = np.round(mant * 2.0**24).astype(np.int64)
    return sig, (exp2 - 24).astype(np.int64), np.where(sig != 0, exp2 - 1, NO_LEAD).astype(np.int64)


def instruction_outputs(a_codes, b_codes, c32, fmt_a, fmt_b, preset):
    """fp32 [R]: output r of an instruction whose row of A is ``a_codes[r]`` and column of B ``b_codes[r]``
    (uint8 codes [R, k]), accumulator ``c32[r]``, computed with ``preset``'s block step."""
    a_codes = np.ascontiguousarray(a_codes, dtype=np.uint8)
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    sa, ea = formats.significands(fmt_a)[a_codes], formats.exponents(fmt_a)[a_codes]
    sb, eb = formats.significands(fmt_b)[b_codes], formats.exponents(fmt_b)[b_codes]
    sig, exp, lead = float32_parts(np.asarray(c32, dtype=np.float32))
    out = np.empty(a_codes.shape[0], np.float32)
    _chains(sa, ea, sb, eb, sig, exp, lead, preset_params(preset, fmt_a, fmt_b), out)
    return out
