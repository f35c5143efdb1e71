"""CPU loops of the block-scaled instruction model (:mod:`mmaemu.arith.block_scaled`).

* :func:`scaled_block_rows` / :func:`scaled_group_rows` (``model.dot``): each row is a chain of instructions of
  ``k`` elements, the fp32 result of one the accumulator of the next. An instruction that holds a NaN/Inf element or
  a NaN scale takes the IEEE value ``c + special[r, i]`` instead (``special`` is the float64 sum of that
  instruction's scaled products, computed by the caller).
* GEMMs (:func:`accumulate_block_scaled`): every output of A [M, K] x B [N, K]^T is one chain of the preset's
  instructions along K from +0 (fast accumulation, no split: the B200 block-scaled profile's kernel). The
  reference loop walks each output alone (:func:`~mmaemu.arith.block_scaled.scaled_block_chain`,
  :func:`~mmaemu.arith.block_scaled.scaled_group_chain`); the fast path computes tiles of outputs at once
  (:func:`~mmaemu.arith.block_scaled.tile_scaled_chain`, :func:`~mmaemu.arith.block_scaled.tile_scaled_group_chain`)
  and hands the outputs it does not cover (a NaN/Inf element or NaN scale in their row or column, a result at or
  above 2**128) to the reference chain.
"""

import threading

import numpy as np

from .. import formats
from .._jit import arithmetic
from ..arith.block_scaled import (block_scaled_instruction, group_scaled_instruction, scaled_block_chain,
                                  scaled_group_chain, tile_scaled_chain, tile_scaled_group_chain)
from ..arith.params import preset_params
from ..arith.tile import lane_bits_needed
from . import threads
from .engine import tile_tables
from .gemm import decode_panel, decoded_rows_arrays, tile_work

# Cost of one product, in products of the fast path (mmaemu.cpu.threads task sizes).
PRODUCT_WORK = 16


