"""The instruction-level probe that gates ``cuda:native``: does this GPU's FP8 MMA compute the preset's block step?

The native kernel's results are whatever the tensor cores compute, so before it is used on a device the device's own
instruction is compared bit for bit with mmaemu's block step (:mod:`mmaemu.cuda.native.instruction_model`, i.e.
:func:`mmaemu.arith.chain.chain_early`) on crafted tiles, through the very instruction forms the kernel issues (on
sm_90 ``wgmma ... m64n128k32`` with scale-d 0 and 1, the fence/commit/wait sequence and the descriptor layout of
:mod:`mmaemu.cuda.native.wgmma`; on sm_89 the sixteen ``mma.sync ... m16n8k32`` per warp and the register fragments
of :mod:`~mmaemu.cuda.native.mma_sync`; the cp.async staging and the accumulator layout of each). The expected side
is the block step of the instruction's preset (hopper's for wgmma, ada's for mma.sync). Any difference rejects the
device for the kernel; the report names the first differing case.

Families of tiles (:func:`probe_tiles`; every format pair; every one of the 64 x 128 outputs of a tile is
compared, a row of A against a column of B):

* ``small next to large``, ``truncation toward zero`` (a large product of either sign with small products of
  either sign whose low bits fall below the block's grid), ``exponent-sum alignment`` (significands near 2, so a
  product lies a binade above its exponent sum), ``14-bit result`` (same-sign sums that carry past 2^(E+1)),
  ``block length`` (small products in the first half of the 32, the large one in the second: one block for
  hopper, two for ada), ``accumulator
  inside the alignment`` (crafted accumulators of up to 14 significant bits, as chains produce, above and below
  the products), ``+0 results`` (exact cancellations, and sums that IEEE would make a tiny negative number),
  ``exponent gaps`` (two terms 0..40 binades apart, random significands; accumulator against product where the
  products' range is too narrow), ``subnormals``, ``random`` codes;
* ``chained`` (four steps: the accumulator of each step is the previous result; the first step with scale-d = 0,
  or with a crafted accumulator);
* ``NaN/Inf`` codes in some rows of A and columns of B: the outputs whose row and column are finite must be
  unaffected (the GEMM's NaN/Inf rule replaces the others, semantics.md c.4, so they are not compared).

The CPU side (:func:`expected`) and the generator run without a GPU (tests/test_native_probe.py); the device side
(:func:`run_probe`) takes a function that runs the tiles through the probe kernel (:func:`device_runner`: on a
device, or under numba's CUDA simulator with the instruction's CPU twin).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List

import numpy as np

from ... import formats
from ...formats import TOP_FIELD, encode, random_codes
from ..native.instruction_model import FORMAT_PAIRS, instruction_outputs

# A probe tile: the outputs of one group of 128 threads (rows of A x columns of B) per 32-k step of either
# instruction (mmaemu.cuda.native.wgmma, mmaemu.cuda.native.mma_sync).
MMA_M, MMA_N, MMA_K = 64, 128, 32

PROBE_VERSION = 2
CHAIN_STEPS = 4
BIAS = {"e4m3": 7, "e5m2": 15}


@dataclasses.dataclass(frozen=True, eq=False)
class ProbeTile:
    """One launch of the probe kernel's warpgroup: ``steps`` chained MMA instructions on A [steps, 64, 32] and
    B [steps, 128, 32] (FP8 codes; B by column, K-major), from the accumulator ``c`` [64, 128] (``use_c``) or
    with scale-d = 0 in the first step. ``compared`` [64, 128]: the outputs checked (False: a NaN/Inf row or
    column)."""

    label: str
    fmt_a: str
    fmt_b: str
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    use_c: bool
    compared: np.ndarray

    @property
    def steps(self) -> int:
        return self.a.shape[0]


# ----------------------------------------------------------------------------------------------------------------
# Codes


def field_of(fmt, exponent):
    """Exponent field of the normal binade 2**exponent."""
    return np.asarray(exponent) + BIAS[fmt]


def _columns(rng, fmt):
    """B [128, 32] of the single-step tiles: +1, -1, alternating +-1, near-2 significands, subnormals, one
    exponent per column at several levels, then random codes."""
    mbits = formats.MANT_BITS[fmt]
    one = encode(fmt, 0, field_of(fmt, 0), 0)
    b = random_codes(rng, (MMA_N, MMA_K), fmt)
    b[0] = one
    b[1] = one | 0x80
    b[2] = np.where(np.arange(MMA_K) % 2, one | 0x80, one)
    b[3] = encode(fmt, rng.integers(0, 2, MMA_K), field_of(fmt, 0), (1 << mbits) - 1)
    b[4] = encode(fmt, rng.integers(0, 2, MMA_K), 0, rng.integers(1, 1 << mbits, MMA_K))
    for j in range(5, 16):  # one random exponent per column, random significands and signs
        b[j] = encode(fmt, rng.integers(0, 2, MMA_K), rng.integers(1, TOP_FIELD[fmt] + 1), rng.integers(0, 8, MMA_K))
    return b


def _gap_row(rng, fmt, gap, width=MMA_K):
    """A row: one term at a high exponent, the others ``gap`` binades below it (where the format reaches), random
    significands and signs."""
    top = TOP_FIELD[fmt] - 1
    low = max(1, top - gap)
    row = encode(fmt, rng.integers(0, 2, width), np.full(width, low), rng.integers(0, 8, width))
    row[rng.integers(0, width)] = encode(fmt, rng.integers(0, 2), top, rng.integers(0, 8))
    return row


def _rows(family, rng, fmt):
    """A [64, 32] of a single-step family."""
    mbits = formats.MANT_BITS[fmt]
    a = np.zeros((MMA_M, MMA_K), np.uint8)
    top = TOP_FIELD[fmt] - 1
    for r in range(MMA_M):
        sign = rng.integers(0, 2, MMA_K)
        mant = rng.integers(0, 1 << mbits, MMA_K)
        if family == "small next to large":
            gap = 1 + r % (top - 1)
            a[r] = encode(fmt, sign, np.full(MMA_K, top - gap), mant)
            a[r, r % MMA_K] = encode(fmt, rng.integers(0, 2), top, rng.integers(0, 8))
        elif family == "truncation toward zero":
            big_sign, small_sign = (r >> 1) & 1, r & 1
            gap = 1 + (r // 4) % 13
            a[r] = encode(fmt, np.full(MMA_K, small_sign), np.full(MMA_K, top - gap), mant | 1)
            a[r, rng.integers(0, MMA_K)] = encode(fmt, big_sign, top, rng.integers(0, 8))
        elif family == "exponent-sum alignment":
            a[r] = encode(fmt, sign, np.full(MMA_K, top - 1 - r % 16), np.full(MMA_K, (1 << mbits) - 1))
            a[r, :r % 8] = encode(fmt, sign[:r % 8], np.full(r % 8, max(1, top - 14 - r % 3)), mant[:r % 8])
        elif family == "14-bit result":
            a[r] = encode(fmt, np.full(MMA_K, r & 1), np.full(MMA_K, top - r % 4), (1 << mbits) - 1 - (mant & 1))
        elif family == "block length":
            a[r, :16] = encode(fmt, sign[:16], np.full(16, max(1, top - 4 - r % 10)), mant[:16])
            a[r, 16 + r % 16] = encode(fmt, rng.integers(0, 2), top, rng.integers(0, 8))
        elif family == "+0 results":
            half = random_codes(rng, MMA_K // 2, fmt)
            a[r] = np.concatenate([half, half ^ 0x80])[rng.permutation(MMA_K)] if r % 2 else \
                np.concatenate([half, half ^ 0x80])
            if r % 4 == 3:  # a tiny product next to the cancellation: IEEE would give a tiny signed number
                a[r, 0] = encode(fmt, rng.integers(0, 2), 1, rng.integers(0, 8))
        elif family == "exponent gaps":
            a[r] = _gap_row(rng, fmt, r % 41)
        elif family == "subnormals":
            a[r] = encode(fmt, sign, np.where(np.arange(MMA_K) % 3 == 0, rng.integers(1, 6, MMA_K), 0),
                          np.where(np.arange(MMA_K) % 3 == 0, mant, rng.integers(1, 1 << mbits, MMA_K)))
        else:  # random, zeros included
            a[r] = random_codes(rng, MMA_K, fmt, fields=(0, TOP_FIELD[fmt]))
            a[r, rng.random(MMA_K) < 0.1] = rng.integers(0, 2) << 7
    return a


SINGLE_STEP = ("small next to large", "truncation toward zero", "exponent-sum alignment", "14-bit result",
               "block length", "+0 results", "exponent gaps", "subnormals", "random")


def _accumulators(rng, shape, lo=-24, hi=40):
    """fp32 accumulators as GEMM chains make them: +0 or at most 14 significant bits, exponents in [lo, hi]."""
    sig = rng.integers(1 << 13, 1 << 14, shape) * rng.choice([-1, 1], shape)
    exp = rng.integers(lo, hi + 1, shape)
    c = np.ldexp(sig.astype(np.float64), exp - 13).astype(np.float32)
    c[rng.random(shape) < 0.05] = 0.0
    return c


def _tile(label, fmt_a, fmt_b, a, b, c=None):
    compared = ~(formats.nonfinite_mask(a, fmt_a).any(axis=(0, 2))[:, None]
                 | formats.nonfinite_mask(b, fmt_b).any(axis=(0, 2))[None, :])
    use_c = c is not None
    c = np.zeros((MMA_M, MMA_N), np.float32) if c is None else c.astype(np.float32)
    return ProbeTile(f"{label} ({fmt_a} x {fmt_b})", fmt_a, fmt_b, a, b, c, use_c, compared)


def probe_tiles(preset, pairs=FORMAT_PAIRS, seed=20261201) -> List[ProbeTile]:
    """Every probe tile for the format pairs (deterministic), for an instruction that computes ``preset``'s block
    (the cancelling accumulators are computed with it)."""
    tiles = []
    for fmt_a, fmt_b in pairs:
        rng = np.random.default_rng([seed, formats.FORMATS.index(fmt_a), formats.FORMATS.index(fmt_b)])
        b = _columns(rng, fmt_b)[None]
        for family in SINGLE_STEP:
            tiles.append(_tile(family, fmt_a, fmt_b, _rows(family, rng, fmt_a)[None], b))
        # The accumulator inside the alignment: crafted accumulators against products above and below them.
        a = _rows("exponent gaps", rng, fmt_a)[None]
        tiles.append(_tile("accumulator inside the alignment", fmt_a, fmt_b, a, b, _accumulators(rng, (MMA_M, MMA_N))))
        # Accumulator against products 0..40 binades apart (wider than the products' own range).
        a = _rows("random", rng, fmt_a)[None]
        gaps = np.arange(MMA_M * MMA_N).reshape(MMA_M, MMA_N) % 41
        c = _accumulators(rng, (MMA_M, MMA_N), lo=0, hi=0) * np.exp2(np.where(gaps % 2, gaps, -gaps)).astype(np.float32)
        tiles.append(_tile("exponent gaps, accumulator", fmt_a, fmt_b, a, b, c))
        # +0 from the accumulator: c cancels the products exactly (row r of A against the column of ones).
        a = _rows("+0 results", rng, fmt_a)[None]
        c = _accumulators(rng, (MMA_M, MMA_N))
        c[:, 0] = -instruction_outputs(a[0], np.repeat(b[0][:1], MMA_M, 0), np.zeros(MMA_M, np.float32), fmt_a,
                                       fmt_b, preset)
        tiles.append(_tile("+0 results, accumulator", fmt_a, fmt_b, a, b, c))
        # Chains: four steps of different families, from scale-d = 0 and from crafted accumulators.
        a = np.stack([_rows(SINGLE_STEP[(i * 3 + 1) % len(SINGLE_STEP)], rng, fmt_a) for i in range(CHAIN_STEPS)])
        bs = np.stack([_columns(rng, fmt_b) for _ in range(CHAIN_STEPS)])
        tiles.append(_tile("chained", fmt_a, fmt_b, a, bs))
        tiles.append(_tile("chained from an accumulator", fmt_a, fmt_b, a[::-1].copy(), bs,
                           _accumulators(rng, (MMA_M, MMA_N))))
        # NaN/Inf codes in some rows and columns: the finite outputs must not notice.
        a = _rows("random", rng, fmt_a)
        bn = _columns(rng, fmt_b)
        nan_a, nan_b = np.uint8(0x7F), np.uint8(0x7F)
        a[5, 3], a[9, 0] = nan_a, (0x7C if fmt_a == "e5m2" else nan_a)
        bn[7, 31], bn[20, 4] = nan_b, (0xFC if fmt_b == "e5m2" else nan_b)
        tiles.append(_tile("NaN/Inf", fmt_a, fmt_b, a[None], bn[None]))
    return tiles


# ----------------------------------------------------------------------------------------------------------------
# CPU side and comparison


def expected(tile: ProbeTile, preset) -> np.ndarray:
    """fp32 [64, 128]: what an instruction computing ``preset``'s block makes of the tile (all steps chained),
    output by output."""
    rows = np.repeat(np.arange(MMA_M), MMA_N)
    cols = np.tile(np.arange(MMA_N), MMA_M)
    a = tile.a.transpose(1, 0, 2).reshape(MMA_M, -1)[rows]
    b = tile.b.transpose(1, 0, 2).reshape(MMA_N, -1)[cols]
    c = tile.c.reshape(-1) if tile.use_c else np.zeros(MMA_M * MMA_N, np.float32)
    return instruction_outputs(a, b, c, tile.fmt_a, tile.fmt_b, preset).reshape(MMA_M, MMA_N)


def first_difference(tile: ProbeTile, got, want):
    """None if the compared outputs agree bit for bit, else a description of the first differing output."""
    g = np.ascontiguousarray(got, np.float32).view(np.uint32)
    w = np.ascontiguousarray(want, np.float32).view(np.uint32)
    bad = np.argwhere((g != w) & tile.compared)
    if not bad.size:
        return None
    r, n = (int(v) for v in bad[0])
    return {"case": tile.label, "output": [r, n], "got": f"{int(g[r, n]):#010x}", "want": f"{int(w[r, n]):#010x}",
            "differing_outputs": int(bad.shape[0]),
            "a_codes": tile.a[:, r].reshape(-1).tobytes().hex(), "b_codes": tile.b[:, n].reshape(-1).tobytes().hex(),
            "c": f"{int(tile.c.view(np.uint32)[r, n]):#010x}" if tile.use_c else "scale-d = 0"}


def run_probe(compute: Callable, preset, tiles=None):
    """(passed, details): ``compute(tiles) -> [fp32 [64, 128]]`` (the device's results) against :func:`expected`
    with ``preset``'s block; details hold the tile count and the first difference of each failing tile (at most
    5)."""
    tiles = probe_tiles(preset) if tiles is None else tiles
    results = compute(tiles)
    failures = []
    for tile, got in zip(tiles, results):
        diff = first_difference(tile, got, expected(tile, preset))
        if diff is not None:
            failures.append(diff)
    details = {"probe_version": PROBE_VERSION, "preset": preset.name, "tiles": len(tiles),
               "outputs_compared": int(sum(t.compared.sum() for t in tiles)), "failing_tiles": len(failures),
               "first": failures[:5]}
    return not failures, details


def summarize(details) -> str:
    if not details["failing_tiles"]:
        return f"instruction probe: {details['outputs_compared']} outputs of {details['tiles']} tiles bit-identical"
    first = details["first"][0]
    return (f"instruction probe: {details['failing_tiles']} of {details['tiles']} tiles differ; first: "
            f"{first['case']} output {first['output']}: got {first['got']}, want {first['want']} "
            f"(a {first['a_codes']}, b {first['b_codes']}, c {first['c']})")


def device_runner(instruction, stream=0):
    """``compute(tiles)`` for :func:`run_probe` that launches the probe kernel of ``instruction`` (a name of
    :data:`mmaemu.cuda.native.kernel.INSTRUCTIONS`) on a device, or under the simulator."""
    from ..dispatch.launch import launch_probe

    def compute(tiles):
        return launch_probe(tiles, instruction, stream)

    return compute
