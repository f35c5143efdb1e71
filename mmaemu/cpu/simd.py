"""512-bit vectors for the CPU's offset engine (:mod:`mmaemu.cpu.offset_engine`): Numba types for LLVM's
``<16 x float>`` and ``<16 x i32>`` and ``@intrinsic`` operations on them, each the LLVM instruction of one
AVX-512 operation (two AVX2 operations on a CPU without AVX-512).

Numba has no SIMD types, and LLVM's vectoriser cannot emit the one operation the offset method needs per product:
a fused multiply-add rounding toward zero. It is emitted two ways, by the target CPU's *rounding*
(:func:`mmaemu.cpu.features.offset_rounding`):

* ``"embedded"`` (AVX-512): LLVM's target intrinsic ``llvm.x86.avx512.vfmadd.ps.512(a, b, c, i32 11)`` (11 =
  round toward zero with exceptions suppressed) compiles to one ``vfmadd231ps {rz-sae}``, which rounds that one
  instruction toward zero and leaves MXCSR (and so every other operation of the process) as it is;
* ``"mxcsr"`` (AVX2 + FMA, which have no per-instruction rounding): the plain ``llvm.fma.v16f32`` (two
  ``vfmadd231ps`` on 256-bit registers), which rounds as the thread's MXCSR says, run inside a *toward-zero
  region*: :func:`enter_toward_zero` saves MXCSR and sets its rounding control to toward zero,
  :func:`leave_toward_zero` restores it. Why no floating-point operation crosses a region's edge: at the IR level
  ``llvm.x86.sse.ldmxcsr`` may read and write any memory (LLVM 22.1, llvmlite's for numba 0.68, declares it
  ``nounwind`` with no memory attribute), so no load is hoisted above it and no store sunk below it, and every
  floating-point operation of the kernel reads an operand loaded inside the region and stores its result there
  (those outside read theirs after it); a pure operation on values computed before the region *can* move into
  or out of it (seen in a test: an FMA of operands loaded before :func:`enter_toward_zero` rounded to nearest).
  At the machine level the X86 backend keeps floating-point instructions on their side of ``LDMXCSR`` (they
  carry an implicit use of ``$mxcsr``, which it defines: an FMA of register operands compiled for haswell by
  LLVM 22.1 stays between two ``vldmxcsr``). A region
  must hold no operation that needs rounding to nearest: in the offset kernel every other floating-point
  operation of a block step is exact (:mod:`mmaemu.arith.offset`, conditions 1-4: Sterbenz subtractions and sums
  inside one binade), and the split combinations and the empty blocks' float64 emulation run outside it.
  On an ``"embedded"`` target the region functions emit nothing.

The other operations are plain LLVM vector instructions (``add``, ``and``, ``umax`` on 16-bit halves, ``fsub``
rounding to nearest, ...), which LLVM lowers to one AVX-512 instruction each (two on AVX2).

Every operation has an exact *twin* on NumPy arrays of 16 lanes (``*_twin``): the same function of the lanes'
bits, written with NumPy integer arithmetic or the scalar :func:`mmaemu.arith.fp32.fma_toward_zero_exact`.
``tests/test_simd.py`` compares each intrinsic with its twin on random and edge inputs (subnormals, +-0, large and
small exponents), the FMA inside a toward-zero region. The vector operations compile only for a target that
:func:`mmaemu.cpu.features.offset_engine_decline` accepts (it checks that before :mod:`.offset_kernel`, their only
user, is imported); defining them compiles nothing.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.datamodel import models, register_default
from numba.core.extending import intrinsic, overload

from ..base._jit import arithmetic
from ..arith import lanes
from ..arith.fp32 import _bitcast, fma_toward_zero_exact
from ..arith.packed import max_u16x2_exact, swap_halves
from .features import ROUNDING_EMBEDDED, numba_target, offset_rounding

LANES = 16  # fp32 / int32 lanes of a 512-bit vector
ROUND_TOWARD_ZERO_SAE = 11  # _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC: the embedded-rounding operand
# MXCSR's rounding-control field, bits 13-14 (Intel SDM vol. 1, 10.2.3): 0b11 rounds toward zero.
MXCSR_ROUNDING_FIELD = 0x6000
MXCSR_TOWARD_ZERO = 0x6000


class Vector(types.Type):
    """A 512-bit vector of ``lanes`` lanes of ``element`` (16 of types.float32 or types.int32, 64 of types.int8),
    kept in one register."""

    def __init__(self, element, lanes=LANES):
        self.element, self.lanes = element, lanes
        super().__init__(name=f"vector{lanes}x{element}")


@register_default(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(dmm.lookup(fe_type.element).get_value_type(), fe_type.lanes))


f32x16 = Vector(types.float32)
i32x16 = Vector(types.int32)
i8x64 = Vector(types.int8, 4 * LANES)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()
_V_I32 = ir.VectorType(_I32, LANES)
_V_F32 = ir.VectorType(_F32, LANES)
_V_I16 = ir.VectorType(ir.IntType(16), 2 * LANES)
_V_I8 = ir.VectorType(ir.IntType(8), 4 * LANES)


def _is_indexed_row_array(array, dtype, row, column):
    """Whether (array, row, column) are a C-contiguous 2-d array of ``dtype`` and two integer indices."""
    return (isinstance(array, types.Array) and array.ndim == 2 and array.dtype == dtype and array.layout == "C"
            and isinstance(row, types.Integer) and isinstance(column, types.Integer))


def _item_pointer(context, builder, signature, args):
    """The pointer to ``array[row, column]`` for an intrinsic whose first three arguments are (array, row,
    column): no wrap-around of negative indices, no bounds check."""
    array_type, row_type, column_type = signature.args[:3]
    row = context.cast(builder, args[1], row_type, types.intp)
    column = context.cast(builder, args[2], column_type, types.intp)
    ary = context.make_array(array_type)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, array_type, ary, [row, column], wraparound=False,
                                    boundscheck=False)


def _vector_pointer(context, builder, signature, args, vector_type):
    return builder.bitcast(_item_pointer(context, builder, signature, args),
                           context.get_value_type(vector_type).as_pointer())


def _load(element, vector_type, lane_type=None):
    """The load of ``vector_type`` from ``array[row, column:column + lanes]``, or with ``lane_type`` (the LLVM
    vector type) ``array[row, column]`` broadcast to every lane."""

    @intrinsic
    def load(typingctx, array, row, column):
        if not _is_indexed_row_array(array, element, row, column):
            return None

        def codegen(context, builder, signature, args):
            if lane_type is not None:
                return _splat(builder, builder.load(_item_pointer(context, builder, signature, args)), lane_type)
            return builder.load(_vector_pointer(context, builder, signature, args, vector_type), align=4)

        return vector_type(array, row, column), codegen

    return load


def _store(element, vector_type):
    @intrinsic
    def store(typingctx, array, row, column, value):
        if not (_is_indexed_row_array(array, element, row, column) and value == vector_type):
            return None

        def codegen(context, builder, signature, args):
            builder.store(args[3], _vector_pointer(context, builder, signature, args, vector_type), align=4)
            return context.get_dummy_value()

        return types.void(array, row, column, value), codegen

    return store


load_f32 = _load(types.float32, f32x16)
load_f32.__doc__ = "``array[row, column:column + 16]`` of a C-contiguous float32 array as a vector."
load_u32 = _load(types.uint32, i32x16)
load_u32.__doc__ = "``array[row, column:column + 16]`` of a C-contiguous uint32 array as an int32 vector."
store_f32 = _store(types.float32, f32x16)
store_f32.__doc__ = "``array[row, column:column + 16] = value`` (a float32 array)."
store_u32 = _store(types.uint32, i32x16)
store_u32.__doc__ = "``array[row, column:column + 16] = value`` (a uint32 array, an int32 vector)."
load_i8 = _load(types.int8, i8x64)
load_i8.__doc__ = "``array[row, column:column + 64]`` of a C-contiguous int8 array as a vector of 64 bytes."
broadcast_load_f32 = _load(types.float32, f32x16, _V_F32)
broadcast_load_f32.__doc__ = ("``array[row, column]`` of a C-contiguous float32 array in every lane (one "
                              "vbroadcastss from memory; no wrap-around of negative indices).")
broadcast_load_i32 = _load(types.uint32, i32x16, _V_I32)
broadcast_load_i32.__doc__ = ("``array[row, column]`` of a C-contiguous uint32 array in every lane (one "
                              "vpbroadcastd from memory; no wrap-around of negative indices).")


@intrinsic
def load_word(typingctx, array, row, column):
    """The little-endian uint32 of the four bytes ``array[row, column:column + 4]`` (a C-contiguous uint8 array;
    one unaligned load, no bounds check)."""
    if not _is_indexed_row_array(array, types.uint8, row, column):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(builder.bitcast(_item_pointer(context, builder, signature, args), _I32.as_pointer()),
                            align=1)

    return types.uint32(array, row, column), codegen


@intrinsic
def broadcast_f32(typingctx, x):
    """A float32 in every lane."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return _splat(builder, args[0], _V_F32)

    return f32x16(x), codegen