@arithmetic
def scaled_block_rows(lo, hi, sa, ea, sb, eb, c, special, has_special, k, params, out):
    """Rows lo .. hi-1 of a chain of scaled-block instructions (``ea``/``eb`` include the scale exponents)."""
    K = sa.shape[1]
    for r in range(lo, hi):
        acc = c[r]
        for i in range(K // k):
            if has_special[r, i]:
                acc = np.float32(np.float64(acc) + special[r, i])
            else:
                acc = block_scaled_instruction(sa[r], ea[r], sb[r], eb[r], i * k, (i + 1) * k, acc, params.lshift,
                                               params.rshift, params.frac, params.frac_out, params.min_exp)
        out[r] = acc


@arithmetic
def scaled_group_rows(lo, hi, sa, ea, sb, eb, ssa, sea, ssb, seb, block, c, special, has_special, k, group, e_floor,
                      lift, frac, frac_out, min_exp, out):
    """Rows lo .. hi-1 of a chain of scaled-groups instructions."""
    K = sa.shape[1]
    for r in range(lo, hi):
        acc = c[r]
        for i in range(K // k):
            if has_special[r, i]:
                acc = np.float32(np.float64(acc) + special[r, i])
            else:
                acc = group_scaled_instruction(sa[r], ea[r], sb[r], eb[r], i * k, (i + 1) * k, group, block, ssa[r],
                                               sea[r], ssb[r], seb[r], acc, e_floor, lift, frac, frac_out, min_exp)
        out[r] = acc


def run_scaled_block_rows(sa, ea, sb, eb, c, special, has_special, k, params, out):
    """:func:`scaled_block_rows` over every row on the CPU backend's threads."""
    threads.parallel_for(scaled_block_rows, sa.shape[0], PRODUCT_WORK * max(1, sa.shape[1]), sa, ea, sb, eb, c,
                         special, has_special, k, params, out)


def run_scaled_group_rows(*args):
    """:func:`scaled_group_rows` over every row on the CPU backend's threads (arguments after lo, hi)."""
    sa = args[0]
    threads.parallel_for(scaled_group_rows, sa.shape[0], PRODUCT_WORK * max(1, sa.shape[1]), *args)


# ----------------------------------------------------------------------------------------------------------------
# GEMMs

# A job of the reference loops is one row of outputs; a product of the reference costs about 25 of the fast path.
REFERENCE_PRODUCT_WORK = 25
# Fast-path tiles: TILE_ROWS rows of A against panels of up to MAX_LANES rows of B (mmaemu.cpu.engine's shape).
TILE_ROWS = 4
MAX_LANES = 64


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


def reference_operands(gemm: BlockScaledGemm):
    """The decoded arrays of the reference chains: per operand (sig, exp, float64 value, scale sig, scale exp,
    float64 scale value, per-instruction NaN/Inf flags)."""
    k = gemm.preset.nfma
    result = []
    for codes, fmt, scales in ((gemm.a, gemm.fmt_a, gemm.sa), (gemm.b, gemm.fmt_b, gemm.sb)):
        sig = formats.significands(fmt)[codes]
        exp = formats.exponents(fmt)[codes].astype(np.int32)
        value = formats.values(fmt)[codes].astype(np.float64)
        ssig = formats.scale_significands(gemm.scale_fmt)[scales].astype(np.int64)
        sexp = formats.scale_exponents(gemm.scale_fmt)[scales].astype(np.int32)
        svalue = formats.decode_scales(scales, gemm.scale_fmt)
        bad = formats.nonfinite_mask(codes, fmt) | np.repeat(formats.scale_nan_codes(gemm.scale_fmt)[scales],
                                                              gemm.block, axis=1)
        rows, K = codes.shape
        flags = np.ascontiguousarray(bad.reshape(rows, K // k, k).any(-1))
        result.append((sig, exp, value, ssig, sexp, svalue, flags))
    return result


@arithmetic
def scaled_block_gemm_rows(lo, hi, sa, ea, sb, eb, va, vb, sva, svb, bad_a, bad_b, k, block, params, todo, out):
    """out[m, n] = the chain of output (m, n) for rows m in lo .. hi-1 where ``todo[m, n]`` (the reference loop:
    every output; the fast path: the outputs it hands over)."""
    N = out.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if todo[m, n]:
                out[m, n] = scaled_block_chain(sa[m], ea[m], sb[n], eb[n], va[m], vb[n], sva[m], svb[n], bad_a[m],
                                               bad_b[n], k, block, params)


@arithmetic
def scaled_group_gemm_rows(lo, hi, sa, ea, sb, eb, va, vb, ssa, sea, ssb, seb, sva, svb, bad_a, bad_b, k, group,
                           block, e_floor, lift, frac, frac_out, min_exp, todo, out):
    """:func:`scaled_block_gemm_rows` for the scaled-groups instructions."""
    N = out.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if todo[m, n]:
                out[m, n] = scaled_group_chain(sa[m], ea[m], sb[n], eb[n], va[m], vb[n], ssa[m], sea[m], ssb[n],
                                               seb[n], sva[m], svb[n], bad_a[m], bad_b[n], k, group, block, e_floor,
                                               lift, frac, frac_out, min_exp)


def _run_reference(gemm: BlockScaledGemm, todo, out):
    """The reference chains of the outputs where ``todo`` is True, into ``out``."""
    (siga, expa, va, ssa, sea, sva, bad_a), (sigb, expb, vb, ssb, seb, svb, bad_b) = reference_operands(gemm)
    preset, (M, N, K) = gemm.preset, gemm.shape
    work = REFERENCE_PRODUCT_WORK * max(1, N) * max(1, K)
    if preset.group:
        e_floor = formats.EMIN[gemm.fmt_a] + formats.EMIN[gemm.fmt_b]
        lift = formats.MANT_BITS[gemm.fmt_a] + formats.MANT_BITS[gemm.fmt_b] + 2 * formats.SCALE_MANT_BITS[
            gemm.scale_fmt]
        threads.parallel_for(scaled_group_gemm_rows, M, work, siga, expa, sigb, expb, va, vb, ssa, sea, ssb, seb,
                             sva, svb, bad_a, bad_b, preset.nfma, preset.group, gemm.block, e_floor, lift,
                             preset.frac, preset.frac_out, preset.min_exp, todo, out)
        return
    # The scale exponents join the element exponents before the alignment (semantics.md b.5).
    expa = np.ascontiguousarray(expa + np.repeat(sea, gemm.block, axis=1))
    expb = np.ascontiguousarray(expb + np.repeat(seb, gemm.block, axis=1))
    threads.parallel_for(scaled_block_gemm_rows, M, work, siga, expa, sigb, expb, va, vb, sva, svb, bad_a, bad_b,
                         preset.nfma, gemm.block, preset_params(preset, gemm.fmt_a, gemm.fmt_b), todo, out)


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
def panel_rows_arrays(tile_rows, K, lanes, lane_proto):
    """A fast-path task's arrays: its tile of decoded rows of A (:func:`mmaemu.cpu.gemm.decoded_rows_arrays`), the
    chain's work arrays (:func:`mmaemu.cpu.gemm.tile_work`), and the chain's overflow flags (uint8) and fp32
    results [tile_rows, lanes]."""
    a_val, a_exp = decoded_rows_arrays(tile_rows, K)
    overflow, result = np.empty((tile_rows, lanes), np.uint8), np.empty((tile_rows, lanes), np.float32)
    return a_val, a_exp, tile_work(tile_rows, lanes, lane_proto), overflow, result


@arithmetic
def store_tile(result, overflow, m0, rows, n0, out, overflowed):
    """The tile's chains into rows m0 .. m0+rows-1 of ``out`` from column n0 (the lanes within N):
    ``out = result``, ``overflowed = overflow != 0``."""
    for r in range(rows):
        for j in range(min(result.shape[1], out.shape[1] - n0)):
            out[m0 + r, n0 + j] = result[r, j]
            overflowed[m0 + r, n0 + j] = overflow[r, j] != 0


@arithmetic
def scaled_block_panel_rows(m_lo, m_hi, a_codes, val_table, exp_table, a_sexp, b_val, b_exp, b_sexp, n0, k, params,
                            tile_rows, lane_proto, out, overflowed):
    """The fast path: out[m, n0:n0+lanes] for rows m_lo .. m_hi-1 of A and one decoded panel of B (b_val/b_exp
    [K, lanes], b_sexp [K / k, lanes]); ``overflowed[m, n]`` marks the outputs whose chain reached 2**128."""
    K = a_codes.shape[1]
    a_val, a_exp, work, overflow, result = panel_rows_arrays(tile_rows, K, b_val.shape[1], lane_proto)
    for m0 in range(m_lo, m_hi, tile_rows):
        rows = min(tile_rows, m_hi - m0)
        decode_tile_rows(a_codes, m0, rows, val_table, exp_table, a_val, a_exp)
        tile_scaled_chain(a_val, a_exp, b_val, b_exp, a_sexp[m0:m0 + rows], b_sexp, rows, K, k, params, work,
                          overflow, result)
        store_tile(result, overflow, m0, rows, n0, out, overflowed)


@arithmetic
def scaled_group_panel_rows(m_lo, m_hi, a_codes, val_table, exp_table, a_ssig, a_sexp, b_val, b_ssig, b_sexp, n0, k,
                            group, block, scale_bits, params, tile_rows, lane_proto, out, overflowed):
    """:func:`scaled_block_panel_rows` for the scaled-groups instructions (``b_ssig``/``b_sexp`` [K / block,
    lanes]: the panel's scale significands and exponents)."""
    K = a_codes.shape[1]
    lanes = b_val.shape[1]
    a_val, a_exp, work, overflow, result = panel_rows_arrays(tile_rows, K, lanes, lane_proto)
    gsum = np.empty((k // group, lanes), np.float32)
    gabs = np.empty((k // group, lanes), np.float32)
    for m0 in range(m_lo, m_hi, tile_rows):
        rows = min(tile_rows, m_hi - m0)
        decode_tile_rows(a_codes, m0, rows, val_table, exp_table, a_val, a_exp)
        tile_scaled_group_chain(a_val, b_val, a_ssig[m0:m0 + rows], a_sexp[m0:m0 + rows], b_ssig, b_sexp, rows, K, k,
                                group, block, scale_bits, params, work, gsum, gabs, overflow, result)
        store_tile(result, overflow, m0, rows, n0, out, overflowed)


def _panel_lanes(N: int) -> int:
    lanes = 16
    while lanes < MAX_LANES and lanes < N:
        lanes *= 2
    return lanes


def _run_fast_blocks(gemm: BlockScaledGemm, out):
    """The fast path into ``out`` (kind::mxf8f6f4 and kind::mxf4nvf4); returns the [M, N] mask of the outputs it
    does not cover."""
    (M, N, K), preset = gemm.shape, gemm.preset
    k = preset.nfma
    lanes = _panel_lanes(N)
    val_a, exp_a = tile_tables(gemm.fmt_a)
    val_b, exp_b = tile_tables(gemm.fmt_b)
    sexp_table = formats.scale_exponents(gemm.scale_fmt).astype(np.int32)
    # block == k for kind::mxf8f6f4: one scale per operand and instruction.
    a_sexp = np.ascontiguousarray(sexp_table[gemm.sa])
    b_sexp = sexp_table[gemm.sb]
    ssig_table = formats.scale_significands(gemm.scale_fmt).astype(np.float32)
    a_ssig = np.ascontiguousarray(ssig_table[gemm.sa])
    b_ssig = ssig_table[gemm.sb]
    scale_bits = 2 * formats.SCALE_MANT_BITS[gemm.scale_fmt]
    params = preset_params(preset, gemm.fmt_a, gemm.fmt_b)
    lane_proto = np.empty(0, np.int32 if lane_bits_needed(preset) == 32 else np.int64)
    overflowed = np.zeros((M, N), np.bool_)
    panels = -(-N // lanes)
    row_tiles = -(-M // TILE_ROWS)
    row_ranges = threads.job_ranges(row_tiles, TILE_ROWS * lanes * K, threads.num_threads(), repeats=panels)
    decoded = {}
    lock = threading.Lock()
    # The panel decode also flags rows holding NaN/Inf codes; this path applies its own rule (scales included),
    # so it asks for no flags (an all-zero table) and drops them.
    no_nonfinite, unused_flags = np.zeros(256, np.uint8), np.zeros(N, np.bool_)

    def panel(p):
        with lock:
            if p not in decoded:
                val, exp = np.empty((K, lanes), np.float32), np.empty((K, lanes), np.int8)
                decode_panel(gemm.b, p * lanes, val_b, exp_b, no_nonfinite, val, exp, unused_flags)
                width = min(lanes, N - p * lanes)
                sexp = np.zeros((b_sexp.shape[1], lanes), np.int32)
                sexp[:, :width] = b_sexp[p * lanes:p * lanes + width].T
                ssig = np.zeros((b_sexp.shape[1], lanes), np.float32)
                ssig[:, :width] = b_ssig[p * lanes:p * lanes + width].T
                decoded[p] = val, exp, sexp, ssig
            return decoded[p]

    def task(p, lo, hi):
        b_val, b_exp, sexp, ssig = panel(p)
        m_lo, m_hi = lo * TILE_ROWS, min(hi * TILE_ROWS, M)
        if preset.group:
            scaled_group_panel_rows(m_lo, m_hi, gemm.a, val_a, exp_a, a_ssig, a_sexp, b_val, ssig, sexp, p * lanes,
                                    k, preset.group, gemm.block, scale_bits, params, TILE_ROWS, lane_proto, out,
                                    overflowed)
        else:
            scaled_block_panel_rows(m_lo, m_hi, gemm.a, val_a, exp_a, a_sexp, b_val, b_exp, sexp, p * lanes, k,
                                    params, TILE_ROWS, lane_proto, out, overflowed)

    threads.run_tasks(lambda t=t: task(*t) for t in [(p, lo, hi) for p in range(panels) for lo, hi in row_ranges])
    bad_a = _bad_rows(gemm.a, gemm.fmt_a, gemm.sa, gemm.scale_fmt)
    bad_b = _bad_rows(gemm.b, gemm.fmt_b, gemm.sb, gemm.scale_fmt)
    return overflowed | bad_a[:, None] | bad_b[None, :]


def _bad_rows(codes, fmt, scales, scale_fmt):
    """Per row: it holds a NaN/Inf element or a NaN scale."""
    return formats.nonfinite_mask(codes, fmt).any(1) | formats.scale_nan_codes(scale_fmt)[scales].any(1)


def accumulate_block_scaled(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset, *,
                            reference=False):
    """fp32 accumulators [M, N] of A [M, K] x B [N, K]^T with block scales (semantics.md b.5): every output one
    chain of ``preset``'s instructions along K from +0 (fast accumulation, no split).

    ``a_codes``/``b_codes``: one uint8 code per element in ``fmt_a``/``fmt_b`` (FP4 unpacked); ``scale_a`` [M, K /
    block] and ``scale_b`` [N, K / block]: uint8 scale codes of ``scale_fmt`` in plain (row, block) layout.
    ``reference=True`` runs the per-output loop; both give the same bits. K must be a whole number of instructions
    (ValueError otherwise). NaN results are canonical (0x7FFFFFFF).
    """
    gemm = BlockScaledGemm(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset)
    M, N, K = gemm.shape
    out = np.zeros((M, N), np.float32)
    if 0 in (M, N, K):
        return out
    if reference:
        _run_reference(gemm, np.ones((M, N), np.bool_), out)
    else:
        todo = _run_fast_blocks(gemm, out)
        if todo.any():
            _run_reference(gemm, todo, out)
    out.view(np.uint32)[np.isnan(out)] = np.uint32(0x7FFFFFFF)
    return out
