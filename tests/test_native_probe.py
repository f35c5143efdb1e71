"""The native kernel's gate without a GPU: the probe's tiles, its CPU side, its power to reject, and the layout
and schedule arithmetic of mmaemu.cuda.wgmma / native_kernel.

* The CPU side (probe.expected) equals the independent oracle (tests/oracle.py) on sampled outputs of every tile.
* The tiles reach what the probe claims to test (gaps 0..40, truncation of both signs, +0 where IEEE gives a
  tiny negative number, subnormals, NaN/Inf rows left out of the comparison, chains from scale-d = 0 and from
  crafted accumulators, every format pair).
* Instruction models that differ from the hopper block step in one parameter each (block length, fraction bits,
  result width, a late accumulator, -0 results) are rejected, each by the family made for it.
* Descriptors, the core-matrix staging layout and the accumulator fragment layout agree with each other; the
  stage plan walks the same k as accumulate_one.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import oracle
from mmaemu import formats
from mmaemu.errors import ExperimentalPresetWarning
from mmaemu.arith.params import preset_params, schedule_params
from mmaemu.cuda import native_kernel, probe, wgmma
from mmaemu.model import Preset, dot
from mmaemu.model.presets import ADA, B200_MMA_SYNC, HOPPER

TILES = probe.probe_tiles()
EXPECTED = [probe.expected(t) for t in TILES]


def _exponents(tile):
    """Per output: sorted exponents of its nonzero terms (product exponent sums, the accumulator's exponent)."""
    a = tile.a.transpose(1, 0, 2).reshape(64, -1)
    b = tile.b.transpose(1, 0, 2).reshape(128, -1)
    ea = np.where(formats.significands(tile.fmt_a)[a] != 0, formats.exponents(tile.fmt_a)[a], np.nan)
    eb = np.where(formats.significands(tile.fmt_b)[b] != 0, formats.exponents(tile.fmt_b)[b], np.nan)
    return ea[:, None, :] + eb[None, :, :]


def test_every_family_for_every_format_pair():
    labels = {t.label for t in TILES}
    for fmt_a, fmt_b in wgmma.FORMAT_PAIRS:
        for family in probe.SINGLE_STEP + ("accumulator inside the alignment", "exponent gaps, accumulator",
                                           "+0 results, accumulator", "chained", "chained from an accumulator",
                                           "NaN/Inf"):
            assert f"{family} ({fmt_a} x {fmt_b})" in labels
    assert {t.steps for t in TILES} == {1, probe.CHAIN_STEPS}
    assert any(t.steps > 1 and t.use_c for t in TILES) and any(t.steps > 1 and not t.use_c for t in TILES)


def test_cpu_side_equals_the_oracle():
    rng = np.random.default_rng(5)
    hopper = oracle.PRESETS["hopper"]
    for tile, want in zip(TILES, EXPECTED):
        rows, cols = np.nonzero(tile.compared)
        for i in rng.choice(rows.size, 12, replace=False):
            r, n = rows[i], cols[i]
            c_bits = int(tile.c.view(np.uint32)[r, n]) if tile.use_c else 0
            got = oracle.dot([int(v) for v in tile.a[:, r].reshape(-1)], [int(v) for v in tile.b[:, n].reshape(-1)],
                             tile.fmt_a, tile.fmt_b,
                             c_bits, hopper)
            assert got == int(want.view(np.uint32)[r, n]), (tile.label, r, n)


def test_tiles_reach_what_the_probe_claims():
    gaps, truncated_up, truncated_down, tiny_negative_zero, subnormal_pairs = set(), 0, 0, 0, set()
    for tile, want in zip(TILES, EXPECTED):
        e = _exponents(tile)
        spans = np.nanmax(e, axis=2) - np.nanmin(e, axis=2)
        gaps |= {int(g) for g in spans[np.isfinite(spans) & tile.compared]}
        if tile.use_c:
            c_exp = np.where(tile.c != 0, np.floor(np.log2(np.abs(tile.c.astype(np.float64)) + 1e-300)), np.nan)
            top = np.nanmax(e, axis=2)
            gaps |= {int(g) for g in np.abs(c_exp - top)[np.isfinite(c_exp - top) & tile.compared]}
        values_a = formats.decode(tile.a, tile.fmt_a)
        values_b = formats.decode(tile.b, tile.fmt_b)
        with np.errstate(invalid="ignore", over="ignore"):
            exact = np.einsum("srk,snk->rn", values_a, values_b) + (tile.c if tile.use_c else 0)
        ok = tile.compared & np.isfinite(exact)
        truncated_up += int(np.sum(ok & (want < exact)))
        truncated_down += int(np.sum(ok & (want > exact)))
        tiny_negative_zero += int(np.sum(ok & (want == 0) & ~np.signbit(want) & (exact < 0)))
        if (tile.a[..., :] & 0x7F < (1 << formats.MANT_BITS[tile.fmt_a])).any() and \
                (tile.b & 0x7F < (1 << formats.MANT_BITS[tile.fmt_b])).any():
            subnormal_pairs.add((tile.fmt_a, tile.fmt_b))
    assert set(range(41)) <= gaps
    assert truncated_up and truncated_down  # truncation toward zero of positive and of negative sums
    assert tiny_negative_zero  # +0 where IEEE arithmetic gives a tiny negative number (T7)
    assert subnormal_pairs == set(wgmma.FORMAT_PAIRS)
    nan_tiles = [t for t in TILES if t.label.startswith("NaN/Inf")]
    assert all(0 < t.compared.sum() < t.compared.size for t in nan_tiles)


def _model(preset, negative_zero=False):
    """compute(tiles) of a hypothetical instruction with ``preset``'s block (mmaemu.model.dot)."""

    def compute(tiles):
        results = []
        for tile in tiles:
            a = torch.from_numpy(np.repeat(tile.a.transpose(1, 0, 2).reshape(64, -1), 128, 0)).view(
                formats.DTYPE_OF[tile.fmt_a])
            b = torch.from_numpy(np.tile(tile.b.transpose(1, 0, 2).reshape(128, -1), (64, 1))).view(
                formats.DTYPE_OF[tile.fmt_b])
            c = torch.from_numpy(tile.c.reshape(-1) if tile.use_c else np.zeros(64 * 128, np.float32))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalPresetWarning)  # the mutants are custom presets
                out = dot(a, b, c, preset=preset).numpy().reshape(64, 128).copy()
            if negative_zero:
                out[out == 0] = -0.0
            results.append(out)
        return results

    return compute


