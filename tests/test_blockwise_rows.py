"""The block-wise recipe's kept decoding call on the offset method's row tiles (mmaemu.cpu.offset_chunked's
chunked_rows_call and token_rows_call, mmaemu.cpu.chunked.ChunkedRows, mmaemu.deepgemm.gemm_nt_kept_rows): bit for
bit the reference engine's accumulators and DeepGEMM's front door, the activations' compiled per-token cast
DeepGEMM's torch cast, and the layer's forward on it the layer's forward on the front door with either engine
forced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oracle
from test_blockwise import _same, _scales
from test_fast_path import cancelling_codes, random_codes, spread_codes
from test_offset_engine import needs_offset

from mmaemu import deepgemm, environment
from mmaemu.arith.offset import ADD_MAX, offset_params
from mmaemu.arith.params import preset_params
from mmaemu.context import Context
from mmaemu.cpu import features, threads
from mmaemu.cpu.cast import token_strips_fp8
from mmaemu.cpu.chunked import (DEEPGEMM_SCALE_ROWS, E4M3_MAX, TOKEN_AMAX_FLOOR, accumulate_chunked_codes,
                                chunk_schedule, chunked_output, chunked_rows)
from mmaemu.cpu.engine import NONFINITE_PATTERN
from mmaemu.cpu.fused import ROW_KERNEL_ROWS
from mmaemu.deepgemm import per_token_cast_to_fp8
from mmaemu.deepgemm import utils as deepgemm_utils
from mmaemu.model.chunked import CHUNKED_KERNELS, DEEPGEMM_SM90_1D1D, DEEPGEMM_SM90_1D2D
from mmaemu.nn_recipes import BlockwiseFP8Linear

pytestmark = [pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")]

EMBEDDED = features.offset_rounding(features.numba_target()) == features.ROUNDING_EMBEDDED
needs_row_tiles = pytest.mark.skipif(not EMBEDDED, reason="row tiles run where the CPU rounds by AVX-512's "
                                                          "embedded rounding")
AUTO = Context(environment.snapshot({}))


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _operands(rng, family, M, N, K):
    """E4M3 codes A [M, K], B [N, K] of a family, with a chunk of zeros, -0 codes and NaN codes in some rows."""
    if family == "random":
        a, b = random_codes(rng, "e4m3", (M, K)), random_codes(rng, "e4m3", (N, K))
    elif family == "spread":
        a, b = spread_codes(rng, "e4m3", (M, K)), spread_codes(rng, "e4m3", (N, K))
    else:
        a, b = cancelling_codes(rng, "e4m3", "e4m3", M, N, K)
    a[0, 0:min(K, 128)] = 0
    b[N // 3, 128:256] = 0x80
    b[N // 2, K // 2] = rng.choice([0x7F, 0xFF])
    if M > 1:
        a[M - 1, K - 1] = 0xFF
    return a, b


def _call_words(kernel, K, scale_rows):
    from mmaemu.cpu.offset_kernel import MASKS
    from mmaemu.cpu.offset_rows import call_words

    preset = kernel.tensor_core_preset
    return call_words(offset_params(preset_params(preset, "e4m3", "e4m3"), "e4m3", "e4m3", ADD_MAX),
                      chunk_schedule(kernel.chunk), MASKS, NONFINITE_PATTERN["e4m3"], NONFINITE_PATTERN["e4m3"], K,
                      kernel.output & 1, (kernel.chunk, kernel.combine, scale_rows))


def _rows_call(kernel, a, b, sfa, sfb, scale_rows=1, kept=None):
    """(ok, accumulators, output bits) of chunked_rows_call on B's offset panels."""
    from mmaemu.cpu.offset_chunked import chunked_rows_call
    from mmaemu.cpu.offset_engine import packing_tables, prepare_b
    from mmaemu.cpu.simd import call_restoring_mxcsr

    p = prepare_b(b, "e4m3")
    acc = np.empty((a.shape[0], b.shape[0]), np.float32)
    out = np.empty(acc.shape, np.uint32 if kernel.output & 1 else np.uint16)
    kept = b.reshape(-1).copy() if kept is None else kept
    ok = call_restoring_mxcsr(chunked_rows_call, _call_words(kernel, a.shape[1], scale_rows), kept, b, p.val, p.exp,
                              p.low, p.sign, a, sfa, *packing_tables("e4m3"), sfb, acc, out)
    return ok, acc, out


