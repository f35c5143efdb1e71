"""Turn a preset, a format pair and a split into the integer tuples the compiled arithmetic takes."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

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


class BlockParams(NamedTuple):
    """A preset's block algorithm for one format pair, as the compiled arithmetic reads it (semantics.md b.1, b.2;
    :mod:`mmaemu.arith.block`): integers, built by :func:`preset_params`."""

    nfma: int  # products per block
    lshift: int  # left shift of a product's integer significand onto the grid 2**(E - frac)
    rshift: int  # right shift of it (one of the two is 0)
    frac: int  # fraction bits of the block's alignment grid
    frac_out: int  # fraction bits kept of a block result
    min_exp: int  # floor of the block's alignment exponent
    late_c: int  # 1: the accumulator is added after the block's products (b.2), 0: it takes part (b.1)


class Schedule(NamedTuple):
    """How one call's K is cut into chains and split partials and how these are combined (semantics.md (c), (d);
    :mod:`mmaemu.arith.schedule`): integers, built by :func:`schedule_params`."""

    tile: int  # width of a k-tile
    splits: int  # S, the number of partials
    interleaved: int  # 1: split s owns the tiles t = s (mod S) (d.2), 0: contiguous runs of tiles (d.1)
    chain_tiles: int  # a chain restarts from +0 every this many of a split's own tiles (0 = never)
    pairwise: int  # 1: partials combined in the pairwise order of d.2, 0: left to right
    padded: int  # 1: split tiles walked at full width, zero padding included; 0: a chain stops at K


def preset_params(preset, fmt_a: str, fmt_b: str) -> BlockParams:
    """The :class:`BlockParams` of a preset and a format pair.

    A product's integer significand carries ``MANT_BITS[a] + MANT_BITS[b]`` fraction bits; moving it onto the
    grid 2**(E - frac) shifts it left by ``frac`` minus those bits (see :mod:`mmaemu.arith.block`).
    """
    shift = preset.frac - MANT_BITS[fmt_a] - MANT_BITS[fmt_b]
    return BlockParams(
        preset.nfma,
        max(shift, 0),
        max(-shift, 0),
        preset.frac,
        preset.frac_out,
        preset.min_exp,
        int(preset.late_c),
    )


def require_gemm_level(preset, use_fast_accum: bool, splits: int = 1) -> None:
    """The one refusal of a preset without GEMM level (``slow_chunk`` None: b200_mma_sync, the Blackwell
    instruction presets, a custom preset): slow accumulation, then split-K (S > 1), raise
    UnsupportedFeatureError (semantics.md b.2, b.3, f.6)."""
    if preset.slow_chunk is not None:
        return
    if not use_fast_accum:
        raise UnsupportedFeatureError(
            f"preset {preset.name!r} has no characterised GEMM level: slow accumulation "
            "(use_fast_accum=False) is not modelled for it; use use_fast_accum=True"
        )
    if splits > 1:
        raise UnsupportedFeatureError(
            f"preset {preset.name!r} has no characterised GEMM level: split-K (S={splits}) is not modelled "
            "for it; use splitk=1"
        )


def schedule_params(preset, K: int, use_fast_accum: bool, splits: int = 1, scheme: str = "none") -> Schedule:
    """The :class:`Schedule` of semantics.md (c)/(d) for one call.

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
    require_gemm_level(preset, use_fast_accum, splits)
    if splits == 1:
        if use_fast_accum:
            return Schedule(max(K, 1), 1, 0, 0, 0, 0)
        return Schedule(preset.slow_chunk, 1, 0, 1, 0, 0)
    interleaved = scheme in ("serial", "pairwise")
    tile = INTERLEAVED_TILE if interleaved else CONTIGUOUS_TILE
    if interleaved and tile % preset.nfma:
        raise UnsupportedFeatureError(
            f"preset {preset.name!r}: nfma={preset.nfma} does not divide the {tile}-wide tiles of the {scheme!r} "
            "scheme, so a block would straddle two tiles of one split; no recording says how hardware does that"
        )
    chain_tiles = 0 if use_fast_accum else SLOW_CHAIN_TILES[scheme]
    return Schedule(tile, splits, int(interleaved), chain_tiles, int(scheme == "pairwise"), 1)


@dataclasses.dataclass(frozen=True)
class CodesGemm:
    """A GEMM of FP8 codes ready for an engine: C-contiguous uint8 operands, the schedule and the block parameters."""

    a_codes: np.ndarray  # [M, K]
    b_codes: np.ndarray  # [N, K]
    schedule: Schedule
    params: BlockParams

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
