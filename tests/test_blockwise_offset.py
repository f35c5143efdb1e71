"""Block-wise (chunked) GEMMs on the CPU's offset engine (mmaemu.cpu.offset_chunked) against the reference engine
(``accumulate_chunked_codes(..., reference=True)``) and the block-wise oracle (tests/oracle.py, section g).

Random and adversarial operands (wide exponent spreads, exact cancellations, NaN rows, whole chunks of zeros, K not a
multiple of 128, E5M2 with Inf codes), adversarial scales (huge, subnormal, zero, NaN, Inf), every chunked kernel,
B packed per call and kept (a prepared B, the kept weight of the front doors), rows split over the threads, altered
block-step masks (so that the comparisons can fail), and an AVX2 target (MXCSR rounding) in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import oracle
from test_blockwise import _same, _scales
from test_fast_path import PAIRS, cancelling_codes, random_codes, spread_codes
from test_offset_engine import _mutation_operands

from mmaemu import environment
from mmaemu.context import Context
from mmaemu.cpu import features, threads
from mmaemu.cpu.chunked import accumulate_chunked_codes, chunk_schedule, chunked_engine, chunked_output
from mmaemu.model.chunked import CHUNKED_KERNELS, DEEPGEMM_SM90_1D1D, DEEPGEMM_SM90_1D2D

OFFSET_RUNS = features.offset_engine_decline(features.numba_target()) is None
pytestmark = [pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning"),
              pytest.mark.skipif(not OFFSET_RUNS, reason="the target CPU has neither AVX-512 F/BW/DQ/VL nor AVX2 "
                                                         "and FMA")]

OFFSET = Context(environment.snapshot({"MMAEMU_CPU_ENGINE": "offset"}))
TILE = Context(environment.snapshot({"MMAEMU_CPU_ENGINE": "tile"}))


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _nonfinite(fmt):
    return {"e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7F]}[fmt]


FAMILIES = ("random", "spread", "cancelling")


def _operands(rng, family, fmt_a, fmt_b, M, N, K):
    """A [M, K], B [N, K] of one family: random, spread, cancelling; then whole zero chunks in some rows, and a
    NaN (or Inf) code in a row of A and one of B."""
    if family == "random":
        a, b = random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K))
    elif family == "spread":
        a, b = spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K))
    else:
        a, b = cancelling_codes(rng, fmt_a, fmt_b, M, N, K)
    a[M // 2, 0:min(K, 128)] = 0  # a whole chunk of zeros (+0 partials)
    b[N // 3, 128:256] = 0x80  # -0 codes over the second chunk
    a[M - 1, K - 1] = rng.choice(_nonfinite(fmt_a))
    b[N // 2, K // 2] = rng.choice(_nonfinite(fmt_b))
    return a, b


def _check(a, b, fmt_a, fmt_b, sfa, sfb, kernel, prepared=None, what=""):
    want = accumulate_chunked_codes(a, b, fmt_a, fmt_b, sfa, sfb, kernel, reference=True)
    got = accumulate_chunked_codes(a, b, fmt_a, fmt_b, sfa, sfb, kernel, prepared_b=prepared, context=OFFSET)
    bad = np.argwhere(~_same(_bits(got), _bits(want)))
    assert not len(bad), f"{len(bad)} outputs differ ({kernel.name}, {fmt_a} x {fmt_b}, {what}); first {bad[0]}"
    return want


@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
@pytest.mark.parametrize("family", FAMILIES)
def test_offset_chunks_equal_the_reference_engine(fmt_a, fmt_b, family):
    """Every kernel, ragged M (tiles of 4 rows with a remainder), N (panels of 64 with a remainder) and K (a
    last chunk of 1, 4, 44 or 72 k), adversarial scales, B packed per call and prepared."""
    from mmaemu.cpu.offset_engine import prepare_b

    rng = np.random.default_rng([PAIRS.index((fmt_a, fmt_b)), FAMILIES.index(family)])
    for M, N, K in [(5, 70, 300), (1, 130, 129), (9, 64, 132), (3, 200, 1000), (6, 65, 576)]:
        a, b = _operands(rng, family, fmt_a, fmt_b, M, N, K)
        chunks = -(-K // 128)
        sfa, sfb = _scales(rng, (M, chunks)), _scales(rng, (N, chunks))
        prepared = prepare_b(b, fmt_b)
        for kernel in CHUNKED_KERNELS.values():
            _check(a, b, fmt_a, fmt_b, sfa, sfb, kernel, what=f"{(M, N, K)} packed per call")
            _check(a, b, fmt_a, fmt_b, sfa, sfb, kernel, prepared, what=f"{(M, N, K)} prepared")


def test_huge_scales_and_nan_rows():
    """Scales near fp32's top (the combine overflows to Inf, and Inf - Inf makes NaN), tiny ones (subnormal
    products of scale and partial), rows of A that are all NaN codes, and a row of B of one NaN code."""
    rng = np.random.default_rng(41)
    M, N, K = 12, 140, 520
    a, b = spread_codes(rng, "e4m3", (M, K)), spread_codes(rng, "e4m3", (N, K))
    a[3] = 0x7F
    b[100, 511] = 0xFF
    chunks = -(-K // 128)
    sfa = np.full((M, chunks), 2.0**127 * 1.5, np.float32)
    sfa[::2] = np.float32(2.0**-149 * 3)
    sfb = np.ldexp(rng.uniform(1, 2, (N, chunks)), rng.integers(-10, 10, (N, chunks))).astype(np.float32)
    sfb[:, 1] *= -1
    for kernel in CHUNKED_KERNELS.values():
        want = _check(a, b, "e4m3", "e4m3", sfa, sfb, kernel, what="huge scales")
        assert np.isinf(want).any() and np.isnan(want[3]).all()  # the families are what they say


def test_rows_split_over_threads_and_a_kept_weight(monkeypatch):
    """More rows than one task takes (B prepared first, then ranges of rows against every panel), on 1 and 2
    threads, and the front doors' kept weight: ``kept_panels`` keeps the offset engine's panels where the chunked
    call runs on it, which then give the same bits."""
    from mmaemu.cpu.chunked import kept_panels
    from mmaemu.cpu.prepared import WeightSlot

    import torch

    rng = np.random.default_rng(43)
    M, N, K = 96, 256, 384
    a, b = random_codes(rng, "e4m3", (M, K)), random_codes(rng, "e4m3", (N, K))
    chunks = K // 128
    sfa, sfb = _scales(rng, (M, chunks)), _scales(rng, (N, chunks))
    for n_threads in (1, 2):
        monkeypatch.setattr(threads, "num_threads", lambda n=n_threads: n)
        _check(a, b, "e4m3", "e4m3", sfa, sfb, DEEPGEMM_SM90_1D2D, what=f"{n_threads} threads")
    weight = torch.from_numpy(b).view(torch.float8_e4m3fn)
    slot = WeightSlot()
    kept = kept_panels(slot, weight, b, "e4m3", "e4m3", DEEPGEMM_SM90_1D2D, M, OFFSET)
    assert kept.engine == "offset" and slot.prepares == 1
    assert kept_panels(slot, weight, b, "e4m3", "e4m3", DEEPGEMM_SM90_1D2D, M, OFFSET) is kept
    assert kept_panels(slot, weight, b, "e4m3", "e4m3", DEEPGEMM_SM90_1D2D, M, TILE).engine == "tile"
    _check(a, b, "e4m3", "e4m3", sfa, sfb, DEEPGEMM_SM90_1D2D, kept, what="kept")


def test_the_engine_choice():
    """The offset method fits the chunks' chains of every shipped kernel and FP8 pair (forced: offset); ``auto``
    follows the tensor-wise shape rule (features.OFFSET_SHAPES); MMAEMU_CPU_ENGINE=tile keeps the tile engine."""
    auto = Context(environment.snapshot({}))
    rounding = features.offset_rounding(features.numba_target())
    shapes = features.OFFSET_SHAPES[rounding]
    for kernel in CHUNKED_KERNELS.values():
        assert features.offset_call_decline(kernel.tensor_core_preset, chunk_schedule(kernel.chunk), "e5m2",
                                            "e4m3") is None
        for fmt_a, fmt_b in PAIRS:
            assert chunked_engine(kernel, fmt_a, fmt_b, (1, 64), OFFSET) == "offset"
            assert chunked_engine(kernel, fmt_a, fmt_b, (512, 5760), TILE) == "tile"
        assert chunked_engine(kernel, "e4m3", "e4m3", (shapes.min_rows, 5760), auto) == "offset"
        assert chunked_engine(kernel, "e4m3", "e4m3", (shapes.min_rows - 1, 5760), auto) == "tile"


def test_every_mask_matters():
    """The chunked kernel reads the block step's masks (mmaemu.cpu.offset_kernel.MASKS): each altered one changes
    an output of the adversarial families, so the comparisons above can fail; the unaltered ones give the
    reference's bits."""
    from mmaemu.arith.params import preset_params
    from mmaemu.cpu.offset_chunked import accumulate_chunked_offset
    from mmaemu.cpu.offset_kernel import MASKS

    rng = np.random.default_rng(47)
    a, b = _mutation_operands()  # the tensor-wise engine's mutation families (K = 160: a last chunk of 32)
    (M, K), N = a.shape, b.shape[0]
    chunks = -(-K // 128)
    sfa = np.ldexp(rng.uniform(1, 2, (M, chunks)), rng.integers(-4, 4, (M, chunks))).astype(np.float32)
    sfb = np.ldexp(rng.uniform(1, 2, (N, chunks)), rng.integers(-4, 4, (N, chunks))).astype(np.float32)
    kernel = DEEPGEMM_SM90_1D2D
    preset = kernel.tensor_core_preset
    assert preset_params(preset, "e4m3", "e4m3").nfma == 32
    want = _bits(accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, kernel, reference=True))
    for index, value in [(0, 0x00010101), (1, 0), (2, -0x01000000), (3, (127 - 1) << 23), (3, (127 + 1) << 23)]:
        for masks in (MASKS._replace(**{MASKS._fields[index]: value}), MASKS):
            out = np.zeros((M, N), np.float32)
            accumulate_chunked_offset(a, b, "e4m3", "e4m3", sfa, sfb, kernel, preset, chunk_schedule(kernel.chunk),
                                      out, masks=masks)
            assert _same(_bits(out), want).all() == (masks is MASKS), (index, value)