def test_the_hopper_model_passes_and_the_report_names_the_first_difference():
    passed, details = probe.run_probe(lambda tiles: EXPECTED, TILES)
    assert passed and details["failing_tiles"] == 0 and details["outputs_compared"] > 400_000
    broken = [e.copy() for e in EXPECTED]
    broken[3].view(np.uint32)[7, 9] ^= 1
    passed, details = probe.run_probe(lambda tiles: broken, TILES)
    assert not passed and details["failing_tiles"] == 1
    first = details["first"][0]
    assert first["case"] == TILES[3].label and first["output"] == [7, 9] and first["differing_outputs"] == 1
    assert probe.summarize(details).startswith(f"instruction probe: 1 of {len(TILES)} tiles differ; first: "
                                               f"{TILES[3].label} output [7, 9]")


@pytest.mark.parametrize("mutant,family", [
    (Preset("blocks of 16", nfma=16, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128),
     "block length"),
    (Preset("frac 14", nfma=32, frac=14, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128),
     "small next to large"),
    (Preset("15-bit results", nfma=32, frac=14, frac_out=14, min_exp=-132, late_c=False, slow_chunk=128),
     "14-bit result"),
    (Preset("late accumulator", nfma=32, frac=13, frac_out=13, min_exp=-132, late_c=True, slow_chunk=None),
     "accumulator inside the alignment"),
    (B200_MMA_SYNC, "truncation toward zero"),
    (ADA, "block length"),
])
def test_mutant_instructions_are_rejected(mutant, family):
    passed, details = probe.run_probe(_model(mutant), TILES)
    assert not passed
    failing = {d["case"] for d in details["first"]}
    # run_probe keeps five; the family made for this property must fail too.
    families = [t for t in TILES if t.label.startswith(family + " (")]
    results = _model(mutant)(families)
    assert any(probe.first_difference(t, r, probe.expected(t)) for t, r in zip(families, results)), family
    assert failing


def test_negative_zero_results_are_rejected():
    zero_tiles = [t for t in TILES if t.label.startswith("+0 results")]
    passed, details = probe.run_probe(_model(HOPPER, negative_zero=True), zero_tiles)
    assert not passed and details["first"][0]["got"] == "0x80000000"


# ----------------------------------------------------------------------------------------------------------------
# Layouts and the stage plan


