"""The sm_89 instructions of ``cuda:native``, as inline PTX (``@intrinsic`` + ``builder.asm``), each with an exact CPU
twin that kernels call under numba's CUDA simulator.

On sm_89 (Ada) ``mma.sync.aligned.m16n8k32.row.col.f32.<atype>.<btype>.f32`` is a native FP8 tensor-core
instruction (SASS ``QMMA.16832.F32.<A>.<B>``). What it computes is the ada preset's block step twice: the
Khattak-Mikaitis Ada recordings (``tests/data/km_vectors.npz``, 5000 + 5000 single instructions, E4M3 and E5M2, with
c) all equal the chain of two 16-product ada blocks over k = 0..15 (c enters there) and then k = 16..31, and fail
in the other order (3365 and 3812 of 5000). On sm_90 and sm_100 the same PTX is not a native FP8 instruction:
ptxas converts the operands to fp16 and issues ``HMMA.16816`` with c added afterwards (other numerics), so this
instruction never stands in for the hopper preset; ``cuda:native`` issues it on sm_89 only
(:data:`mmaemu.cuda.catalog.NATIVE_INSTRUCTIONS`). sm_120 also runs it as ``QMMA``, but no recording says it
computes the ada block there, so it is not used there either.

A group of four warps (128 threads) computes 64 x 128 outputs per 32 k, warp ``w`` the columns ``32 w .. 32 w + 31``
as 4 x 4 tiles of m16n8 (tile ``(mt, nt)`` in accumulator registers ``4 (4 mt + nt) .. + 3``): the same 64 fp32
accumulators per thread as the warpgroup MMA (:mod:`mmaemu.cuda.native.fragment`), from the same staged operands.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32", 8-bit types; ``g = lane >> 2``, ``q = lane & 3``):

* A (16 x 32, row-major): four .b32 registers of four codes each, lowest k in the lowest byte; register ``r`` holds
  row ``g + 8 (r & 1)``, k ``4 q + 16 (r >> 1) .. + 3``;
* B (32 x 8, column-major): two .b32 registers; register ``r`` holds column ``g``, k ``4 q + 16 r .. + 3``;
* C/D (16 x 8, fp32): register ``e`` holds row ``g + 8 (e >> 1)``, column ``2 q + (e & 1)``.

The operands are read from shared memory staged in the warpgroup MMA's core-matrix layout (8 rows x 16 bytes,
``row // 8`` groups ``stride_bytes`` apart, 16-byte k chunks ``leading_bytes`` apart): each fragment register is
one 4-byte ``ld.shared.b32`` at a constant offset from a per-thread base, and the 32 lanes of a warp read 128
contiguous bytes per register (no bank conflicts).

Twins: a load twin reads the calling thread's bytes; the MMA is warp-collective (a thread's outputs depend on the
registers of other lanes), so its twin is too: every thread of the simulated block posts its registers, meets the
others at the block's barrier, rebuilds its warp's A and B tiles from the 32 lanes' registers with the fragment
rules above, and computes its own outputs with the ada block step (:mod:`mmaemu.cuda.native.instruction_model`). The
simulator runs one thread block at a time, and every thread of a native kernel issues every MMA.
"""

from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.core.extending import intrinsic

from ...base._jit import arithmetic
from ...model.presets import ADA
from .. import shim
from . import cp_async
from .cp_async import SIM_SHARED_BASE
from .fragment import FRAGMENT, FRAGMENT_TYPE, fragment_zero
from .instruction_model import instruction_outputs

NAME = "mma_sync"
PRESET = ADA  # the block the instruction computes (the probe checks each device against it)
TARGET = (8, 9)  # compute capability compiled for (no architecture suffix)
SASS_MMA = "QMMA.16832.F32.{a}.{b}"
GROUP_M = 64  # rows per group of 128 threads and 32-k step
GROUP_N = 128
MMA_K = 32
WARP_TILES_M = 4  # m16 tiles per warp
WARP_TILES_N = 4  # n8 tiles per warp
A_WORDS = 4 * WARP_TILES_M
B_WORDS = 2 * WARP_TILES_N
WORD_TYPES = {A_WORDS: types.UniTuple(types.uint32, A_WORDS), B_WORDS: types.UniTuple(types.uint32, B_WORDS)}


