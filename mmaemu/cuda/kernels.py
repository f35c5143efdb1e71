"""The ``@cuda.jit`` kernels of mmaemu: thin launch shells around the arithmetic of :mod:`mmaemu.arith`.

No arithmetic is written here: every output is computed by the same ``@njit`` functions the CPU loops run
(:func:`mmaemu.arith.schedule.accumulate_one`, or the chain and tile functions of :mod:`mmaemu.arith` for the
other kernels), the NaN/Inf rule by :func:`mmaemu.arith.special.nonfinite_accumulator` and the epilogue by
:func:`mmaemu.arith.epilogue.epilogue_one`. Those functions use integers and correctly rounded fp32 operations
only; the kernels are compiled without fast-math (no flush-to-zero, IEEE division and square root; no fused
multiply-add appears in their PTX but the round-toward-zero ones the biased kernel asks for, see
``tests/test_cuda_sim.py``).

Kernels (operands decoded on the device: significands int8 [rows, K], alignment exponents int16 [rows, K]; the
biased and lanes kernels decode the uint8 codes themselves):

* :func:`gemm_simple` - one thread per output calls ``accumulate_one`` on the output's row of A and row of B in
  global memory (any K, any schedule, any preset);
* :func:`gemm_tiled` - a 16 x 16 thread block stages the decoded rows of its 16 rows of A and 16 rows of B through
  shared memory, 128 k at a time, and each thread walks its output's schedule over the staged chunks with the
  chain functions, carrying the exact chain state from chunk to chunk. The walk is the one of
  ``accumulate_one`` / ``split_partial`` / ``chain_over_tiles``, from the same functions of
  :mod:`mmaemu.arith.schedule` and :mod:`mmaemu.arith.chain` (``combine_step``, ``split_chains``,
  ``chain_tiles_of``, ``chain_range``): the same chain ranges, the same fp32 adds in the same order;
* :func:`gemm_lanes` - the fast formulation of :mod:`mmaemu.arith.tile` (the CPU fast path's arithmetic: exact
  fp32 products ``trunc((a * P) * b)``, int32 block sums, int16 exponent maxima): a 16 x 8 thread block decodes
  the FP8 codes of its 32 rows of A and 32 rows of B into shared memory (fp32 value, int8 exponent; B
  transposed), 128 k at a time, and each thread runs ``tile_block_early_kmajor`` on every block of a 2 x 4 tile
  of outputs (its state in registers). Unsplit schedules of early-accumulator presets with int32 block sums only
  (:func:`lanes_decline`); the dispatcher gives other calls to the next kernel;
* ``gemm_biased`` / ``gemm_biased_split`` (:mod:`mmaemu.cuda.biased_kernel`) - the formulation of
  :mod:`mmaemu.arith.biased` (each product one fp32 fused multiply-add rounding toward zero), every schedule;
  the codes kernels (biased, lanes) are launched through :func:`mmaemu.cuda.launch.launch_codes`;
* :func:`override_nonfinite` - the NaN/Inf rule on every output whose row of A or of B holds a non-finite code;
* :func:`epilogue` - the scaled_mm epilogue (semantics.md (e)) from the fp32 accumulators and the scales' bits.

Importing this module imports ``numba.cuda`` (no driver call); :mod:`.launch` launches them, which compiles
them on first use.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int8, int16, int32

from .. import formats
from ..arith import chain as _chain
from ..arith import epilogue as _epilogue
from ..arith import rounding as _rounding
from ..arith import schedule as _schedule
from ..arith import special as _special
from ..arith import tile as _tile
from ..arith.block import NO_LEAD
from . import shim

shim.restore_numpy_row_stack()  # before numba-cuda compiles anything (see shim)
shim.install_builtin_minmax()

accumulate_one = shim.device(_schedule.accumulate_one)
combine_step = shim.device(_schedule.combine_step)
combine = shim.device(_schedule.combine)
split_chains = shim.device(_schedule.split_chains)
chain_tiles_of = shim.device(_schedule.chain_tiles_of)
chain_range_count = shim.device(_chain.chain_range_count)
chain_range = shim.device(_chain.chain_range)
chain_early = shim.device(_chain.chain_early)
chain_late = shim.device(_chain.chain_late)
exact_to_float32 = shim.device(_chain.exact_to_float32)
nonfinite_accumulator = shim.device(_special.nonfinite_accumulator)
epilogue_one = shim.device(_epilogue.epilogue_one)
scale_product = shim.device(_epilogue.scale_product)
value_of_bits = shim.device(_rounding.value_of_bits)
tile_decode = shim.device(_tile.tile_decode)
tile_block_early_kmajor = shim.device(_tile.tile_block_early_kmajor)
tile_chain_reset = shim.device(_tile.tile_chain_reset)
tile_chain_flush = shim.device(_tile.tile_chain_flush)

FINITE = _special.FINITE
FLOAT32 = _rounding.FLOAT32
ABSENT_EXP = formats.ABSENT_EXP
TILE_ABSENT_EXP = _tile.TILE_ABSENT_EXP

# Launch geometry. The tiled kernel's chunk (CHUNK k per stage) must be a multiple of the preset's nfma so that no
# block straddles two chunks; rows are padded so that the 16 rows a warp reads at one k lie in distinct banks.
BLOCK = 16
TILE_M = 16
TILE_N = 16
THREADS = TILE_M * TILE_N
CHUNK = 128
PAD8 = CHUNK + 4  # int8 rows of 132 bytes = 33 words
PAD16 = CHUNK + 2  # int16 rows of 260 bytes = 65 words
SCHEDULE_FIELDS = ("tile", "splits", "interleaved", "chain_tiles", "pairwise", "padded")
MAX_GRID_Y = 65535
EPILOGUE_THREADS = 256
TILE_FORMATS_E4M3 = _tile.TILE_FORMATS["e4m3"]
# The lanes kernel: each thread computes a LANES_ROWS x LANES_COLS register tile of outputs, rows ty + LANES_TY * r
# and columns tx + LANES_TX * j of its block's LANES_M x LANES_N outputs (strided, so that at one k the threads of
# a warp read LANES_TX adjacent columns of B and LANES_TY rows of A: no bank conflict). Per staged k a thread
# reads LANES_ROWS + LANES_COLS values and as many exponents for LANES_ROWS * LANES_COLS products: 2 x 4 gives
# 1.5 shared loads per multiply (a tile of one output: 4). The block's CHUNK k of A (LANES_M rows) and B
# (LANES_N columns) stay under the 48 KiB of static shared memory. A is staged as [row, k] (fp32 rows padded by
# one word so that the rows a warp reads lie in different banks), B transposed to [k, column] (padded so that the
# staging writes, which run along k, do not collide).
LANES_ROWS = 2
LANES_COLS = 4
LANES_TY = 16
LANES_TX = 8
LANES_THREADS = LANES_TY * LANES_TX
LANES_M = LANES_TY * LANES_ROWS
LANES_N = LANES_TX * LANES_COLS
LANES_PAD_A = CHUNK + 1
LANES_PAD_AE = CHUNK + 4
LANES_PAD_B = LANES_N + 1
LANES_PAD_BE = LANES_N + 4


def lanes_decline(schedule, params):
    """Why the lanes kernel does not compute this schedule and preset (None if it does).

    It walks one unsplit chain (fast: the whole of K; slow: one chain per ``tile`` k, restarted from +0, their
    fp32 results added in increasing k) of an early-accumulator preset with int32 lanes
    (:func:`mmaemu.arith.tile.lane_bits_needed`); split-K schedules, late-accumulator presets, presets whose block
    sums need int64 lanes or whose nfma exceeds a stage, and slow chunks that nfma does not divide are left to the
    next kernel.
    """
    tile, splits, interleaved, chain_tiles, pairwise, padded = (int(v) for v in schedule)
    nfma, frac, late_c = int(params[0]), int(params[3]), int(params[6])
    if late_c:
        # tile_block_late ends each block with c = fp32(d + c) after d = c_sig * 2**e, a multiply-add pair that
        # NVVM fuses (exact product, so the bits would not change, but the PTX is kept free of fma).
        return "computes the early-accumulator presets (hopper, ada) only, this preset adds c late"
    if splits != 1:
        return f"computes unsplit GEMMs only, this call has split-K S={splits}"
    if not 1 <= nfma <= CHUNK:
        return f"stages {CHUNK} k at a time, the preset has nfma={nfma}"
    if nfma * 2 ** (frac + 2) + 2 ** (frac + 1) >= 2**31:
        return f"sums blocks in int32 lanes, the preset's block sums (nfma={nfma}, frac={frac}) need int64"
    if chain_tiles not in (0, 1) or padded or (chain_tiles == 1 and tile % nfma):
        return f"walks chains of whole blocks from k = 0, schedule {tuple(schedule)} does not fit"
    return None


def tiled_chunk(nfma: int) -> int:
    """k per stage of the tiled kernel for a preset's block length (0 if the kernel cannot run it)."""
    if nfma < 1 or nfma > CHUNK:
        return 0
    return (CHUNK // nfma) * nfma


# ----------------------------------------------------------------------------------------------------------------
# GEMM kernels


@cuda.jit(fastmath=False)
def gemm_simple(sa, ea, sb, eb, schedule, params, out):
    """out[m, n] = accumulate_one(row m of A, row n of B): one thread per output."""
    n, m = cuda.grid(2)
    if m < out.shape[0] and n < out.shape[1]:
        out[m, n] = accumulate_one(sa[m], ea[m], sb[n], eb[n], sa.shape[1], schedule, params)


@cuda.jit(device=True, fastmath=False)
def _stage_rows(sig, exp, row0, c0, valid, rows, sh_sig, sh_exp, t):
    """Copy k in [c0, c0 + valid) of ``rows`` rows from row0 into shared memory (absent codes past the end)."""
    for idx in range(t, rows * valid, THREADS):
        r = idx // valid
        j = idx - r * valid
        if row0 + r < sig.shape[0]:
            sh_sig[r, j] = sig[row0 + r, c0 + j]
            sh_exp[r, j] = exp[row0 + r, c0 + j]
        else:
            sh_sig[r, j] = 0
            sh_exp[r, j] = ABSENT_EXP


@cuda.jit(device=True, fastmath=False)
def _stage(sa, ea, sb, eb, m0, n0, c0, valid, sh_sa, sh_ea, sh_sb, sh_eb):
    """Copy k in [c0, c0 + valid) of the block's rows of A and B into shared memory (absent past M or N)."""
    t = cuda.threadIdx.y * TILE_N + cuda.threadIdx.x
    cuda.syncthreads()  # every thread is done with the previous chunk
    _stage_rows(sa, ea, m0, c0, valid, TILE_M, sh_sa, sh_ea, t)
    _stage_rows(sb, eb, n0, c0, valid, TILE_N, sh_sb, sh_eb, t)
    cuda.syncthreads()


@cuda.jit(device=True, fastmath=False)
def _chain_streamed(sa, ea, sb, eb, m0, n0, K, first, stride, count, tile, padded, params, chunk, active,
                    sh_sa, sh_ea, sh_sb, sh_eb):
    """``chain_over_tiles`` with the operands staged chunk by chunk: the same ranges (``chain_range``), blocks
    and state."""
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    late_c = params[6]
    c = np.float32(0.0)
    sig, exp, lead = 0, 0, NO_LEAD
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, tile, padded, i)
        c0 = k0
        while c0 < k1:
            c1 = min(c0 + chunk, k1)
            valid = max(0, min(c1, K) - c0)
            if valid > 0:
                _stage(sa, ea, sb, eb, m0, n0, c0, valid, sh_sa, sh_ea, sh_sb, sh_eb)
            if active:
                # Chunk-local indices: blocks start at multiples of nfma from the range start (chunk is a
                # multiple of nfma) and stop at the staged length, exactly where the global walk stops at K.
                if late_c:
                    c = chain_late(sh_sa[ty, :valid], sh_ea[ty, :valid], sh_sb[tx, :valid], sh_eb[tx, :valid],
                                   0, c1 - c0, c, params)
                else:
                    sig, exp, lead = chain_early(sh_sa[ty, :valid], sh_ea[ty, :valid], sh_sb[tx, :valid],
                                                 sh_eb[tx, :valid], 0, c1 - c0, sig, exp, lead, params)
            c0 = c1
    if late_c:
        return c
    return exact_to_float32(sig, exp)