@needs_offset
@pytest.mark.parametrize("family", ["random", "spread", "cancelling"])
def test_chunked_row_tiles_equal_the_reference_engine(family):
    """Every chunked kernel's combine rule, rows 0 .. 5 of A (row r of a 4-row tile and the next tile), N with a
    partial panel, K with a last chunk of 1, 44 or 64 k, adversarial scales per row of B (scale_rows 1), NaN codes
    in rows of A and B: the accumulators and the output's bits are the reference engine's."""
    rng = np.random.default_rng(["random", "spread", "cancelling"].index(family))
    for M, N, K in [(1, 70, 300), (2, 130, 129), (5, 64, 576), (1, 20, 192)]:
        a, b = _operands(rng, family, M, N, K)
        chunks = -(-K // 128)
        sfa, sfb = _scales(rng, (M, chunks)), _scales(rng, (N, chunks))
        for kernel in CHUNKED_KERNELS.values():
            want = accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, kernel, reference=True)
            ok, acc, out = _rows_call(kernel, a, b, sfa, sfb)
            assert ok
            assert _same(_bits(acc), _bits(want)).all(), (kernel.name, M, N, K)
            if not kernel.output & 2:  # no addend: the output's bits of the accumulators
                assert np.array_equal(out, chunked_output(want, kernel).reshape(M, N)), (kernel.name, M, N, K)