def test_the_blockwise_oracle():
    """Outputs of the offset engine's chunked path through DeepGEMM's two output steps (bf16; fp32 reduce-add into
    d) against the oracle's integers (128-k chunks from +0 by its own chains, the FMA combine, the output), K = 300
    (a last chunk of 44), a NaN code, a chunk of zeros, non-power-of-two and huge scales."""
    rng = np.random.default_rng(53)
    M, N, K = 4, 66, 300
    a, b = spread_codes(rng, "e4m3", (M, K)), random_codes(rng, "e4m3", (N, K))
    a[1, 0:128] = 0
    b[65, 7] = 0x7F
    chunks = -(-K // 128)
    sfa = np.ldexp(rng.uniform(1, 2, (M, chunks)), rng.integers(-8, 8, (M, chunks))).astype(np.float32)
    sfb = np.ldexp(rng.uniform(1, 2, (N, chunks)), rng.integers(-8, 8, (N, chunks))).astype(np.float32)
    sfa[2, 1] = np.float32(2.0**120)
    d = rng.standard_normal((M, N)).astype(np.float32)
    for kernel, out in ((DEEPGEMM_SM90_1D2D, "bfloat16"), (DEEPGEMM_SM90_1D1D, "float32")):
        final = accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, kernel, context=OFFSET)
        ours = chunked_output(final, kernel, d).reshape(M, N)
        for i in range(M):
            for j in range(N):
                want = oracle.blockwise_one([int(x) for x in a[i]], [int(x) for x in b[j]], "e4m3", "e4m3",
                                            [int(x) for x in sfa[i].view(np.uint32)],
                                            [int(x) for x in sfb[j].view(np.uint32)], out,
                                            int(d[i, j].view(np.uint32)))
                assert int(ours[i, j]) == want, (kernel.name, i, j)


