"""The ``cuda:offset`` GEMM kernel: the formulation of :mod:`mmaemu.arith.offset` on a register tile per thread.

Every product is one fp32 fused multiply-add rounding toward zero into an offset accumulator, plus a quarter of an
``IDP4A`` and two integer instructions that count the products it floors one unit too far; the block exponent is
a packed 16-bit add and maximum per two products. Two kernels:

* :func:`decode_operand` packs the FP8 codes of a panel of rows once (:func:`mmaemu.arith.offset.offset_pack`)
  into k-major arrays: fp32 values ``val[k, r]``, exponent words ``exp[k // 2, r]``, low-byte and sign-byte words
  ``low[k // 4, r]``, ``sign[k // 4, r]``; padded with zero codes to whole stages and thread blocks, so the GEMM
  kernel stages them with plain copies;
* :func:`gemm_offset`: a TY x TX thread block owns BLOCK_M x BLOCK_N outputs, each thread a ROWS x COLS tile of
  them (rows ``ty * ROWS + r``, columns ``tx * COLS + j``: adjacent words, vector loads). The block copies STAGE_K
  k of its rows of A and of B into shared memory (48 KiB, the static limit); each thread runs
  :func:`mmaemu.arith.offset.offset_block` on every block of its chains, state in registers, and ends each chain
  with :func:`mmaemu.arith.offset.offset_chain_value`.

The schedule (unsplit fast and slow, every split-K scheme) is walked with the functions ``accumulate_one`` uses
(``combine_step``, ``split_chains``, ``chain_tiles_of``, ``chain_range``); presets are those
:func:`offset_decline` accepts. No arithmetic is written here.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32

from ..arith import offset as _offset
from . import ptx, shim
from .kernels import chain_range, chain_range_count, chain_tiles_of, combine, combine_step, split_chains

shim.install_fma_toward_zero()
ptx.install()

offset_block = shim.device(_offset.offset_block)
offset_chain_value = shim.device(_offset.offset_chain_value)
offset_pack = shim.device(_offset.offset_pack)

# Geometry: ROWS x COLS outputs per thread (registers: four words per output while a block runs), TY x TX threads.
ROWS = 8
COLS = 4
TY = 16
TX = 16
THREADS = TY * TX
BLOCK_M = TY * ROWS
BLOCK_N = TX * COLS
STAGE_K = 32  # a multiple of the shipped presets' nfma (32, 16), so that no block straddles two stages
STAGE_WORDS2 = STAGE_K // 2  # exponent words per stage (two k each)
STAGE_WORDS4 = STAGE_K // 4  # byte words per stage (four k each)
DECODE_BLOCK = (32, 8)  # decode kernel: 32 rows x 8 groups of 4 k per thread block
REGISTERS = 255


def offset_decline(schedule, params):
    """Why the offset kernel does not compute this schedule and preset (None if it does): a preset that
    :func:`mmaemu.arith.offset.offset_decline` accepts, whose blocks tile the STAGE_K-wide stages, and whose
    k-tiles start on a stage (an unsplit fast chain is one range from k = 0)."""
    tile, splits, interleaved, chain_tiles, pairwise, padded = (int(v) for v in schedule)
    nfma, frac, frac_out, late_c = int(params[0]), int(params[3]), int(params[4]), int(params[6])
    why = _offset.offset_decline(nfma, frac, frac_out, late_c)
    if why is not None:
        return why
    if STAGE_K % nfma:
        return f"stages {STAGE_K} k at a time, which nfma={nfma} does not divide"
    if (splits > 1 or chain_tiles) and tile % STAGE_K:
        return f"starts k-tiles on its {STAGE_K}-wide stages, the schedule's tiles are {tile} wide"
    return None


@cuda.jit(fastmath=False)
def decode_operand(codes, tables, row0, val, exp, low, sign):
    """Pack four k of row ``row0 + r`` per thread (``offset_pack``; zero codes past the rows or past K). Groups
    stride over the grid's y extent, so any K fits the grid."""
    r, g = cuda.grid(2)
    g_step = cuda.gridDim.y * cuda.blockDim.y
    rows = val.shape[1]
    while g < low.shape[0] and r < rows:
        row = row0 + r
        if row < codes.shape[0]:
            v0, v1, v2, v3, e01, e23, lw, sg = offset_pack(codes, row, g, tables)
        else:
            v0, v1, v2, v3, e01, e23, lw, sg = offset_pack(codes, 0, codes.shape[1], tables)  # all zero codes
        val[4 * g, r] = v0
        val[4 * g + 1, r] = v1
        val[4 * g + 2, r] = v2
        val[4 * g + 3, r] = v3
        exp[2 * g, r] = e01
        exp[2 * g + 1, r] = e23
        low[g, r] = lw
        sign[g, r] = sg
        g += g_step


