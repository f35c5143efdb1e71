"""GPU instructions that numba has no name for, as inline PTX (numba ``@intrinsic`` + llvmlite ``builder.asm``).

Each one is the CUDA body of a primitive of :mod:`mmaemu.arith` whose exact CPU twin runs on CPUs and in the
simulator; :func:`install` registers them as ``target="cuda"`` overloads, which numba prefers to the generic ones
in kernels, so the arithmetic stays one function for both targets:

* :func:`mmaemu.arith.packed.dp4a` -> ``dp4a.u32.u32`` (SASS ``IDP4A``, sm_61 and newer);
* :func:`mmaemu.arith.packed.max_u16x2` -> ``max.u16x2`` on sm_90 and newer; below, ``max.f16x2``, the same
  maximum on the words the arithmetic gives it (positive normal fp16 patterns, see :mod:`mmaemu.arith.packed`);
* :func:`mmaemu.arith.packed.add_u16x2` -> ``add.u16x2`` on sm_90 and newer (ptxas fuses it with a following
  ``max.u16x2`` into ``VIADDMNMX.U16x2``); below, ``add.u32``, the same sums on the words the arithmetic gives it.
  The architecture is chosen when NVVM compiles for its target, through ``__nvvm_reflect("__CUDA_ARCH")``.
* :func:`mmaemu.arith.bf16.fma_bf16x2` -> ``fma.rn.bf16x2`` (SASS ``HFMA2.BF16_V2``, sm_80 and newer: the
  kernel that calls it is launched on those devices only, see :mod:`mmaemu.cuda.dispatch.launch`);
* :func:`mmaemu.arith.bf16.low_halves` / :func:`~mmaemu.arith.bf16.high_halves` -> two ``mov.b32`` through 16-bit
  registers, which ptxas folds into the bf16x2 instruction that reads the result (operand swizzle ``.H0_H0`` /
  ``.H1_H1``, no instruction of its own).

And two data movements of the kernels, not arithmetic: :func:`load4` (four consecutive 32-bit elements of a 1-D
array; in kernels one 16-byte ``ld.global.nc.v4`` load, ``LDG.E.128``), whose plain-Python body is what the
simulator runs, and :func:`mmaemu.arith.packed.load_words4` (four consecutive elements of a row of a 2-D array:
one LLVM load of a 16-byte-aligned vector, ``LDS.128`` from shared memory).
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


def load4(array, index):
    """``array[index:index + 4]`` as a tuple: four consecutive elements of a 1-D array of 32-bit numbers.

    In CUDA kernels one 16-byte load through the read-only data cache: the array must not be written while the
    kernel runs, and ``index`` must address a 16-byte boundary (the caller's layout guarantees both)."""
    return array[index], array[index + 1], array[index + 2], array[index + 3]


def _by_arch(builder, fnty, newer, older, constraints, args):
    """Inline PTX ``newer`` on sm_90 and newer, ``older`` below (one instruction each, the same constraints)."""
    from llvmlite import ir

    word = ir.IntType(32)
    is_newer = builder.icmp_signed(">=", _reflect_arch(builder), ir.Constant(word, 900))
    with builder.if_else(is_newer) as (then, otherwise):
        with then:
            native = builder.asm(fnty, newer, constraints, args, False)
            native_block = builder.block
        with otherwise:
            emulated = builder.asm(fnty, older, constraints, args, False)
            emulated_block = builder.block
    result = builder.phi(fnty.return_type)
    result.add_incoming(native, native_block)
    result.add_incoming(emulated, emulated_block)
    return result


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

    def packed_pair(newer, older):
        @intrinsic
        def pair_word(typingctx, a, b):
            def codegen(context, builder, signature, args):
                args = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, signature.args)]
                return _by_arch(builder, ir.FunctionType(word, [word] * 2), newer, older, "=r,r,r", args)

            return types.uint32(a, b), codegen

        return pair_word

    max_u16x2_word = packed_pair("max.u16x2 $0, $1, $2;", "max.f16x2 $0, $1, $2;")
    add_u16x2_word = packed_pair("add.u16x2 $0, $1, $2;", "add.u32 $0, $1, $2;")

    @intrinsic
    def fma_bf16x2_word(typingctx, a, b, c):
        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, signature.args)]
            return builder.asm(ir.FunctionType(word, [word] * 3), "fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r",
                               args, False)

        return types.uint32(a, b, c), codegen

    def repeated_half(half):
        @intrinsic
        def repeat(typingctx, x):
            def codegen(context, builder, signature, args):
                arg = context.cast(builder, args[0], signature.args[0], types.uint32)
                text = ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; mov.b32 $0, {%s, %s}; }" % (half, half))
                return builder.asm(ir.FunctionType(word, [word]), text, "=r,r", [arg], False)

            return types.uint32(x), codegen

        return repeat

    low_halves_word, high_halves_word = repeated_half("lo"), repeated_half("hi")

    @intrinsic
    def load4_global(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype in (types.float32, types.uint32,
                                                                                        types.int32)):
            return None

        def codegen(context, builder, signature, args):
            from numba.core import cgutils

            array_type, index_type = signature.args
            view = context.make_array(array_type)(context, builder, args[0])
            position = context.cast(builder, args[1], index_type, types.intp)
            pointer = cgutils.get_item_pointer(context, builder, array_type, view, [position], wraparound=False)
            address = builder.ptrtoint(builder.addrspacecast(pointer, ir.PointerType(pointer.type.pointee, 1)),
                                       ir.IntType(64))
            element = context.get_value_type(array_type.dtype)
            words = builder.asm(ir.FunctionType(ir.LiteralStructType([word] * 4), [ir.IntType(64)]),
                                "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [address], False)
            values = [builder.bitcast(builder.extract_value(words, i), element) for i in range(4)]
            return context.make_tuple(builder, signature.return_type, values)

        return types.UniTuple(array.dtype, 4)(array, index), codegen

    @intrinsic
    def load_words4_aligned(typingctx, array, row, column):
        if not (isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C"
                and array.dtype in (types.float32, types.uint32, types.int32)):
            return None

        def codegen(context, builder, signature, args):
            from numba.core import cgutils

            array_type = signature.args[0]
            view = context.make_array(array_type)(context, builder, args[0])
            indices = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:])]
            pointer = cgutils.get_item_pointer(context, builder, array_type, view, indices, wraparound=False)
            element = context.get_value_type(array_type.dtype)
            vector = builder.load(builder.bitcast(pointer, ir.PointerType(ir.VectorType(element, 4))), align=16)
            values = [builder.extract_element(vector, ir.Constant(word, i)) for i in range(4)]
            return context.make_tuple(builder, signature.return_type, values)

        return types.UniTuple(array.dtype, 4)(array, row, column), codegen

    return (dp4a_u32, max_u16x2_word, add_u16x2_word, fma_bf16x2_word, low_halves_word, high_halves_word,
            load4_global, load_words4_aligned)