HASWELL_RUN = """
import sys
import numpy as np
from mmaemu import environment
from mmaemu.context import Context
from mmaemu.cpu import features
from mmaemu.cpu.chunked import accumulate_chunked_codes
from mmaemu.cpu.simd import MXCSR_ROUNDING_FIELD, thread_mxcsr
from mmaemu.model.chunked import CHUNKED_KERNELS
(M, N, K), fmts = (int(x) for x in sys.argv[1:4]), sys.argv[4:6]
a, b = (np.frombuffer(bytes.fromhex(t), np.uint8).reshape(r, K) for t, r in zip(sys.argv[6:8], (M, N)))
sfa, sfb = (np.frombuffer(bytes.fromhex(t), np.float32).reshape(r, -1) for t, r in zip(sys.argv[8:10], (M, N)))
offset = Context(environment.snapshot({"MMAEMU_CPU_ENGINE": "offset"}))
print(features.offset_rounding(features.numba_target()))
for kernel in CHUNKED_KERNELS.values():
    got = accumulate_chunked_codes(a, b, *fmts, sfa, sfb, kernel, context=offset)
    print(got.view(np.uint32).tobytes().hex())
print(thread_mxcsr() & MXCSR_ROUNDING_FIELD)
"""


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e5m2", "e4m3")])
def test_an_avx2_target_gives_the_same_bits(tmp_path, fmt_a, fmt_b):
    """NUMBA_CPU_NAME=haswell with AVX2 and FMA only (its own cache folder): the chunked offset path rounds by
    MXCSR around each chunk's block steps (the combine's float64 FMA emulation runs outside, rounding to nearest),
    gives the reference engine's bits for every kernel, and leaves the thread rounding to nearest."""
    rng = np.random.default_rng(59)
    M, N, K = 6, 70, 300
    a, b = _operands(rng, "spread", fmt_a, fmt_b, M, N, K)
    chunks = -(-K // 128)
    sfa, sfb = _scales(rng, (M, chunks)), _scales(rng, (N, chunks))
    want = [accumulate_chunked_codes(a, b, fmt_a, fmt_b, sfa, sfb, kernel, reference=True)
            for kernel in CHUNKED_KERNELS.values()]
    env = dict(os.environ, NUMBA_CPU_NAME="haswell",
               NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+f16c,+popcnt,+sse4.2,+bmi,+bmi2,+lzcnt,+movbe",
               MMAEMU_CACHE_DIR=str(tmp_path))
    env.pop("MMAEMU_CPU_ENGINE", None)
    args = [str(M), str(N), str(K), fmt_a, fmt_b] + [x.tobytes().hex() for x in (a, b, sfa, sfb)]
    run = subprocess.run([sys.executable, "-c", HASWELL_RUN, *args], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split()
    assert lines[0] == "mxcsr" and lines[-1] == "0"
    for kernel, line, w in zip(CHUNKED_KERNELS.values(), lines[1:-1], want):
        got = np.frombuffer(bytes.fromhex(line), np.uint32)
        assert _same(got, _bits(w).reshape(-1)).all(), kernel.name
