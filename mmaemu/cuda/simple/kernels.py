"""The ``@cuda.jit`` kernels of mmaemu besides the offset kernel: thin launch shells around :mod:`mmaemu.arith`.

No arithmetic is written here: every output is computed by the same ``@njit`` functions the CPU loops run
(:func:`mmaemu.arith.schedule.accumulate_one`), the NaN/Inf rule by :func:`mmaemu.arith.special.nonfinite_accumulator`
and the epilogue by :func:`mmaemu.arith.epilogue.epilogue_one`. Those functions use integers and correctly rounded
fp32 operations only; the kernels are compiled without fast-math (no flush-to-zero, IEEE division and square root;
no fused multiply-add appears in their PTX, see ``tests/test_cuda_sim.py``).

* :func:`gemm_simple` - the GPU reference: one thread per output calls ``accumulate_one`` on the output's row of A
  and row of B (significands int8 [rows, K], alignment exponents int16 [rows, K], decoded on the device) in global
  memory; any K, any schedule, any preset. Obviously correct, slow; the fast kernel is
  :mod:`mmaemu.cuda.offset.kernel`, which walks its schedules with the functions exported here
  (``combine_step``, ``split_chains``, ``chain_tiles_of``, ``chain_range``);
* :func:`override_nonfinite` - the NaN/Inf rule on every output whose row of A or of B holds a non-finite code;
* :func:`epilogue` - the scaled_mm epilogue (semantics.md (e)) from the fp32 accumulators and the scales' bits;
* :func:`rowwise_epilogue` - torch's row-wise epilogue (:mod:`mmaemu.arith.rowwise`) from the fp32 accumulators,
  the scale vectors' and the bias's bits.

Importing this module imports ``numba.cuda`` (no driver call); :mod:`.launch` launches them, which compiles
them on first use.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...arith import chain as _chain
from ...arith import epilogue as _epilogue
from ...arith import rounding as _rounding
from ...arith import rowwise as _rowwise
from ...arith import schedule as _schedule
from ...arith import special as _special
from .. import shim

shim.restore_numpy_row_stack()  # before numba-cuda compiles anything (see shim)
shim.install_builtin_minmax()

accumulate_one, combine_step, combine, split_chains, chain_tiles_of = shim.devices(
    _schedule, "accumulate_one", "combine_step", "combine", "split_chains", "chain_tiles_of")
chain_range_count, chain_range = shim.devices(_chain, "chain_range_count", "chain_range")
nonfinite_accumulator, = shim.devices(_special, "nonfinite_accumulator")
epilogue_one, scale_product = shim.devices(_epilogue, "epilogue_one", "scale_product")
value_of_bits, = shim.devices(_rounding, "value_of_bits")
rowwise_epilogue_one, = shim.devices(_rowwise, "rowwise_epilogue_one")

FINITE = _special.FINITE
FLOAT32 = _rounding.FLOAT32
BFLOAT16 = _rounding.BFLOAT16

# Launch geometry: BLOCK x BLOCK threads per block (simple and override kernels).
BLOCK = 16
MAX_GRID_Y = 65535
EPILOGUE_THREADS = 256


# ----------------------------------------------------------------------------------------------------------------
# The reference GEMM kernel


@cuda.jit(fastmath=False)
def gemm_simple(sa, ea, sb, eb, schedule, params, out):
    """out[m, n] = accumulate_one(row m of A, row n of B): one thread per output."""
    n, m = cuda.grid(2)
    if m < out.shape[0] and n < out.shape[1]:
        out[m, n] = accumulate_one(sa[m], ea[m], sb[n], eb[n], sa.shape[1], schedule, params)


# ----------------------------------------------------------------------------------------------------------------
# NaN/Inf rule and epilogue


@cuda.jit(fastmath=False)
def override_nonfinite(a_codes, a_flags, a_table, b_codes, b_flags, b_table, out_bits):
    """The NaN/Inf rule (c.4) on every output whose row of A or row of B holds a non-finite code."""
    n, m = cuda.grid(2)
    if m < out_bits.shape[0] and n < out_bits.shape[1]:
        if a_flags[m] != 0 or b_flags[n] != 0:
            bits = nonfinite_accumulator(a_codes[m], b_codes[n], a_table, b_table)
            if bits != FINITE:
                out_bits[m, n] = bits


@cuda.jit(device=True)
def _signed(bits, width):
    """The two's-complement value of the low ``width`` bits (stored through a signed integer view)."""
    value = bits & ((1 << width) - 1)
    if value >= (1 << (width - 1)):
        value -= 1 << width
    return value


@cuda.jit(fastmath=False)
def epilogue(acc, scale_bits, has_scale_result, out_code, width, out_bits):
    """out_bits[i] = output bits of acc[i] (semantics.md (e)); scale_bits = int32 bits of scale_a, scale_b,
    scale_result (the last ignored unless has_scale_result)."""
    i = cuda.grid(1)
    if i < acc.shape[0]:
        alpha = scale_product(value_of_bits(np.int64(scale_bits[0]) & 0xFFFFFFFF, FLOAT32),
                              value_of_bits(np.int64(scale_bits[1]) & 0xFFFFFFFF, FLOAT32))
        scale_result = 1.0
        if has_scale_result != 0:
            scale_result = value_of_bits(np.int64(scale_bits[2]) & 0xFFFFFFFF, FLOAT32)
        bits = epilogue_one(acc[i], alpha, out_code, scale_result, has_scale_result != 0)
        out_bits[i] = _signed(bits, width)


@cuda.jit(fastmath=False)
def rowwise_epilogue(acc, x_scale_bits, w_scale_bits, bias_bits, has_bias, x_first, out_bits):
    """out_bits[m, n] = bf16 bits (int16 view) of torch's row-wise epilogue of acc[m, n]: x_scale_bits [M] and
    w_scale_bits [N] int32 fp32 bits, bias_bits [N] int16 bf16 bits (ignored unless has_bias; +0 then)."""
    n, m = cuda.grid(2)
    if m < acc.shape[0] and n < acc.shape[1]:
        x = value_of_bits(np.int64(x_scale_bits[m]) & 0xFFFFFFFF, FLOAT32)
        w = value_of_bits(np.int64(w_scale_bits[n]) & 0xFFFFFFFF, FLOAT32)
        bias = 0.0
        if has_bias != 0:
            bias = value_of_bits(np.int64(bias_bits[n]) & 0xFFFF, BFLOAT16)
        if x_first != 0:
            bits = rowwise_epilogue_one(acc[m, n], x, w, bias)
        else:
            bits = rowwise_epilogue_one(acc[m, n], w, x, bias)
        out_bits[m, n] = _signed(bits, 16)


def simple_decline(schedule, params):
    """Why :func:`gemm_simple` does not compute this schedule and preset: never (None). It runs ``accumulate_one``,
    the CPU reference's own walk, so every preset and schedule is its; this rule is declared so that the dispatcher
    asks every kernel the same question (its registry entry, :mod:`mmaemu.cuda.catalog`)."""
    return None