@intrinsic
def broadcast_i32(typingctx, x):
    """An integer (its low 32 bits) in every lane."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        width = value.type.width
        if width > 32:
            value = builder.trunc(value, _I32)
        elif width < 32:
            value = builder.zext(value, _I32)
        return _splat(builder, value, _V_I32)

    return i32x16(x), codegen


def _splat(builder, value, vector_type):
    """``value`` in every lane: insertelement into lane 0 and a zero-mask shufflevector (one vbroadcast)."""
    first = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, vector_type.count), [0] * vector_type.count))


def _binary(vector_type, emit, doc):
    @intrinsic
    def operation(typingctx, a, b):
        if a != vector_type or b != vector_type:
            return None

        def codegen(context, builder, signature, args):
            return emit(builder, args[0], args[1])

        return vector_type(a, b), codegen

    operation.__doc__ = doc
    return operation


add_i32 = _binary(i32x16, lambda b, x, y: b.add(x, y), "Lane-wise sum modulo 2**32 (vpaddd).")
sub_i32 = _binary(i32x16, lambda b, x, y: b.sub(x, y), "Lane-wise difference modulo 2**32 (vpsubd).")
and_i32 = _binary(i32x16, lambda b, x, y: b.and_(x, y), "Lane-wise and (vpandd).")
or_i32 = _binary(i32x16, lambda b, x, y: b.or_(x, y), "Lane-wise or (vpord).")
xor_i32 = _binary(i32x16, lambda b, x, y: b.xor(x, y), "Lane-wise exclusive or (vpxord).")
andnot_i32 = _binary(i32x16, lambda b, x, y: b.and_(b.not_(x), y), "Lane-wise ``~a & b`` (vpandnd).")
mul_i32 = _binary(i32x16, lambda b, x, y: b.mul(x, y), "Lane-wise product modulo 2**32 (vpmulld).")
max_i32 = _binary(i32x16, lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y),
                  "Lane-wise signed maximum (vpmaxsd).")
min_i32 = _binary(i32x16, lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y),
                  "Lane-wise signed minimum (vpminsd).")


def _max_u16x2(builder, x, y):
    x16, y16 = builder.bitcast(x, _V_I16), builder.bitcast(y, _V_I16)
    return builder.bitcast(builder.select(builder.icmp_unsigned(">", x16, y16), x16, y16), _V_I32)


max_u16x2_i32 = _binary(i32x16, _max_u16x2, "Per lane :func:`mmaemu.arith.packed.max_u16x2` (vpmaxuw).")
max_i8 = _binary(i8x64, lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y),
                 "Byte-wise signed maximum (vpmaxsb).")


def _add_saturated(builder, x, y):
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V_I8, [_V_I8, _V_I8]),
                                              "llvm.sadd.sat.v64i8")
    return builder.call(function, [x, y])


add_saturated_i8 = _binary(i8x64, _add_saturated, "Byte-wise signed sum saturated to [-128, 127] (vpaddsb).")
add_f32 = _binary(f32x16, lambda b, x, y: b.fadd(x, y), "Lane-wise fp32 sum rounded to nearest (vaddps).")
sub_f32 = _binary(f32x16, lambda b, x, y: b.fsub(x, y), "Lane-wise fp32 difference rounded to nearest (vsubps).")


def _shift(emit, doc):
    @intrinsic
    def operation(typingctx, a, amount):
        if a != i32x16 or not isinstance(amount, types.IntegerLiteral):
            return None
        count = amount.literal_value
        if not 0 <= count < 32:
            return None

        def codegen(context, builder, signature, args):
            return emit(builder, args[0], ir.Constant(_V_I32, [count] * LANES))

        return i32x16(a, amount), codegen

    operation.__doc__ = doc
    return operation


shl_i32 = _shift(lambda b, x, n: b.shl(x, n), "Lane-wise left shift by a constant (vpslld).")
lshr_i32 = _shift(lambda b, x, n: b.lshr(x, n), "Lane-wise logical right shift by a constant (vpsrld).")
ashr_i32 = _shift(lambda b, x, n: b.ashr(x, n), "Lane-wise arithmetic right shift by a constant (vpsrad).")
rotate16_i32 = _shift(lambda b, x, n: b.or_(b.lshr(x, n), b.shl(x, n)),
                      "Per lane :func:`mmaemu.arith.packed.swap_halves` (vprold 16); the amount must be 16.")


# Byte lanes, for B's panel decode (:func:`mmaemu.cpu.offset_kernel.decode_words`: 64 codes an operation)
add_i8 = _binary(i8x64, lambda b, x, y: b.add(x, y), "Byte-wise sum modulo 256 (vpaddb).")
sub_i8 = _binary(i8x64, lambda b, x, y: b.sub(x, y), "Byte-wise difference modulo 256 (vpsubb).")
and_i8 = _binary(i8x64, lambda b, x, y: b.and_(x, y), "Byte-wise and (vpandd).")
or_i8 = _binary(i8x64, lambda b, x, y: b.or_(x, y), "Byte-wise or (vpord).")
xor_i8 = _binary(i8x64, lambda b, x, y: b.xor(x, y), "Byte-wise exclusive or (vpxord).")
max_u8 = _binary(i8x64, lambda b, x, y: b.select(b.icmp_unsigned(">", x, y), x, y),
                 "Byte-wise unsigned maximum (vpmaxub).")
less_u8 = _binary(i8x64, lambda b, x, y: b.sext(b.icmp_unsigned("<", x, y), _V_I8),
                  "0xFF in the bytes where ``a < b`` unsigned, 0 in the others (vpcmpub and vpmovm2b).")
lshr_by_i32 = _binary(i32x16, lambda b, x, y: b.lshr(x, y),
                      "Lane-wise logical right shift by the lanes of ``b`` (each 0 ... 31; vpsrlvd, or vpsrld "
                      "where they are one broadcast count).")


def _select_bytes(builder, mask, x, y):
    """Where ``mask``'s byte is 0xFF the byte of x, where 0 the byte of y (one vpternlogd)."""
    return builder.or_(builder.and_(mask, x), builder.and_(builder.not_(mask), y))


