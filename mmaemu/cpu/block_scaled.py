"""CPU loops of the block-scaled instruction model (:mod:`mmaemu.arith.block_scaled`), and the one host
preparation of block-scaled operands that every engine computes from.

* :func:`chain_operand` / :func:`chain_operands`: the operands decoded on the host for the reference chains
  (:class:`ChainOperand`, :class:`ChainOperands`), used by ``model.dot``, the CPU reference loop and the CUDA
  kernel (:mod:`mmaemu.cuda.block_scaled.kernel`) alike; :func:`canonical_nan` their results' NaN rule.
* :func:`scaled_rows` (``model.dot``): each row is a chain of instructions of ``k`` elements, the fp32 result of
  one the accumulator of the next. An instruction that holds a NaN/Inf element or a NaN scale takes the IEEE value
  ``c + special[r, i]`` instead (``special`` is the float64 sum of that instruction's scaled products, computed by
  the caller).
* GEMMs (:func:`accumulate_block_scaled`): every output of A [M, K] x B [N, K]^T is one chain of the preset's
  instructions along K from +0 (fast accumulation, no split: the B200 block-scaled profile's kernel). The
  reference loop walks each output alone (:func:`~mmaemu.arith.block_scaled.scaled_chain`); the fast path computes
  tiles of TILE_ROWS rows of A against panels of B at once (:func:`~mmaemu.arith.block_scaled.tile_scaled_chain`),
  one compiled call per task over a range of panels and rows, and hands the outputs it does not cover (a NaN/Inf
  element or NaN scale in their row or column, a result at or above 2**128) to the reference chain. B's panels
  and scales in the tile layout (:class:`PreparedBlockScaledB`) are decoded by the task that needs them, or once
  for many calls (:func:`prepare_block_scaled_b`, kept by :mod:`mmaemu.cpu.prepared` for a repeated weight).
"""

import math
from typing import NamedTuple

import numpy as np

from .. import formats
from ..base._jit import arithmetic
from ..arith.block_scaled import (ROWS, SCALED_ABSENT_EXP, GroupMasks, GroupParams, TileScales, group_params,
                                  narrow_run, panel_group_masks, row_group_masks, scaled_chain, scaled_instruction,
                                  tile_scaled_chain)
from ..arith.params import BlockParams, preset_params
from ..arith.rounding import grid_code
from ..arith.tile import TILE_ABSENT_EXP, lane_bits_needed
from . import threads
from .engine import tile_tables
from .gemm import decode_panel, tile_work

# Cost of one product, in products of the fast path (mmaemu.cpu.threads task sizes).
PRODUCT_WORK = 16
CANONICAL_NAN_F32 = np.uint32(0x7FFFFFFF)


# ----------------------------------------------------------------------------------------------------------------
# The host preparation of every engine


class ChainOperand(NamedTuple):
    """One operand of the reference chains, decoded on the host (:func:`chain_operand`)."""

    sig: np.ndarray  # integer significands of the element codes [rows, K]
    exp: np.ndarray  # int32 element exponents [rows, K], plus the block scale's exponent for a scaled-block preset
    value: np.ndarray  # float64 element values [rows, K] (NaN/Inf included)
    scale_sig: np.ndarray  # int64 integer significands of the scales [rows, K / block]
    scale_exp: np.ndarray  # int32 exponents of the scales [rows, K / block]
    scale_value: np.ndarray  # float64 scale values [rows, K / block] (NaN for the NaN code)
    bad: np.ndarray  # bool [rows, K / k]: the instruction holds a NaN/Inf element or a NaN scale

    def rows(self, lo: int, hi: int) -> "ChainOperand":
        """Rows lo .. hi-1 of every field, C-contiguous."""
        return ChainOperand(*(np.ascontiguousarray(field[lo:hi]) for field in self))


class ChainOperands(NamedTuple):
    """Both operands of a block-scaled GEMM or dot decoded for the reference chains, with what the instructions
    read besides: the block length, the preset's :class:`~mmaemu.arith.params.BlockParams` (the scaled-block
    instruction) and :class:`~mmaemu.arith.block_scaled.GroupParams` (``group`` 0 for a scaled-block preset)."""

    a: ChainOperand
    b: ChainOperand
    k: int
    block: int
    params: BlockParams
    group: GroupParams