@cuda.jit(device=True, fastmath=False)
def _copy(source, cols, row0, first, count, rows, target):
    """``target[i, r] = source[(first + i) * cols + row0 + r]`` for i < count, r < rows (the staged rows of a
    flat k-major panel): thread t copies row ``t % rows`` at every ``THREADS // rows``-th i, so that a warp copies
    consecutive words (count * rows is a multiple of THREADS)."""
    t = np.uint32(cuda.threadIdx.y * TX + cuda.threadIdx.x)
    r = np.uint32(t % np.uint32(rows))
    i0 = np.uint32(t // np.uint32(rows))
    step = THREADS // rows
    flat = np.uint32(np.uint32(np.uint32(first + i0) * np.uint32(cols)) + np.uint32(row0 + r))
    for n in range(count // step):
        target[np.uint32(i0 + np.uint32(n * step)), r] = source[np.uint32(flat + np.uint32(np.uint32(n * step) *
                                                                                             np.uint32(cols)))]


@cuda.jit(device=True, fastmath=False)
def _stage(panel, row0, c0, rows, staged):
    """Copy k in [c0, c0 + STAGE_K) of ``rows`` packed rows from row0 into shared memory."""
    val, exp, low, sign, cols = panel
    sh_val, sh_exp, sh_low, sh_sign = staged
    _copy(val, cols, row0, c0, STAGE_K, rows, sh_val)
    _copy(exp, cols, row0, c0 // 2, STAGE_WORDS2, rows, sh_exp)
    _copy(low, cols, row0, c0 // 4, STAGE_WORDS4, rows, sh_low)
    _copy(sign, cols, row0, c0 // 4, STAGE_WORDS4, rows, sh_sign)


@cuda.jit(device=True, fastmath=False)
def _stages():
    """The block's staged operands in shared memory (one set per kernel: call once per thread)."""
    # One allocation per line: numba's simulator tells shared arrays apart by the line that allocates them.
    a_val = cuda.shared.array((STAGE_K, BLOCK_M), float32)
    a_exp = cuda.shared.array((STAGE_WORDS2, BLOCK_M), uint32)
    a_low = cuda.shared.array((STAGE_WORDS4, BLOCK_M), uint32)
    a_sign = cuda.shared.array((STAGE_WORDS4, BLOCK_M), uint32)
    b_val = cuda.shared.array((STAGE_K, BLOCK_N), float32)
    b_exp = cuda.shared.array((STAGE_WORDS2, BLOCK_N), uint32)
    b_low = cuda.shared.array((STAGE_WORDS4, BLOCK_N), uint32)
    b_sign = cuda.shared.array((STAGE_WORDS4, BLOCK_N), uint32)
    return (a_val, a_exp, a_low, a_sign), (b_val, b_exp, b_low, b_sign)


@cuda.jit(device=True, fastmath=False)
def _chain(a, b, K, first, stride, count, schedule, params, sh_a, sh_b, work, c_val):
    """One chain from +0 over ``count`` k-tiles (``chain_range``), staged STAGE_K k at a time; ``c_val`` ends with
    its deferred accumulator. Blocks start every nfma k from each range's start; those past K (zero padding of a
    split tile) run on the accumulator alone, as in the reference."""
    m0 = np.int32(cuda.blockIdx.y * BLOCK_M)
    n0 = np.int32(cuda.blockIdx.x * BLOCK_N)
    r0 = np.uint32(cuda.threadIdx.y * ROWS)
    j0 = np.uint32(cuda.threadIdx.x * COLS)
    nfma = params[0]
    for r in range(ROWS):
        for j in range(COLS):
            c_val[r, j] = np.float32(0.0)
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, schedule[0], schedule[5], i)
        for c0 in range(np.int32(k0), np.int32(k1), STAGE_K):
            if c0 < K:
                cuda.syncthreads()  # every thread is done with the previous stage
                _stage(a, m0, c0, BLOCK_M, sh_a)
                _stage(b, n0, c0, BLOCK_N, sh_b)
                cuda.syncthreads()
            # Stage-local block bounds: [kb, ke), empty past K.
            stop = np.int32(min(STAGE_K, k1 - c0))
            valid = np.int32(max(min(STAGE_K, K - c0), 0))
            for kb in range(0, stop, nfma):
                ke = np.int32(max(min(kb + nfma, valid), kb))
                offset_block(sh_a[0], sh_a[1], sh_a[2], sh_a[3], r0, sh_b[0], sh_b[1], sh_b[2], sh_b[3], j0,
                             np.uint32(kb), np.uint32(ke), params, c_val, work)


@cuda.jit(device=True, fastmath=False)
def _split_partial(a, b, K, s, schedule, params, sh_a, sh_b, partial):
    """``partial`` = the fp32 sum, in increasing k, of the chains of split s from +0 (``split_partial``); the
    thread's block state lives here (local arrays are handed down to callees, never returned)."""
    work = (cuda.local.array((ROWS, COLS), uint32), cuda.local.array((ROWS, COLS), float32),
            cuda.local.array((ROWS, COLS), uint32), cuda.local.array((ROWS, COLS), uint32))
    c_val = cuda.local.array((ROWS, COLS), float32)
    frac_out = params[2]
    for r in range(ROWS):
        for j in range(COLS):
            partial[r, j] = np.float32(0.0)
            work[0][r, j] = np.uint32(0x04000400)  # no exponent term yet (offset_block's entry state)
    for c in range(split_chains(K, s, schedule)):
        first, stride, count = chain_tiles_of(K, s, c, schedule)
        _chain(a, b, K, first, stride, count, schedule, params, sh_a, sh_b, work, c_val)
        for r in range(ROWS):
            for j in range(COLS):
                partial[r, j] = np.float32(partial[r, j] + offset_chain_value(c_val[r, j], frac_out))


@cuda.jit(device=True, fastmath=False)
def _write(out, acc):
    m0 = cuda.blockIdx.y * BLOCK_M + cuda.threadIdx.y * ROWS
    n0 = cuda.blockIdx.x * BLOCK_N + cuda.threadIdx.x * COLS
    for r in range(ROWS):
        for j in range(COLS):
            if m0 + r < out.shape[0] and n0 + j < out.shape[1]:
                out[m0 + r, n0 + j] = acc[r, j]


@cuda.jit(fastmath=False, **shim.register_cap(REGISTERS))
def gemm_offset(a_val, a_exp, a_low, a_sign, a_cols, b_val, b_exp, b_low, b_sign, b_cols, K, schedule, params, out):
    """out[m, n] for a BLOCK_M x BLOCK_N tile per thread block; see the module docstring. The operands are packed
    panels (:func:`decode_operand`) seen flat with a_cols / b_cols rows, K the operands' own length. The split
    partials are combined in the order of ``combine_step`` (one partial, added to +0, when unsplit); every thread
    of the block walks the same schedule, so barriers are uniform."""
    sh_a, sh_b = _stages()
    partial = cuda.local.array((ROWS, COLS), float32)
    acc = cuda.local.array((ROWS, COLS), float32)
    slot = cuda.local.array((ROWS, COLS), float32)
    a = (a_val, a_exp, a_low, a_sign, a_cols)
    b = (b_val, b_exp, b_low, b_sign, b_cols)
    splits = schedule[1]
    for r in range(ROWS):
        for j in range(COLS):
            acc[r, j] = np.float32(0.0)
            slot[r, j] = np.float32(0.0)
    for i in range(splits):
        s, target, flush = combine_step(splits, schedule[4], i)
        _split_partial(a, b, np.int32(K), s, schedule, params, sh_a, sh_b, partial)
        for r in range(ROWS):
            for j in range(COLS):
                acc[r, j], slot[r, j] = combine(acc[r, j], slot[r, j], partial[r, j], target, flush)
    _write(out, acc)