@intrinsic
def select_i8(typingctx, mask, a, b):
    """Byte-wise ``a if mask else b`` for a mask of 0xFF and 0 bytes (:func:`less_u8`'s): ``mask & a | ~mask & b``
    (one vpternlogd)."""
    if (mask, a, b) != (i8x64,) * 3:
        return None

    def codegen(context, builder, signature, args):
        return _select_bytes(builder, *args)

    return i8x64(mask, a, b), codegen


@intrinsic
def trailing_zeros_i8(typingctx, x):
    """Byte-wise count of trailing zero bits, 8 for a zero byte (``llvm.cttz.v64i8``: vpopcntb of ``~x & (x - 1)``
    with AVX-512 BITALG, nibble look-ups by vpshufb without)."""
    if x != i8x64:
        return None

    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V_I8, [_V_I8, ir.IntType(1)]),
                                                  "llvm.cttz.v64i8")
        return builder.call(function, [args[0], ir.Constant(ir.IntType(1), 0)])

    return i8x64(x), codegen


bits_of_f32 = _bitcast(f32x16, i32x16, "The int32 patterns of the lanes (a bitcast, no instruction).")
f32_of_bits = _bitcast(i32x16, f32x16, "The fp32 numbers whose patterns are the lanes (a bitcast, no instruction).")
bytes_of_i32 = _bitcast(i32x16, i8x64, "The 64 bytes of the lanes, little-endian (a bitcast, no instruction).")
i32_of_bytes = _bitcast(i8x64, i32x16, "The 16 lanes of 64 bytes, little-endian (a bitcast, no instruction).")


