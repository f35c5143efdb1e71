"""The accumulator fragment of ``cuda:native``: the 64 fp32 accumulator registers one thread holds, as a value.

Both native instructions leave 64 accumulators per thread for a group of 128 threads computing 64 x 128 outputs
(:mod:`mmaemu.cuda.native.wgmma`: one warpgroup's ``m64n128k32``; :mod:`mmaemu.cuda.native.mma_sync`: four warps of 16
``m16n8k32`` each). In a kernel the fragment is a ``UniTuple(float32, 64)``, an LLVM ``[64 x float]`` value that
stays in registers (an array indexed at run time would go to local memory); the helpers here read and write it
with constant indices only. Each has an exact CPU twin that kernels call under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``), where a fragment is a tuple of numpy float32.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .. import shim

FRAGMENT = 64  # fp32 accumulator registers per thread
FRAGMENT_TYPE = types.UniTuple(types.float32, FRAGMENT)


def asm_fragment(builder, context, text, fragment, extra_values, extra_constraints):
    """Emit the inline PTX ``text`` with the fragment as tied in/out "f" registers ($0..$63 out, then the fragment
    in, then the extra operands) and return the new fragment tuple (codegen helper of the instructions' intrinsics).
    """
    f32 = ir.FloatType()
    values = [builder.extract_value(fragment, i) for i in range(FRAGMENT)]
    out_type = ir.LiteralStructType([f32] * FRAGMENT)
    fnty = ir.FunctionType(out_type, [f32] * FRAGMENT + [v.type for v in extra_values])
    constraints = ",".join(["=f"] * FRAGMENT + [str(i) for i in range(FRAGMENT)] + list(extra_constraints)
                           + ["~{memory}"])
    result = builder.asm(fnty, text, constraints, values + list(extra_values), side_effect=True)
    return context.make_tuple(builder, FRAGMENT_TYPE, [builder.extract_value(result, i) for i in range(FRAGMENT)])


def fragment_statement(text):
    """An intrinsic ``f(fragment) -> fragment`` emitting the PTX statement ``text`` with the fragment passed through
    (so the compiler cannot move a use of the accumulator across it)."""

    @intrinsic
    def statement(typingctx, fragment):
        def codegen(context, builder, signature, args):
            return asm_fragment(builder, context, text, args[0], (), ())

        return FRAGMENT_TYPE(FRAGMENT_TYPE), codegen

    return statement


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


# ----------------------------------------------------------------------------------------------------------------
# CPU twins


def _identity(fragment):
    return fragment


def _fragment_zero_twin():
    return (np.float32(0.0),) * FRAGMENT


def _fragment_add_twin(total, fragment):
    return tuple(np.float32(np.float32(x) + np.float32(y)) for x, y in zip(total, fragment))


def _fragment_to_array_twin(fragment, array):
    shim._unwrap(array)[:FRAGMENT] = np.array(fragment, np.float32)


def _fragment_from_array_twin(array):
    return tuple(np.float32(v) for v in shim._unwrap(array)[:FRAGMENT])


_SIMULATED = shim.simulator_enabled()


def statement_or_identity(text):
    """:func:`fragment_statement` on a device; the identity under the simulator (fences and waits have nothing to
    order there)."""
    return _identity if _SIMULATED else fragment_statement(text)


fragment_zero = _fragment_zero_twin if _SIMULATED else _fragment_zero
fragment_add = _fragment_add_twin if _SIMULATED else _fragment_add
fragment_to_array = _fragment_to_array_twin if _SIMULATED else _fragment_to_array
fragment_from_array = _fragment_from_array_twin if _SIMULATED else _fragment_from_array
