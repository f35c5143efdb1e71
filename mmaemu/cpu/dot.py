"""CPU loop of the instruction-level model: one chain per row from a given fp32 accumulator c."""

from numba import prange

from .._jit import arithmetic_parallel
from ..arith.chain import chain_early, chain_late, exact_to_float32
from . import threads


@arithmetic_parallel
def dot_chains_loop(sa, ea, sb, eb, c_sig, c_exp, c_lead, c_value, params, out):
    """out[r] = chain over row r of A and row r of B (length K) starting from accumulator c[r].

    Early presets take c as the exact pair (c_sig, c_exp, c_lead); late presets take its fp32 value.
    """
    R, K = sa.shape
    late_c = params[6]
    for r in prange(R):
        if late_c:
            out[r] = chain_late(sa[r], ea[r], sb[r], eb[r], 0, K, c_value[r], params)
        else:
            sig, exp, lead = chain_early(sa[r], ea[r], sb[r], eb[r], 0, K, c_sig[r], c_exp[r], c_lead[r], params)
            out[r] = exact_to_float32(sig, exp)


def dot_chains(sa, ea, sb, eb, c_sig, c_exp, c_lead, c_value, params, out):
    """:func:`dot_chains_loop` inside the CPU backend's parallel region (one parallel loop at a time, see
    :mod:`mmaemu.cpu.threads`)."""
    with threads.parallel_region():
        dot_chains_loop(sa, ea, sb, eb, c_sig, c_exp, c_lead, c_value, params, out)