@intrinsic
def f32_of_i32(typingctx, x):
    """Lane-wise the fp32 nearest to the int32 (vcvtdq2ps; exact for magnitudes up to 2**24)."""
    if x != i32x16:
        return None

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], _V_F32)

    return f32x16(x), codegen


mul_f32 = _binary(f32x16, lambda b, x, y: b.fmul(x, y), "Lane-wise fp32 product rounded to nearest (vmulps).")


@intrinsic
def store_low_bytes(typingctx, array, row, column, value):
    """``array[row, column:column + 16]`` (a C-contiguous int8 array) = the low byte of each lane of ``value``
    (vpmovdb)."""
    if not (_is_indexed_row_array(array, types.int8, row, column) and value == i32x16):
        return None

    def codegen(context, builder, signature, args):
        narrow = builder.trunc(args[3], ir.VectorType(ir.IntType(8), LANES))
        pointer = builder.bitcast(_item_pointer(context, builder, signature, args), narrow.type.as_pointer())
        builder.store(narrow, pointer, align=1)
        return context.get_dummy_value()

    return types.void(array, row, column, value), codegen


@intrinsic
def widen_i8(typingctx, x, quarter):
    """Bytes ``16 * quarter ... 16 * quarter + 15`` of a byte vector sign-extended to 16 int32 lanes (vpmovsxbd);
    ``quarter`` a constant 0 ... 3."""
    if x != i8x64 or not isinstance(quarter, types.IntegerLiteral) or not 0 <= quarter.literal_value < 4:
        return None
    first = LANES * quarter.literal_value

    def codegen(context, builder, signature, args):
        part = builder.shuffle_vector(args[0], ir.Constant(_V_I8, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, LANES), list(range(first, first + LANES))))
        return builder.sext(part, _V_I32)

    return i32x16(x, quarter), codegen


