"""NumPy-level entry points of the CPU backend: decode, schedule, run the compiled loops."""

from __future__ import annotations

import numpy as np

from .. import formats
from ..arith.epilogue import OUT_CODES, scale_product
from ..arith.params import codes_gemm
from ..arith.rounding import FLOAT32, value_of_bits
from ..arith.tile import TILE_FORMATS, lane_bits_needed, tile_decode
from . import threads
from .gemm import (accumulate_gemm, accumulate_gemm_reference, epilogue_gemm, nonfinite_rows,
                   override_nonfinite)

_OUT_VIEW = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16,
             "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def decode_operand(codes: np.ndarray, fmt: str):
    """Significands (int8) and alignment exponents (int16) of a [rows, K] array of FP8 codes."""
    return formats.significands(fmt)[codes], formats.exponents(fmt)[codes]


def tile_tables(fmt: str):
    """(fp32 value, int8 exponent) of the 256 codes of a format: :func:`mmaemu.arith.tile.tile_decode` tabulated."""
    if fmt not in _TILE_TABLES:
        pairs = [tile_decode(np.uint8(code), TILE_FORMATS[fmt]) for code in range(256)]
        value = np.array([v for v, _ in pairs], np.float32)
        exp = np.array([e for _, e in pairs], np.int8)
        value.setflags(write=False)
        exp.setflags(write=False)
        _TILE_TABLES[fmt] = (value, exp)
    return _TILE_TABLES[fmt]


_TILE_TABLES = {}
# A job is TILE_ROWS rows of A against one panel of up to MAX_LANES columns: a tile of 4 x 128 outputs keeps a
# block of B (nfma x 128 x 5 bytes) in the L1 cache while its 4 rows use it, and every lane loop runs whole
# AVX-512 vectors. Panels are decoded a group at a time: PANELS_PER_THREAD panels per thread, at most
# GROUP_BYTES of decoded operands (but at least one panel).
TILE_ROWS = 4
MAX_LANES = 128
PANELS_PER_THREAD = 4
GROUP_BYTES = 64 << 20


def tile_shape(M: int, N: int, K: int, n_threads: int):
    """``(tile_rows, group, lanes)`` of the fast path: panels as wide as N needs (16 .. 128 lanes), tiles of up
    to TILE_ROWS rows, groups of up to PANELS_PER_THREAD panels per thread within GROUP_BYTES."""
    lanes = 16
    while lanes < MAX_LANES and lanes < N:
        lanes *= 2
    panels = -(-N // lanes)
    group = min(panels, PANELS_PER_THREAD * n_threads, max(1, GROUP_BYTES // (5 * K * lanes)))
    return min(TILE_ROWS, M), group, lanes


def accumulate_fast(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out):
    """Run the fast path (:func:`mmaemu.cpu.gemm.accumulate_gemm`) into ``out`` [M, N] (finite outputs)."""
    (M, K), N = a_codes.shape, b_codes.shape[0]
    n_threads = threads.num_threads()
    tile_rows, group, lanes = tile_shape(M, N, K, n_threads)
    lane_proto = np.empty(0, np.int32 if lane_bits_needed(preset) == 32 else np.int64)
    with threads.parallel_region():
        accumulate_gemm(a_codes, b_codes, TILE_FORMATS[fmt_a], tile_tables(fmt_b), schedule, params, tile_rows,
                        group, lanes, lane_proto, threads.max_threads(), out)


# NaN and Inf codes are exactly the codes with ``code & mask == pattern`` (E4M3: S.1111.111; E5M2: S.11111.xx).
NONFINITE_PATTERN = {"e4m3": (0x7F, 0x7F), "e5m2": (0x7C, 0x7C)}


def nonfinite_flags(codes, fmt: str):
    """Per row of ``codes``: True if it holds a NaN or Inf code (formats.nonfinite_mask(...).any(axis=1))."""
    flags = np.empty(codes.shape[0], np.bool_)
    with threads.parallel_region():
        nonfinite_rows(codes, *NONFINITE_PATTERN[fmt], flags)
    return flags


def accumulate_codes(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none", *,
                     reference=False):
    """fp32 accumulators [M, N] of A [M, K] times B [N, K]^T given as uint8 FP8 codes (semantics.md (c), (d)).

    Every format pair is accepted (E5M2 x E5M2 included); non-finite codes follow the rule of c.4.
    ``reference=True`` runs the straightforward loop (one chain walk per output) instead of the fast path.
    """
    gemm = codes_gemm(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits, scheme)
    a_codes, b_codes, schedule, params = gemm.a_codes, gemm.b_codes, gemm.schedule, gemm.params
    out = np.zeros(gemm.shape[:2], np.float32)
    if gemm.empty:
        return out
    if reference:
        sa, ea = decode_operand(a_codes, fmt_a)
        sb, eb = decode_operand(b_codes, fmt_b)
        with threads.parallel_region():
            accumulate_gemm_reference(sa, ea, sb, eb, schedule, params, out)
    else:
        accumulate_fast(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out)
    a_flags = nonfinite_flags(a_codes, fmt_a)
    b_flags = nonfinite_flags(b_codes, fmt_b)
    if a_flags.any() or b_flags.any():
        with threads.parallel_region():
            override_nonfinite(a_codes, a_flags, formats.values(fmt_a), b_codes, b_flags, formats.values(fmt_b),
                               out.view(np.int32))
    return out


def float32_value(bits: int) -> float:
    """Exact value of an fp32 bit pattern (integer decoding: immune to denormals-are-zero)."""
    return float(value_of_bits(np.int64(bits), FLOAT32))


def epilogue_codes(acc, scale_a_bits, scale_b_bits, scale_result_bits, out_dtype_name):
    """Output bit patterns (unsigned integers of the output's width) of fp32 accumulators (semantics.md (e)).

    Scales are given as fp32 bit patterns; ``scale_result_bits`` None when absent (ignored unless FP8 output).
    """
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    alpha = scale_product(float32_value(scale_a_bits), float32_value(scale_b_bits))
    has_sr = scale_result_bits is not None
    scale_result = float32_value(scale_result_bits) if has_sr else 1.0
    out = np.empty(acc.size, _OUT_VIEW[out_dtype_name])
    with threads.parallel_region():
        epilogue_gemm(acc.reshape(-1), alpha, OUT_CODES[out_dtype_name], scale_result, has_sr, out)
    return out.reshape(acc.shape)