@cuda.jit(device=True, fastmath=False)
def _partial_streamed(sa, ea, sb, eb, m0, n0, K, s, schedule, params, chunk, active, sh_sa, sh_ea, sh_sb, sh_eb):
    """``split_partial`` over staged chunks: the chains of split s (``split_chains``, ``chain_tiles_of``), added in
    increasing k from +0."""
    tile = schedule[0]
    padded = schedule[5]
    partial = np.float32(0.0)
    for c in range(split_chains(K, s, schedule)):
        first, stride, n = chain_tiles_of(K, s, c, schedule)
        value = _chain_streamed(sa, ea, sb, eb, m0, n0, K, first, stride, n, tile, padded, params, chunk, active,
                                sh_sa, sh_ea, sh_sb, sh_eb)
        partial = np.float32(partial + value)
    return partial


@cuda.jit(fastmath=False)
def gemm_tiled(sa, ea, sb, eb, schedule, params, chunk, out):
    """out[m, n] for a 16 x 16 tile per thread block, operands staged through shared memory."""
    sh_sa = cuda.shared.array((TILE_M, PAD8), int8)
    sh_ea = cuda.shared.array((TILE_M, PAD16), int16)
    sh_sb = cuda.shared.array((TILE_N, PAD8), int8)
    sh_eb = cuda.shared.array((TILE_N, PAD16), int16)
    m0 = cuda.blockIdx.y * TILE_M
    n0 = cuda.blockIdx.x * TILE_N
    m = m0 + cuda.threadIdx.y
    n = n0 + cuda.threadIdx.x
    active = m < out.shape[0] and n < out.shape[1]
    K = sa.shape[1]
    splits = schedule[1]
    # accumulate_one's combination of the split partials (combine_step). Every thread of the block runs the same
    # walk (the schedule is the call's), so the stages' barriers are reached uniformly.
    acc = np.float32(0.0)
    slot = np.float32(0.0)
    for i in range(splits):
        s, target, flush = combine_step(splits, schedule[4], i)
        partial = _partial_streamed(sa, ea, sb, eb, m0, n0, K, s, schedule, params, chunk, active, sh_sa, sh_ea,
                                    sh_sb, sh_eb)
        acc, slot = combine(acc, slot, partial, target, flush)
    if active:
        out[m, n] = acc