def a_offsets(leading_bytes, stride_bytes):
    """Byte offsets of a thread's A registers (register ``4 mt + r``) from its base ``16 g + 4 q``: row group
    ``2 mt + (r & 1)``, k chunk ``r >> 1``."""
    return tuple((2 * mt + (r & 1)) * stride_bytes + (r >> 1) * leading_bytes
                 for mt in range(WARP_TILES_M) for r in range(4))


def b_offsets(leading_bytes, stride_bytes):
    """Byte offsets of a thread's B registers (register ``2 nt + r``) from its base ``4 w stride + 16 g + 4 q``."""
    return tuple(nt * stride_bytes + r * leading_bytes for nt in range(WARP_TILES_N) for r in range(2))


@arithmetic
def fragment_coord(thread, i):
    """(row, column) in the group's 64 x 128 outputs of accumulator register ``i`` of group thread ``thread``."""
    lane = thread & 31
    tile = i >> 2
    row = ((tile >> 2) << 4) + (lane >> 2) + (((i >> 1) & 1) << 3)
    col = ((thread >> 5) << 5) + ((tile & 3) << 3) + ((lane & 3) << 1) + (i & 1)
    return row, col


# ----------------------------------------------------------------------------------------------------------------
# Device intrinsics


def _load_words_intrinsic(offsets):
    """``load(smem, base) -> UniTuple(uint32)``: one ``ld.shared.b32`` at ``base + offset`` per constant offset."""
    count = len(offsets)
    word_type = WORD_TYPES[count]

    @intrinsic
    def load(typingctx, smem, base):
        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
            words = [builder.asm(fnty, f"ld.shared.b32 $0, [$1+{offset}];", "=r,r,~{memory}", [args[1]],
                                 side_effect=True) for offset in offsets]
            return context.make_tuple(builder, word_type, words)

        return word_type(smem, types.uint32), codegen

    return load


