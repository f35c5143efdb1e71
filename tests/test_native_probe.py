"""The native kernel's gate without a GPU: the probe's tiles, its CPU side, its power to reject, and the layout
and schedule arithmetic of mmaemu.cuda.native.wgmma / mma_sync / native_kernel; for both instructions (the warpgroup MMA
with the hopper block, mma.sync with the ada block).

* The instruction model equals the hardware: the Khattak-Mikaitis H100 wgmma and Ada mma.sync recordings.
* The CPU side (probe.expected) equals the independent oracle (tests/oracle.py) on sampled outputs of every tile.
* The tiles reach what the probe claims to test (gaps 0..40, truncation of both signs, +0 where IEEE gives a
  tiny negative number, subnormals, NaN/Inf rows left out of the comparison, chains from scale-d = 0 and from
  crafted accumulators, every format pair).
* Instruction models that differ from the instruction's block step in one parameter each (block length, fraction
  bits, result width, a late accumulator, -0 results) are rejected, each by the family made for it.
* Descriptors, the core-matrix staging layout, mma.sync's register fragments and the accumulator layouts agree
  with each other; the stage plan walks the same k as accumulate_one; the gate's device rules.
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
from mmaemu.cuda.native import mma_sync, kernel as native_kernel, wgmma
from mmaemu.cuda.verdicts import probe
from mmaemu.cuda.native.instruction_model import FORMAT_PAIRS, instruction_outputs
from mmaemu.model import Preset, dot
from mmaemu.model.presets import ADA, B200_MMA_SYNC, HOPPER
from vectors import km_cases

INSTRUCTIONS = ("wgmma", "mma_sync")
PRESET = {"wgmma": HOPPER, "mma_sync": ADA}
TILES = {i: probe.probe_tiles(PRESET[i]) for i in INSTRUCTIONS}
EXPECTED = {i: [probe.expected(t, PRESET[i]) for t in TILES[i]] for i in INSTRUCTIONS}


@pytest.mark.parametrize("gpu,fmt,instruction", [("H100", "E4M3", "wgmma"), ("H100", "E5M2", "wgmma"),
                                                 ("Ada", "E4M3", "mma_sync"), ("Ada", "E5M2", "mma_sync")])
def test_instruction_model_equals_the_hardware_recordings(gpu, fmt, instruction):
    a, b, c, d = (np.asarray(v) for v in km_cases(gpu, fmt))
    c32 = np.asarray(c, np.uint32).view(np.float32) if gpu == "Ada" else np.zeros(len(d), np.float32)  # H100: c unused
    f = fmt.lower()
    got = instruction_outputs(a, b, c32, f, f, native_kernel.INSTRUCTIONS[instruction].PRESET)
    assert np.array_equal(got.view(np.uint32), np.asarray(d, np.uint32))


def _exponents(tile):
    """Per output: sorted exponents of its nonzero terms (product exponent sums, the accumulator's exponent)."""
    a = tile.a.transpose(1, 0, 2).reshape(64, -1)
    b = tile.b.transpose(1, 0, 2).reshape(128, -1)
    ea = np.where(formats.significands(tile.fmt_a)[a] != 0, formats.exponents(tile.fmt_a)[a], np.nan)
    eb = np.where(formats.significands(tile.fmt_b)[b] != 0, formats.exponents(tile.fmt_b)[b], np.nan)
    return ea[:, None, :] + eb[None, :, :]


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_every_family_for_every_format_pair(instruction):
    tiles = TILES[instruction]
    labels = {t.label for t in tiles}
    for fmt_a, fmt_b in FORMAT_PAIRS:
        for family in probe.SINGLE_STEP + ("accumulator inside the alignment", "exponent gaps, accumulator",
                                           "+0 results, accumulator", "chained", "chained from an accumulator",
                                           "NaN/Inf"):
            assert f"{family} ({fmt_a} x {fmt_b})" in labels
    assert {t.steps for t in tiles} == {1, probe.CHAIN_STEPS}
    assert any(t.steps > 1 and t.use_c for t in tiles) and any(t.steps > 1 and not t.use_c for t in tiles)


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_cpu_side_equals_the_oracle(instruction):
    rng = np.random.default_rng(5)
    model = oracle.PRESETS[PRESET[instruction].name]
    for tile, want in zip(TILES[instruction], EXPECTED[instruction]):
        rows, cols = np.nonzero(tile.compared)
        for i in rng.choice(rows.size, 12, replace=False):
            r, n = rows[i], cols[i]
            c_bits = int(tile.c.view(np.uint32)[r, n]) if tile.use_c else 0
            got = oracle.dot([int(v) for v in tile.a[:, r].reshape(-1)], [int(v) for v in tile.b[:, n].reshape(-1)],
                             tile.fmt_a, tile.fmt_b, c_bits, model)
            assert got == int(want.view(np.uint32)[r, n]), (tile.label, r, n)


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_tiles_reach_what_the_probe_claims(instruction):
    gaps, truncated_up, truncated_down, tiny_negative_zero, subnormal_pairs = set(), 0, 0, 0, set()
    for tile, want in zip(TILES[instruction], EXPECTED[instruction]):
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
    assert subnormal_pairs == set(FORMAT_PAIRS)
    nan_tiles = [t for t in TILES[instruction] if t.label.startswith("NaN/Inf")]
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


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_the_model_passes_and_the_report_names_the_first_difference(instruction):
    tiles, expected = TILES[instruction], EXPECTED[instruction]
    passed, details = probe.run_probe(lambda t: expected, PRESET[instruction], tiles)
    assert passed and details["failing_tiles"] == 0 and details["outputs_compared"] > 400_000
    broken = [e.copy() for e in expected]
    broken[3].view(np.uint32)[7, 9] ^= 1
    passed, details = probe.run_probe(lambda t: broken, PRESET[instruction], tiles)
    assert not passed and details["failing_tiles"] == 1 and details["preset"] == PRESET[instruction].name
    first = details["first"][0]
    assert first["case"] == tiles[3].label and first["output"] == [7, 9] and first["differing_outputs"] == 1
    assert probe.summarize(details).startswith(f"instruction probe: 1 of {len(tiles)} tiles differ; first: "
                                               f"{tiles[3].label} output [7, 9]")


def _mutant(name, nfma, frac=13, frac_out=13, late_c=False):
    return Preset(name, nfma=nfma, frac=frac, frac_out=frac_out, min_exp=-132, late_c=late_c,
                  slow_chunk=None if late_c else 128)


@pytest.mark.parametrize("instruction,mutant,family", [
    ("wgmma", _mutant("blocks of 16", 16), "block length"),
    ("wgmma", _mutant("frac 14", 32, frac=14), "small next to large"),
    ("wgmma", _mutant("15-bit results", 32, frac=14, frac_out=14), "14-bit result"),
    ("wgmma", _mutant("late accumulator", 32, late_c=True), "accumulator inside the alignment"),
    ("wgmma", B200_MMA_SYNC, "truncation toward zero"),
    ("wgmma", ADA, "block length"),
    ("mma_sync", HOPPER, "block length"),
    ("mma_sync", _mutant("frac 14", 16, frac=14), "small next to large"),
    ("mma_sync", _mutant("15-bit results", 16, frac=14, frac_out=14), "14-bit result"),
    ("mma_sync", _mutant("late accumulator", 16, late_c=True), "accumulator inside the alignment"),
    ("mma_sync", B200_MMA_SYNC, "truncation toward zero"),
], ids=lambda v: getattr(v, "name", v))
def test_mutant_instructions_are_rejected(instruction, mutant, family):
    preset = PRESET[instruction]
    families = [t for t in TILES[instruction] if t.label.startswith(family + " (")]
    passed, details = probe.run_probe(_model(mutant), preset, families)
    assert not passed and details["first"][0]["case"].startswith(family), family


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_negative_zero_results_are_rejected(instruction):
    zero_tiles = [t for t in TILES[instruction] if t.label.startswith("+0 results")]
    passed, details = probe.run_probe(_model(PRESET[instruction], negative_zero=True), PRESET[instruction],
                                      zero_tiles)
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
    # The second 32-k step of a stage starts at the next two 16-byte chunks.
    assert native_kernel.STEP_BYTES == 2 * native_kernel.LEADING_BYTES == native_kernel.stage_offset(0, 2)


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_fragment_layout_covers_the_tile_once(instruction):
    module = native_kernel.INSTRUCTIONS[instruction]
    seen = np.zeros((module.GROUP_M, module.GROUP_N), int)
    for t in range(native_kernel.GROUP_THREADS):
        for i in range(native_kernel.FRAGMENT):
            seen[module.fragment_coord(t, i)] += 1
    assert (seen == 1).all()
    # Thread 5 (warp 0, group 1, thread-in-group 1): registers 0-3 at rows 1 and 9, columns 2 and 3 (the m16n8
    # accumulator layout of both instructions); register 4: wgmma's next 8 columns, mma.sync's next n8 tile.
    coords = [module.fragment_coord(5, i) for i in range(5)]
    assert coords == [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10)]
    # Thread 37 (warp 1, lane 5): wgmma's warp 1 owns rows 16-31, mma.sync's owns columns 32-63.
    assert module.fragment_coord(37, 0) == ((17, 2) if instruction == "wgmma" else (1, 34))