@cuda.jit(device=True, fastmath=False)
def _decode_rows(codes, fmt, row0, rows, c0, valid, transposed, sh_val, sh_exp):
    """Decode k in [c0, c0 + valid) of ``rows`` rows of codes from row0 into shared memory (tile layout of
    mmaemu.arith.tile: fp32 value, int8 exponent; absent past the last row), at [row, k] or, ``transposed``,
    at [k, row]."""
    t = cuda.threadIdx.y * LANES_TX + cuda.threadIdx.x
    for idx in range(t, rows * valid, LANES_THREADS):
        r = idx // valid
        j = idx - r * valid
        if row0 + r < codes.shape[0]:
            v, e = tile_decode(codes[row0 + r, c0 + j], fmt)
        else:
            v, e = np.float32(0.0), TILE_ABSENT_EXP
        if transposed:
            sh_val[j, r] = v
            sh_exp[j, r] = e
        else:
            sh_val[r, j] = v
            sh_exp[r, j] = e


@cuda.jit(device=True, fastmath=False)
def _stage_lanes(a_codes, b_codes, fmt_a, fmt_b, m0, n0, c0, valid, sh_av, sh_ae, sh_bv, sh_be):
    """Decode k in [c0, c0 + valid) of the block's rows of A and B into shared memory (absent past M or N);
    B is stored transposed, [k, column]."""
    cuda.syncthreads()  # every thread is done with the previous chunk
    _decode_rows(a_codes, fmt_a, m0, LANES_M, c0, valid, False, sh_av, sh_ae)
    _decode_rows(b_codes, fmt_b, n0, LANES_N, c0, valid, True, sh_bv, sh_be)
    cuda.syncthreads()