def test_descriptor_round_trip_and_staging_layout_agree():
    desc = wgmma.matrix_descriptor(0x4080, native_kernel.LEADING_BYTES, native_kernel.STRIDE_BYTES)
    assert wgmma.descriptor_fields(desc) == (0x4080, native_kernel.LEADING_BYTES, native_kernel.STRIDE_BYTES, 0, 0)
    # Where the descriptor says element (r, k) is, the staging copy put byte k of row r.
    offsets = wgmma.descriptor_offset(native_kernel.CTA_M, native_kernel.STAGE_K, native_kernel.LEADING_BYTES,
                                      native_kernel.STRIDE_BYTES)
    staged = np.array([[native_kernel.stage_offset(r, k // 16) + k % 16 for k in range(native_kernel.STAGE_K)]
                       for r in range(native_kernel.CTA_M)])
    assert np.array_equal(offsets, staged)
    assert len(np.unique(staged)) == staged.size == native_kernel.OPERAND_STAGE_BYTES
    # The second 32-k step of a stage: its descriptor addresses the next two 16-byte chunks.
    step = wgmma.descriptor_fields(desc + native_kernel.DESCRIPTOR_STEP)[0] - 0x4080
    assert step == 2 * native_kernel.LEADING_BYTES == native_kernel.stage_offset(0, 2)


def test_fragment_layout_covers_the_tile_once():
    seen = np.zeros((wgmma.MMA_M, wgmma.MMA_N), int)
    for t in range(wgmma.WARPGROUP):
        rows, cols = wgmma.fragment_coords(t)
        seen[rows, cols] += 1
    assert (seen == 1).all()
    # Thread 5 (warp 0, group 1, thread-in-group 1): registers 0-3 at rows 1 and 9, columns 2 and 3.
    rows, cols = wgmma.fragment_coords(5)
    assert list(zip(rows[:4], cols[:4])) == [(1, 2), (1, 3), (9, 2), (9, 3)] and (rows[4], cols[4]) == (1, 10)


@pytest.mark.parametrize("K,fast,splits,scheme", [(300, True, 1, "none"), (300, False, 1, "none"),
                                                  (1000, False, 3, "contiguous"), (384, True, 4, "contiguous"),
                                                  (64, False, 1, "none"), (1, True, 1, "none")])
def test_stage_plan_walks_the_chains_of_accumulate_one(K, fast, splits, scheme):
    schedule = schedule_params(HOPPER, K, fast, splits, scheme)
    plan, counts = native_kernel.stage_plan(K, schedule)
    oracle_tiles = oracle.contiguous_split_tiles(K, splits) if splits > 1 else None
    for s in range(splits):
        stages = plan[s, :counts[s]]
        covered = [k for k0, flags in stages
                   for k in range(k0, k0 + 32 * (flags >> native_kernel.PLAN_STEPS_SHIFT))]
        if splits > 1:
            want = [k for t in oracle_tiles[s] for k in range(128 * t, 128 * t + 128) if k < -(-K // 32) * 32]
        else:
            want = list(range(-(-K // 32) * 32))
        assert covered == want
        starts = [k0 for k0, flags in stages if flags & native_kernel.PLAN_START]
        ends = [k0 for k0, flags in stages if flags & native_kernel.PLAN_END]
        chain = 128 if not fast else None
        if chain:
            assert starts == [k for k in covered if k % chain == 0 and k % 64 == 0]
        else:
            assert len(starts) == len(ends) == (1 if counts[s] else 0)


def test_native_declines_every_block_but_the_instructions():
    params = preset_params(HOPPER, "e4m3", "e5m2")
    assert native_kernel.native_decline(schedule_params(HOPPER, 100, False, 2, "contiguous"), params) is None
    for preset in (ADA, B200_MMA_SYNC,
                   Preset("frac 12", nfma=32, frac=12, frac_out=12, min_exp=-132, late_c=False, slow_chunk=128)):
        why = native_kernel.native_decline(schedule_params(preset, 100, True), preset_params(preset, "e4m3", "e4m3"))
        assert why.startswith("computes the block of the sm_90 warpgroup MMA")
    odd = Preset("odd chunk", nfma=32, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=96)
    assert "96 wide" in native_kernel.native_decline(schedule_params(odd, 300, False), params)


def test_device_requirements_of_the_native_kernel():
    from mmaemu.cuda import gating as cuda_backend
    from mmaemu.cuda.device import DeviceInfo

    def info(capability, compiler):
        return DeviceInfo(0, "GPU", None, capability, 1, "driver", compiler, "torch")

    assert cuda_backend.device_skip("native", info((9, 0), "numba 0.68 + numba-cuda 0.30.4")) is None
    assert "this device is sm_89" in cuda_backend.device_skip("native", info((8, 9), "numba + numba-cuda 0.30"))
    assert "this device is sm_100" in cuda_backend.device_skip("native", info((10, 0), "numba + numba-cuda 0.30"))
    assert "needs numba-cuda" in cuda_backend.device_skip("native", info((9, 0), "numba 0.68 (built-in CUDA target)"))
    assert cuda_backend.device_skip("biased", info((8, 9), "numba 0.68 (built-in CUDA target)")) is None