def _mma_intrinsic(fmt_a, fmt_b):
    """``mma(fragment, a_words, b_words, thread) -> fragment``: the warp's 16 m16n8k32 tiles."""

    @intrinsic
    def mma(typingctx, fragment, a_words, b_words, thread):
        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            text = (f"mma.sync.aligned.m16n8k32.row.col.f32.{fmt_a}.{fmt_b}.f32 "
                    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
            out = []
            for tile in range(WARP_TILES_M * WARP_TILES_N):
                mt, nt = tile >> 2, tile & 3
                operands = ([builder.extract_value(args[1], 4 * mt + r) for r in range(4)]
                            + [builder.extract_value(args[2], 2 * nt + r) for r in range(2)]
                            + [builder.extract_value(args[0], 4 * tile + e) for e in range(4)])
                result = builder.asm(fnty, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", operands, side_effect=True)
                out += [builder.extract_value(result, e) for e in range(4)]
            return context.make_tuple(builder, FRAGMENT_TYPE, out)

        return FRAGMENT_TYPE(FRAGMENT_TYPE, WORD_TYPES[A_WORDS], WORD_TYPES[B_WORDS], thread), codegen

    return mma


# ----------------------------------------------------------------------------------------------------------------
# CPU twins (numba's CUDA simulator)


def _load_words_twin(offsets):
    def load(smem, base):
        buffer = shim._unwrap(smem)
        words = []
        for offset in offsets:
            start = int(base) + offset - SIM_SHARED_BASE
            if start % 4:
                raise RuntimeError(f"ld.shared.b32 twin: address {int(base) + offset:#x} is not 4-byte aligned")
            words.append(np.uint32(buffer[start:start + 4].view(np.uint32)[0]))
        return tuple(words)

    return load


_POSTED = {}  # block thread id -> (A words, B words) of the MMA being issued (one simulated block at a time)
_POSTED_LOCK = threading.Lock()


def _fragment_positions(registers, rows_of, k_of):
    """(rows, ks) int arrays [32, registers, 4]: where byte j of register i of lane l sits in its matrix."""
    lane, reg, byte = np.meshgrid(np.arange(32), np.arange(registers), np.arange(4), indexing="ij")
    return rows_of(lane >> 2, reg), k_of(lane & 3, reg) + byte


# A: register 4 mt + r holds row 16 mt + g + 8 (r & 1), k 4 q + 16 (r >> 1) + byte; B (by column): register
# 2 nt + r holds column 8 nt + g, k 4 q + 16 r + byte.
_A_POSITIONS = _fragment_positions(A_WORDS, lambda g, i: 16 * (i >> 2) + g + 8 * (i & 1),
                                   lambda q, i: 4 * q + 16 * ((i & 3) >> 1))
_B_POSITIONS = _fragment_positions(B_WORDS, lambda g, i: 8 * (i >> 1) + g, lambda q, i: 4 * q + 16 * (i & 1))


def warp_tiles(a_words, b_words):
    """(A [64, 32], B [32, 32]) uint8 codes of a warp, B by column (K-major), from the 32 lanes' A and B registers
    (sequences indexed by lane), by the fragment rules of the module docstring (lowest k in the lowest byte)."""
    a = np.zeros((GROUP_M, MMA_K), np.uint8)
    b = np.zeros((WARP_TILES_N * 8, MMA_K), np.uint8)
    a[_A_POSITIONS] = np.array(a_words, np.uint32).astype("<u4").view(np.uint8).reshape(32, A_WORDS, 4)
    b[_B_POSITIONS] = np.array(b_words, np.uint32).astype("<u4").view(np.uint8).reshape(32, B_WORDS, 4)
    return a, b


def _mma_twin(fmt_a, fmt_b):
    def mma(fragment, a_words, b_words, thread):
        me = threading.current_thread()
        with _POSTED_LOCK:
            _POSTED[me.thread_id] = (a_words, b_words)
        me.syncthreads()  # every lane has posted its registers
        first = me.thread_id - me.thread_id % 32
        with _POSTED_LOCK:
            lanes = [_POSTED[first + lane] for lane in range(32)]
        me.syncthreads()  # every lane has read them before the next MMA posts again
        a, b = warp_tiles([w[0] for w in lanes], [w[1] for w in lanes])
        lane = int(thread) & 31
        g, q = lane >> 2, lane & 3
        tile = np.arange(FRAGMENT) >> 2
        e = np.arange(FRAGMENT) & 3
        rows = 16 * (tile >> 2) + g + 8 * (e >> 1)
        cols = 8 * (tile & 3) + 2 * q + (e & 1)
        out = instruction_outputs(a[rows], b[cols], np.array(fragment, np.float32), fmt_a, fmt_b, PRESET)
        return tuple(np.float32(v) for v in out)

    return mma


# ----------------------------------------------------------------------------------------------------------------
# The step the native kernels call


_SIMULATED = shim.simulator_enabled()


def _identity(fragment):
    return fragment


# Nothing to fence before a step (mma.sync reads registers) or to wait for after it (its results are in the
# registers when it returns); staged operands need no proxy fence (ld.shared reads them as they were written).
begin = end = _identity if _SIMULATED else cuda.jit(device=True, fastmath=False)(_identity)
copies_wait_one, copies_wait_all = cp_async.copies_wait_one, cp_async.copies_wait_all


def make_step(fmt_a, fmt_b, leading_bytes, stride_bytes):
    """``step(fragment, a_start, b_start, scale_d, smem, thread) -> fragment``: one 32-k step of the group's
    64 x 128 outputs from A at shared address ``a_start`` (64 staged rows) and B at ``b_start`` (128 rows), from the
    fragment (``scale_d`` 1) or from +0 (``scale_d`` 0, a chain's first step); ``thread``: 0..127 in the group."""
    load_a = (_load_words_twin if _SIMULATED else _load_words_intrinsic)(a_offsets(leading_bytes, stride_bytes))
    load_b = (_load_words_twin if _SIMULATED else _load_words_intrinsic)(b_offsets(leading_bytes, stride_bytes))
    mma = (_mma_twin if _SIMULATED else _mma_intrinsic)(fmt_a, fmt_b)
    warp_b_bytes = WARP_TILES_N * stride_bytes

    def step(fragment, a_start, b_start, scale_d, smem, thread):
        lane = thread & 31
        within = (lane >> 2) * 16 + (lane & 3) * 4
        a_words = load_a(smem, np.uint32(a_start + within))
        b_words = load_b(smem, np.uint32(b_start + (thread >> 5) * warp_b_bytes + within))
        if scale_d == 0:
            fragment = fragment_zero()
        return mma(fragment, a_words, b_words, thread)

    return step if _SIMULATED else cuda.jit(device=True, fastmath=False)(step)
