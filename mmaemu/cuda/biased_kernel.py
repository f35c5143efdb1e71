"""The ``cuda:biased`` GEMM kernel: the formulation of :mod:`mmaemu.arith.biased` on a register tile per thread.

Every product is one fp32 fused multiply-add rounding toward zero into a biased accumulator (no float-to-integer
conversion), every exponent maximum one int32 add-then-max. Two kernels:

* :func:`decode_operand` decodes the FP8 codes of a panel of rows once, into k-major arrays split by sign
  (``pos[k, r]``, ``neg[k, r]`` fp32, ``exp[k, r]`` int32; :func:`mmaemu.arith.biased.biased_decode`), padded
  with absent terms (code 0) to whole stages and whole thread blocks, so the GEMM kernel stages without a
  bounds check or a decode;
* :func:`gemm_biased`: a 16 x 8 thread block owns BIASED_M x BIASED_N outputs, each thread a BIASED_ROWS x
  BIASED_COLS tile of them (rows ``ty * BIASED_ROWS + r``, columns ``tx * BIASED_COLS + j``: adjacent words, one
  vector load per operand and k). The block copies BIASED_K k of its rows of A and of B at a time into shared
  memory; each thread then runs :func:`mmaemu.arith.biased.biased_block` on every block of its chains, state in
  registers, and adds the chain results in fp32 as ``accumulate_one`` does.

Schedules: every schedule (unsplit fast and slow, the split-K schemes; :func:`gemm_biased_split` for splits) of
the early-accumulator presets within the fp32 window that :func:`biased_decline` accepts; the dispatcher gives
other calls to the next kernel. The decoded panels take 12 bytes per operand
element (at most PANEL_BYTES per operand panel at a time). No arithmetic is written here.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from ..arith import biased as _biased
from . import shim
from .kernels import chain_range, chain_range_count, chain_tiles_of, combine, combine_step, split_chains

shim.install_fma_toward_zero()

biased_block = shim.device(_biased.biased_block)
biased_decode = shim.device(_biased.biased_decode)

# Geometry. BIASED_K is a multiple of the shipped presets' nfma (32, 16) so that no block straddles two stages.
BIASED_ROWS = 4
BIASED_COLS = 4
BIASED_TY = 8
BIASED_TX = 16
BIASED_THREADS = BIASED_TY * BIASED_TX
BIASED_M = BIASED_TY * BIASED_ROWS
BIASED_N = BIASED_TX * BIASED_COLS
BIASED_K = 32
DECODE_BLOCK = (32, 8)  # decode kernel: 32 rows x 8 k per thread block
# Register caps (ptxas for sm_90 fits the kernels in them without spills; uncapped it takes 128 and 168, which
# halves the thread blocks an SM holds).
UNSPLIT_REGISTERS = 96
SPLIT_REGISTERS = 128


def biased_decline(schedule, params):
    """Why the biased kernel does not compute this schedule and preset (None if it does).

    It computes every schedule (unsplit fast and slow, the split schemes) of a preset that
    :func:`mmaemu.arith.biased.biased_decline` accepts, whose blocks tile its BIASED_K-wide stages and whose k-tiles
    start on a stage (an unsplit fast chain is one range from k = 0).
    """
    tile, splits, interleaved, chain_tiles, pairwise, padded = (int(v) for v in schedule)
    nfma, frac, frac_out, late_c = int(params[0]), int(params[3]), int(params[4]), int(params[6])
    why = _biased.biased_decline(nfma, frac, frac_out, late_c)
    if why is not None:
        return why
    if nfma < 1 or BIASED_K % nfma:
        return f"stages {BIASED_K} k at a time, which nfma={nfma} does not divide"
    if (splits > 1 or chain_tiles) and tile % BIASED_K:
        return f"starts k-tiles on its {BIASED_K}-wide stages, the schedule's tiles are {tile} wide"
    return None


@cuda.jit(fastmath=False)
def decode_operand(codes, fmt, row0, pos, neg, exp):
    """``pos[k, r], neg[k, r], exp[k, r] = biased_decode(codes[row0 + r, k])``; code 0 (+0, absent) past the rows
    or past K of ``codes`` (the decoded arrays are padded to whole stages and thread blocks). k strides over the
    grid's y extent, so any K fits the grid."""
    r, k = cuda.grid(2)
    k_step = cuda.gridDim.y * cuda.blockDim.y
    while k < pos.shape[0] and r < pos.shape[1]:
        code = np.uint8(0)
        if row0 + r < codes.shape[0] and k < codes.shape[1]:
            code = codes[row0 + r, k]
        pos[k, r], neg[k, r], exp[k, r] = biased_decode(code, fmt)
        k += k_step