def chain_operand(codes, fmt, scales, scale_fmt, block, preset) -> ChainOperand:
    """The :class:`ChainOperand` of element codes [rows, K] (uint8, one per element) with scale codes [rows, K /
    block]. For a scaled-block preset the scale exponents join the element exponents before the alignment
    (semantics.md b.5)."""
    k = preset.nfma
    sig = formats.significands(fmt)[codes]
    exp = formats.exponents(fmt)[codes].astype(np.int32)
    scale_exp = formats.scale_exponents(scale_fmt)[scales].astype(np.int32)
    if not preset.group:
        exp = exp + np.repeat(scale_exp, block, axis=1)
    nan_scale = formats.scale_nan_codes(scale_fmt)[scales]
    bad = formats.nonfinite_mask(codes, fmt) | np.repeat(nan_scale, block, axis=1)
    rows, K = codes.shape
    return ChainOperand(np.ascontiguousarray(sig), np.ascontiguousarray(exp),
                        formats.values(fmt)[codes].astype(np.float64),
                        formats.scale_significands(scale_fmt)[scales].astype(np.int64), scale_exp,
                        formats.decode_scales(scales, scale_fmt),
                        np.ascontiguousarray(bad.reshape(rows, K // k, k).any(-1)))


def chain_operands(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, block, preset) -> ChainOperands:
    """:class:`ChainOperands` of A and B (codes [rows, K], scale codes [rows, K / block])."""
    gp = group_params(preset, fmt_a, fmt_b, scale_fmt) if preset.group else GroupParams(0, 0, 0, 0, 0, 0)
    params = BlockParams(*(int(v) for v in preset_params(preset, fmt_a, fmt_b)))
    return ChainOperands(chain_operand(a_codes, fmt_a, scale_a, scale_fmt, block, preset),
                         chain_operand(b_codes, fmt_b, scale_b, scale_fmt, block, preset),
                         preset.nfma, block, params, GroupParams(*(int(v) for v in gp)))


def canonical_nan(out):
    """``out`` (fp32) with every NaN the canonical 0x7FFFFFFF, in place; returned."""
    out.view(np.uint32)[np.isnan(out)] = CANONICAL_NAN_F32
    return out


# ----------------------------------------------------------------------------------------------------------------
# model.dot: one chain per row


@arithmetic
def scaled_rows(lo, hi, a, b, c, special, has_special, k, block, params, gp, out):
    """Rows lo .. hi-1 of a chain of the preset's instructions (``a``/``b``: :class:`ChainOperand`; row r of A
    against row r of B)."""
    K = a.sig.shape[1]
    for r in range(lo, hi):
        acc = c[r]
        for i in range(K // k):
            if has_special[r, i]:
                acc = np.float32(np.float64(acc) + special[r, i])
            else:
                acc = scaled_instruction(a.sig[r], a.exp[r], b.sig[r], b.exp[r], a.scale_sig[r], a.scale_exp[r],
                                         b.scale_sig[r], b.scale_exp[r], i * k, (i + 1) * k, block, acc, params, gp)
        out[r] = acc


def run_scaled_rows(ops: ChainOperands, c, special, has_special, out):
    """:func:`scaled_rows` over every row on the CPU backend's threads."""
    threads.parallel_for(scaled_rows, ops.a.sig.shape[0], PRODUCT_WORK * max(1, ops.a.sig.shape[1]), ops.a, ops.b,
                         c, special, has_special, ops.k, ops.block, ops.params, ops.group, out)


# ----------------------------------------------------------------------------------------------------------------
# GEMMs

# A job of the reference loops is one row of outputs; a product of the reference costs about 25 of the fast path.
REFERENCE_PRODUCT_WORK = 25
# Fast-path tiles: TILE_ROWS rows of A against panels of up to MAX_LANES rows of B (mmaemu.cpu.engine's shape).
TILE_ROWS = ROWS
MAX_LANES = 64
# Decoding one code of a panel costs about 2 ns, some 20 products of the fast path (mmaemu.cpu.engine).
PANEL_DECODE_WORK = 20


class BlockScaledGemm:
    """A checked block-scaled GEMM: codes [M, K] / [N, K] (one uint8 code per element), their formats, scale
    codes [M, K / block] / [N, K / block] of ``scale_fmt``, the block length and the preset."""

    def __init__(self, a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset):
        self.a = np.ascontiguousarray(a_codes, np.uint8)
        self.b = np.ascontiguousarray(b_codes, np.uint8)
        self.sa = np.ascontiguousarray(scale_a, np.uint8)
        self.sb = np.ascontiguousarray(scale_b, np.uint8)
        self.fmt_a, self.fmt_b, self.scale_fmt, self.preset = fmt_a, fmt_b, scale_fmt, preset
        self.block = check_block_scaled_gemm(self.a, self.b, fmt_a, fmt_b, self.sa, self.sb, scale_fmt, preset)

    @property
    def shape(self):
        return self.a.shape[0], self.b.shape[0], self.a.shape[1]


def check_block_scaled_gemm(a, b, fmt_a, fmt_b, sa, sb, scale_fmt, preset) -> int:
    """The instruction's rules for a GEMM (semantics.md b.5); returns the block length. ValueError names the rule."""
    name = "block-scaled GEMM"
    if not preset.block_scaled:
        raise ValueError(f"{name}: preset {preset.name!r} is not block-scaled")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"{name}: a [M, K] and b [N, K] codes are required, got {a.shape} and {b.shape}")
    for label, fmt in (("a", fmt_a), ("b", fmt_b)):
        if fmt not in preset.operand_formats:
            raise ValueError(f"{name}: preset {preset.name!r} takes operands in {preset.operand_formats}; {label} is "
                             f"{fmt}")
    K = a.shape[1]
    if sa.ndim != 2 or sb.ndim != 2 or sa.shape[0] != a.shape[0] or sb.shape[0] != b.shape[0] or \
            sa.shape[1] != sb.shape[1] or sa.shape[1] == 0 or K % sa.shape[1]:
        raise ValueError(f"{name}: scales [M, K / block] and [N, K / block] are required for K = {K}, got "
                         f"{sa.shape} and {sb.shape}")
    block = K // sa.shape[1]
    if (block, scale_fmt) not in preset.scale_kinds:
        accepted = ", ".join(f"one {f} per {blk}" for blk, f in preset.scale_kinds)
        raise ValueError(f"{name}: preset {preset.name!r} takes scales {accepted}; got one {scale_fmt} per {block} "
                         "elements of K")
    if K % preset.nfma:
        raise ValueError(f"{name}: K = {K} is not a whole number of {preset.name!r} instructions (k = "
                         f"{preset.nfma}); zero-pad K to a multiple of {preset.nfma}")
    for label, codes, fmt in (("a", a, fmt_a), ("b", b, fmt_b)):
        if codes.size and int(codes.max()) >= 1 << formats.CODE_BITS[fmt]:
            raise ValueError(f"{name}: {label} holds codes beyond the {formats.CODE_BITS[fmt]} bits of {fmt}")
    return block


@arithmetic
def scaled_gemm_rows(lo, hi, a, b, k, block, params, gp, todo, out):
    """out[m, n] = the chain of output (m, n) for rows m in lo .. hi-1 where ``todo[m, n]`` (the reference loop:
    every output; the fast path: the outputs it hands over); ``a``/``b``: :class:`ChainOperand`."""
    N = out.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if todo[m, n]:
                out[m, n] = scaled_chain(a.sig[m], a.exp[m], b.sig[n], b.exp[n], a.value[m], b.value[n],
                                         a.scale_sig[m], a.scale_exp[m], b.scale_sig[n], b.scale_exp[n],
                                         a.scale_value[m], b.scale_value[n], a.bad[m], b.bad[n], k, block, params, gp)


def gemm_chain_operands(gemm: BlockScaledGemm) -> ChainOperands:
    """:func:`chain_operands` of a checked GEMM."""
    return chain_operands(gemm.a, gemm.b, gemm.fmt_a, gemm.fmt_b, gemm.sa, gemm.sb, gemm.scale_fmt, gemm.block,
                          gemm.preset)


def _run_reference(gemm: BlockScaledGemm, todo, out):
    """The reference chains of the outputs where ``todo`` is True, into ``out``."""
    ops = gemm_chain_operands(gemm)
    M, N, K = gemm.shape
    threads.parallel_for(scaled_gemm_rows, M, REFERENCE_PRODUCT_WORK * max(1, N) * max(1, K), ops.a, ops.b, ops.k,
                         ops.block, ops.params, ops.group, todo, out)


# ----------------------------------------------------------------------------------------------------------------
# The fast path


class PreparedBlockScaledB(NamedTuple):
    """B [N, K] with its scales in the fast path's tile layout, for any number of products with it: ``val`` float32
    and ``exp`` int8 [panels, K, lanes] (:func:`mmaemu.cpu.gemm.decode_panel`), the scales' integer significands
    ``scale_sig`` (float32) and exponents ``scale_exp`` (int32) [panels, K / block, lanes] (lanes past N: 0), and
    ``bad`` bool [N] (row n holds a NaN/Inf element or a NaN scale). A pure function of B's codes, scale codes and
    formats (:func:`prepare_block_scaled_b`)."""

    fmt: str
    scale_fmt: str
    shape: tuple
    block: int
    val: np.ndarray
    exp: np.ndarray
    scale_sig: np.ndarray
    scale_exp: np.ndarray
    bad: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.val, self.exp, self.scale_sig, self.scale_exp, self.bad))


def prepared_nbytes(N: int, K: int, block: int) -> int:
    """Bytes of a :class:`PreparedBlockScaledB` of a [N, K] B: 5 per code and 8 per scale of whole panels, 1 per
    row."""
    lanes = panel_lanes(N)
    panels = -(-N // lanes)
    return panels * lanes * (K * 5 + (K // block) * 8) + N


@arithmetic
def decode_scale_panel(scales, n0, sig_table, exp_table, sig, exp):
    """Rows n0 .. n0+lanes-1 of B's scale codes [N, K / block] transposed: ``sig[s, j]``, ``exp[s, j]`` from the
    tables (0 for lanes past the last row)."""
    N, blocks = scales.shape
    lanes = sig.shape[1]
    for s in range(blocks):
        for j in range(lanes):
            sig[s, j] = np.float32(0.0)
            exp[s, j] = 0
    for j in range(min(lanes, N - n0)):
        for s in range(blocks):
            code = scales[n0 + j, s]
            sig[s, j] = sig_table[code]
            exp[s, j] = exp_table[code]


@arithmetic
def bad_rows(lo, hi, codes, nonfinite, scales, scale_nan, block, flags):
    """flags[r] = row r (lo .. hi-1) holds a NaN/Inf element code or a NaN scale code (the two tables, uint8)."""
    for r in range(lo, hi):
        hit = np.uint8(0)
        for kk in range(codes.shape[1]):
            hit |= nonfinite[codes[r, kk]]
        for s in range(scales.shape[1]):
            hit |= scale_nan[scales[r, s]]
        flags[r] = hit != 0


class BlockTables(NamedTuple):
    """The decode tables of one operand format and scale format (uint8 code -> tile value, tile exponent with
    :data:`~mmaemu.arith.block_scaled.SCALED_ABSENT_EXP` for zero and non-finite codes, NaN/Inf flag; scale code ->
    float32 integer significand, int32 exponent, NaN flag)."""

    val: np.ndarray
    exp: np.ndarray
    nonfinite: np.ndarray
    scale_sig: np.ndarray
    scale_exp: np.ndarray
    scale_nan: np.ndarray


def block_tables(fmt: str, scale_fmt: str) -> BlockTables:
    """:class:`BlockTables` of a format pair, built once."""
    key = (fmt, scale_fmt)
    if key not in _TABLES:
        val, exp = tile_tables(fmt)
        exp = np.where(exp == TILE_ABSENT_EXP, SCALED_ABSENT_EXP, exp).astype(np.int8)
        codes = np.arange(256) % (1 << formats.CODE_BITS[fmt])
        _TABLES[key] = BlockTables(val, exp, formats.nonfinite_codes(fmt)[codes].astype(np.uint8),
                                   formats.scale_significands(scale_fmt).astype(np.float32),
                                   formats.scale_exponents(scale_fmt).astype(np.int32),
                                   formats.scale_nan_codes(scale_fmt).astype(np.uint8))
    return _TABLES[key]


_TABLES = {}
# The panel decode of mmaemu.cpu.gemm also flags rows holding NaN/Inf codes; this path applies its own rule
# (scales included, bad_rows), so it hands it an all-zero table.
_NO_FLAGS = np.zeros(256, np.uint8)


def _row_flags(codes, scales, tables: BlockTables, block):
    flags = np.zeros(codes.shape[0], np.bool_)
    threads.parallel_for(bad_rows, codes.shape[0], max(1, codes.shape[1]), codes, tables.nonfinite, scales,
                         tables.scale_nan, block, flags)
    return flags


@arithmetic
def decode_b_panels(lo, hi, codes, scales, val_table, exp_table, no_flags, sig_table, sexp_table, val, exp,
                    scale_sig, scale_exp, unused_flags):
    """Panels lo .. hi-1 of B and its scales in the tile layout (:class:`PreparedBlockScaledB`)."""
    lanes = val.shape[2]
    for p in range(lo, hi):
        decode_panel(codes, p * lanes, val_table, exp_table, no_flags, val[p], exp[p], unused_flags)
        decode_scale_panel(scales, p * lanes, sig_table, sexp_table, scale_sig[p], scale_exp[p])


def prepare_block_scaled_b(b_codes, fmt_b: str, scale_b, scale_fmt: str, block: int) -> PreparedBlockScaledB:
    """Decode every panel of B [N, K] (uint8 codes, one per element) and of its scale codes [N, K / block] for the
    fast path, in parallel over the panels."""
    b_codes = np.ascontiguousarray(b_codes, np.uint8)
    scale_b = np.ascontiguousarray(scale_b, np.uint8)
    N, K = b_codes.shape
    lanes = panel_lanes(N)
    panels = -(-N // lanes)
    blocks = scale_b.shape[1]
    t = block_tables(fmt_b, scale_fmt)
    val, exp = np.empty((panels, K, lanes), np.float32), np.empty((panels, K, lanes), np.int8)
    scale_sig, scale_exp = np.empty((panels, blocks, lanes), np.float32), np.empty((panels, blocks, lanes), np.int32)
    threads.parallel_for(decode_b_panels, panels, lanes * K * PANEL_DECODE_WORK, b_codes, scale_b, t.val, t.exp,
                         _NO_FLAGS, t.scale_sig, t.scale_exp, val, exp, scale_sig, scale_exp,
                         np.zeros(N, np.bool_))
    return PreparedBlockScaledB(fmt_b, scale_fmt, (N, K), block, val, exp, scale_sig, scale_exp,
                                _row_flags(b_codes, scale_b, t, block))


@arithmetic
def decode_tile_rows(codes, m0, rows, val_table, exp_table, val, exp):
    """Rows m0 .. m0+rows-1 of A in the tile layout through the tables of :func:`mmaemu.cpu.engine.tile_tables`."""
    K = codes.shape[1]
    for r in range(rows):
        for kk in range(K):
            c = codes[m0 + r, kk]
            val[r, kk] = val_table[c]
            exp[r, kk] = exp_table[c]


@arithmetic
def decode_a(codes, val_table, exp_table, group, val, exp, masks):
    """Every row of A [M, K] in the tile layout (:func:`decode_tile_rows`) and, for a scaled-groups preset
    (``group`` > 0), the nonzero masks of its groups (:func:`~mmaemu.arith.block_scaled.row_group_masks`): once
    per call, for all its tasks (each task decoded its tiles of A again for every panel before)."""
    M = codes.shape[0]
    decode_tile_rows(codes, 0, M, val_table, exp_table, val, exp)
    if group:
        row_group_masks(val, M, group, masks)


@arithmetic
def store_tile(result, overflow, m0, rows, n0, out, overflowed):
    """The tile's chains into rows m0 .. m0+rows-1 of ``out`` from column n0 (the lanes within N):
    ``out = result``, ``overflowed = overflow != 0``."""
    for r in range(rows):
        for j in range(min(result.shape[1], out.shape[1] - n0)):
            out[m0 + r, n0 + j] = result[r, j]
            overflowed[m0 + r, n0 + j] = overflow[r, j] != 0


class FastCall(NamedTuple):
    """What every task of a fast-path call reads: A [M, K] in the tile layout with its groups' nonzero masks
    (:func:`decode_a`) and its scales' significands and exponents [M, K / block], B's codes and scale codes
    (decoded by the task) or B prepared (``prepared`` 1: the panels in ``b_val`` .. ``b_scale_exp``; else these
    hold one panel's buffers shape and are unused), the instruction's k, its parameters, the int32 run of the
    scaled-block products, and the block length."""

    a_val: np.ndarray
    a_exp: np.ndarray
    a_masks: np.ndarray
    a_scale_sig: np.ndarray
    a_scale_exp: np.ndarray
    b_codes: np.ndarray
    b_scales: np.ndarray
    b_tables: BlockTables
    prepared: int
    b_val: np.ndarray
    b_exp: np.ndarray
    b_scale_sig: np.ndarray
    b_scale_exp: np.ndarray
    k: int
    block: int
    scale_bits: int
    run: int
    params: BlockParams
    group: GroupParams


@arithmetic
def fast_panels(p_lo, p_hi, m_lo, m_hi, call, tile_rows, lane_proto, out, overflowed):
    """The fast path for panels p_lo .. p_hi-1 of B and rows m_lo .. m_hi-1 of A (a task): out[m, n] for those
    outputs, ``overflowed[m, n]`` where a chain reached 2**128. Each panel is read from the prepared B or decoded
    here; A comes decoded (:func:`decode_a`)."""
    K = call.a_val.shape[1]
    lanes = call.b_val.shape[2]
    blocks = call.b_scale_exp.shape[1]
    t = call.b_tables
    work = tile_work(tile_rows, lanes, lane_proto)
    overflow, result = np.empty((tile_rows, lanes), np.uint8), np.empty((tile_rows, lanes), np.float32)
    top, part = np.empty((tile_rows, lanes), np.int8), np.empty((tile_rows, lanes), np.int32)
    c_val = np.empty((tile_rows, lanes), np.float64)  # the scaled-block accumulators' values
    group = call.group.group
    gsum = np.empty((max(1, call.k // max(1, group)), tile_rows, lanes), np.float32)
    b_masks = np.zeros((call.a_masks.shape[1], lanes), np.int32)  # the nonzero masks of the scaled groups
    if call.prepared:
        val, exp = call.b_val[0], call.b_exp[0]
        ssig, sexp = call.b_scale_sig[0], call.b_scale_exp[0]
    else:
        val, exp = np.empty((K, lanes), np.float32), np.empty((K, lanes), np.int8)
        ssig, sexp = np.empty((blocks, lanes), np.float32), np.empty((blocks, lanes), np.int32)
    unused_flags = np.zeros(call.b_codes.shape[0], np.bool_)
    for p in range(p_lo, p_hi):
        if call.prepared:
            val, exp = call.b_val[p], call.b_exp[p]
            ssig, sexp = call.b_scale_sig[p], call.b_scale_exp[p]
        else:
            decode_panel(call.b_codes, p * lanes, t.val, t.exp, t.nonfinite, val, exp, unused_flags)
            decode_scale_panel(call.b_scales, p * lanes, t.scale_sig, t.scale_exp, ssig, sexp)
        if group:
            panel_group_masks(val, group, b_masks)
        for m0 in range(m_lo, m_hi, tile_rows):
            rows = min(tile_rows, m_hi - m0)
            m1 = m0 + rows
            scales = TileScales(call.a_scale_sig[m0:m1], call.a_scale_exp[m0:m1], ssig, sexp, call.block,
                                call.scale_bits)
            tile_scaled_chain(call.a_val[m0:m1], call.a_exp[m0:m1], val, exp, scales, rows, K, call.k, call.params,
                              call.group, call.run, work, c_val, top, part, gsum,
                              GroupMasks(call.a_masks[m0:m1], b_masks), overflow, result)
            store_tile(result, overflow, m0, rows, p * lanes, out, overflowed)


def panel_lanes(N: int) -> int:
    """Lanes of the fast path's panels of B: as wide as N needs, 16 .. MAX_LANES (a power of two)."""
    lanes = 16
    while lanes < MAX_LANES and lanes < N:
        lanes *= 2
    return lanes


def _fast_tasks(M: int, N: int, K: int, lanes: int):
    """The fast path's tasks ``(p_lo, p_hi, m_lo, m_hi)`` and their costs in products: ranges of row tiles of A
    (:func:`mmaemu.cpu.threads.job_ranges`) against each panel, or, where one range holds every row (small M,
    decoding), ranges of panels against all rows, so that a call is a few compiled calls."""
    n_threads = threads.num_threads()
    panels, row_tiles = -(-N // lanes), -(-M // TILE_ROWS)
    row_ranges = threads.job_ranges(row_tiles, TILE_ROWS * lanes * K, n_threads, repeats=panels)
    if len(row_ranges) == 1:
        ranges = threads.job_ranges(panels, M * lanes * K, n_threads)
        return [(lo, hi, 0, M) for lo, hi in ranges], [(hi - lo) * M * lanes * K for lo, hi in ranges]
    tasks = [(p, p + 1, lo * TILE_ROWS, min(hi * TILE_ROWS, M)) for p in range(panels) for lo, hi in row_ranges]
    return tasks, [(m_hi - m_lo) * lanes * K for _, _, m_lo, m_hi in tasks]


class FastKernel(NamedTuple):
    """What the fast path of one preset, format pair and block reads besides the operands, made once
    (:func:`fast_kernel`): both operands' :class:`BlockTables`, the instruction's parameters, the int32 run of the
    scaled-block products, the scale significands' bits and the lanes' integer type (an empty array)."""

    preset: object
    fmt_a: str
    fmt_b: str
    scale_fmt: str
    block: int
    ta: BlockTables
    tb: BlockTables
    params: BlockParams
    group: GroupParams
    run: int
    scale_bits: int
    lane_proto: np.ndarray


def fast_kernel(preset, fmt_a: str, fmt_b: str, scale_fmt: str, block: int) -> FastKernel:
    """The :class:`FastKernel` of a checked GEMM's preset, formats and block, kept."""
    key = (preset, fmt_a, fmt_b, scale_fmt, block)
    kernel = _FAST_KERNELS.get(key)
    if kernel is None:
        gp = group_params(preset, fmt_a, fmt_b, scale_fmt) if preset.group else GroupParams(0, 0, 0, 0, 0, 0)
        kernel = _FAST_KERNELS[key] = FastKernel(
            preset, fmt_a, fmt_b, scale_fmt, block, block_tables(fmt_a, scale_fmt), block_tables(fmt_b, scale_fmt),
            preset_params(preset, fmt_a, fmt_b), gp, 0 if preset.group else narrow_run(preset),
            2 * formats.SCALE_MANT_BITS[scale_fmt],
            np.empty(0, np.int32 if lane_bits_needed(preset) == 32 else np.int64))
    return kernel


_FAST_KERNELS = {}


def block_sums_exact_in_float64(preset) -> bool:
    """Whether every block sum of a scaled-block preset is below 2**53 (mmaemu.arith.tile (3): nfma * 2**(frac + 2)
    + 2**(frac + 1)), so that the fast path's float64 normalisation (:func:`~mmaemu.arith.block_scaled.
    tile_normalize_value`) is exact: every shipped preset (frac 25: below 2**33)."""
    return preset.nfma * 2 ** (preset.frac + 2) + 2 ** (preset.frac + 1) < 2**53


def _run_fast_blocks(gemm: BlockScaledGemm, out, prepared=None):
    """The fast path into ``out``; returns the [M, N] mask of the outputs it does not cover. ``prepared``: B's
    :class:`PreparedBlockScaledB` (made from ``gemm``'s B), or None (each task decodes its panels)."""
    kernel = fast_kernel(gemm.preset, gemm.fmt_a, gemm.fmt_b, gemm.scale_fmt, gemm.block)
    return _run_fast(kernel, gemm.a, gemm.sa, gemm.b, gemm.sb, prepared, out)


def _run_fast(kernel: FastKernel, a, sa, b, sb, prepared, out):
    """:func:`_run_fast_blocks` of checked operands: A's codes [M, K] and scale codes, B's codes [N, K] and scale
    codes, B's :class:`PreparedBlockScaledB` or None."""
    M, K = a.shape
    N = b.shape[0]
    if not (kernel.group.group or block_sums_exact_in_float64(kernel.preset)):
        return np.ones((M, N), np.bool_)  # a custom preset beyond the fast path's float64 block sums
    lanes = panel_lanes(N)
    ta, tb = kernel.ta, kernel.tb
    if prepared is None:
        blocks = sb.shape[1]
        b_arrays = (np.empty((1, K, lanes), np.float32), np.empty((1, K, lanes), np.int8),
                    np.empty((1, blocks, lanes), np.float32), np.empty((1, blocks, lanes), np.int32))
    else:
        b_arrays = (prepared.val, prepared.exp, prepared.scale_sig, prepared.scale_exp)
    group = kernel.group.group
    a_val, a_exp = np.empty((M, K), np.float32), np.empty((M, K), np.int8)
    a_masks = np.zeros((M, K // group if group else 1), np.int32)
    decode_a(a, ta.val, ta.exp, group, a_val, a_exp, a_masks)
    call = FastCall(a_val, a_exp, a_masks, np.ascontiguousarray(ta.scale_sig[sa]),
                    np.ascontiguousarray(ta.scale_exp[sa]), b, sb, tb, int(prepared is not None), *b_arrays,
                    kernel.preset.nfma, kernel.block, kernel.scale_bits, kernel.run, kernel.params, kernel.group)
    overflowed = np.zeros((M, N), np.bool_)
    tasks, works = _fast_tasks(M, N, K, lanes)

    def task(t):
        fast_panels(*t, call, TILE_ROWS, kernel.lane_proto, out, overflowed)

    if len(tasks) == 1:
        task(tasks[0])
    else:
        threads.run_tasks([lambda t=t: task(t) for t in tasks], works)
    bad_a = _row_flags(a, sa, ta, kernel.block)
    bad_b = _row_flags(b, sb, tb, kernel.block) if prepared is None else prepared.bad
    if not (bad_a.any() or bad_b.any()):
        return overflowed
    return overflowed | bad_a[:, None] | bad_b[None, :]


def accumulate_block_scaled(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset, *,
                            reference=False, prepared_b=None):
    """fp32 accumulators [M, N] of A [M, K] x B [N, K]^T with block scales (semantics.md b.5): every output one
    chain of ``preset``'s instructions along K from +0 (fast accumulation, no split).

    ``a_codes``/``b_codes``: one uint8 code per element in ``fmt_a``/``fmt_b`` (FP4 unpacked); ``scale_a`` [M, K /
    block] and ``scale_b`` [N, K / block]: uint8 scale codes of ``scale_fmt`` in plain (row, block) layout.
    ``reference=True`` runs the per-output loop; both give the same bits. ``prepared_b``: B prepared by
    :func:`prepare_block_scaled_b` from these codes and scales (the caller's guarantee: :mod:`mmaemu.cpu.prepared`
    checks it), or None. K must be a whole number of instructions (ValueError otherwise). NaN results are
    canonical (0x7FFFFFFF).
    """
    gemm = BlockScaledGemm(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset)
    M, N, K = gemm.shape
    out = np.zeros((M, N), np.float32)
    if 0 in (M, N, K):
        return out
    if prepared_b is not None and (prepared_b.fmt, prepared_b.scale_fmt, prepared_b.shape, prepared_b.block) != (
            fmt_b, scale_fmt, (N, K), gemm.block):
        raise ValueError(f"prepared_b was prepared for a {prepared_b.fmt} B of shape {prepared_b.shape} with one "
                         f"{prepared_b.scale_fmt} per {prepared_b.block}, not for this {fmt_b} B of shape {(N, K)} "
                         f"with one {scale_fmt} per {gemm.block}")
    if reference:
        _run_reference(gemm, np.ones((M, N), np.bool_), out)
    else:
        todo = _run_fast_blocks(gemm, out, prepared_b)
        if todo.any():
            _run_reference(gemm, todo, out)
    return canonical_nan(out)


# ----------------------------------------------------------------------------------------------------------------
# The element casts of mmaemu.block_quantize

# Cost of rounding one element onto its grid, in products of the fast path.
GRID_CODE_WORK = 16


@arithmetic
def grid_codes_of(lo, hi, y_bits, grid_bits, mid_bits, mbits, emin, sign_bit, nan_code, out):
    """out[i] = :func:`~mmaemu.arith.rounding.grid_code` of y_bits[i] for i in lo .. hi-1 (flat uint32 fp32 bits,
    uint8 codes)."""
    for i in range(lo, hi):
        out[i] = np.uint8(grid_code(y_bits[i], grid_bits, mid_bits, mbits, emin, sign_bit, nan_code))


def round_onto_grid(y, grid, mbits: int, emin: int, sign_bit: int, nan_code: int):
    """uint8 codes of the fp32 array ``y`` (any shape) rounded onto a format's grid (``grid``: float64 values of
    the codes 0 .. n-1; the other arguments as :func:`~mmaemu.arith.rounding.grid_code` takes them), on the CPU
    backend's threads."""
    flat = np.ascontiguousarray(y, np.float32).reshape(-1)
    out = np.empty(flat.shape[0], np.uint8)
    grid_bits, mid_bits = grid_tables(grid)
    threads.parallel_for(grid_codes_of, flat.shape[0], GRID_CODE_WORK, flat.view(np.uint32), grid_bits, mid_bits,
                         np.int32(mbits), np.int32(emin), np.int32(sign_bit), np.int32(nan_code), out)
    return out.reshape(np.shape(y))


# Cost of one element of the casts' block passes below, in products of the fast path.
CAST_ELEMENT_WORK = 8
_FP32_MAGNITUDE, _FP32_INF_BITS = np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)


@arithmetic
def fp32_divide(a, b):
    """``fp32(a / b)`` of two float32 values, IEEE: a zero ``b`` gives ±Inf, or NaN for a zero or NaN ``a``
    (numpy's quotient, computed here without the exception Python raises for a zero divisor)."""
    if b == 0:
        if a == 0 or a != a:
            return np.float32(np.nan)
        negative = (a < 0) != (math.copysign(1.0, b) < 0)
        return np.float32(-np.inf) if negative else np.float32(np.inf)
    return np.float32(a / b)


@arithmetic
def mx_block_rows(lo, hi, x, x_bits, block, emax_elem, mode, mbits, scale_codes, scaled):
    """Rows lo .. hi-1 of the MX cast's blocks (:func:`mmaemu.block_quantize.quantize_mx`) of fp32 ``x`` [M, K]
    (``x_bits`` its uint32 view): ``scale_codes[r, s]``, the UE8M0 code of the block's amax (0xFF for a block
    holding a NaN; else E - ``emax_elem`` clamped to [-127, 127], plus 127, E read off the amax's fp32 bits by
    the rule ``mode``: 0 "floor", 1 "ceil", 2 "even" with ``mbits`` fraction bits; non-negative fp32 values order
    as their bits, so the amax's bits are the largest magnitude bits of the block), and ``scaled[r, k] =
    fp32(x / d)``, d = 2**(code - 127) (2**-126 for code 0, +Inf for 0xFF)."""
    K = x.shape[1]
    for r in range(lo, hi):
        for s in range(K // block):
            top = np.uint32(0)
            for kk in range(s * block, (s + 1) * block):
                top = max(top, x_bits[r, kk] & _FP32_MAGNITUDE)
            if top > _FP32_INF_BITS:
                code = np.int32(0xFF)
                divisor = np.float32(np.inf)
            else:
                bits = np.int64(top)
                if mode == 2:  # the significand rounded to mbits fraction bits, ties away; a carry bumps E
                    bits = (bits + (np.int64(1) << np.int64(22 - mbits))) & ~np.int64(0x7FFFFF)
                exponent = np.int32((bits >> np.int64(23)) & np.int64(0xFF)) - np.int32(127)
                if mode == 1 and (bits & np.int64(0x7FFFFF)) != 0:
                    exponent += np.int32(1)
                code = min(max(exponent - np.int32(emax_elem), np.int32(-127)), np.int32(127)) + np.int32(127)
                divisor = np.float32(math.ldexp(1.0, max(code, np.int32(1)) - 127))
            scale_codes[r, s] = np.uint8(code)
            for kk in range(s * block, (s + 1) * block):
                scaled[r, kk] = np.float32(x[r, kk] / divisor)


@arithmetic
def abs_max_span(x, lo, hi):
    """max |x[i]| for i in lo .. hi-1 of a flat fp32 array, from +0; NaN where one is NaN (numpy's max)."""
    top = np.float32(0.0)
    nan = False
    for i in range(lo, hi):
        a = abs(x[i])
        if a != a:
            nan = True
        elif a > top:
            top = a
    return np.float32(np.nan) if nan else top


@arithmetic
def abs_max_of(x, out):
    """out[0] = :func:`abs_max_span` of the whole flat fp32 ``x``."""
    out[0] = abs_max_span(x, 0, x.shape[0])


@arithmetic
def nvfp4_block_rows(lo, hi, x, block, inverse_6, g, has_global, low, high, out):
    """Rows lo .. hi-1 of NVFP4's block scales before their rounding (:func:`mmaemu.block_quantize.quantize_nvfp4`)
    of fp32 ``x`` [M, K]: ``b = fp32(amax * inverse_6)`` (amax NaN where the block holds a NaN), divided by the
    global scale ``g`` where ``has_global``, then clamped to [low, high] unless NaN; ``out`` [M, K / block]
    float32."""
    K = x.shape[1]
    for r in range(lo, hi):
        row = x[r]
        for s in range(K // block):
            b = np.float32(abs_max_span(row, s * block, (s + 1) * block) * inverse_6)
            if has_global:
                b = fp32_divide(b, g)
            if b == b:
                b = min(max(b, low), high)
            out[r, s] = b


@arithmetic
def nvfp4_element_rows(lo, hi, x, block, scale_codes, scale_values, inverse_g, has_global, limit, out):
    """Rows lo .. hi-1 of NVFP4's scaled elements before their rounding: ``x * fp32(1 / s)`` or, with a global
    scale, ``x * fp32(inverse_g / s)`` (s the UE4M3 value of the block's scale code, ``scale_values`` the
    float32 table of the codes), clamped to [-limit, limit] unless NaN; ``out`` [M, K] float32."""
    K = x.shape[1]
    for r in range(lo, hi):
        for s in range(K // block):
            value = scale_values[scale_codes[r, s]]
            reciprocal = fp32_divide(inverse_g if has_global else np.float32(1.0), value)
            for kk in range(s * block, (s + 1) * block):
                y = np.float32(x[r, kk] * reciprocal)
                if y == y:
                    y = min(max(y, -limit), limit)
                out[r, kk] = y


def mx_blocks(x, block: int, emax_elem: int, mode: int, mbits: int):
    """(scale codes [M, K / block] uint8, scaled elements [M, K] float32) of :func:`mx_block_rows` over every row
    of the fp32 ``x`` [M, K], on the CPU backend's threads."""
    x = np.ascontiguousarray(x, np.float32)
    M, K = x.shape
    codes, scaled = np.empty((M, K // block), np.uint8), np.empty((M, K), np.float32)
    threads.parallel_for(mx_block_rows, M, CAST_ELEMENT_WORK * max(1, K), x, x.view(np.uint32), block, emax_elem,
                         mode, mbits, codes, scaled)
    return codes, scaled


def abs_max(x) -> np.float32:
    """max |x| of an fp32 array (any shape; +0 when empty), NaN where x holds a NaN (:func:`abs_max_span`)."""
    out = np.zeros(1, np.float32)
    abs_max_of(np.ascontiguousarray(x, np.float32).reshape(-1), out)
    return out[0]


def nvfp4_block_values(x, block: int, inverse_6, global_scale, low, high):
    """NVFP4's block scales [M, K / block] (float32) before their rounding (:func:`nvfp4_block_rows`) of the fp32
    ``x`` [M, K]; ``global_scale`` an fp32 value or None."""
    x = np.ascontiguousarray(x, np.float32)
    M, K = x.shape
    out = np.empty((M, K // block), np.float32)
    has_global = global_scale is not None
    threads.parallel_for(nvfp4_block_rows, M, CAST_ELEMENT_WORK * max(1, K), x, block, np.float32(inverse_6),
                         np.float32(global_scale if has_global else 1.0), has_global, np.float32(low),
                         np.float32(high), out)
    return out


def nvfp4_element_values(x, block: int, scale_codes, scale_values, inverse_g, limit):
    """NVFP4's scaled elements [M, K] (float32) before their rounding (:func:`nvfp4_element_rows`) of the fp32
    ``x`` [M, K] with the block scale codes [M, K / block]; ``inverse_g`` fp32(1 / g), or None without a global
    scale."""
    x = np.ascontiguousarray(x, np.float32)
    M, K = x.shape
    out = np.empty((M, K), np.float32)
    has_global = inverse_g is not None
    threads.parallel_for(nvfp4_element_rows, M, CAST_ELEMENT_WORK * max(1, K), x, block,
                         np.ascontiguousarray(scale_codes, np.uint8), scale_values,
                         np.float32(inverse_g if has_global else 1.0), has_global, np.float32(limit), out)
    return out


def grid_tables(grid):
    """(fp32 bits of the grid values, of the midpoints of neighbours) of a float64 grid, both uint32, kept; the
    midpoints checked exact in fp32."""
    key = grid.tobytes()
    if key not in _GRID_TABLES:
        mid = (grid[:-1] + grid[1:]) / 2
        if not (grid.astype(np.float32) == grid).all() or not (mid.astype(np.float32) == mid).all():
            raise ValueError("round_onto_grid: the grid and its midpoints must be exact in fp32")
        _GRID_TABLES[key] = (grid.astype(np.float32).view(np.uint32), mid.astype(np.float32).view(np.uint32))
    return _GRID_TABLES[key]


_GRID_TABLES = {}


# ----------------------------------------------------------------------------------------------------------------
# A kept B (a weight): mmaemu.cpu.prepared keeps it between calls


KEPT_BYTES_PER_RAW_BYTE = 16


class KeptBlockScaledB(NamedTuple):
    """A B as the kernel reads it, kept for many calls: element codes [N, K] (uint8, one per element, K padded as
    the call's kernel pads it), scale codes [N, K / block] and their :class:`PreparedBlockScaledB`."""

    codes: np.ndarray
    scales: np.ndarray
    prepared: PreparedBlockScaledB


def kept_b_engine(name: str, operands_of, fmt: str, scale_fmt: str, block: int):
    """The :class:`mmaemu.cpu.prepared.Engine` of a block-scaled B: the store compares the bytes it is handed (B's
    raw bytes and scale bytes, as the call holds them) and, for bytes it has not kept, ``operands_of(bytes) ->
    (codes [N, K], scale codes [N, K / block])`` gives what is prepared (:class:`KeptBlockScaledB`). ``name``
    must name everything ``operands_of`` reads besides the bytes (formats, block, K, padding)."""
    from .prepared import Engine

    def prepare(raw, _fmt):
        codes, scales = operands_of(raw)
        codes, scales = np.ascontiguousarray(codes, np.uint8), np.ascontiguousarray(scales, np.uint8)
        return KeptBlockScaledB(codes, scales, prepare_block_scaled_b(codes, fmt, scales, scale_fmt, block))

    def nbytes(rows, raw_size):
        # The store asks for the bytes kept for compared bytes of shape [1, raw_size]: an upper bound (per element
        # one code byte and 5 + 8 / block bytes of panels, at most two elements per raw byte (FP4), whole panels).
        return rows * raw_size * KEPT_BYTES_PER_RAW_BYTE + MAX_LANES * 1024


    return Engine(f"block-scaled:{name}", prepare, nbytes)


def accumulate_kept(a_codes, scale_a, fmt_a: str, kept: KeptBlockScaledB, preset, scale_fmt: str):
    """:func:`accumulate_block_scaled` (fast path, same bits) of A's codes [M, K] and scale codes [M, K / block]
    (plain layout, uint8, checked by the caller: codes of ``fmt_a``, K that of the kept B) against a kept B
    (:class:`KeptBlockScaledB`), without the checks and preparations of a first call: B's tables and the
    preset's parameters are kept (:func:`fast_kernel`); the outputs the fast path hands over go to the reference
    chain as there."""
    a = np.ascontiguousarray(a_codes, np.uint8)
    sa = np.ascontiguousarray(scale_a, np.uint8)
    prepared = kept.prepared
    M, N = a.shape[0], kept.codes.shape[0]
    out = np.zeros((M, N), np.float32)
    if 0 in (M, N, a.shape[1]):
        return out
    kernel = fast_kernel(preset, fmt_a, prepared.fmt, scale_fmt, prepared.block)
    todo = _run_fast(kernel, a, sa, kept.codes, kept.scales, prepared, out)
    if todo.any():
        gemm = BlockScaledGemm(a, kept.codes, fmt_a, prepared.fmt, sa, kept.scales, scale_fmt, preset)
        _run_reference(gemm, todo, out)
    return canonical_nan(out)


def plain_b_engine(fmt: str, scale_fmt: str, block: int, N: int, K: int):
    """:func:`kept_b_engine` of a B [N, K] handed over as its raw codes (FP4 packed two per byte) then its scale
    codes [N, K / block] in plain layout (a recipe layer's weight buffers), kept per format, block and shape."""
    key = (fmt, scale_fmt, block, N, K)
    engine = _PLAIN_ENGINES.get(key)
    if engine is None:
        raw_size = N * K // (2 if fmt == "e2m1" else 1)

        def operands_of(raw):
            raw = raw.reshape(-1)
            codes = raw[:raw_size].reshape(N, -1)
            return (formats.unpack_fp4(codes) if fmt == "e2m1" else codes), raw[raw_size:].reshape(N, K // block)

        engine = _PLAIN_ENGINES[key] = kept_b_engine(f"plain:{fmt}:{scale_fmt}:{block}:{N}:{K}", operands_of, fmt,
                                                     scale_fmt, block)
    return engine


_PLAIN_ENGINES = {}
