"""GPU instructions that numba has no name for, as inline PTX (numba ``@intrinsic`` + llvmlite ``builder.asm``).

Each one is the CUDA body of a primitive of :mod:`mmaemu.arith` whose exact CPU twin runs on CPUs and in the
simulator; :func:`install` registers them as ``target="cuda"`` overloads, which numba prefers to the generic ones
in kernels, so the arithmetic stays one function for both targets:

* :func:`mmaemu.arith.packed.dp4a` -> ``dp4a.u32.u32`` (SASS ``IDP4A``, sm_61 and newer);
* :func:`mmaemu.arith.packed.replicate_byte` -> ``prmt.b32`` with selector 0 (SASS ``PRMT``);
* :func:`mmaemu.arith.packed.max_u16x2` -> ``max.u16x2`` on sm_90 and newer; below, ``max.f16x2``, the same
  maximum on the words the arithmetic gives it (positive normal fp16 patterns, see :mod:`mmaemu.arith.packed`).
  The architecture is chosen when NVVM compiles for its target, through ``__nvvm_reflect("__CUDA_ARCH")``.
"""

from __future__ import annotations

_INSTALLED = False


def _reflect_arch(builder):
    """The ``__CUDA_ARCH`` NVVM compiles for (e.g. 900), folded to a constant by NVVM's reflect pass."""
    from llvmlite import ir

    module = builder.module
    name = "__CUDA_ARCH"
    data = bytearray(name.encode()) + b"\0"
    text = module.globals.get("mmaemu_reflect_arch")
    if text is None:
        text = ir.GlobalVariable(module, ir.ArrayType(ir.IntType(8), len(data)), name="mmaemu_reflect_arch")
        text.global_constant = True
        text.linkage = "internal"
        text.initializer = ir.Constant(ir.ArrayType(ir.IntType(8), len(data)), data)
    reflect = module.globals.get("__nvvm_reflect")
    if reflect is None:
        reflect = ir.Function(module, ir.FunctionType(ir.IntType(32), [ir.PointerType(ir.IntType(8))]),
                              "__nvvm_reflect")
    return builder.call(reflect, [builder.bitcast(text, ir.PointerType(ir.IntType(8)))])


def _intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    word = ir.IntType(32)

    @intrinsic
    def dp4a_u32(typingctx, a, b, c):
        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, signature.args)]
            return builder.asm(ir.FunctionType(word, [word] * 3), "dp4a.u32.u32 $0, $1, $2, $3;", "=r,r,r,r", args,
                               False)

        return types.uint32(a, b, c), codegen

    @intrinsic
    def max_u16x2_word(typingctx, a, b):
        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, signature.args)]
            fnty = ir.FunctionType(word, [word] * 2)
            newer = builder.icmp_signed(">=", _reflect_arch(builder), ir.Constant(word, 900))
            with builder.if_else(newer) as (then, otherwise):
                with then:
                    native = builder.asm(fnty, "max.u16x2 $0, $1, $2;", "=r,r,r", args, False)
                    native_block = builder.block
                with otherwise:
                    emulated = builder.asm(fnty, "max.f16x2 $0, $1, $2;", "=r,r,r", args, False)
                    emulated_block = builder.block
            result = builder.phi(word)
            result.add_incoming(native, native_block)
            result.add_incoming(emulated, emulated_block)
            return result

        return types.uint32(a, b), codegen

    @intrinsic
    def prmt_replicate(typingctx, x):
        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[0], signature.args[0], types.uint32)
            return builder.asm(ir.FunctionType(word, [word]), "prmt.b32 $0, $1, 0, 0;", "=r,r", [value], False)

        return types.uint32(x), codegen

    return dp4a_u32, max_u16x2_word, prmt_replicate


def install():
    """Register the CUDA bodies of the packed primitives (no-op under the simulator, which runs the twins)."""
    global _INSTALLED
    from .shim import simulator_enabled

    if _INSTALLED or simulator_enabled():
        return
    from numba.core import types
    from numba.core.extending import overload

    from ..arith.packed import dp4a, max_u16x2, replicate_byte

    dp4a_u32, max_u16x2_word, prmt_replicate = _intrinsics()

    def words(*args):
        return all(isinstance(arg, types.Integer) for arg in args)

    @overload(dp4a, target="cuda")
    def _dp4a_cuda(a, b, c):
        if words(a, b, c):
            return lambda a, b, c: dp4a_u32(a, b, c)
        return None

    @overload(max_u16x2, target="cuda")
    def _max_u16x2_cuda(a, b):
        if words(a, b):
            return lambda a, b: max_u16x2_word(a, b)
        return None

    @overload(replicate_byte, target="cuda")
    def _replicate_byte_cuda(x):
        if words(x):
            return lambda x: prmt_replicate(x)
        return None

    _INSTALLED = True
