"""The sm_90a instructions of the native kernel, as inline PTX (``@intrinsic`` + ``builder.asm``), each with an
exact CPU twin that kernels call under numba's CUDA simulator.

Instructions (PTX ISA 8.0+, target ``sm_90a``):

* ``wgmma.mma_async.sync.aligned.m64n128k32.f32.<atype>.<btype> d, a-desc, b-desc, scale-d, 1, 1`` - a warpgroup
  (4 warps, 128 threads) computes D[64, 128] = A[64, 32] x B[32, 128] (+ D when the predicate scale-d is true).
  FP8 operands come from shared memory through 64-bit matrix descriptors and must be K-major ("A row-major,
  B column-major"; the transpose immediates exist only for f16/bf16). The fp32 accumulator lives in 64 registers
  per thread: register ``i`` of thread ``t`` holds row ``16 (t // 32) + (t % 32) // 4 + 8 ((i % 4) // 2)`` and
  column ``8 (i // 4) + 2 (t % 4) + i % 2`` (:func:`fragment_coords`).
* ``wgmma.fence.sync.aligned`` before a wgmma reads registers written otherwise; ``wgmma.commit_group.sync.aligned``
  and ``wgmma.wait_group.sync.aligned N`` before its results are read. The fence and the wait take the fragment in
  and out (tied registers), so the compiler cannot move a use of the accumulator across them.
* ``fence.proxy.async.shared::cta`` after the ``cp.async`` copies landed (:mod:`mmaemu.cuda.native.cp_async`): data
  written to shared memory through the generic proxy must be made visible to the async proxy that wgmma reads it
  through.

Matrix descriptor (no swizzle, the "interleave" layout): bits 0-13 the start address >> 4, bits 16-29 the leading
dimension byte offset >> 4, bits 32-45 the stride dimension byte offset >> 4, bits 49-51 the base offset (0),
bits 62-63 the swizzle mode (0 = none). For K-major operands the core matrix is 8 rows x 16 bytes stored as 128
contiguous bytes (row r at r * 16); the leading byte offset is the distance between core matrices adjacent in K,
the stride byte offset the distance between core matrices adjacent in M (A) or N (B). So element (r, k) of a
descriptor's matrix lies at ``start + (r // 8) * SBO + (r % 8) * 16 + (k // 16) * LBO + k % 16``
(:func:`descriptor_offset`). Start addresses must be 16-byte aligned.

Sources relied on: the PTX ISA (sections "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions":
wgmma.mma_async syntax and FP8 variants, "Register Fragments and Shared Memory Matrix Layouts", "Matrix Descriptor
Format"; cp.async; fence.proxy.async); the descriptor bit table as documented for Mojo's ``WGMMADescriptor``;
MMA-Sim's sm_90 test kernels (an independent tensor-core model: they store a 64 x 32 FP8 tile with LBO = 128
between the two 16-byte K halves and SBO = 256 between 8-row groups, and read the accumulator with the row/column
formula above); TensorRT-LLM's ``gmma_impl.cuh`` (the ``m64nNk32.f32.e4m3.e4m3`` operand list with an immediate
scale-d) and CUTLASS's ``GmmaDescriptor`` (the same bit fields). Numba specifics: the fragment is a
``UniTuple(float32, 64)`` (an LLVM ``[64 x float]`` value that stays in registers); on a device the intrinsics
compile with numba-cuda, which targets ``sm_90a`` on a CC 9.0 device (numba's built-in target cannot name it;
offline, :func:`tools.ptx_offline.compile_ptx` renames its sm_90 target).

The twins (selected when ``NUMBA_ENABLE_CUDASIM=1``) compute what the instruction computes for the calling
thread: a wgmma twin decodes the descriptors, reads the two tiles from the kernel's shared buffer, and returns
the thread's 64 outputs of the hopper preset's block step (:mod:`mmaemu.cuda.native.instruction_model`) from the
thread's own accumulator registers. No output depends on another thread's registers (each accumulator element
lives in exactly one thread, the operands come from shared memory), so a per-thread twin is faithful. Fences,
commits and waits are no-ops there (the simulator's copies are synchronous).

This module is one of the two instructions of ``cuda:native`` (the other is :mod:`mmaemu.cuda.native.mma_sync`); both
offer the names the native kernels use: ``NAME``, ``PRESET``, ``TARGET``, ``SASS_MMA``, ``GROUP_M`` x ``GROUP_N``
outputs per group of 128 threads and ``MMA_K``, :func:`fragment_coord`, :func:`make_step`, ``begin`` / ``end``
around a stage's steps, and ``copies_wait_one`` / ``copies_wait_all``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types
from numba.core.extending import intrinsic

from ...base._jit import arithmetic
from ...model.presets import HOPPER
from .. import shim
from .cp_async import SIM_SHARED_BASE, statement_or_nothing
from .fragment import FRAGMENT, FRAGMENT_TYPE, asm_fragment, statement_or_identity
from .instruction_model import FORMAT_PAIRS, instruction_outputs

NAME = "wgmma"
PRESET = HOPPER  # the block the instruction computes (the probe checks each device against it)
TARGET = (9, 0, "a")  # sm_90a: the warpgroup MMA is architecture-specific
SASS_MMA = "QGMMA.64x128x32.F32.{a}.{b}"
MMA_M = 64  # rows of A (and of D) per warpgroup instruction
MMA_N = 128  # columns of B (and of D)
MMA_K = 32  # products per output and instruction: one hopper block
GROUP_M, GROUP_N = MMA_M, MMA_N
WARPGROUP = 128
CORE_ROWS = 8  # a core matrix: 8 rows of 16 bytes, 128 contiguous bytes
CORE_BYTES = 16
assert FRAGMENT == MMA_M * MMA_N // WARPGROUP


# ----------------------------------------------------------------------------------------------------------------
# Descriptors and layout (plain integer code: the kernels, the twins and the tests share it)


@arithmetic
def matrix_descriptor(address, leading_bytes, stride_bytes):
    """64-bit wgmma matrix descriptor (no swizzle, base offset 0) of the shared-memory address ``address``."""
    desc = np.uint64((address & 0x3FFFF) >> 4)
    desc |= np.uint64((leading_bytes & 0x3FFFF) >> 4) << np.uint64(16)
    desc |= np.uint64((stride_bytes & 0x3FFFF) >> 4) << np.uint64(32)
    return desc


def descriptor_fields(desc):
    """(start address, leading byte offset, stride byte offset, base offset, swizzle mode) of a descriptor."""
    desc = int(desc)
    return ((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, (desc >> 49) & 7,
            desc >> 62)


def descriptor_offset(rows, cols, leading_bytes, stride_bytes):
    """int64 [rows, cols]: byte offset from the start address of element (r, k) of a K-major no-swizzle matrix."""
    r = np.arange(rows)[:, None]
    k = np.arange(cols)[None, :]
    return ((r // CORE_ROWS) * stride_bytes + (r % CORE_ROWS) * CORE_BYTES + (k // CORE_BYTES) * leading_bytes
            + k % CORE_BYTES)


@arithmetic
def fragment_coord(thread, i):
    """(row, column) of D held by accumulator register ``i`` of warpgroup thread ``thread`` (0..127): row
    ``16 warp + lane // 4 + 8 ((i % 4) // 2)``, column ``8 (i // 4) + 2 (lane % 4) + i % 2`` (shifts and masks:
    non-negative operands)."""
    lane = thread & 31
    row = ((thread >> 5) << 4) + (lane >> 2) + (((i >> 1) & 1) << 3)
    return row, ((i >> 2) << 3) + ((lane & 3) << 1) + (i & 1)


def fragment_coords(thread):
    """(rows, cols) int arrays [FRAGMENT]: :func:`fragment_coord` of every register of warpgroup thread
    ``thread``."""
    coords = np.array([fragment_coord(thread, i) for i in range(FRAGMENT)])
    return coords[:, 0], coords[:, 1]


# ----------------------------------------------------------------------------------------------------------------
# Device intrinsics


def _wgmma_intrinsic(fmt_a, fmt_b):
    registers = ", ".join(f"${i}" for i in range(FRAGMENT))
    desc_a, desc_b, scale = 2 * FRAGMENT, 2 * FRAGMENT + 1, 2 * FRAGMENT + 2
    # scale-d is a predicate: set from the int operand inside the statement.
    text = ("{\n.reg .pred p;\n"
            f"setp.ne.b32 p, ${scale}, 0;\n"
            f"wgmma.mma_async.sync.aligned.m{MMA_M}n{MMA_N}k{MMA_K}.f32.{fmt_a}.{fmt_b} "
            f"{{{registers}}}, ${desc_a}, ${desc_b}, p, 1, 1;\n}}")

    @intrinsic
    def wgmma(typingctx, fragment, desc_a, desc_b, scale_d, smem, thread):
        sig = FRAGMENT_TYPE(FRAGMENT_TYPE, types.uint64, types.uint64, types.int32, smem, thread)

        def codegen(context, builder, signature, args):
            return asm_fragment(builder, context, text, args[0], args[1:4], ("l", "l", "r"))

        return sig, codegen

    return wgmma


# ----------------------------------------------------------------------------------------------------------------
# CPU twins (numba's CUDA simulator)


def _wgmma_twin(fmt_a, fmt_b):
    def wgmma(fragment, desc_a, desc_b, scale_d, smem, thread):
        buffer = shim._unwrap(smem)
        tiles = []
        for desc, rows in ((desc_a, MMA_M), (desc_b, MMA_N)):
            start, leading, stride, base, swizzle = descriptor_fields(desc)
            if swizzle or base:
                raise RuntimeError(f"wgmma twin: only the no-swizzle layout is modelled (swizzle {swizzle}, base "
                                   f"offset {base})")
            if start % CORE_BYTES:
                raise RuntimeError(f"wgmma twin: start address {start:#x} is not 16-byte aligned")
            tiles.append(buffer[start - SIM_SHARED_BASE + descriptor_offset(rows, MMA_K, leading, stride)])
        rows, cols = fragment_coords(int(thread) % WARPGROUP)
        c = np.array(fragment, np.float32) if int(scale_d) else np.zeros(FRAGMENT, np.float32)
        out = instruction_outputs(tiles[0][rows], tiles[1][cols], c, fmt_a, fmt_b, PRESET)
        return tuple(np.float32(v) for v in out)

    return wgmma


# ----------------------------------------------------------------------------------------------------------------
# The names the native kernels call: intrinsics on a device, twins under the simulator

_SIMULATED = shim.simulator_enabled()

WGMMA = {pair: (_wgmma_twin if _SIMULATED else _wgmma_intrinsic)(*pair) for pair in FORMAT_PAIRS}
begin = statement_or_identity("wgmma.fence.sync.aligned;")
_commit = statement_or_nothing("wgmma.commit_group.sync.aligned;")
_wait_all = statement_or_identity("wgmma.wait_group.sync.aligned 0;")
# Wait until at most one (or no) group of copies is in flight, then make the landed stage visible to wgmma's async
# proxy.
copies_wait_one = statement_or_nothing("cp.async.wait_group 1;\nfence.proxy.async.shared::cta;")
copies_wait_all = statement_or_nothing("cp.async.wait_group 0;\nfence.proxy.async.shared::cta;")
_descriptor = shim.device(matrix_descriptor)


def _end(fragment):
    """Commit the stage's MMAs and wait for them: the fragment holds their results afterwards."""
    _commit()
    return _wait_all(fragment)


end = _end if _SIMULATED else cuda.jit(device=True, fastmath=False)(_end)


def make_step(fmt_a, fmt_b, leading_bytes, stride_bytes):
    """``step(fragment, a_start, b_start, scale_d, smem, thread) -> fragment``: one warpgroup MMA of the group's
    64 x 128 outputs from A at shared address ``a_start`` and B at ``b_start`` (core matrices ``leading_bytes``
    apart in K, ``stride_bytes`` apart in M/N), from the fragment (``scale_d`` 1) or not (0); issued between
    :data:`begin` and :data:`end`."""
    mma = WGMMA[(fmt_a, fmt_b)]

    def step(fragment, a_start, b_start, scale_d, smem, thread):
        return mma(fragment, _descriptor(a_start, leading_bytes, stride_bytes),
                   _descriptor(b_start, leading_bytes, stride_bytes), scale_d, smem, thread)

    return step if _SIMULATED else cuda.jit(device=True, fastmath=False)(step)
