"""The ``cuda:offset`` GEMM kernel: the formulation of :mod:`mmaemu.arith.offset` on a register tile per thread.

Every product is one fp32 fused multiply-add rounding toward zero into an offset accumulator, plus a quarter of an
``IDP4A`` and two integer instructions that count the products it floors one unit too far; the block exponent
costs half an instruction per product: a bf16x2 power-sum fma (E4M3 x E4M3, from sm_80) or a packed 16-bit add
and maximum (other pairs; one instruction on sm_90, two below). Two kernels, the GEMM one compiled once per
exponent pass:

* :func:`decode_operand` packs the FP8 codes of a panel of rows once (:func:`mmaemu.arith.offset.offset_pack_into`)
  into k-major arrays: fp32 values ``val[k, r]``, exponent words ``exp[k // 2, r]`` (paired for the power sums:
  rows 2p and 2p + 1 of one k per word), and the low-byte and sign-byte words of four k side by side,
  ``bytes[k // 4, 2 * r]`` and ``bytes[k // 4, 2 * r + 1]``; padded with zero codes to whole stages and thread
  blocks, so the GEMM kernel stages them with plain 16-byte copies;
* :func:`gemm_offset` (add-max) and :func:`gemm_offset_powers` (power sums): a TY x TX thread block owns BLOCK_M x
  BLOCK_N outputs, each thread a ROWS x COLS tile of them (rows ``ty * ROWS + r``, columns ``tx * COLS + j``:
  adjacent words, vector loads). The block copies STAGE_K k of its rows of A and of B into shared memory (48 KiB,
  the static limit), each thread 16 bytes per load (:func:`mmaemu.cuda.offset.ptx.load4`); each thread runs
  :func:`mmaemu.arith.offset.offset_block` (or :func:`~mmaemu.arith.offset.power_offset_block`) on every block of
  its chains, state in registers, and enters each chain into its split's partial with
  :func:`mmaemu.arith.offset.add_chain_values` (``offset_chain_value`` per output, as the CPU's offset engine).

The schedule (unsplit fast and slow, every split-K scheme) is walked with the functions ``accumulate_one`` uses
(``combine_step``, ``split_chains``, ``chain_tiles_of``, ``chain_range``); presets are those
:func:`offset_decline` accepts. No arithmetic is written here.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32

from ...arith import offset as _offset
from ...arith import schedule as _schedule
from .. import shim
from . import ptx
from .ptx import load4
from ..simple.kernels import chain_range, chain_range_count, chain_tiles_of, combine, combine_step, split_chains

shim.install_fma_toward_zero()
ptx.install()

offset_block = shim.device(_offset.offset_block)
power_offset_block = shim.device(_offset.power_offset_block)
offset_empty_block = shim.device(_offset.offset_empty_block)
add_chain_values = shim.device(_offset.add_chain_values)
clear_tile = shim.device(_schedule.clear_tile)
offset_pack_into = shim.device(_offset.offset_pack_into)

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
STAGE_WORDS4 = STAGE_K // 4  # byte-word pairs per stage (four k each)
BYTES_M = 2 * BLOCK_M  # words per staged row of byte words: a low-byte and a sign-byte word per row of A
BYTES_N = 2 * BLOCK_N
DECODE_BLOCK = (32, 8)  # decode kernel: 32 rows x 8 groups of 4 k per thread block
REGISTERS = 255


def offset_decline(schedule, params):
    """Why the offset kernel does not compute this schedule and preset (None if it does): a preset that
    :func:`mmaemu.arith.offset.offset_preset_decline` accepts, whose blocks tile the STAGE_K-wide stages, and whose
    k-tiles start on a stage (an unsplit fast chain is one range from k = 0)."""
    tile, splits, chain_tiles = int(schedule.tile), int(schedule.splits), int(schedule.chain_tiles)
    nfma = int(params.nfma)
    why = _offset.offset_preset_decline(params)
    if why is not None:
        return why
    if STAGE_K % nfma:
        return f"stages {STAGE_K} k at a time, which nfma={nfma} does not divide"
    if (splits > 1 or chain_tiles) and tile % STAGE_K:
        return f"starts k-tiles on its {STAGE_K}-wide stages, the schedule's tiles are {tile} wide"
    return None


def block_loop_trips(nfma: int):
    """(blocks per stage, passes of the exponent-pass loop per block, passes of the product loop per block) for a
    preset's nfma: what :func:`tools.sass.block_loop_cost` weighs the loops by."""
    words = nfma // 2  # exponent words per block (two k each)
    return (STAGE_K // nfma, words // _offset.EXPONENT_PASS_WORDS - 1,
            nfma // (_offset.K_GROUP * _offset.PRODUCT_PASS_GROUPS))


def products_per_stage() -> int:
    """Products one thread computes per stage: its ROWS x COLS outputs times STAGE_K k."""
    return ROWS * COLS * STAGE_K


@cuda.jit(fastmath=False)
def decode_operand(codes, tables, row0, val, exp, byte_words, paired):
    """Pack four k of row ``row0 + r`` per thread (``offset_pack_into``; zero codes past the rows or past K; row0
    even; ``paired``: power words). Groups stride over the grid's y extent, so any K fits the grid."""
    r, g = cuda.grid(2)
    g_step = cuda.gridDim.y * cuda.blockDim.y
    rows = val.shape[1]
    while g < byte_words.shape[0] and r < rows:
        offset_pack_into(codes, row0 + r, g, tables, r, val, exp, byte_words, paired)
        g += g_step


@cuda.jit(device=True, fastmath=False)
def _copy(source, cols, col0, first, target):
    """``target[i, c] = source[(first + i) * cols + col0 + c]`` for the whole target (the staged part of a flat
    k-major panel), 16 bytes per load: thread t copies words ``4 * (t % quads) ...`` of every ``THREADS //
    quads``-th row i (quads = words per row / 4), so that a warp reads consecutive words. The target's size is a
    multiple of 4 * THREADS words, and cols and col0 are multiples of 4 (16-byte boundaries)."""
    count, width = target.shape
    quads = width // 4
    t = np.uint32(cuda.threadIdx.y * TX + cuda.threadIdx.x)
    c = np.uint32(np.uint32(4) * (t % np.uint32(quads)))
    i0 = np.uint32(t // np.uint32(quads))
    step = THREADS // quads
    flat = np.uint32(np.uint32(np.uint32(first + i0) * np.uint32(cols)) + np.uint32(col0 + c))
    for n in range(count // step):
        w0, w1, w2, w3 = load4(source, np.uint32(flat + np.uint32(np.uint32(n * step) * np.uint32(cols))))
        i = np.uint32(i0 + np.uint32(n * step))
        target[i, c] = w0
        target[i, c + np.uint32(1)] = w1
        target[i, c + np.uint32(2)] = w2
        target[i, c + np.uint32(3)] = w3


@cuda.jit(device=True, fastmath=False)
def _stage(panel, row0, c0, staged):
    """Copy k in [c0, c0 + STAGE_K) of the packed rows from row0 on into shared memory."""
    val, exp, byte_words, cols = panel
    sh_val, sh_exp, sh_bytes = staged
    _copy(val, cols, row0, c0, sh_val)
    _copy(exp, cols, row0, c0 // 2, sh_exp)
    _copy(byte_words, 2 * cols, 2 * row0, c0 // 4, sh_bytes)


@cuda.jit(device=True, fastmath=False)
def _stages():
    """The block's staged operands in shared memory (one set per kernel: call once per thread). Each array is a
    multiple of 16 bytes, so ptxas, which places them, starts each on a 16-byte boundary (it vectorises the product
    loop's loads from them itself); the exponent pass's explicit 16-byte loads (``load_words4``) rely on that."""
    # One allocation per line: numba's simulator tells shared arrays apart by the line that allocates them.
    a_val = cuda.shared.array((STAGE_K, BLOCK_M), float32)
    a_exp = cuda.shared.array((STAGE_WORDS2, BLOCK_M), uint32)
    a_bytes = cuda.shared.array((STAGE_WORDS4, BYTES_M), uint32)
    b_val = cuda.shared.array((STAGE_K, BLOCK_N), float32)
    b_exp = cuda.shared.array((STAGE_WORDS2, BLOCK_N), uint32)
    b_bytes = cuda.shared.array((STAGE_WORDS4, BYTES_N), uint32)
    return (a_val, a_exp, a_bytes), (b_val, b_exp, b_bytes)


@cuda.jit(device=True, fastmath=False)
def _combine_into(out, slot, paired, partial, first, target, flush):
    """Enter a split's partial into the thread's outputs as ``combine_step`` says: the accumulator lives in
    ``out`` (+0 before the first partial) and, for a pairwise schedule (``paired``), the slot in ``slot`` (global
    memory: the thread's registers hold only the chain state; each thread touches only its own outputs)."""
    m0 = cuda.blockIdx.y * BLOCK_M + cuda.threadIdx.y * ROWS
    n0 = cuda.blockIdx.x * BLOCK_N + cuda.threadIdx.x * COLS
    for r in range(ROWS):
        for j in range(COLS):
            m, n = m0 + r, n0 + j
            if m < out.shape[0] and n < out.shape[1]:
                acc = np.float32(0.0) if first else out[m, n]
                held = slot[m, n] if paired else np.float32(0.0)
                acc, held = combine(acc, held, partial[r, j], target, flush)
                out[m, n] = acc
                if paired:
                    slot[m, n] = held


_COMPILED_HERE = set()


def compile_for_simulator(block_step, constants):
    """Compile ``block_step`` (an arithmetic dispatcher of :mod:`mmaemu.arith.offset`) and the block-end helpers
    in the calling thread for the types the GEMM kernel's threads call them with (stage arrays, uint32 offsets,
    ``constants``), once per process and block step. Only for numba's simulator: there each thread of a block is a
    Python thread, and a compilation started inside a block competes with the other 255 threads for the
    interpreter, taking several times longer than here (the results are the same)."""
    if (block_step, constants) in _COMPILED_HERE:
        return
    sh_a = (np.zeros((STAGE_K, BLOCK_M), np.float32), np.zeros((STAGE_WORDS2, BLOCK_M), np.uint32),
            np.zeros((STAGE_WORDS4, BYTES_M), np.uint32))
    sh_b = (np.zeros((STAGE_K, BLOCK_N), np.float32), np.zeros((STAGE_WORDS2, BLOCK_N), np.uint32),
            np.zeros((STAGE_WORDS4, BYTES_N), np.uint32))
    work = tuple(np.zeros((ROWS, COLS), t) for t in (np.uint32, np.float32, np.uint32, np.uint32))
    c_val = np.zeros((ROWS, COLS), np.float32)
    u = np.uint32
    block_step(*sh_a, u(0), *sh_b, u(0), u(0), u(constants.nfma), constants, c_val, work)
    _offset.offset_empty_block(constants, c_val, work)
    _offset.add_chain_values(c_val, c_val, constants.frac_out)
    _schedule.clear_tile(c_val)
    _COMPILED_HERE.add((block_step, constants))


def _gemm_kernel(block_step):
    """The GEMM kernel whose threads run ``block_step`` (:func:`mmaemu.arith.offset.offset_block` or
    :func:`~mmaemu.arith.offset.power_offset_block`) on every block: one source, one kernel per exponent pass."""

    @cuda.jit(device=True, fastmath=False)
    def chain(a, b, K, first, stride, count, schedule, constants, sh_a, sh_b, work, c_val):
        """One chain from +0 over ``count`` k-tiles (``chain_range``), staged STAGE_K k at a time; ``c_val`` ends
        with its deferred accumulator. Blocks start every nfma k from each range's start (a multiple of STAGE_K,
        and nfma divides STAGE_K); those past K (zero padding of a split tile) run on the accumulator alone, as in
        the reference, after the range's staged blocks (they come last in k)."""
        i32 = np.int32
        m0 = i32(cuda.blockIdx.y * BLOCK_M)
        n0 = i32(cuda.blockIdx.x * BLOCK_N)
        r0 = np.uint32(cuda.threadIdx.y * ROWS)
        j0 = np.uint32(cuda.threadIdx.x * COLS)
        nfma = i32(constants.nfma)
        clear_tile(c_val)
        for i in range(chain_range_count(stride, count)):
            k0, k1 = chain_range(K, first, stride, count, schedule.tile, schedule.padded, i)
            data_end = i32(min(i32(k1), K))
            c0 = i32(k0)
            while c0 < data_end:  # the block loop: one stage per pass
                cuda.syncthreads()  # every thread is done with the previous stage
                _stage(a, m0, c0, sh_a)
                _stage(b, n0, c0, sh_b)
                cuda.syncthreads()
                stop = i32(min(i32(STAGE_K), i32(data_end - c0)))  # blocks that start before the data's end
                valid = i32(min(i32(STAGE_K), i32(K - c0)))
                kb = i32(0)
                while kb < stop:
                    block_step(sh_a[0], sh_a[1], sh_a[2], r0, sh_b[0], sh_b[1], sh_b[2], j0, np.uint32(kb),
                               np.uint32(min(i32(kb + nfma), valid)), constants, c_val, work)
                    kb += nfma
                c0 += i32(STAGE_K)
            kb = i32(k0)
            while kb < data_end:
                kb += nfma
            while kb < i32(k1):  # blocks past K
                offset_empty_block(constants, c_val, work)
                kb += nfma

    @cuda.jit(device=True, fastmath=False)
    def split_partial(a, b, K, s, schedule, constants, sh_a, sh_b, partial):
        """``partial`` = the fp32 sum, in increasing k, of the chains of split s from +0 (``split_partial``); the
        thread's block state lives here (local arrays are handed down to callees, never returned)."""
        work = (cuda.local.array((ROWS, COLS), uint32), cuda.local.array((ROWS, COLS), float32),
                cuda.local.array((ROWS, COLS), uint32), cuda.local.array((ROWS, COLS), uint32))
        c_val = cuda.local.array((ROWS, COLS), float32)
        clear_tile(partial)
        for c in range(split_chains(K, s, schedule)):
            first, stride, count = chain_tiles_of(K, s, c, schedule)
            chain(a, b, K, first, stride, count, schedule, constants, sh_a, sh_b, work, c_val)
            add_chain_values(partial, c_val, constants.frac_out)

    @cuda.jit(fastmath=False, **shim.register_cap(REGISTERS))
    def gemm(a_val, a_exp, a_bytes, a_cols, b_val, b_exp, b_bytes, b_cols, K, schedule, constants, out, slot):
        """out[m, n] for a BLOCK_M x BLOCK_N tile per thread block; see the module docstring. The operands are
        packed panels (:func:`decode_operand`) seen flat with a_cols / b_cols rows, K the operands' own length.
        The split partials are combined in the order of ``combine_step`` (one partial, added to +0, when unsplit);
        ``slot`` (out's shape) holds the pairwise scheme's slot, any other schedule passes a 1 x 1 array that is
        never touched. Every thread of the block walks the same schedule, so barriers are uniform."""
        sh_a, sh_b = _stages()
        partial = cuda.local.array((ROWS, COLS), float32)
        a = (a_val, a_exp, a_bytes, a_cols)
        b = (b_val, b_exp, b_bytes, b_cols)
        splits = schedule.splits
        paired = splits > 1 and schedule.pairwise != 0
        for i in range(splits):
            s, target, flush = combine_step(splits, schedule.pairwise, i)
            split_partial(a, b, np.int32(K), s, schedule, constants, sh_a, sh_b, partial)
            _combine_into(out, slot, paired, partial, i == 0, target, flush)

    return gemm


gemm_offset = _gemm_kernel(offset_block)  # exponents by add-max: any format pair
gemm_offset_powers = _gemm_kernel(power_offset_block)  # exponents by power sums: E4M3 x E4M3, sm_80 and newer
