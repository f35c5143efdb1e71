"""CPU loops of the block-scaled instruction model: chains of instructions per row (:mod:`mmaemu.arith.block_scaled`).

Each row is a chain of instructions of ``k`` elements, the fp32 result of one the accumulator of the next. An
instruction that holds a NaN/Inf element or a NaN scale takes the IEEE value ``c + special[r, i]`` instead
(``special`` is the float64 sum of that instruction's scaled products, computed by the caller).
"""

import numpy as np

from .._jit import arithmetic
from ..arith.block_scaled import block_scaled_instruction, group_scaled_instruction
from . import threads

# Cost of one product, in products of the fast path (mmaemu.cpu.threads task sizes).
PRODUCT_WORK = 16


@arithmetic
def scaled_block_rows(lo, hi, sa, ea, sb, eb, c, special, has_special, k, params, out):
    """Rows lo .. hi-1 of a chain of scaled-block instructions (``ea``/``eb`` include the scale exponents)."""
    K = sa.shape[1]
    for r in range(lo, hi):
        acc = c[r]
        for i in range(K // k):
            if has_special[r, i]:
                acc = np.float32(np.float64(acc) + special[r, i])
            else:
                acc = block_scaled_instruction(sa[r], ea[r], sb[r], eb[r], i * k, (i + 1) * k, acc, params.lshift,
                                               params.rshift, params.frac, params.frac_out, params.min_exp)
        out[r] = acc


@arithmetic
def scaled_group_rows(lo, hi, sa, ea, sb, eb, ssa, sea, ssb, seb, block, c, special, has_special, k, group, e_floor,
                      lift, frac, frac_out, min_exp, out):
    """Rows lo .. hi-1 of a chain of scaled-groups instructions."""
    K = sa.shape[1]
    for r in range(lo, hi):
        acc = c[r]
        for i in range(K // k):
            if has_special[r, i]:
                acc = np.float32(np.float64(acc) + special[r, i])
            else:
                acc = group_scaled_instruction(sa[r], ea[r], sb[r], eb[r], i * k, (i + 1) * k, group, block, ssa[r],
                                               sea[r], ssb[r], seb[r], acc, e_floor, lift, frac, frac_out, min_exp)
        out[r] = acc


def run_scaled_block_rows(sa, ea, sb, eb, c, special, has_special, k, params, out):
    """:func:`scaled_block_rows` over every row on the CPU backend's threads."""
    threads.parallel_for(scaled_block_rows, sa.shape[0], PRODUCT_WORK * max(1, sa.shape[1]), sa, ea, sb, eb, c,
                         special, has_special, k, params, out)


def run_scaled_group_rows(*args):
    """:func:`scaled_group_rows` over every row on the CPU backend's threads (arguments after lo, hi)."""
    sa = args[0]
    threads.parallel_for(scaled_group_rows, sa.shape[0], PRODUCT_WORK * max(1, sa.shape[1]), *args)
