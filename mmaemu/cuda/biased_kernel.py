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

Schedules: what :func:`biased_decline` accepts (unsplit, fast or slow, early-accumulator presets within the fp32
window); the dispatcher gives other calls to the next kernel. The decoded panels take 12 bytes per operand
element (at most PANEL_BYTES per operand panel at a time). No arithmetic is written here.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from ..arith import biased as _biased
from ..arith import tile as _tile
from . import shim

shim.install_builtin_minmax()
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
MAX_GRID_Y = 65535
# Decoded operand panels are kept below this size (rows of A or B per launch).
PANEL_BYTES = 256 * 2**20
DECODED_BYTES = 12  # pos, neg (fp32) and exp (int32) per operand element


def biased_decline(schedule, params):
    """Why the biased kernel does not compute this schedule and preset (None if it does).

    It walks one unsplit chain (fast: the whole of K; slow: a chain per ``tile`` k, restarted from +0, their fp32
    results added in increasing k) of a preset that :func:`mmaemu.arith.biased.biased_decline` accepts, with
    blocks that tile its BIASED_K-wide stages.
    """
    tile, splits, interleaved, chain_tiles, pairwise, padded = (int(v) for v in schedule)
    nfma, frac, frac_out, late_c = int(params[0]), int(params[3]), int(params[4]), int(params[6])
    why = _biased.biased_decline(nfma, frac, frac_out, late_c)
    if why is not None:
        return why
    if splits != 1:
        return f"computes unsplit GEMMs only, this call has split-K S={splits}"
    if nfma < 1 or BIASED_K % nfma:
        return f"stages {BIASED_K} k at a time, which nfma={nfma} does not divide"
    if chain_tiles not in (0, 1) or padded or (chain_tiles == 1 and tile % nfma):
        return f"walks chains of whole blocks from k = 0, schedule {tuple(schedule)} does not fit"
    return None


@cuda.jit(fastmath=False)
def decode_operand(codes, fmt, row0, pos, neg, exp):
    """``pos[k, r], neg[k, r], exp[k, r] = biased_decode(codes[row0 + r, k])``; code 0 (+0, absent) past the rows
    or past K of ``codes`` (the decoded arrays are padded to whole stages and thread blocks)."""
    r, k = cuda.grid(2)
    if k < pos.shape[0] and r < pos.shape[1]:
        code = np.uint8(0)
        if row0 + r < codes.shape[0] and k < codes.shape[1]:
            code = codes[row0 + r, k]
        pos[k, r], neg[k, r], exp[k, r] = biased_decode(code, fmt)


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
def _flush(c_val, partial):
    """End the tile's chains: partial += chain value (fp32 add, as accumulate_one), then restart from +0."""
    for r in range(BIASED_ROWS):
        for j in range(BIASED_COLS):
            partial[r, j] = np.float32(partial[r, j] + c_val[r, j])
            c_val[r, j] = np.float32(0.0)


@cuda.jit(fastmath=False)
def gemm_biased(a_pos, a_neg, a_exp, a_cols, b_pos, b_neg, b_exp, b_cols, K, schedule, params, out):
    """out[m, n] for a BIASED_M x BIASED_N tile per thread block (see the module docstring): the operands are
    decoded panels [Kp, a_cols] and [Kp, b_cols] (:func:`decode_operand`) seen flat, K the operands' own
    length."""
    sh_ap = cuda.shared.array((BIASED_K, BIASED_M), float32)
    sh_an = cuda.shared.array((BIASED_K, BIASED_M), float32)
    sh_ae = cuda.shared.array((BIASED_K, BIASED_M), int32)
    sh_bp = cuda.shared.array((BIASED_K, BIASED_N), float32)
    sh_bn = cuda.shared.array((BIASED_K, BIASED_N), float32)
    sh_be = cuda.shared.array((BIASED_K, BIASED_N), int32)
    c_val = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    e_max = cuda.local.array((BIASED_ROWS, BIASED_COLS), int32)
    acc_pos = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    acc_neg = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    partial = cuda.local.array((BIASED_ROWS, BIASED_COLS), float32)
    m0 = np.int32(cuda.blockIdx.y * BIASED_M)
    n0 = np.int32(cuda.blockIdx.x * BIASED_N)
    r0 = np.uint32(cuda.threadIdx.y * BIASED_ROWS)
    j0 = np.uint32(cuda.threadIdx.x * BIASED_COLS)
    K = np.int32(K)
    nfma = params[0]
    restart = schedule[0] if schedule[3] else 0  # slow: a chain per tile of k
    for r in range(BIASED_ROWS):
        for j in range(BIASED_COLS):
            partial[r, j] = np.float32(0.0)
            c_val[r, j] = np.float32(0.0)
    for c0 in range(0, K, BIASED_K):
        cuda.syncthreads()  # every thread is done with the previous stage
        _stage(a_pos, a_neg, a_exp, a_cols, m0, c0, BIASED_M, sh_ap, sh_an, sh_ae)
        _stage(b_pos, b_neg, b_exp, b_cols, n0, c0, BIASED_N, sh_bp, sh_bn, sh_be)
        cuda.syncthreads()
        valid = np.int32(min(BIASED_K, K - c0))
        for kb in range(0, valid, nfma):
            if restart and c0 + kb > 0 and (c0 + kb) % restart == 0:
                _flush(c_val, partial)
            biased_block(sh_ap, sh_an, sh_ae, r0, sh_bp, sh_bn, sh_be, j0, kb, min(kb + nfma, valid), params, c_val,
                         e_max, acc_pos, acc_neg)
    _flush(c_val, partial)
    for r in range(BIASED_ROWS):
        m = m0 + r0 + r
        for j in range(BIASED_COLS):
            n = n0 + j0 + j
            if m < out.shape[0] and n < out.shape[1]:
                out[m, n] = np.float32(np.float32(0.0) + partial[r, j])


