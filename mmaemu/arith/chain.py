"""A chain: consecutive blocks of nfma products over a K range, each block's result feeding the next
(semantics.md (c)). A chain starts from the accumulator it is given (+0 in every GEMM chain); the last block
of a range is padded with zero products, which are excluded terms.

``params`` is the preset as integers, a :class:`mmaemu.arith.params.BlockParams` built by
:func:`mmaemu.arith.params.preset_params`.
"""

import math

import numpy as np

from ..base._jit import arithmetic
from .block import NO_LEAD, block_products_late, block_step_early


@arithmetic
def exact_to_float32(sig, exp):
    """The fp32 value ``sig * 2**exp`` (exact for every block result: at most 24 significant bits)."""
    return np.float32(math.ldexp(np.float64(sig), exp))


@arithmetic
def chain_early(sa, ea, sb, eb, k0, k1, c_sig, c_exp, c_lead, params):
    """Early-accumulator chain (hopper, ada) over k in [k0, k1); returns the exact state (sig, exp, lead).

    Blocks past the end of the operands (k >= K) are zero padding: they still run, so a chain over a padded
    tile applies the block step to the accumulator alone. That truncates c like any block (b.1 steps 2-6): the
    identity for a GEMM accumulator when frac >= frac_out (every shipped preset), a re-truncation of c for a
    custom preset with frac < frac_out, and, for the arbitrary c of ``model.dot``, a cut of c's extra bits and of
    anything below the result grid 2**(-126 - frac_out).
    """
    nfma = params.nfma
    for kb in range(k0, k1, nfma):
        c_sig, c_exp, c_lead = block_step_early(sa, ea, sb, eb, kb, min(kb + nfma, k1, sa.shape[0]), c_sig, c_exp,
                                                c_lead, params.lshift, params.rshift, params.frac, params.frac_out,
                                                params.min_exp)
    return c_sig, c_exp, c_lead


@arithmetic
def chain_late(sa, ea, sb, eb, k0, k1, c, params):
    """Late-accumulator chain (b200_mma_sync): each block's product sum is added to c with one fp32 RNE add."""
    nfma = params.nfma
    for kb in range(k0, k1, nfma):
        d_sig, d_exp, d_lead = block_products_late(sa, ea, sb, eb, kb, min(kb + nfma, k1, sa.shape[0]),
                                                   params.lshift, params.rshift, params.frac, params.frac_out,
                                                   params.min_exp)
        c = np.float32(exact_to_float32(d_sig, d_exp) + c)
    return c


@arithmetic
def chain_range_count(stride, count):
    """Number of K ranges of a chain over ``count`` tiles: adjacent tiles (stride 1) form one range."""
    return 1 if stride == 1 else count


@arithmetic
def chain_range(K, first, stride, count, tile, padded, i):
    """``(k0, k1)``: the i-th K range of a chain over tiles ``first, first + stride, ...`` of width tile; with
    ``padded`` at full width (zero padding past K included), else stopped at K."""
    span = count * tile if stride == 1 else tile
    k0 = (first + i * stride) * tile
    k1 = k0 + span if padded else min(k0 + span, K)
    return k0, k1


@arithmetic
def chain_over_tiles(sa, ea, sb, eb, K, first, stride, count, tile, padded, params):
    """The fp32 result of one chain from +0 over ``count`` k-tiles ``first, first + stride, ...`` of width tile.

    Adjacent tiles (stride 1) form one K range, so blocks run on across tile edges; strided tiles are walked
    one by one with the state carried over, which the planner allows only when nfma divides the tile width
    (then no block straddles a tile edge). With ``padded`` the tiles are walked at their full width: the ragged
    end of the last tile and whole padding tiles (k >= K) are zero codes whose blocks still run (see
    chain_early); without it the chain stops at K.
    """
    late_c = params.late_c
    c = np.float32(0.0)
    sig, exp, lead = 0, 0, NO_LEAD
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, tile, padded, i)
        if late_c:
            c = chain_late(sa, ea, sb, eb, k0, k1, c, params)
        else:
            sig, exp, lead = chain_early(sa, ea, sb, eb, k0, k1, sig, exp, lead, params)
    if late_c:
        return c
    return exact_to_float32(sig, exp)