@cuda.jit(device=True, fastmath=False)
def _stage(pos, neg, exp, cols, row0, c0, rows, sh_pos, sh_neg, sh_exp):
    """Copy k in [c0, c0 + BIASED_K) of ``rows`` decoded rows from row0 into shared memory. The decoded arrays
    are flat [Kp * cols] (k-major); thread t copies row ``t % rows`` at every ``BIASED_THREADS // rows``-th k, so
    a warp reads and writes consecutive words, and one index serves the three arrays."""
    t = np.uint32(cuda.threadIdx.y * BIASED_TX + cuda.threadIdx.x)
    r = np.uint32(t % np.uint32(rows))
    k0 = np.uint32(t // np.uint32(rows))
    step = BIASED_THREADS // rows
    flat = np.uint32(np.uint32(np.uint32(c0 + k0) * np.uint32(cols)) + np.uint32(row0 + r))
    for i in range(BIASED_K // step):
        k = np.uint32(k0 + np.uint32(i * step))
        g = np.uint32(flat + np.uint32(np.uint32(i * step) * np.uint32(cols)))
        sh_pos[k, r] = pos[g]
        sh_neg[k, r] = neg[g]
        sh_exp[k, r] = exp[g]


@cuda.jit(device=True, fastmath=False)
def _zero(tile):
    for r in range(BIASED_ROWS):
        for j in range(BIASED_COLS):
            tile[r, j] = np.float32(0.0)


@cuda.jit(device=True, fastmath=False)
def _chain(a_pos, a_neg, a_exp, a_cols, b_pos, b_neg, b_exp, b_cols, K, first, stride, count, schedule, params,
           sh_a, sh_b, work, c_val):
    """One chain from +0 over ``count`` k-tiles (``chain_range``), staged BIASED_K k at a time; ``c_val`` ends
    with its value. Blocks start every nfma k from each range's start; those past K (zero padding of a split
    tile) run on the accumulator alone, as in the reference."""
    sh_ap, sh_an, sh_ae = sh_a
    sh_bp, sh_bn, sh_be = sh_b
    e_max, acc_pos, acc_neg = work
    m0 = np.int32(cuda.blockIdx.y * BIASED_M)
    n0 = np.int32(cuda.blockIdx.x * BIASED_N)
    r0 = np.uint32(cuda.threadIdx.y * BIASED_ROWS)
    j0 = np.uint32(cuda.threadIdx.x * BIASED_COLS)
    nfma = params[0]
    _zero(c_val)
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, schedule[0], schedule[5], i)
        for c0 in range(np.int32(k0), np.int32(k1), BIASED_K):
            if c0 < K:
                cuda.syncthreads()  # every thread is done with the previous stage
                _stage(a_pos, a_neg, a_exp, a_cols, m0, c0, BIASED_M, sh_ap, sh_an, sh_ae)
                _stage(b_pos, b_neg, b_exp, b_cols, n0, c0, BIASED_N, sh_bp, sh_bn, sh_be)
                cuda.syncthreads()
            # Chunk-local block bounds: [kb, ke) within the stage, empty past K.
            stop = np.int32(min(BIASED_K, k1 - c0))
            valid = np.int32(max(min(BIASED_K, K - c0), 0))
            for kb in range(0, stop, nfma):
                ke = np.int32(max(min(kb + nfma, valid), kb))
                biased_block(sh_ap, sh_an, sh_ae, r0, sh_bp, sh_bn, sh_be, j0, kb, ke, params, c_val, e_max,
                             acc_pos, acc_neg)


@cuda.jit(device=True, fastmath=False)
def _stages():
    """The block's staged operands in shared memory (one set per kernel: call once per thread)."""
    # One allocation per line: numba's simulator tells shared arrays apart by the line that allocates them.
    sh_ap = cuda.shared.array((BIASED_K, BIASED_M), float32)
    sh_an = cuda.shared.array((BIASED_K, BIASED_M), float32)
    sh_ae = cuda.shared.array((BIASED_K, BIASED_M), int32)
    sh_bp = cuda.shared.array((BIASED_K, BIASED_N), float32)
    sh_bn = cuda.shared.array((BIASED_K, BIASED_N), float32)
    sh_be = cuda.shared.array((BIASED_K, BIASED_N), int32)
    return (sh_ap, sh_an, sh_ae), (sh_bp, sh_bn, sh_be)


@cuda.jit(device=True, fastmath=False)
def _split_partial(a, b, K, s, schedule, params, sh_a, sh_b, partial):
    """``partial`` = the fp32 sum, in increasing k, of the chains of split s from +0 (``split_partial``): the
    chains from ``split_chains`` / ``chain_tiles_of``, each walked by :func:`_chain`. The thread's block state
    lives here (local arrays are handed down to callees, never returned)."""
    work = (cuda.local.array((BIASED_ROWS, BIASED_COLS), int32),
            cuda.local.array((BIASED_ROWS, BIASED_COLS), float32),
            cuda.local.array((BIASED_ROWS, BIASED_COLS), float32))
    c_val = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    _zero(partial)
    for c in range(split_chains(K, s, schedule)):
        first, stride, count = chain_tiles_of(K, s, c, schedule)
        _chain(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], K, first, stride, count, schedule, params, sh_a, sh_b,
               work, c_val)
        for r in range(BIASED_ROWS):
            for j in range(BIASED_COLS):
                partial[r, j] = np.float32(partial[r, j] + c_val[r, j])