def install():
    """Register the CUDA bodies of the packed primitives (no-op under the simulator, which runs the twins)."""
    global _INSTALLED
    from ..shim import simulator_enabled

    if _INSTALLED or simulator_enabled():
        return
    from numba.core import types
    from numba.core.extending import overload

    from ...arith.bf16 import fma_bf16x2, high_halves, low_halves
    from ...arith.packed import add_u16x2, dp4a, load_words4, max_u16x2, overload_on_words

    (dp4a_u32, max_u16x2_word, add_u16x2_word, fma_bf16x2_word, low_halves_word, high_halves_word,
     load4_global, load_words4_aligned) = _intrinsics()
    for function, instruction in ((dp4a, dp4a_u32), (max_u16x2, max_u16x2_word), (add_u16x2, add_u16x2_word),
                                  (fma_bf16x2, fma_bf16x2_word), (low_halves, low_halves_word),
                                  (high_halves, high_halves_word)):
        overload_on_words(function, instruction, "cuda")

    @overload(load4, target="cuda")
    def _load4_cuda(array, index):
        if isinstance(array, types.Array) and isinstance(index, types.Integer):
            return lambda array, index: load4_global(array, index)
        return None

    @overload(load_words4, target="cuda")
    def _load_words4_cuda(array, row, column):
        if isinstance(array, types.Array) and isinstance(row, types.Integer) and isinstance(column, types.Integer):
            return lambda array, row, column: load_words4_aligned(array, row, column)
        return None

    _INSTALLED = True
