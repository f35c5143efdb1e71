"""Shared-memory staging of ``cuda:native``: asynchronous 16-byte copies from global to shared memory, as inline
PTX (``@intrinsic`` + ``builder.asm``), each with an exact CPU twin that kernels call under numba's CUDA simulator.

* ``cp.async.cg.shared.global [dst], [src], 16`` with ``cp.async.commit_group`` / ``cp.async.wait_group N``
  (PTX ISA "cp.async", sm_80+): the next stage's operands load while the tensor cores work on this one.
* The 32-bit shared-window address of a shared array (``cvta.to.shared``): the instructions address shared memory
  by it (cp.async destinations, wgmma's matrix descriptors, ``ld.shared``).

Under the simulator a shared buffer gets the fake address :data:`SIM_SHARED_BASE` (16-byte aligned, deliberately
not 128-byte aligned), so a kernel's alignment and address arithmetic run as on a device; copies are synchronous
there and commits and waits do nothing.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .. import shim

COPY_BYTES = 16
SIM_SHARED_BASE = 0x4030  # simulator: the shared buffer's fake address (16-aligned, not 128-aligned)


def statement(text):
    """An intrinsic ``f()`` emitting the PTX statement ``text`` (a memory clobber: nothing moves across it)."""

    @intrinsic
    def emit(typingctx):
        def codegen(context, builder, signature, args):
            builder.asm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", [], side_effect=True)
            return context.get_dummy_value()

        return types.none(), codegen

    return emit


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


# ----------------------------------------------------------------------------------------------------------------
# CPU twins


def _nothing():
    return None


def _shared_address_twin(array):
    import numpy as np

    return np.uint32(SIM_SHARED_BASE)


def _copy16_twin(smem, dst, source, offset):
    buffer = shim._unwrap(smem)
    flat = shim._unwrap(source).reshape(-1)
    start = int(dst) - SIM_SHARED_BASE
    if start % COPY_BYTES or int(offset) % COPY_BYTES:
        raise RuntimeError(f"cp.async twin: 16-byte copy from offset {int(offset)} to {int(dst):#x} is misaligned")
    buffer[start:start + COPY_BYTES] = flat[int(offset):int(offset) + COPY_BYTES]


_SIMULATED = shim.simulator_enabled()


def statement_or_nothing(text):
    """:func:`statement` on a device; a no-op under the simulator."""
    return _nothing if _SIMULATED else statement(text)


shared_address = _shared_address_twin if _SIMULATED else _shared_address
copy16 = _copy16_twin if _SIMULATED else _copy16
copies_commit = statement_or_nothing("cp.async.commit_group;")
# Wait until at most one group of copies is in flight (the one for the next stage), or none.
copies_wait_one = statement_or_nothing("cp.async.wait_group 1;")
copies_wait_all = statement_or_nothing("cp.async.wait_group 0;")