def _round_up(x: int, step: int) -> int:
    return (x + step - 1) // step * step


def _panel_rows(K: int, block_rows: int) -> int:
    """Rows of an operand decoded at a time: whole thread blocks, at most PANEL_BYTES (at least one block)."""
    rows = PANEL_BYTES // (DECODED_BYTES * _round_up(max(K, 1), BIASED_K))
    return max(block_rows, min(rows, MAX_GRID_Y * BIASED_M) // block_rows * block_rows)


def _decode_panel(codes, fmt, row0, rows, K, alloc, stream):
    """Decoded (pos, neg, exp) arrays [Kp, rows] of codes[row0:row0 + rows] (padded with absent terms), flat, and
    their number of columns."""
    Kp = _round_up(max(K, 1), BIASED_K)
    pos, neg = alloc((Kp, rows), np.float32), alloc((Kp, rows), np.float32)
    exp = alloc((Kp, rows), np.int32)
    grid = ((rows + DECODE_BLOCK[0] - 1) // DECODE_BLOCK[0], (Kp + DECODE_BLOCK[1] - 1) // DECODE_BLOCK[1])
    decode_operand[grid, DECODE_BLOCK, stream](codes, fmt, row0, pos, neg, exp)
    return pos.reshape(-1), neg.reshape(-1), exp.reshape(-1), rows


def launch_biased(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, alloc=None):
    """out [M, N] (fp32) = accumulators of A [M, K] and B [N, K] given as uint8 FP8 codes of formats fmt_a, fmt_b
    (names of mmaemu.arith.tile.TILE_FORMATS), with the biased kernel. RuntimeError if it declines the call.

    ``alloc(shape, dtype)`` gives the work arrays of the decoded panels (default ``cuda.device_array``; the torch
    path passes torch's caching allocator). Operands are decoded in panels of rows (:func:`_panel_rows`).
    """
    from .kernels import quiet_launches

    M, N = out.shape
    K = a_codes.shape[1]
    if M == 0 or N == 0:
        return
    schedule = tuple(int(v) for v in schedule)
    params = tuple(int(v) for v in params)
    why = biased_decline(schedule, params)
    if why is not None:
        raise RuntimeError(f"the biased kernel {why}")
    if alloc is None:
        def alloc(shape, dtype):
            return cuda.device_array(shape, dtype, stream=stream)
    fa = tuple(int(v) for v in _tile.TILE_FORMATS[fmt_a])
    fb = tuple(int(v) for v in _tile.TILE_FORMATS[fmt_b])
    rows_a, rows_b = _panel_rows(K, BIASED_M), _panel_rows(K, BIASED_N)
    with quiet_launches():
        for n0 in range(0, N, rows_b):
            n1 = min(N, n0 + rows_b)
            b = _decode_panel(b_codes, fb, n0, _round_up(n1 - n0, BIASED_N), K, alloc, stream)
            for m0 in range(0, M, rows_a):
                m1 = min(M, m0 + rows_a)
                a = _decode_panel(a_codes, fa, m0, _round_up(m1 - m0, BIASED_M), K, alloc, stream)
                grid = ((n1 - n0 + BIASED_N - 1) // BIASED_N, (m1 - m0 + BIASED_M - 1) // BIASED_M)
                gemm_biased[grid, (BIASED_TX, BIASED_TY), stream](*a, *b, K, schedule, params, out[m0:m1, n0:n1])