def test_mma_sync_fragments_read_the_staged_rows():
    """The registers each lane loads (constant offsets from its base, as the kernel computes them) hold, by the
    PTX ISA's m16n8k32 fragment rules (mma_sync.warp_tiles), exactly the staged rows of A and columns of B."""
    L, S = native_kernel.LEADING_BYTES, native_kernel.STRIDE_BYTES
    stage = np.random.default_rng(3).integers(0, 256, 2 * native_kernel.OPERAND_STAGE_BYTES, dtype=np.uint8)
    a_rows = stage[wgmma.descriptor_offset(64, 32, L, S)]
    b_rows = stage[native_kernel.OPERAND_STAGE_BYTES + wgmma.descriptor_offset(128, 32, L, S)]
    for warp in range(4):
        a_words, b_words = [], []
        for lane in range(32):
            within = (lane >> 2) * 16 + (lane & 3) * 4
            b_base = native_kernel.OPERAND_STAGE_BYTES + warp * mma_sync.WARP_TILES_N * S + within
            a_words.append([stage[within + o:within + o + 4].view(np.uint32)[0] for o in mma_sync.a_offsets(L, S)])
            b_words.append([stage[b_base + o:b_base + o + 4].view(np.uint32)[0] for o in mma_sync.b_offsets(L, S)])
        a, b = mma_sync.warp_tiles(a_words, b_words)
        assert np.array_equal(a, a_rows) and np.array_equal(b, b_rows[32 * warp:32 * warp + 32])
    # Each lane's 16 + 8 registers: 4 bytes each, distinct, inside the stage.
    offsets = sorted(mma_sync.a_offsets(L, S) + tuple(native_kernel.OPERAND_STAGE_BYTES + o
                                                       for o in mma_sync.b_offsets(L, S)))
    assert len(set(offsets)) == 24 and all(o % 4 == 0 for o in offsets)


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
    assert native_kernel.instruction_of(params) is wgmma
    ada = preset_params(ADA, "e5m2", "e4m3")
    assert native_kernel.native_decline(schedule_params(ADA, 100, False, 5, "pairwise"), ada) is None
    assert native_kernel.instruction_of(ada) is mma_sync
    for preset in (B200_MMA_SYNC, _mutant("frac 12", 32, frac=12, frac_out=12), _mutant("blocks of 8", 8)):
        why = native_kernel.native_decline(schedule_params(preset, 100, True), preset_params(preset, "e4m3", "e4m3"))
        assert why.startswith("computes the blocks of the FP8 MMA instructions it issues only (hopper's on sm_90")
    odd = Preset("odd chunk", nfma=32, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=96)
    assert "96 wide" in native_kernel.native_decline(schedule_params(odd, 300, False), params)


