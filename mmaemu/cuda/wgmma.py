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
* ``cp.async.cg.shared.global [dst], [src], 16`` with ``cp.async.commit_group`` / ``cp.async.wait_group N``
  (sm_80+), and ``fence.proxy.async.shared::cta``: data written to shared memory through the generic proxy must be
  made visible to the async proxy that wgmma reads it through.

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
``UniTuple(float32, 64)`` (an LLVM ``[64 x float]`` value that stays in registers); the intrinsics compile with
numba-cuda, which targets ``sm_90a`` on a CC 9.0 device (numba's built-in target cannot).

The twins (selected when ``NUMBA_ENABLE_CUDASIM=1``) compute what the instruction computes for the calling
thread: a wgmma twin decodes the descriptors, reads the two tiles from the kernel's shared buffer, and returns
the thread's 64 outputs of the hopper preset's block step (:mod:`mmaemu.cuda.instruction_model`) from the
thread's own accumulator registers. No output depends on another thread's registers (each accumulator element
lives in exactly one thread), so a per-thread twin is faithful. The simulator gives the shared buffer the fake
address :data:`SIM_SHARED_BASE` (deliberately not 128-byte aligned), so the kernel's alignment and address
arithmetic run as on a device; fences, commits and waits are no-ops there (the simulator's copies are synchronous).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .._jit import arithmetic
from ..model.presets import HOPPER
from . import shim
from .instruction_model import instruction_outputs

MMA_M = 64  # rows of A (and of D) per warpgroup instruction
MMA_N = 128  # columns of B (and of D)
MMA_K = 32  # products per output and instruction: one hopper block
FRAGMENT = MMA_M * MMA_N // 128  # fp32 accumulator registers per thread
WARPGROUP = 128
CORE_ROWS = 8  # a core matrix: 8 rows of 16 bytes, 128 contiguous bytes
CORE_BYTES = 16
SIM_SHARED_BASE = 0x4030  # simulator: the shared buffer's fake address (16-aligned, not 128-aligned)
# The instruction's arithmetic as mmaemu models it (the gate checks the device against it).
INSTRUCTION_PRESET = HOPPER
FRAGMENT_TYPE = types.UniTuple(types.float32, FRAGMENT)


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


def _asm_fragment(builder, context, text, fragment, extra_values, extra_constraints):
    """Emit ``text`` with the fragment as tied in/out "f" registers ($0..$63 out, then the fragment in, then the
    extra operands) and return the new fragment tuple."""
    f32 = ir.FloatType()
    values = [builder.extract_value(fragment, i) for i in range(FRAGMENT)]
    out_type = ir.LiteralStructType([f32] * FRAGMENT)
    fnty = ir.FunctionType(out_type, [f32] * FRAGMENT + [v.type for v in extra_values])
    constraints = ",".join(["=f"] * FRAGMENT + [str(i) for i in range(FRAGMENT)] + list(extra_constraints)
                           + ["~{memory}"])
    result = builder.asm(fnty, text, constraints, values + list(extra_values), side_effect=True)
    return context.make_tuple(builder, FRAGMENT_TYPE, [builder.extract_value(result, i) for i in range(FRAGMENT)])


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
            return _asm_fragment(builder, context, text, args[0], args[1:4], ("l", "l", "r"))

        return sig, codegen

    return wgmma


def _fragment_statement(text):
    @intrinsic
    def statement(typingctx, fragment):
        def codegen(context, builder, signature, args):
            return _asm_fragment(builder, context, text, args[0], (), ())

        return FRAGMENT_TYPE(FRAGMENT_TYPE), codegen

    return statement


def _statement(text):
    @intrinsic
    def statement(typingctx):
        def codegen(context, builder, signature, args):
            builder.asm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", [], side_effect=True)
            return context.get_dummy_value()

        return types.none(), codegen

    return statement


@intrinsic
def _shared_address(typingctx, array):
    """The 32-bit shared-window address of a shared array's first element."""

    def codegen(context, builder, signature, args):
        data = cgutils.create_struct_proxy(signature.args[0])(context, builder, value=args[0]).data
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64)])
        window = builder.asm(fnty, "cvta.to.shared.u64 $0, $1;", "=l,l", [builder.ptrtoint(data, ir.IntType(64))],
                             side_effect=False)
        return builder.trunc(window, ir.IntType(32))

    return types.uint32(array), codegen


@intrinsic
def _copy16(typingctx, smem, dst, source, offset):
    """cp.async of 16 bytes from ``source`` (a global array) at byte ``offset`` to shared address ``dst``."""

    def codegen(context, builder, signature, args):
        data = cgutils.create_struct_proxy(signature.args[2])(context, builder, value=args[2]).data
        address = builder.add(builder.ptrtoint(data, ir.IntType(64)), builder.sext(args[3], ir.IntType(64))
                              if args[3].type.width < 64 else args[3])
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.IntType(64)])
        builder.asm(fnty, "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}", [args[1], address],
                    side_effect=True)
        return context.get_dummy_value()

    return types.none(smem, types.uint32, source, offset), codegen