@cuda.jit(fastmath=False)
def gemm_lanes(a_codes, b_codes, fmt_a, fmt_b, schedule, params, chunk, out):
    """out[m, n] for a LANES_M x LANES_N tile per thread block with the fast formulation of mmaemu.arith.tile.

    Operands are FP8 codes (uint8), decoded into shared memory chunk by chunk. Each thread holds a LANES_ROWS x
    LANES_COLS tile of outputs (rows ty + LANES_TY * r, columns tx + LANES_TX * j, as strided views of the staged
    chunk): it runs tile_block_early_kmajor (tile_block_early with k outermost) on every block of their chains,
    state in int32 lanes of small local arrays that the compiler keeps in registers, so the arithmetic is that of
    the CPU fast path. Only the schedules :func:`lanes_decline` accepts: one unsplit chain (fast) or chains
    restarted every ``tile`` k (slow), their results added in fp32 from +0 in increasing k, then added to +0 as
    accumulate_one does. Outputs past M or N are computed on absent codes and not written.
    """
    sh_av = cuda.shared.array((LANES_M, LANES_PAD_A), float32)
    sh_ae = cuda.shared.array((LANES_M, LANES_PAD_AE), int8)
    sh_bv = cuda.shared.array((CHUNK, LANES_PAD_B), float32)
    sh_be = cuda.shared.array((CHUNK, LANES_PAD_BE), int8)
    c_sig = cuda.local.array((LANES_ROWS, LANES_COLS), int32)
    c_lead = cuda.local.array((LANES_ROWS, LANES_COLS), int32)
    e_max = cuda.local.array((LANES_ROWS, LANES_COLS), int16)
    scale = cuda.local.array((LANES_ROWS, LANES_COLS), float32)
    total = cuda.local.array((LANES_ROWS, LANES_COLS), int32)
    c_val = cuda.local.array((LANES_ROWS, LANES_COLS), float32)
    partial = cuda.local.array((LANES_ROWS, LANES_COLS), float32)
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    m0 = cuda.blockIdx.y * LANES_M
    n0 = cuda.blockIdx.x * LANES_N
    K = a_codes.shape[1]
    nfma = params[0]
    frac_out = params[4]
    restart = schedule[0] if schedule[3] else 0  # slow: a chain per tile of k
    a_val = sh_av[ty:ty + LANES_TY * (LANES_ROWS - 1) + 1:LANES_TY]
    a_exp = sh_ae[ty:ty + LANES_TY * (LANES_ROWS - 1) + 1:LANES_TY]
    b_val = sh_bv[:, tx:tx + LANES_TX * (LANES_COLS - 1) + 1:LANES_TX]
    b_exp = sh_be[:, tx:tx + LANES_TX * (LANES_COLS - 1) + 1:LANES_TX]
    for r in range(LANES_ROWS):
        for j in range(LANES_COLS):
            partial[r, j] = np.float32(0.0)
    tile_chain_reset(c_sig, c_lead, c_val)
    for c0 in range(0, K, chunk):
        valid = min(chunk, K - c0)
        _stage_lanes(a_codes, b_codes, fmt_a, fmt_b, m0, n0, c0, valid, sh_av, sh_ae, sh_bv, sh_be)
        for kb in range(0, valid, nfma):
            if restart and c0 + kb > 0 and (c0 + kb) % restart == 0:
                tile_chain_flush(c_sig, c_lead, c_val, frac_out, 0, partial)
            tile_block_early_kmajor(a_val, a_exp, b_val, b_exp, kb, min(kb + nfma, valid), params, c_sig, c_lead,
                                    e_max, scale, total)
    tile_chain_flush(c_sig, c_lead, c_val, frac_out, 0, partial)
    for r in range(LANES_ROWS):
        m = m0 + ty + LANES_TY * r
        for j in range(LANES_COLS):
            n = n0 + tx + LANES_TX * j
            if m < out.shape[0] and n < out.shape[1]:
                out[m, n] = np.float32(np.float32(0.0) + partial[r, j])


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