@needs_offset
def test_huge_and_zero_scales_and_block_scales():
    """Scales near fp32's top (the combine overflows to Inf, Inf - Inf makes NaN), subnormal and zero scales, B's
    scales per 128 rows (DeepGEMM's blocks, read as scales_b[n // 128]): the reference engine's bits."""
    rng = np.random.default_rng(7)
    M, N, K = 2, 300, 520
    a, b = spread_codes(rng, "e4m3", (M, K)), spread_codes(rng, "e4m3", (N, K))
    chunks = -(-K // 128)
    sfa = np.full((M, chunks), 2.0**127 * 1.5, np.float32)
    sfa[1] = np.float32(2.0**-149 * 3)
    blocks = np.ldexp(rng.uniform(1, 2, (-(-N // 128), chunks)), rng.integers(-10, 10, (-(-N // 128), chunks)))
    blocks = blocks.astype(np.float32)
    blocks[0, 1] = 0.0
    blocks[1, 2] = -0.0
    blocks[2, 0] *= -1
    per_row = np.ascontiguousarray(np.repeat(blocks, 128, axis=0)[:N])
    kernel = DEEPGEMM_SM90_1D2D
    want = accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, per_row, kernel, reference=True)
    assert np.isinf(want).any() or np.isnan(want).any()
    ok, acc, out = _rows_call(kernel, a, b, sfa, blocks, scale_rows=DEEPGEMM_SCALE_ROWS)
    assert ok and _same(_bits(acc), _bits(want)).all()
    assert np.array_equal(out, chunked_output(want, kernel).reshape(M, N))


@needs_offset
def test_a_changed_b_is_refused():
    """Codes that differ from the kept copy by one byte: nothing computed (False)."""
    rng = np.random.default_rng(3)
    a, b = random_codes(rng, "e4m3", (1, 256)), random_codes(rng, "e4m3", (64, 256))
    kept = b.reshape(-1).copy()
    kept[-1] ^= 1
    sfa, sfb = _scales(rng, (1, 2)), _scales(rng, (64, 2))
    assert not _rows_call(DEEPGEMM_SM90_1D2D, a, b, sfa, sfb, kept=kept)[0]


def _adversarial_activations(rng, M, K):
    x = rng.standard_normal((M, K)).astype(np.float32) * np.float32(3.0)
    x[0, :5] = [np.nan, 1.0, -2.0, 0.0, -0.0][:K]  # a NaN strip
    if K > 130:
        x[0, 128:132] = [np.inf, 1.0, -1.0, -0.0]  # Inf: scale Inf, its inverse 0, Inf * 0 NaN, -x * 0 = -0
    if K > 260:
        x[0, 256:384] = np.float32(1e-30) * rng.standard_normal(min(128, K - 256))  # under the amax floor
    if M > 1 and K > 5:
        x[1] = np.ldexp(rng.uniform(-2, 2, K), rng.integers(-140, 120, K)).astype(np.float32)  # extreme exponents
        x[1, :128] = np.float32(3.0e38)
        x[1, 5] = -3.3e38
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("K", [1, 127, 300, 576])
def test_token_cast_is_deepgemms_cast(dtype, K):
    """token_strips_fp8 of x widened to fp32 = per_token_cast_to_fp8 (use_ue8m0=False, torch's operations): the
    same scales (NaN where torch's is NaN) and codes, a NaN code being either NaN code; and its constants are the
    utils' own."""
    assert (float(TOKEN_AMAX_FLOOR), E4M3_MAX) == (np.float32(deepgemm_utils._AMAX_FLOOR), deepgemm_utils._E4M3_MAX)
    rng = np.random.default_rng(K)
    x = torch.from_numpy(_adversarial_activations(rng, 3, K)).to(dtype)
    codes, scales = per_token_cast_to_fp8(x, use_ue8m0=False)
    ours = np.empty((3, K), np.uint8)
    our_scales = np.empty((3, -(-K // 128)), np.float32)
    from mmaemu.base.gpu_torch_ops import reciprocal_of_number

    token_strips_fp8(x.float().numpy(), 128, TOKEN_AMAX_FLOOR, reciprocal_of_number(E4M3_MAX), ours, our_scales)
    want = codes.view(torch.uint8).numpy()
    nan = (want & 0x7F) == 0x7F
    assert np.array_equal((ours & 0x7F) == 0x7F, nan)
    assert np.array_equal(ours[~nan], want[~nan])
    assert _same(_bits(our_scales), _bits(scales.numpy())).all()


def _layer(rng, N, K, bias=True, nan_row=None, zero_block=False):
    weight = torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32) * 0.05)
    codes, sf = deepgemm.per_block_cast_to_fp8(weight, use_ue8m0=False)
    if nan_row is not None:
        raw = codes.view(torch.uint8).clone()
        raw[nan_row, K // 3] = 0x7F
        codes = raw.view(torch.float8_e4m3fn)
    sf = sf.float().contiguous()
    if zero_block:
        sf[0, 0] = 0.0
    b = torch.from_numpy(rng.standard_normal(N).astype(np.float32)) if bias else None
    return BlockwiseFP8Linear(codes, sf, bias=b)


def _front_door(layer, x, backend):
    """The layer's output through DeepGEMM's front door on ``backend``: the torch cast, fp8_gemm_nt, the bias."""
    x_fp8, sfa = per_token_cast_to_fp8(x.reshape(-1, layer.in_features), use_ue8m0=False)
    d = torch.empty((x_fp8.shape[0], layer.out_features), dtype=torch.bfloat16)
    deepgemm.fp8_gemm_nt((x_fp8, sfa), (layer.weight, layer.weight_scale), d, backend=backend)
    if layer.bias is not None:
        d = d + layer.bias
    return d.to(x.dtype).reshape(tuple(x.shape[:-1]) + (layer.out_features,))


def _same_tensor(x, y):
    """The same dtype, shape and bits."""
    as_int = {2: torch.int16, 4: torch.int32}
    return x.dtype == y.dtype and torch.equal(x.view(as_int[x.element_size()]), y.view(as_int[y.element_size()]))


@needs_row_tiles
@pytest.mark.parametrize("M", list(range(1, ROW_KERNEL_ROWS + 1)))
@pytest.mark.parametrize("N,K", [(576, 576), (192, 576), (130, 300), (1536, 576)])
def test_layer_decoding_step_on_row_tiles_gives_the_front_doors_bits(M, N, K, monkeypatch):
    """A BlockwiseFP8Linear's decoding step (kept weight) on row tiles, with NaN/Inf activations, extreme
    exponents, a NaN code in a weight row, a zero block scale, fp32 and bf16 inputs: the bits of the reference
    engine's front door and of the layer with each engine forced (MMAEMU_CPU_ENGINE=tile and offset: the front
    door's path), and the row tiles did run where their plan says."""
    from mmaemu.cpu.chunked import ChunkedRows

    rng = np.random.default_rng([M, N, K])
    layer = _layer(rng, N, K, nan_row=N - 1, zero_block=True)
    runs = []
    original = ChunkedRows.run
    monkeypatch.setattr(ChunkedRows, "run", lambda self, *args: runs.append(1) or original(self, *args))
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.from_numpy(_adversarial_activations(rng, M, K)).to(dtype)
        with torch.no_grad():
            want = _front_door(layer, x, "reference")
            for _ in range(2):  # the first call prepares the weight, the second reads it kept
                got = layer(x)
                assert got.dtype == dtype and _same_tensor(got, want)
            for engine in ("tile", "offset"):
                monkeypatch.setenv("MMAEMU_CPU_ENGINE", engine)
                count = len(runs)
                assert _same_tensor(layer(x), want), engine
                assert len(runs) == count  # not on row tiles: the front door's engine
                monkeypatch.delenv("MMAEMU_CPU_ENGINE")
    # row tiles where the tile engine's kept call is one task (M = 1 on these shapes: test_the_row_tiles_plan)
    assert bool(runs) == (chunked_rows(DEEPGEMM_SM90_1D2D, M, N, K, threads.num_threads(), AUTO) is not None)


@needs_row_tiles
def test_a_weight_changed_behind_the_version_counter(monkeypatch):
    """The weight's codes written through numpy (no version bump) and its scales changed: the next decoding step
    computes with the new ones."""
    rng = np.random.default_rng(11)
    layer = _layer(rng, 256, 384)
    x = torch.from_numpy(_adversarial_activations(rng, 1, 384)[:, ::-1].copy())
    with torch.no_grad():
        layer(x), layer(x)
        layer.weight.view(torch.uint8).numpy()[5, 7] ^= 0x11
        layer.weight_scale.numpy()[1, 2] = 2.0**-20
        assert _same_tensor(layer(x), _front_door(layer, x, "reference"))


@needs_row_tiles
def test_the_row_tiles_plan():
    """Row tiles run for M <= ROW_KERNEL_ROWS only, for a kernel without addend, one task of the tile engine's kept
    call (or one thread), not with MMAEMU_CPU_ENGINE forced."""
    kernel = DEEPGEMM_SM90_1D2D
    assert chunked_rows(kernel, 1, 576, 576, 2, AUTO) is not None
    assert chunked_rows(kernel, ROW_KERNEL_ROWS + 1, 576, 576, 1, AUTO) is None
    assert chunked_rows(DEEPGEMM_SM90_1D1D, 1, 576, 576, 1, AUTO) is None
    assert chunked_rows(kernel, 1, 5760, 1920, 2, AUTO) is None
    assert chunked_rows(kernel, 1, 5760, 1920, 1, AUTO) is not None
    for engine in ("tile", "offset"):
        forced = Context(environment.snapshot({"MMAEMU_CPU_ENGINE": engine}))
        assert chunked_rows(kernel, 1, 576, 576, 1, forced) is None


def _assert_layer_matches_oracle(layer, x):
    """The layer's second call on ``x`` (its weight kept) against the oracle's integers, output by output
    (DeepGEMM's bf16 output of DeepGEMM's per-token cast of ``x``)."""
    with torch.no_grad():
        layer(x)
        got = layer(x).to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF  # exact: bf16 widened
    x_fp8, sfa = per_token_cast_to_fp8(x, use_ue8m0=False)
    a = x_fp8.view(torch.uint8).numpy()
    b = layer.weight.view(torch.uint8).numpy()
    N = b.shape[0]
    sfb = np.repeat(layer.weight_scale.numpy(), 128, axis=0)[:N]
    for i in range(a.shape[0]):
        for j in range(N):
            want = oracle.blockwise_one([int(v) for v in a[i]], [int(v) for v in b[j]], "e4m3", "e4m3",
                                        [int(v) for v in sfa.numpy()[i].view(np.uint32)],
                                        [int(v) for v in sfb[j].view(np.uint32)], "bfloat16", 0)
            assert int(got[i, j]) == want, (i, j)


def test_oracle_of_one_decoding_step():
    """One decoding step of the layer against the oracle's integers (DeepGEMM's bf16 output), K = 300."""
    rng = np.random.default_rng(5)
    layer = _layer(rng, 70, 300, bias=False)
    _assert_layer_matches_oracle(layer, torch.from_numpy(rng.standard_normal((1, 300)).astype(np.float32)))
