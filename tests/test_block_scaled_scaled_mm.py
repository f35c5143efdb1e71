"""``scaled_mm`` with MXFP8 and NVFP4 operands on the B200 profile (``b200-mx-experimental``): the GEMM equals a
chain of MMA-Sim 2.1.1's ``tcgen05.mma`` block-scaled instructions per output (the external oracle; the scales
arrive swizzled and are mapped back by mmaemu), torch's validation order for block scales, the profile and
``explain``."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu.scale_layout import to_blocked
from mmaemu.warn import collecting
from test_mmasim_block_scale import MXF4, MXF8, make_cases

PROFILE = "b200-mx-experimental"


def _fp8(codes, fmt):
    return torch.from_numpy(codes).view(torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)


def _fp4(codes):
    return torch.from_numpy((codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)).view(torch.float4_e2m1fn_x2)


def _scaled_mm(a, w, sa, sb, scale_dtype, out_dtype=torch.float32, **kw):
    swizzled = [to_blocked(torch.from_numpy(s).view(scale_dtype)) for s in (sa, sb)]
    scale_a, scale_b = swizzled
    if "globals_" in kw:
        ga, gb = kw.pop("globals_")
        scale_a, scale_b = (scale_a, ga), (scale_b, gb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        return mmaemu.scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=out_dtype, **{"profile": PROFILE, **kw})


def _mmasim_chains(sim, inst, fmt_a, fmt_b, a, b, sa, sb):
    """fp32 bits [M, N]: per output, the chain of MMA-Sim's instruction along K from +0."""
    M, N = a.shape[0], b.shape[0]
    rows_a, rows_b = np.repeat(a, N, axis=0), np.tile(b, (M, 1))
    srows_a, srows_b = np.repeat(sa, N, axis=0), np.tile(sb, (M, 1))
    model = getattr(sim, inst.model)(inst.arch, inst.shape.format(a=fmt_a, b=fmt_b))
    scale_dtype = torch.float8_e8m0fnu if inst.scale == "ue8m0" else torch.float8_e4m3fn

    def operand(codes, fmt):
        if inst.packed_fp4:  # MMA-Sim unpacks the high nibble first
            return torch.from_numpy(((codes[:, 0::2] << 4) | codes[:, 1::2]).astype(np.uint8))
        if fmt == "e2m1":  # an FP4 code of kind::mxf8f6f4 sits in bits 5:2 of a byte
            return torch.from_numpy((codes << 2).astype(np.uint8))
        return _fp8(codes, fmt)

    x, y = operand(rows_a, fmt_a), operand(rows_b, fmt_b)
    s, t = torch.from_numpy(srows_a).view(scale_dtype), torch.from_numpy(srows_b).view(scale_dtype)
    c = torch.zeros(M * N)
    k, per = inst.k, inst.k // inst.block
    width = k // 2 if inst.packed_fp4 else k
    for i in range(a.shape[1] // k):
        c = model.dpa(x[:, i * width:(i + 1) * width], y[:, i * width:(i + 1) * width], c,
                      s[:, i * per:(i + 1) * per], t[:, i * per:(i + 1) * per])
    bits = c.numpy().view(np.uint32).copy()
    bits[np.isnan(c.numpy())] = 0x7FFFFFFF
    return bits.reshape(M, N)


def _diff(ours, theirs):
    bad = np.argwhere(ours != theirs)
    return "" if not bad.size else (f"{len(bad)} of {ours.size} outputs differ; first {bad[0].tolist()}: mmaemu "
                                    f"{ours[tuple(bad[0])]:08X}, MMA-Sim {theirs[tuple(bad[0])]:08X}")


@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_mxfp8_scaled_mm_equals_mmasim_chains(sim, fmt_a, fmt_b):
    M, N, K = 6, 32, 128
    a = make_cases(fmt_a, fmt_b, K, 32, "ue8m0", M, 11)
    b = make_cases(fmt_b, fmt_a, K, 32, "ue8m0", N, 12)
    out = _scaled_mm(_fp8(a.a, fmt_a), _fp8(b.a, fmt_b), a.sa, b.sa, torch.float8_e8m0fnu, use_fast_accum=True)
    ours = out.numpy().view(np.uint32)
    theirs = _mmasim_chains(sim, MXF8[0], fmt_a, fmt_b, a.a, b.a, a.sa, b.sa)
    assert not _diff(ours, theirs), _diff(ours, theirs)
    slow = _scaled_mm(_fp8(a.a, fmt_a), _fp8(b.a, fmt_b), a.sa, b.sa, torch.float8_e8m0fnu, backend="reference")
    assert np.array_equal(slow.numpy().view(np.uint32), ours)  # use_fast_accum computes the same chain


def test_nvfp4_scaled_mm_equals_mmasim_chains_and_global_scales_go_into_alpha(sim):
    M, N, K = 5, 16, 192
    inst = next(i for i in MXF4 if i.preset == "tcgen05_mxf4nvf4" and i.scale == "ue4m3")
    a = make_cases("e2m1", "e2m1", K, 16, "ue4m3", M, 21)
    b = make_cases("e2m1", "e2m1", K, 16, "ue4m3", N, 22)
    theirs = _mmasim_chains(sim, inst, "e2m1", "e2m1", a.a, b.a, a.sa, b.sa)
    out = _scaled_mm(_fp4(a.a), _fp4(b.a), a.sa, b.sa, torch.float8_e4m3fn)
    ours = out.numpy().view(np.uint32)
    assert not _diff(ours, theirs), _diff(ours, theirs)
    ga, gb = torch.tensor(0.1), torch.tensor(3.0)
    two_level = _scaled_mm(_fp4(a.a), _fp4(b.a), a.sa, b.sa, torch.float8_e4m3fn, globals_=(ga, gb))
    alpha = np.float32(ga.item()) * np.float32(gb.item())
    with np.errstate(invalid="ignore", over="ignore"):
        expected = theirs.view(np.float32) * alpha
    expected_bits = expected.view(np.uint32).copy()
    expected_bits[np.isnan(expected)] = 0x7FFFFFFF
    assert np.array_equal(two_level.numpy().view(np.uint32), expected_bits)


def test_bf16_output_rounds_the_chain_once():
    rng = np.random.default_rng(3)
    M, N, K = 4, 16, 64
    a, b = rng.integers(0, 0x7E, (M, K)).astype(np.uint8), rng.integers(0, 0x7E, (N, K)).astype(np.uint8)
    sa, sb = rng.integers(100, 150, (M, 2)).astype(np.uint8), rng.integers(100, 150, (N, 2)).astype(np.uint8)
    f32 = _scaled_mm(_fp8(a, "e4m3"), _fp8(b, "e4m3"), sa, sb, torch.float8_e8m0fnu)
    bf16 = _scaled_mm(_fp8(a, "e4m3"), _fp8(b, "e4m3"), sa, sb, torch.float8_e8m0fnu, out_dtype=torch.bfloat16)
    assert torch.equal(bf16, f32.to(torch.bfloat16))


def _mx_call(M=4, N=16, K=64, **changes):
    a = torch.zeros(M, K, dtype=torch.uint8).view(torch.float8_e4m3fn)
    w = torch.zeros(N, K, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sa = to_blocked(torch.full((M, -(-K // 32)), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    sb = to_blocked(torch.full((N, -(-K // 32)), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    args = dict(input=a, mat2=w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, profile=PROFILE)
    args.update(changes)
    return args


def _validation(**args):
    return mmaemu.explain(**args).validation


def test_explain_shows_the_instruction_the_kernel_and_the_unknowns():
    plan = mmaemu.explain(**_mx_call())
    assert (plan.validation, plan.profile, plan.preset, plan.preset_maturity) == ("ok", PROFILE, "tcgen05_mxf8f6f4",
                                                                                  "experimental")
    assert plan.kernel.startswith("cuBLASLt block-scaled") and plan.backend == "cpu"
    assert (plan.split.S, plan.split.source) == (1, "kernel") and "unknown" in plan.split.note
    assert any("MXFP8" in w and "docs/limitations.md" in w for w in plan.warnings)


def test_validation_in_torchs_order():
    assert _validation(**_mx_call()) == "ok"
    sa = _mx_call()["scale_a"]
    kind, message = _validation(**_mx_call(scale_a=sa[:-1]))
    assert kind == "ReferenceRejectsError" and "Expected scale_a size to be 512 but got 511" in message
    # the scale size is checked before the divisibility of K by 16 (torch's order)
    kind, message = _validation(**_mx_call(K=8, scale_a=sa[:-1]))
    assert "Expected scale_a size" in message
    kind, message = _validation(**_mx_call(K=48))
    assert kind == "UnsupportedFeatureError" and "multiple of 32" in message
    kind, message = _validation(**_mx_call(profile="hopper"))
    assert kind == "UnsupportedFeatureError" and PROFILE in message
    kind, message = _validation(**_mx_call(out_dtype=torch.float8_e4m3fn))
    assert kind == "UnsupportedFeatureError" and "FP8 output" in message
    kind, message = _validation(**_mx_call(splitk=(2, "serial")))
    assert kind == "UnsupportedFeatureError" and "splitk" in message
    mx = _mx_call()
    kind, message = _validation(**_mx_call(scale_a=(mx["scale_a"], torch.tensor(1.0))))
    assert kind == "ReferenceRejectsError" and "global_scale_b must have a value" in message
    kind, message = _validation(**_mx_call(scale_a=(mx["scale_a"], torch.tensor(1.0)),
                                           scale_b=(mx["scale_b"], torch.tensor(1.0))))
    assert kind == "UnsupportedFeatureError" and "NVFP4 only" in message


def test_nvfp4_refusals():
    M, N, K = 4, 16, 64
    a = torch.zeros(M, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    w = torch.zeros(N, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sa = to_blocked(torch.zeros(M, K // 16, dtype=torch.uint8).view(torch.float8_e4m3fn))
    sb = to_blocked(torch.zeros(N, K // 16, dtype=torch.uint8).view(torch.float8_e4m3fn))
    plan = mmaemu.explain(a, w.t(), sa, sb, out_dtype=torch.bfloat16, profile=PROFILE)
    assert plan.validation == "ok" and plan.preset == "tcgen05_mxf4nvf4" and plan.split.S == 1
    assert any("NVFP4" in w and "unknown" in w for w in plan.warnings)
    kind, message = mmaemu.explain(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True,
                                   profile=PROFILE).validation
    assert kind == "ReferenceRejectsError" and "use_fast_accum" in message
    mx_scales = [to_blocked(torch.zeros(r, K // 32, dtype=torch.uint8).view(torch.float8_e8m0fnu)) for r in (M, N)]
    plan = mmaemu.explain(a, w.t(), *mx_scales, out_dtype=torch.bfloat16, profile=PROFILE)  # MXFP4
    assert plan.validation == "ok" and plan.preset == "tcgen05_mxf4nvf4" and plan.split.S == 1
    assert any("MXFP4" in w and "kind::mxf4" in w for w in plan.warnings)


def test_the_profile_refuses_tensor_wise_calls_and_profile_from_preset_makes_block_scaled_profiles():
    x = torch.zeros(16, 32, dtype=torch.uint8).view(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    kind, message = mmaemu.explain(x, x.t(), one, one, out_dtype=torch.bfloat16, profile=PROFILE).validation
    assert kind == "UnsupportedFeatureError" and "block-scaled" in message
    assert PROFILE in mmaemu.list_profiles()
    sm120 = mmaemu.profile_from_preset("sm120_mxf8f6f4", base=PROFILE)
    plan = mmaemu.explain(**_mx_call(profile=sm120))
    assert plan.validation == "ok" and plan.preset == "sm120_mxf8f6f4"
    kind, message = mmaemu.explain(**{**_nvfp4_args(), "profile": sm120}).validation
    assert kind == "UnsupportedFeatureError" and "does not take NVFP4" in message


def _nvfp4_args(M=4, N=16, K=64):
    a = torch.zeros(M, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sa = to_blocked(torch.zeros(M, K // 16, dtype=torch.uint8).view(torch.float8_e4m3fn))
    sb = to_blocked(torch.zeros(N, K // 16, dtype=torch.uint8).view(torch.float8_e4m3fn))
    w = torch.zeros(N, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    return dict(input=a, mat2=w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, profile=PROFILE)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_swizzled_scales_reach_their_blocks_across_tiles(recipe):
    """Several 128-row and 4-column scale tiles (M = 130, N = 144, K / block = 10 or 20): scaled_mm on the swizzled
    scales equals the engine on the plain [rows, K / block] scales."""
    from mmaemu.cpu.block_scaled import accumulate_block_scaled

    rng = np.random.default_rng(9)
    M, N, K = 130, 144, 320
    block, scale_fmt = (32, "ue8m0") if recipe == "mxfp8" else (16, "ue4m3")
    scale_dtype = torch.float8_e8m0fnu if recipe == "mxfp8" else torch.float8_e4m3fn
    sa = rng.integers(110, 140, (M, K // block)).astype(np.uint8) if recipe == "mxfp8" else \
        rng.integers(1, 0x7E, (M, K // block)).astype(np.uint8)
    sb = rng.integers(110, 140, (N, K // block)).astype(np.uint8) if recipe == "mxfp8" else \
        rng.integers(1, 0x7E, (N, K // block)).astype(np.uint8)
    if recipe == "mxfp8":
        a, b = rng.integers(0, 0x7E, (M, K)).astype(np.uint8), rng.integers(0, 0x7E, (N, K)).astype(np.uint8)
        x, w, fmt, preset = _fp8(a, "e4m3"), _fp8(b, "e4m3"), "e4m3", "tcgen05_mxf8f6f4"
    else:
        a, b = rng.integers(0, 16, (M, K)).astype(np.uint8), rng.integers(0, 16, (N, K)).astype(np.uint8)
        x, w, fmt, preset = _fp4(a), _fp4(b), "e2m1", "tcgen05_mxf4nvf4"
    got = _scaled_mm(x, w, sa, sb, scale_dtype).numpy().view(np.uint32)
    want = accumulate_block_scaled(a, b, fmt, fmt, sa, sb, scale_fmt, mmaemu.get_preset(preset, warn=False))
    assert np.array_equal(got, want.view(np.uint32))
    transposed = _scaled_mm(x, w, sa[::-1].copy(), sb, scale_dtype).numpy().view(np.uint32)
    assert not np.array_equal(transposed, got)  # the scales matter, row by row


def test_backends_of_block_scaled_calls(monkeypatch):
    assert mmaemu.explain(**_mx_call(backend="reference")).backend == "reference"
    kind, message = mmaemu.explain(**_mx_call(backend="cuda:offset")).validation
    assert kind == "BackendUnavailableError" and "cuda:simple" in message
    monkeypatch.setenv("MMAEMU_BACKEND", "cuda:offset")  # a preference: the CPU computes, and says why
    plan = mmaemu.explain(**_mx_call())
    assert plan.backend == "cpu" and "cuda:simple" in plan.fallbacks[0]


def test_cuda_simple_for_a_block_scaled_call_says_its_kernel_has_no_device_self_test(monkeypatch):
    """Named cuda:simple on CUDA tensors is an explicit choice of a kernel checked only under the simulator: the
    plan takes it and carries the warning (the plan of a CUDA call, built on the CPU from a device stand-in)."""
    from mmaemu import environment
    from mmaemu.context import Context
    from mmaemu.cuda.catalog import GateResult
    from mmaemu.cuda.dispatch import gating
    from mmaemu.base.device_facts import DeviceFacts
    from mmaemu.plan import steps
    from mmaemu.platform import block_scaled

    facts = DeviceFacts(0, "Fake GPU", "GPU-1234", (10, 0), 148, None, torch.__version__, None, None, "13.0",
                        compiler="numba 0.68 + numba-cuda 0.30")
    monkeypatch.setattr(gating, "_probe", lambda device=None: facts)  # the device stand-in

    def verdicts(outcome):
        return lambda info, kernel: GateResult("selftest", outcome, "" if outcome else f"stub: {kernel} fails", {},
                                               0.0, True)

    for outcome in (True, False):
        context = Context(environment.snapshot({}), verdicts=verdicts(outcome))
        plan = types.SimpleNamespace(notices=[], fallbacks=[], backend=None, context=context)
        with collecting():
            if not outcome:  # the kernel runs under cuda:simple's verdict: a failed one refuses the named backend
                with pytest.raises(mmaemu.BackendUnavailableError, match="cuda:simple: stub: simple fails"):
                    steps.choose_block_scaled_backend(plan, torch.device("cuda"), "cuda:simple", context,
                                                      recipe="block_scaled")
                continue
            steps.choose_block_scaled_backend(plan, torch.device("cuda"), "cuda:simple", context,
                                              recipe="block_scaled")
        assert plan.backend == "cuda:simple" and plan.context.device == facts
        assert [(n.category, n.message) for n in plan.notices] == [
            (mmaemu.ExperimentalPresetWarning, block_scaled.CUDA_SIMPLE_UNCHECKED)]
    assert "no device self-test" in block_scaled.CUDA_SIMPLE_UNCHECKED


# ---------------------------------------------------------------------------------------------------------------
# MXFP4 (FP4 operands, UE8M0 block-32 scales), K % 64 == 32 (the zero-padded last instruction), bias, globals

MXF4_B200 = next(i for i in MXF4 if i.label == "B200 tcgen05.mma mxf4 block32 ue8m0")
SAFE_KINDS = ("random", "c-dominant", "c-cancel", "tiny-subnormal-c", "cancel", "zero-groups", "underflow")


def _finite_cases(K, block, scale_fmt, n, seed):
    """n operand rows of make_cases' kinds whose chains stay finite (no NaN scale, no overflowing scales)."""
    cases = make_cases("e2m1", "e2m1", K, block, scale_fmt, 4 * n, seed)
    rows = np.flatnonzero(np.isin(cases.kinds, SAFE_KINDS))[:n]
    return cases.a[rows], cases.sa[rows]


def _fraction_chain(a, b, sa, sb, block, scale_fmt):
    """fp32 bits of one output: tests/test_block_scaled.py's Fraction oracle of one kind::mxf4(nvf4) instruction,
    chained along K from +0 (a short last instruction is one of zero-padded groups by the oracle's own rule)."""
    from test_block_scaled import oracle_mxf4

    c, per = 0, 64 // block
    for i in range(0, len(a), 64):
        c = oracle_mxf4(a[i:i + 64], b[i:i + 64], sa[i // block:i // block + per], sb[i // block:i // block + per],
                        c, block, scale_fmt)
    return c


def test_mxfp4_scaled_mm_equals_mmasim_kind_mxf4_chains(sim):
    """The B200 profile computes MXFP4 as one chain of kind::mxf4 (block32 UE8M0) per output: MMA-Sim's model."""
    M, N, K = 5, 16, 192
    a = make_cases("e2m1", "e2m1", K, 32, "ue8m0", M, 31)
    b = make_cases("e2m1", "e2m1", K, 32, "ue8m0", N, 32)
    theirs = _mmasim_chains(sim, MXF4_B200, "e2m1", "e2m1", a.a, b.a, a.sa, b.sa)
    out = _scaled_mm(_fp4(a.a), _fp4(b.a), a.sa, b.sa, torch.float8_e8m0fnu)
    assert not _diff(out.numpy().view(np.uint32), theirs), _diff(out.numpy().view(np.uint32), theirs)
    slow = _scaled_mm(_fp4(a.a), _fp4(b.a), a.sa, b.sa, torch.float8_e8m0fnu, backend="reference")
    assert np.array_equal(slow.numpy().view(np.uint32), theirs)


@pytest.mark.parametrize("K", [128, 96])
def test_mxfp4_scaled_mm_equals_the_fraction_oracle(K):
    M, N = 3, 16
    a, sa = _finite_cases(K, 32, "ue8m0", M, 33)
    b, sb = _finite_cases(K, 32, "ue8m0", N, 34)
    out = _scaled_mm(_fp4(a), _fp4(b), sa, sb, torch.float8_e8m0fnu).numpy().view(np.uint32)
    want = np.array([[_fraction_chain(a[i], b[j], sa[i], sb[j], 32, "ue8m0") for j in range(N)] for i in range(M)],
                    np.uint32)
    assert np.array_equal(out, want), _diff(out, want)


def test_fp4_operands_of_kind_mxf8f6f4_on_a_profile_made_from_that_preset(sim):
    """profile_from_preset('tcgen05_mxf8f6f4') computes MXFP4 calls with FP4 operands of kind::mxf8f6f4 (32 elements
    per instruction, the block algorithm): MMA-Sim's chains of that instruction, and not those of kind::mxf4."""
    profile = mmaemu.profile_from_preset("tcgen05_mxf8f6f4", base=PROFILE)
    M, N, K = 4, 16, 128
    a = make_cases("e2m1", "e2m1", K, 32, "ue8m0", M, 35)
    b = make_cases("e2m1", "e2m1", K, 32, "ue8m0", N, 36)
    assert mmaemu.explain(**{**_nvfp4_args(), "profile": profile}).validation[0] == "UnsupportedFeatureError"
    out = _scaled_mm(_fp4(a.a), _fp4(b.a), a.sa, b.sa, torch.float8_e8m0fnu, profile=profile)
    ours = out.numpy().view(np.uint32)
    theirs = _mmasim_chains(sim, MXF8[0], "e2m1", "e2m1", a.a, b.a, a.sa, b.sa)
    assert not _diff(ours, theirs), _diff(ours, theirs)
    assert not np.array_equal(ours, _mmasim_chains(sim, MXF4_B200, "e2m1", "e2m1", a.a, b.a, a.sa, b.sa))


def _padded_scales(plain, fill, rng):
    """The swizzled scale tensor of plain [rows, blocks] scales whose padding columns (up to a multiple of 4) hold
    ``fill`` codes (random finite codes for "random")."""
    rows, blocks = plain.shape
    wide = np.zeros((rows, -(-blocks // 4) * 4), np.uint8)
    wide[:, :blocks] = plain
    wide[:, blocks:] = rng.integers(1, 0x7E, (rows, wide.shape[1] - blocks)) if fill == "random" else fill
    return wide


@pytest.mark.parametrize("recipe,K", [("nvfp4", 96), ("nvfp4", 160), ("mxfp4", 96), ("mxfp4", 224)])
def test_fp4_k_of_an_odd_number_of_32_is_the_zero_padded_last_instruction(sim, recipe, K):
    """torch takes K % 64 == 32 for FP4 (K / 2 a multiple of 16): the kernel's last 64-element instruction is zero-
    padded. On MMA-Sim's model: the call equals the chains over the operands padded with +0 to whole instructions,
    with the scale codes the swizzled tensor holds in its padding; and any finite padding scale gives the same bits
    (a group of zero products takes part in no alignment), so the result is that of the K elements alone."""
    rng = np.random.default_rng(K)
    block, scale_fmt, dtype = (16, "ue4m3", torch.float8_e4m3fn) if recipe == "nvfp4" else \
        (32, "ue8m0", torch.float8_e8m0fnu)
    inst = next(i for i in MXF4 if i.preset == "tcgen05_mxf4nvf4" and (i.block, i.scale) == (block, scale_fmt)
                and i.label.startswith("B200"))
    M, N, Kp = 4, 16, -(-K // 64) * 64
    a = make_cases("e2m1", "e2m1", Kp, block, scale_fmt, M, 37)
    b = make_cases("e2m1", "e2m1", Kp, block, scale_fmt, N, 38)
    results = []
    for fill in ("random", 0):
        wa, wb = _padded_scales(a.sa[:, :K // block], fill, rng), _padded_scales(b.sa[:, :K // block], fill, rng)
        swizzled = [to_blocked(torch.from_numpy(w).view(dtype)) for w in (wa, wb)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
            out = mmaemu.scaled_mm(_fp4(a.a[:, :K]), _fp4(b.a[:, :K]).t(), *swizzled, out_dtype=torch.float32,
                                   profile=PROFILE).numpy().view(np.uint32)
        zero_tail = [np.concatenate([x[:, :K], np.zeros((x.shape[0], Kp - K), np.uint8)], 1) for x in (a.a, b.a)]
        theirs = _mmasim_chains(sim, inst, "e2m1", "e2m1", *zero_tail, wa[:, :Kp // block], wb[:, :Kp // block])
        assert not _diff(out, theirs), (fill, _diff(out, theirs))
        results.append(out)
    assert np.array_equal(results[0], results[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        slow = mmaemu.scaled_mm(_fp4(a.a[:, :K]), _fp4(b.a[:, :K]).t(), *swizzled, out_dtype=torch.float32,
                                profile=PROFILE, backend="reference")
    assert np.array_equal(slow.numpy().view(np.uint32), results[1])
    plan = mmaemu.explain(_fp4(a.a[:, :K]), _fp4(b.a[:, :K]).t(), *swizzled, out_dtype=torch.bfloat16, profile=PROFILE)
    assert plan.validation == "ok" and f"K zero-padded to {Kp}" in plan.split.note


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_a_nan_code_in_the_scale_padding_that_the_padded_instruction_reads_is_refused(recipe):
    K, M, N = 96, 4, 16
    block, nan, dtype = (16, 0x7F, torch.float8_e4m3fn) if recipe == "nvfp4" else (32, 0xFF, torch.float8_e8m0fnu)
    rng = np.random.default_rng(5)
    x = _fp4(rng.integers(0, 16, (M, K)).astype(np.uint8))
    w = _fp4(rng.integers(0, 16, (N, K)).astype(np.uint8))
    plain = np.full((N, K // block), 0x38 if recipe == "nvfp4" else 127, np.uint8)
    sa = to_blocked(torch.from_numpy(_padded_scales(plain[:M], 0, rng)).view(dtype))
    sb = to_blocked(torch.from_numpy(_padded_scales(plain, nan, rng)).view(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        with pytest.raises(mmaemu.UnsupportedFeatureError, match="padding column.*NaN|NaN.*padding"):
            mmaemu.scaled_mm(x, w.t(), sa, sb, out_dtype=torch.bfloat16, profile=PROFILE)
        ok = to_blocked(torch.from_numpy(_padded_scales(plain, 0, rng)).view(dtype))
        assert mmaemu.scaled_mm(x, w.t(), sa, ok, out_dtype=torch.bfloat16, profile=PROFILE).shape == (M, N)


def _fp4_call(recipe, M=4, N=16, K=64):
    block, dtype = (16, torch.float8_e4m3fn) if recipe == "nvfp4" else (32, torch.float8_e8m0fnu)
    a = torch.zeros(M, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    w = torch.zeros(N, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sa, sb = (to_blocked(torch.zeros(r, K // block, dtype=torch.uint8).view(dtype)) for r in (M, N))
    return dict(input=a, mat2=w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, profile=PROFILE)


def test_the_bias_of_a_block_scaled_call_is_refused_naming_cublaslts_epilogue_and_the_probe():
    """torch._scaled_mm hands a block-scaled bias to cuBLASLt's closed epilogue: refused, after torch's own bias
    rules (an fp32 output with a bias is torch's rejection)."""
    bias = torch.zeros(16, dtype=torch.bfloat16)
    for call in (_mx_call(), _fp4_call("nvfp4"), _fp4_call("mxfp4")):
        kind, message = _validation(**{**call, "bias": bias})
        assert kind == "UnsupportedFeatureError" and "CUBLASLT_EPILOGUE_BIAS" in message
        assert "bias probe in docs/limitations.md" in message and "add it to the result" in message
        kind, message = _validation(**{**call, "bias": bias, "out_dtype": torch.float32})
        assert kind == "ReferenceRejectsError" and "Bias is not supported when out_dtype is set to Float32" in message


def test_a_python_float_global_scale_is_a_type_error_naming_the_argument():
    call = _fp4_call("nvfp4")
    one = torch.tensor(1.0)
    for scale_a, scale_b, name in (((call["scale_a"], 0.5), (call["scale_b"], one), "global_scale_a"),
                                   ((call["scale_a"], one), (call["scale_b"], 2), "global_scale_b")):
        with pytest.raises(TypeError, match=rf"{name} .*Python (float|int).*torch\.tensor\("):
            mmaemu.scaled_mm(call["input"], call["mat2"], scale_a, scale_b, out_dtype=torch.bfloat16,
                             profile=PROFILE)
    mx = _fp4_call("mxfp4")
    kind, message = _validation(**{**mx, "scale_a": (mx["scale_a"], one), "scale_b": (mx["scale_b"], one)})
    assert kind == "UnsupportedFeatureError" and "NVFP4 only" in message


def test_mxfp4_takes_the_operands_f_scaled_mm_passes():
    """torchao's MXFP4 GEMM calls F.scaled_mm(x [M, K/2], w.t() [K/2, N] column-major, BlockWise1x32 e8m0 scales
    swizzled 32_4_4 and flat); the same tensors reach mmaemu.scaled_mm, and torch's MX scale-size rule counts K
    unpacked (128 * ceil(rows / 128) * 4 * ceil(K / 32 / 4) codes)."""
    M, N, K = 4, 16, 96
    call = _fp4_call("mxfp4", M, N, K)
    assert call["scale_a"].numel() == 128 * 4 and call["mat2"].stride() == (1, K // 2)
    plan = mmaemu.explain(**call)
    assert plan.validation == "ok" and plan.preset == "tcgen05_mxf4nvf4"
    short = call["scale_a"].reshape(-1)[:-1]
    kind, message = _validation(**{**call, "scale_a": short})
    assert kind == "ReferenceRejectsError" and "Expected scale_a size to be 512" in message
