"""Turn a preset, a format pair and a split into the integer tuples the compiled arithmetic takes."""

from __future__ import annotations

import dataclasses
from typing import Tuple

import numpy as np

from ..errors import UnsupportedFeatureError
from ..formats import MANT_BITS

# k-tile widths of the split schemes (semantics.md d.1: 128 on the H100; d.2: 64 on the RTX 4060).
CONTIGUOUS_TILE = 128
INTERLEAVED_TILE = 64
# An interleaved split's slow chain restarts every 2 of its own tiles (d.2 step 4); a contiguous split's slow
# chain is one 128-wide tile (d.1 step 3).
SLOW_CHAIN_TILES = {"contiguous": 1, "serial": 2, "pairwise": 2}
SCHEMES = ("none", "contiguous", "serial", "pairwise")


def preset_params(preset, fmt_a: str, fmt_b: str):
    """``(nfma, lshift, rshift, frac, frac_out, min_exp, late_c)`` for a preset and a format pair.

    A product's integer significand carries ``MANT_BITS[a] + MANT_BITS[b]`` fraction bits; moving it onto the
    grid 2**(E - frac) shifts it left by ``frac`` minus those bits (see :mod:`mmaemu.arith.block`).
    """
    shift = preset.frac - MANT_BITS[fmt_a] - MANT_BITS[fmt_b]
    return (
        preset.nfma,
        max(shift, 0),
        max(-shift, 0),
        preset.frac,
        preset.frac_out,
        preset.min_exp,
        int(preset.late_c),
    )


def schedule_params(preset, K: int, use_fast_accum: bool, splits: int = 1, scheme: str = "none"):
    """``(tile, splits, interleaved, chain_tiles, pairwise, padded)`` of semantics.md (c)/(d) for one call.

    Raises UnsupportedFeatureError where the preset has no GEMM level (slow or split with b200_mma_sync or a
    custom preset whose slow_chunk is None), and where a custom preset's nfma does not divide an interleaved
    tile (no evidence says how such a block would straddle two tiles of one split).
    """
    if preset.block_scaled:
        raise UnsupportedFeatureError(
            f"preset {preset.name!r} models a block-scaled instruction: instruction level only (mmaemu.model.dot "
            "with scale_a= and scale_b=), not a GEMM schedule")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown split scheme {scheme!r}; expected one of {SCHEMES}")
    if (splits == 1) != (scheme == "none"):
        raise ValueError(f"splits={splits} does not fit scheme {scheme!r}: S = 1 has scheme 'none', S > 1 not")
    needs_gemm_level = splits > 1 or not use_fast_accum
    if needs_gemm_level and preset.slow_chunk is None:
        what = "split-K" if splits > 1 else "slow accumulation (use_fast_accum=False)"
        raise UnsupportedFeatureError(
            f"preset {preset.name!r} has no characterised GEMM level: {what} is not modelled for it; "
            "use use_fast_accum=True with splitk=1"
        )
    if splits == 1:
        if use_fast_accum:
            return (max(K, 1), 1, 0, 0, 0, 0)
        return (preset.slow_chunk, 1, 0, 1, 0, 0)
    interleaved = scheme in ("serial", "pairwise")
    tile = INTERLEAVED_TILE if interleaved else CONTIGUOUS_TILE
    if interleaved and tile % preset.nfma:
        raise UnsupportedFeatureError(
            f"preset {preset.name!r}: nfma={preset.nfma} does not divide the {tile}-wide tiles of the {scheme!r} "
            "scheme, so a block would straddle two tiles of one split; no recording says how hardware does that"
        )
    chain_tiles = 0 if use_fast_accum else SLOW_CHAIN_TILES[scheme]
    return (tile, splits, int(interleaved), chain_tiles, int(scheme == "pairwise"), 1)


@dataclasses.dataclass(frozen=True)
class CodesGemm:
    """A GEMM of FP8 codes ready for an engine: C-contiguous uint8 operands and the integer tuples."""

    a_codes: np.ndarray  # [M, K]
    b_codes: np.ndarray  # [N, K]
    schedule: Tuple[int, ...]
    params: Tuple[int, ...]

    @property
    def shape(self):
        """(M, N, K)."""
        return self.a_codes.shape[0], self.b_codes.shape[0], self.a_codes.shape[1]

    @property
    def empty(self) -> bool:
        """Nothing to accumulate: the result is all +0."""
        return 0 in self.shape


def codes_gemm(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none") -> CodesGemm:
    """Check and prepare ``A [M, K] x B [N, K]^T`` given as FP8 codes for any engine."""
    a_codes = np.ascontiguousarray(a_codes, dtype=np.uint8)
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    schedule = schedule_params(preset, a_codes.shape[1], use_fast_accum, splits, scheme)
    return CodesGemm(a_codes, b_codes, schedule, preset_params(preset, fmt_a, fmt_b))