@intrinsic
def _fragment_zero(typingctx):
    def codegen(context, builder, signature, args):
        zero = context.get_constant(types.float32, 0.0)
        return context.make_tuple(builder, FRAGMENT_TYPE, [zero] * FRAGMENT)

    return FRAGMENT_TYPE(), codegen


@intrinsic
def _fragment_add(typingctx, total, fragment):
    """Element-wise fp32 addition (IEEE, round to nearest even; no contraction: plain LLVM fadd)."""

    def codegen(context, builder, signature, args):
        sums = [builder.fadd(builder.extract_value(args[0], i), builder.extract_value(args[1], i))
                for i in range(FRAGMENT)]
        return context.make_tuple(builder, FRAGMENT_TYPE, sums)

    return FRAGMENT_TYPE(FRAGMENT_TYPE, FRAGMENT_TYPE), codegen


@intrinsic
def _fragment_to_array(typingctx, fragment, array):
    """array[i] = fragment[i] for every register (constant indices: no switch over a runtime index)."""

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[1])(context, builder, value=args[1])
        for i in range(FRAGMENT):
            pointer = cgutils.get_item_pointer(context, builder, signature.args[1], ary,
                                               [context.get_constant(types.intp, i)])
            builder.store(builder.extract_value(args[0], i), pointer)
        return context.get_dummy_value()

    return types.none(FRAGMENT_TYPE, array), codegen


@intrinsic
def _fragment_from_array(typingctx, array):
    """The fragment whose register i is array[i] (constant indices)."""

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, value=args[0])
        values = [builder.load(cgutils.get_item_pointer(context, builder, signature.args[0], ary,
                                                        [context.get_constant(types.intp, i)]))
                  for i in range(FRAGMENT)]
        return context.make_tuple(builder, FRAGMENT_TYPE, values)

    return FRAGMENT_TYPE(array), codegen


def _wait_async_copies_intrinsic(pending):
    return _statement(f"cp.async.wait_group {pending};\nfence.proxy.async.shared::cta;")


# ----------------------------------------------------------------------------------------------------------------
# CPU twins (numba's CUDA simulator)


def _sim_array(array):
    return shim._unwrap(array)


def _wgmma_twin(fmt_a, fmt_b):
    def wgmma(fragment, desc_a, desc_b, scale_d, smem, thread):
        buffer = _sim_array(smem)
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
        out = instruction_outputs(tiles[0][rows], tiles[1][cols], c, fmt_a, fmt_b, INSTRUCTION_PRESET)
        return tuple(np.float32(v) for v in out)

    return wgmma


def _identity(fragment):
    return fragment


def _nothing():
    return None


def _fragment_zero_twin():
    return (np.float32(0.0),) * FRAGMENT


def _fragment_add_twin(total, fragment):
    return tuple(np.float32(np.float32(x) + np.float32(y)) for x, y in zip(total, fragment))


def _fragment_to_array_twin(fragment, array):
    _sim_array(array)[:FRAGMENT] = np.array(fragment, np.float32)


def _fragment_from_array_twin(array):
    return tuple(np.float32(v) for v in _sim_array(array)[:FRAGMENT])


def _shared_address_twin(array):
    return np.uint32(SIM_SHARED_BASE)


def _copy16_twin(smem, dst, source, offset):
    buffer = _sim_array(smem)
    flat = _sim_array(source).reshape(-1)
    start = int(dst) - SIM_SHARED_BASE
    if start % CORE_BYTES or int(offset) % CORE_BYTES:
        raise RuntimeError(f"cp.async twin: 16-byte copy from offset {int(offset)} to {int(dst):#x} is misaligned")
    buffer[start:start + CORE_BYTES] = flat[int(offset):int(offset) + CORE_BYTES]


# ----------------------------------------------------------------------------------------------------------------
# The names kernels call: intrinsics on a device, twins under the simulator

FORMAT_PAIRS = (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2"))
_SIMULATED = shim.simulator_enabled()

WGMMA = {pair: (_wgmma_twin if _SIMULATED else _wgmma_intrinsic)(*pair) for pair in FORMAT_PAIRS}
wgmma_fence = _identity if _SIMULATED else _fragment_statement("wgmma.fence.sync.aligned;")
wgmma_commit = _nothing if _SIMULATED else _statement("wgmma.commit_group.sync.aligned;")
wgmma_wait_all = _identity if _SIMULATED else _fragment_statement("wgmma.wait_group.sync.aligned 0;")
fragment_zero = _fragment_zero_twin if _SIMULATED else _fragment_zero
fragment_add = _fragment_add_twin if _SIMULATED else _fragment_add
fragment_to_array = _fragment_to_array_twin if _SIMULATED else _fragment_to_array
fragment_from_array = _fragment_from_array_twin if _SIMULATED else _fragment_from_array
shared_address = _shared_address_twin if _SIMULATED else _shared_address
copy16 = _copy16_twin if _SIMULATED else _copy16
copies_commit = _nothing if _SIMULATED else _statement("cp.async.commit_group;")
# Wait until at most one group of copies is in flight (the one for the next stage), then make the landed
# stage visible to wgmma's async proxy.
copies_wait_one = _nothing if _SIMULATED else _wait_async_copies_intrinsic(1)
copies_wait_all = _nothing if _SIMULATED else _wait_async_copies_intrinsic(0)