@intrinsic
def max_f32(typingctx, a, b):
    """Lane-wise ``a if a > b else b`` (vmaxps: the ordered comparison; no NaN reaches it in mmaemu)."""
    if a != f32x16 or b != f32x16:
        return None

    def codegen(context, builder, signature, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])

    return f32x16(a, b), codegen


def _embedded_rounding() -> bool:
    """Whether the target Numba compiles for rounds the FMA by AVX-512 embedded rounding (else by MXCSR)."""
    return offset_rounding(numba_target()) == ROUNDING_EMBEDDED


@intrinsic
def fma_toward_zero_f32(typingctx, a, b, c):
    """Lane-wise :func:`mmaemu.arith.fp32.fma_toward_zero`: ``a * b + c`` rounded once toward zero. On an
    ``"embedded"`` target by AVX-512 embedded rounding (``vfmadd231ps {rz-sae}``; MXCSR is neither read nor
    changed), anywhere; on an ``"mxcsr"`` target by the plain FMA, so only inside a toward-zero region
    (:func:`enter_toward_zero`): outside one it rounds to nearest."""
    if (a, b, c) != (f32x16,) * 3:
        return None

    def codegen(context, builder, signature, args):
        if _embedded_rounding():
            function_type = ir.FunctionType(_V_F32, [_V_F32, _V_F32, _V_F32, _I32])
            function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.x86.avx512.vfmadd.ps.512")
            return builder.call(function, [*args, ir.Constant(_I32, ROUND_TOWARD_ZERO_SAE)])
        function_type = ir.FunctionType(_V_F32, [_V_F32, _V_F32, _V_F32])
        function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.fma.v16f32")
        return builder.call(function, list(args))

    return f32x16(a, b, c), codegen



@intrinsic
def abs_f32(typingctx, x):
    """Lane-wise ``|x|``: the sign bits cleared (``llvm.fabs``: one vandps with a constant)."""
    if x != f32x16:
        return None

    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V_F32, [_V_F32]),
                                                  "llvm.fabs.v16f32")
        return builder.call(function, [args[0]])

    return f32x16(x), codegen


# ----------------------------------------------------------------------------------------------------------------
# The lane operations of mmaemu.arith.lanes on vectors: each stub's overload for Vector arguments is the intrinsic
# of the same name here, so that mmaemu.arith.offset_step compiles on vectors.

LANE_OPERATIONS = {1: ("bits_of_f32", "f32_of_bits", "abs_f32"),
                   2: ("add_i32", "sub_i32", "mul_i32", "and_i32", "or_i32", "xor_i32", "andnot_i32", "max_i32",
                       "min_i32", "add_f32", "sub_f32", "max_f32"),
                   3: ("fma_toward_zero_f32",)}
