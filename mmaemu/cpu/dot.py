"""CPU loop of the instruction-level model: one chain per row from a given fp32 accumulator c."""

from .._jit import arithmetic
from ..arith.chain import chain_early, chain_late, exact_to_float32
from . import threads

# Cost of one product of a chain walk, in products of the fast path (mmaemu.cpu.threads task sizes).
CHAIN_PRODUCT_WORK = 16


@arithmetic
def dot_chains_loop(lo, hi, sa, ea, sb, eb, c_sig, c_exp, c_lead, c_value, params, out):
    """out[r] = chain over row r of A and row r of B (length K) starting from accumulator c[r], rows lo .. hi-1.

    Early presets take c as the exact pair (c_sig, c_exp, c_lead); late presets take its fp32 value.
    """
    K = sa.shape[1]
    late_c = params[6]
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