@cuda.jit(device=True, fastmath=False)
def _write(out, acc):
    m0 = cuda.blockIdx.y * BIASED_M + cuda.threadIdx.y * BIASED_ROWS
    n0 = cuda.blockIdx.x * BIASED_N + cuda.threadIdx.x * BIASED_COLS
    for r in range(BIASED_ROWS):
        for j in range(BIASED_COLS):
            if m0 + r < out.shape[0] and n0 + j < out.shape[1]:
                out[m0 + r, n0 + j] = acc[r, j]


@cuda.jit(fastmath=False, **shim.register_cap(UNSPLIT_REGISTERS))
def gemm_biased(a_pos, a_neg, a_exp, a_cols, b_pos, b_neg, b_exp, b_cols, K, schedule, params, out):
    """out[m, n] for a BIASED_M x BIASED_N tile per thread block, unsplit schedules (one partial, added to +0 as
    accumulate_one does); see the module docstring. The operands are decoded panels [Kp, a_cols] and
    [Kp, b_cols] (:func:`decode_operand`) seen flat, K the operands' own length. Every thread of the block walks
    the same schedule, so barriers are uniform."""
    sh_a, sh_b = _stages()
    partial = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    _split_partial((a_pos, a_neg, a_exp, a_cols), (b_pos, b_neg, b_exp, b_cols), np.int32(K), 0, schedule, params,
                   sh_a, sh_b, partial)
    for r in range(BIASED_ROWS):
        for j in range(BIASED_COLS):
            partial[r, j] = np.float32(np.float32(0.0) + partial[r, j])
    _write(out, partial)


@cuda.jit(fastmath=False, **shim.register_cap(SPLIT_REGISTERS))
def gemm_biased_split(a_pos, a_neg, a_exp, a_cols, b_pos, b_neg, b_exp, b_cols, K, schedule, params, out):
    """:func:`gemm_biased` for split-K schedules: the partials computed and combined in the order of
    ``combine_step`` (a kernel of its own, so that the unsplit one keeps the registers of its two extra tiles)."""
    sh_a, sh_b = _stages()
    partial = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    acc = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    slot = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    splits = schedule[1]
    _zero(acc)
    _zero(slot)
    for i in range(splits):
        s, target, flush = combine_step(splits, schedule[4], i)
        _split_partial((a_pos, a_neg, a_exp, a_cols), (b_pos, b_neg, b_exp, b_cols), np.int32(K), s, schedule,
                       params, sh_a, sh_b, partial)
        for r in range(BIASED_ROWS):
            for j in range(BIASED_COLS):
                acc[r, j], slot[r, j] = combine(acc[r, j], slot[r, j], partial[r, j], target, flush)
    _write(out, acc)