LANE_SHIFTS = ("shl_i32", "lshr_i32")


def _vectors(*args):
    return all(isinstance(a, Vector) for a in args)


def _overload_on_vectors(name, arity, operation):
    stub = getattr(lanes, name)
    if arity == 1:
        @overload(stub)
        def unary(a):
            if _vectors(a):
                return lambda a: operation(a)
    elif arity == 2:
        @overload(stub)
        def binary(a, b):
            if _vectors(a, b):
                return lambda a, b: operation(a, b)
    else:
        @overload(stub)
        def ternary(a, b, c):
            if _vectors(a, b, c):
                return lambda a, b, c: operation(a, b, c)


def _overload_shift_on_vectors(name, operation):
    @overload(getattr(lanes, name))
    def shift(a, amount):
        if _vectors(a) and isinstance(amount, types.IntegerLiteral):
            count = amount.literal_value  # the intrinsic's constant amount, a literal in the implementation
            return lambda a, amount: operation(a, count)


for _arity, _names in LANE_OPERATIONS.items():
    for _name in _names:
        _overload_on_vectors(_name, _arity, globals()[_name])
for _name in LANE_SHIFTS:
    _overload_shift_on_vectors(_name, globals()[_name])


_I8_POINTER = ir.IntType(8).as_pointer()


def _mxcsr_call(builder, name, slot):
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_I8_POINTER]), name)
    builder.call(function, [builder.bitcast(slot, _I8_POINTER)])


def _read_mxcsr(builder):
    slot = cgutils.alloca_once(builder, _I32)
    _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
    return builder.load(slot)


def _write_mxcsr(builder, value):
    slot = cgutils.alloca_once(builder, _I32)
    builder.store(value, slot)
    _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)


@intrinsic
def enter_toward_zero(typingctx):
    """Start a toward-zero region of the calling thread: on an ``"mxcsr"`` target MXCSR's rounding control set to
    toward zero (its other bits kept: exception masks, flush modes); returns the MXCSR to give
    :func:`leave_toward_zero`. On an ``"embedded"`` target nothing is changed and 0 is returned."""

    def codegen(context, builder, signature, args):
        if _embedded_rounding():
            return ir.Constant(_I32, 0)
        saved = _read_mxcsr(builder)
        field = ir.Constant(_I32, MXCSR_ROUNDING_FIELD)
        _write_mxcsr(builder, builder.or_(builder.and_(saved, builder.not_(field)),
                                          ir.Constant(_I32, MXCSR_TOWARD_ZERO)))
        return saved

    return types.uint32(), codegen


@intrinsic
def leave_toward_zero(typingctx, saved):
    """End a toward-zero region: MXCSR back to ``saved`` (:func:`enter_toward_zero`'s result) on an ``"mxcsr"``
    target; nothing on an ``"embedded"`` one."""
    if saved != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        if not _embedded_rounding():
            _write_mxcsr(builder, args[0])
        return context.get_dummy_value()

    return types.void(saved), codegen


@intrinsic
def _mxcsr(typingctx):
    def codegen(context, builder, signature, args):
        return _read_mxcsr(builder)

    return types.uint32(), codegen


@intrinsic
def _set_mxcsr(typingctx, bits):
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        _write_mxcsr(builder, context.cast(builder, args[0], signature.args[0], types.uint32))
        return context.get_dummy_value()

    return types.void(bits), codegen


@arithmetic
def thread_mxcsr():
    """The calling thread's MXCSR (x86-64 only)."""
    return _mxcsr()


@arithmetic
def set_thread_mxcsr(bits):
    """Load ``bits`` (its low 32 bits) into the calling thread's MXCSR (x86-64 only)."""
    _set_mxcsr(bits)


def call_restoring_mxcsr(kernel, *args):
    """``kernel(*args)`` with the calling thread's MXCSR as it was before, also when the kernel raises inside a
    toward-zero region (the kernels leave their regions themselves when they return). On an ``"embedded"`` target
    the kernel is just called."""
    if _embedded_rounding():
        return kernel(*args)
    saved = thread_mxcsr()
    try:
        return kernel(*args)
    finally:
        if thread_mxcsr() != saved:
            set_thread_mxcsr(saved)


