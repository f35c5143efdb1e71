"""CPU loop of the instruction-level model: one chain per row from a given fp32 accumulator c.

:func:`dot_codes` is the model from FP8 codes and fp32 accumulators (``mmaemu.model.dot`` for finite inputs, and
the expected side of ``cuda:native``'s instruction twins and probe, :mod:`mmaemu.cuda.native.instruction_model`);
:func:`dot_chains` its loop over decoded operands.
"""

import numpy as np

from .. import formats
from ..base._jit import arithmetic
from ..arith.block import NO_LEAD
from ..arith.chain import chain_early, chain_late, exact_to_float32
from ..arith.params import preset_params
from . import threads

# Cost of one product of a chain walk, in products of the fast path (mmaemu.cpu.threads task sizes).
CHAIN_PRODUCT_WORK = 16


@arithmetic
def dot_chains_loop(lo, hi, sa, ea, sb, eb, c_sig, c_exp, c_lead, c_value, params, out):
    """out[r] = chain over row r of A and row r of B (length K) starting from accumulator c[r], rows lo .. hi-1.

    Early presets take c as the exact pair (c_sig, c_exp, c_lead); late presets take its fp32 value.
    """
    K = sa.shape[1]
    late_c = params.late_c
    for r in range(lo, hi):
        if late_c:
            out[r] = chain_late(sa[r], ea[r], sb[r], eb[r], 0, K, c_value[r], params)
        else:
            sig, exp, lead = chain_early(sa[r], ea[r], sb[r], eb[r], 0, K, c_sig[r], c_exp[r], c_lead[r], params)
            out[r] = exact_to_float32(sig, exp)


def dot_chains(sa, ea, sb, eb, c_sig, c_exp, c_lead, c_value, params, out):
    """:func:`dot_chains_loop` over every row, on the CPU backend's threads (:mod:`mmaemu.cpu.threads`)."""
    threads.parallel_for(dot_chains_loop, sa.shape[0], CHAIN_PRODUCT_WORK * max(1, sa.shape[1]), sa, ea, sb, eb,
                         c_sig, c_exp, c_lead, c_value, params, out)


def float32_parts(c32):
    """(sig, exp, lead) int64 arrays of fp32 values: c = sig * 2**exp exactly, lead = floor(log2|c|) (NO_LEAD for
    0); non-finite values are taken as +0."""
    finite = np.isfinite(c32)
    mant, exp2 = np.frexp(np.where(finite, c32, 0).astype(np.float64))
    sig = np.round(mant * 2.0**24).astype(np.int64)
    exp = (exp2 - 24).astype(np.int64)
    lead = np.where(sig != 0, exp2 - 1, NO_LEAD).astype(np.int64)
    return sig, exp, lead


def dot_codes(a_codes, b_codes, c32, fmt_a, fmt_b, preset):
    """fp32 [R]: the chain of ``preset``'s blocks over row r of A and row r of B (uint8 FP8 codes [R, K]) from the
    fp32 accumulator ``c32[r]``. Zero and non-finite codes are excluded terms (:mod:`mmaemu.formats`): rows with a
    NaN/Inf code or accumulator are the caller's to override (the NaN/Inf rule)."""
    sa, ea = formats.significands(fmt_a)[a_codes], formats.exponents(fmt_a)[a_codes]
    sb, eb = formats.significands(fmt_b)[b_codes], formats.exponents(fmt_b)[b_codes]
    sig, exp, lead = float32_parts(c32)
    out = np.empty(a_codes.shape[0], np.float32)
    dot_chains(sa, ea, sb, eb, sig, exp, lead, c32, preset_params(preset, fmt_a, fmt_b), out)
    return out