def test_device_requirements_of_the_native_kernel():
    from mmaemu.cuda.dispatch import gating as cuda_backend
    from mmaemu.base.device_facts import DeviceFacts

    def info(capability, compiler):
        return DeviceFacts(0, "GPU", None, capability, 1, None, "torch", None, None, None, compiler=compiler)

    skip = cuda_backend.device_skip
    hopper_gpu = info((9, 0), "numba 0.68 + numba-cuda 0.30.4")
    ada_gpu = info((8, 9), "numba 0.68 (built-in CUDA target)")
    assert skip("native", hopper_gpu) is None and skip("native", hopper_gpu, HOPPER) is None
    assert skip("native", ada_gpu) is None and skip("native", ada_gpu, ADA) is None  # mma.sync: any compiler
    # The instruction of a device computes its own preset only: never mma.sync for hopper, never wgmma for ada.
    assert skip("native", hopper_gpu, ADA) == ("computes the hopper preset's block on sm_90 (wgmma), preset 'ada' "
                                               "has another")
    assert skip("native", ada_gpu, HOPPER).startswith("computes the ada preset's block on sm_89 (mma_sync)")
    for capability in ((10, 0), (12, 0), (8, 0), (9, 1)):  # sm_120 runs QMMA too, but nothing says it is ada's
        why = skip("native", info(capability, "numba + numba-cuda 0.30"))
        assert why.startswith("issues the native FP8 MMA of sm_90a (wgmma, hopper preset), sm_89 (mma_sync, ada "
                              "preset) only, this device is sm_") and why.endswith(f"{capability[0]}{capability[1]}")
    assert "needs numba-cuda to target sm_90a" in skip("native", info((9, 0), "numba 0.68 (built-in CUDA target)"))
    assert skip("offset", info((8, 9), "numba 0.68 (built-in CUDA target)")) is None


def test_catalog_names_each_instruction_as_its_module_does():
    from mmaemu.cuda.catalog import NATIVE_INSTRUCTIONS

    assert {name for name, _, _ in NATIVE_INSTRUCTIONS.values()} == set(native_kernel.INSTRUCTIONS)
    for capability, (name, preset_name, target) in NATIVE_INSTRUCTIONS.items():
        module = native_kernel.INSTRUCTIONS[name]
        assert module.PRESET.name == preset_name and tuple(module.TARGET[:2]) == capability
        assert target == "sm_{}{}{}".format(*module.TARGET, *([""] if len(module.TARGET) == 2 else []))