# ----------------------------------------------------------------------------------------------------------------
# The exact twins: the same functions of 16 lanes, on NumPy arrays (uint32 patterns or float32 values)


def _u32(x):
    return np.asarray(x, np.uint32)


def _i32(x):
    return _u32(x).view(np.int32)


def add_i32_twin(a, b):
    return ((_u32(a).astype(np.uint64) + _u32(b)) % 2**32).astype(np.uint32)


def sub_i32_twin(a, b):
    return ((_u32(a).astype(np.int64) - _u32(b).astype(np.int64)) % 2**32).astype(np.uint32)


def mul_i32_twin(a, b):
    return ((_u32(a).astype(object) * _u32(b).astype(object)) % 2**32).astype(np.uint32)


def and_i32_twin(a, b):
    return _u32(a) & _u32(b)


def or_i32_twin(a, b):
    return _u32(a) | _u32(b)


def xor_i32_twin(a, b):
    return _u32(a) ^ _u32(b)


def andnot_i32_twin(a, b):
    return ~_u32(a) & _u32(b)


def max_i32_twin(a, b):
    return np.maximum(_i32(a), _i32(b)).view(np.uint32)


def min_i32_twin(a, b):
    return np.minimum(_i32(a), _i32(b)).view(np.uint32)


def max_u16x2_twin(a, b):
    return np.array([max_u16x2_exact(int(x), int(y)) for x, y in zip(_u32(a), _u32(b))], np.uint32)


def shl_i32_twin(a, n):
    return ((_u32(a).astype(np.uint64) << np.uint64(n)) % 2**32).astype(np.uint32)


def lshr_i32_twin(a, n):
    return _u32(a) >> np.uint32(n)


def rotate16_i32_twin(a):
    return np.array([swap_halves(int(x)) for x in _u32(a)], np.uint32)


def fma_toward_zero_twin(a, b, c):
    return np.array([fma_toward_zero_exact(np.float32(x), np.float32(y), np.float32(z)) for x, y, z in zip(a, b, c)],
                    np.float32)


def _i8(x):
    return np.asarray(x, np.int8)


def max_i8_twin(a, b):
    return np.maximum(_i8(a), _i8(b))


def add_saturated_i8_twin(a, b):
    return np.clip(_i8(a).astype(np.int64) + _i8(b), -128, 127).astype(np.int8)


def widen_i8_twin(a, quarter):
    return _i8(a)[LANES * quarter:LANES * (quarter + 1)].astype(np.int32).view(np.uint32)


def _u8(x):
    return np.asarray(x, np.int8).view(np.uint8)


def add_i8_twin(a, b):
    return ((_u8(a).astype(np.int64) + _u8(b)) % 256).astype(np.uint8).view(np.int8)


def sub_i8_twin(a, b):
    return ((_u8(a).astype(np.int64) - _u8(b)) % 256).astype(np.uint8).view(np.int8)


def and_i8_twin(a, b):
    return _i8(a) & _i8(b)


def or_i8_twin(a, b):
    return _i8(a) | _i8(b)


def xor_i8_twin(a, b):
    return _i8(a) ^ _i8(b)


def max_u8_twin(a, b):
    return np.maximum(_u8(a), _u8(b)).view(np.int8)


def less_u8_twin(a, b):
    return np.where(_u8(a) < _u8(b), -1, 0).astype(np.int8)


def select_i8_twin(mask, a, b):
    return np.where(_i8(mask) == -1, _i8(a), _i8(b)).astype(np.int8)  # masks of 0xFF and 0 bytes only


def trailing_zeros_i8_twin(a):
    return np.array([next((i for i in range(8) if (int(x) >> i) & 1), 8) for x in _u8(a)], np.int8)


def lshr_by_i32_twin(a, n):
    return _u32(a) >> _u32(n)


def ashr_i32_twin(a, n):
    return (_i32(a) >> np.int32(n)).view(np.uint32)


def f32_of_i32_twin(a):
    return _i32(a).astype(np.float32)


def mul_f32_twin(a, b):
    return np.asarray(a, np.float32) * np.asarray(b, np.float32)


def store_low_bytes_twin(a):
    return (_u32(a) & np.uint32(0xFF)).astype(np.uint8).view(np.int8)


def load_word_twin(row, column):
    return int.from_bytes(bytes(np.asarray(row, np.uint8)[column:column + 4]), "little")
