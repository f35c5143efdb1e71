"""mmaemu.patch on today's torch API: every scaled-GEMM entry point of the installed torch is routed or refused
inside a block (torch._scaled_mm, torch._scaled_mm_v2 = F.scaled_mm, torch._scaled_grouped_mm(_v2) =
F.scaled_grouped_mm); F.scaled_mm gives mmaemu.scaled_mm's bits; block-wise and cuBLASLt row-wise are refused
as the kernel-family table says (mmaemu.platform.kernel_families)."""

import dataclasses
import warnings
import pathlib

import pytest
import torch
import torch.nn.functional as F

import mmaemu
from mmaemu import patching, scaled_v2
from mmaemu.errors import ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.platform import kernel_families
from mmaemu.platform.profiles import get_profile
from mmaemu.scale_layout import to_blocked
from mmaemu.testing import assert_bitwise_equal

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
ORIGINALS = {name: getattr(torch, name) for name in patching.scaled_gemm_attributes()}
TW, RW = F.ScalingType.TensorWise, F.ScalingType.RowWise
# A Hopper stack whose torch sends row-wise scales to cuBLASLt and 1x128 / 128x128 scales to its block-wise modes.
HOPPER_LT129 = dataclasses.replace(get_profile("hopper"), name="hopper-lt12.9-test", cublaslt_version="12.9.1.4",
                                   torch_version="2.11.0+cu129", maturity="experimental")


def fp8(shape, seed, dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-4, 4, shape, generator=g).float())
    return (values * 16).clamp(-448, 448).to(dtype)


def scales(shape, seed):
    """Non-power-of-two fp32 scales (the two scale orders of a row-wise epilogue differ on them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 1.5 + 0.25


@pytest.fixture(autouse=True)
def torch_is_restored():
    yield
    for name, function in ORIGINALS.items():
        assert getattr(torch, name) is function
    assert not patching.is_patched()


# ---------------------------------------------------------------------------------------------------------------
# Every scaled-GEMM entry point: routed or refused


def test_every_scaled_gemm_attribute_of_torch_is_replaced_inside_a_block():
    found = [name for name in dir(torch) if name.startswith("_scaled") and "mm" in name[len("_scaled"):]]
    assert set(patching.scaled_gemm_attributes()) == set(found)
    assert set(patching.ROUTED) <= set(found)  # torch 2.13.0 has all four; each is routed, any other refused
    with mmaemu.patch(splitk=1):
        for name in found:
            replaced = getattr(torch, name)
            assert replaced is not ORIGINALS[name] and replaced.__name__ == name, name


def test_an_unknown_scaled_gemm_of_a_new_torch_is_refused_not_run_natively(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "_scaled_mm_v9", lambda *a: calls.append(a), raising=False)
    assert "_scaled_mm_v9" in patching.scaled_gemm_attributes()
    with mmaemu.patch():
        with pytest.raises(UnsupportedFeatureError, match="torch._scaled_mm_v9 is a scaled GEMM of this torch"):
            torch._scaled_mm_v9(1, 2)
    torch._scaled_mm_v9(3)  # restored after the block: torch's own again
    assert calls == [(3,)]
    monkeypatch.delattr(torch, "_scaled_mm_v9")
    patching._originals.pop("_scaled_mm_v9", None)


def _is_scaled_gemm_function(name: str) -> bool:
    return name.startswith("scaled") and name.endswith("mm")


def test_every_public_scaled_gemm_function_reaches_a_routed_attribute_through_the_torch_module():
    public = [name for name in dir(F) if name.startswith("scaled")]
    gemms = [name for name in public if _is_scaled_gemm_function(name)]
    assert set(public) - set(gemms) == {"scaled_dot_product_attention"}  # attention, not a scaled GEMM
    for name in gemms:
        attribute = patching.REACHED_THROUGH[f"torch.nn.functional.{name}"]
        code = getattr(F, name).__code__
        assert "torch" in code.co_names and attribute in code.co_names, name  # looked up at each call
        assert attribute in patching.ROUTED


def test_every_aten_scaled_gemm_op_has_a_routed_python_attribute():
    """torch.ops.aten ops are not replaced (docs/guide.md); each one's Python entry point is."""
    ops = [name for name in ("_scaled_mm", "_scaled_mm_v2", "_scaled_grouped_mm", "_scaled_grouped_mm_v2")
           if hasattr(torch.ops.aten, name)]
    listed = [name for name in dir(torch.ops.aten) if name.startswith("_scaled") and "mm" in name[7:]]
    for name in set(ops) | set(listed):
        assert name in patching.ROUTED, name
    a, w, one = fp8((16, 64), 40), fp8((32, 64), 41), torch.tensor(1.0)
    native = torch.ops.aten._scaled_mm(a, w.t(), one, one, out_dtype=torch.float32)
    with mmaemu.patch(splitk=1) as log:
        inside = torch.ops.aten._scaled_mm(a, w.t(), one, one, out_dtype=torch.float32)
    assert_bitwise_equal(inside, native)  # the dispatcher's op is not replaced (documented)
    assert len(log) == 0


# ---------------------------------------------------------------------------------------------------------------
# F.scaled_mm inside a block: mmaemu.scaled_mm's bits


@pytest.mark.parametrize("fast", [True, False])
def test_tensorwise_f_scaled_mm_inside_patch_gives_mmaemu_scaled_mm_bits(fast):
    a, w = fp8((32, 128), 1), fp8((48, 128), 2)
    sa, sb = torch.tensor(0.375), torch.tensor(1.625)
    with mmaemu.patch(profile="hopper", splitk="assume-unsplit") as log:
        y = F.scaled_mm(a, w.t(), sa, TW, sb, TW, output_dtype=torch.bfloat16, use_fast_accum=fast)
    expected = mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                profile="hopper", splitk="assume-unsplit")
    assert_bitwise_equal(y, expected)
    (record,) = log
    assert (record.entry_point, record.recipe) == ("torch._scaled_mm_v2", "tensorwise_tensorwise")
    assert record.S == 1 and record.error is None and "via torch._scaled_mm_v2" in log.summary()


def test_tensorwise_differs_from_torch_cpu_so_the_routing_is_visible():
    """Outside a block torch's CPU kernel computes F.scaled_mm; its bits differ from the H100's (the reason the
    entry point must be routed)."""
    a, w = fp8((32, 256), 3), fp8((64, 256), 4)
    sa, sb = torch.tensor(0.7), torch.tensor(1.3)
    native = F.scaled_mm(a, w.t(), sa, TW, sb, TW, output_dtype=torch.float32, use_fast_accum=True)
    with mmaemu.patch(profile="hopper", splitk=1):
        emulated = F.scaled_mm(a, w.t(), sa, TW, sb, TW, output_dtype=torch.float32, use_fast_accum=True)
    assert not torch.equal(native.view(torch.int32), emulated.view(torch.int32))


def test_rowwise_f_scaled_mm_inside_patch_gives_mmaemu_scaled_mm_bits():
    a, w = fp8((64, 128), 5), fp8((96, 128), 6)
    sa, sb = scales((64, 1), 7), scales((1, 96), 8)
    with mmaemu.patch(profile="hopper") as log:
        y = F.scaled_mm(a, w.t(), sa, RW, sb, RW)  # output_dtype defaults to bfloat16
    assert_bitwise_equal(y, mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, profile="hopper"))
    assert log[0].recipe == "rowwise_rowwise" and log[0].split.source == "kernel"


def test_the_op_form_and_the_public_v2_function_agree_with_scaled_mm():
    a, w = fp8((16, 64), 9), fp8((32, 64), 10)
    sa, sb = torch.tensor(2.0), torch.tensor(0.3)
    expected = mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.float32, splitk=1)
    assert_bitwise_equal(mmaemu.scaled_mm_v2(a, w.t(), sa, TW, sb, TW, output_dtype=torch.float32, splitk=1),
                         expected)
    with mmaemu.patch(splitk=1):
        y = torch._scaled_mm_v2(a, w.t(), [sa], [0], [], [sb], [0], [], None, torch.float32, [], False)
        z = torch._scaled_mm_v2(a, w.t(), [sa], [0], [], [sb], [0], [], None, None)  # None: mat_a's dtype
    assert_bitwise_equal(y, expected)
    assert_bitwise_equal(z, mmaemu.scaled_mm(a, w.t(), sa, sb, splitk=1))


def test_mxfp8_f_scaled_mm_on_the_b200_profile_gives_scaled_mm_bits():
    M, N, K = 16, 32, 64
    a, w = fp8((M, K), 11), fp8((N, K), 12)
    g = torch.Generator().manual_seed(13)
    sa = to_blocked(torch.randint(120, 134, (M, K // 32), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    sb = to_blocked(torch.randint(120, 134, (N, K // 32), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    swizzle = F.SwizzleType.SWIZZLE_32_4_4
    blockwise = F.ScalingType.BlockWise1x32
    with mmaemu.patch(profile="b200-mx-experimental") as log:
        y = F.scaled_mm(a, w.t(), sa, blockwise, sb, blockwise, swizzle, swizzle, output_dtype=torch.float32)
        with pytest.raises(ReferenceRejectsError, match="swizzle_a must have 1 value"):
            F.scaled_mm(a, w.t(), sa, blockwise, sb, blockwise, output_dtype=torch.float32)
    expected = mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.float32, profile="b200-mx-experimental")
    assert_bitwise_equal(y, expected)
    assert [r.recipe for r in log] == ["mxfp8_mxfp8", "mxfp8_mxfp8"] and log[1].error.startswith("Reference")


def test_contraction_dim_other_than_the_default_is_refused():
    a, w = fp8((16, 64), 14), fp8((32, 64), 15)
    with pytest.raises(UnsupportedFeatureError, match="contraction_dim"):
        mmaemu.scaled_mm_v2(a, w.t(), torch.tensor(1.0), TW, torch.tensor(1.0), TW, contraction_dim=(0, 1))


def test_an_invalid_recipe_pair_is_rejected_as_torch_rejects_it():
    a, w = fp8((16, 64), 16), fp8((32, 64), 17)
    with pytest.raises(ReferenceRejectsError, match="Invalid scaling configuration"):
        mmaemu.scaled_mm_v2(a, w.t(), torch.tensor(1.0), TW, torch.ones(1, 32), RW)


# ---------------------------------------------------------------------------------------------------------------
# Block-wise: refused on hopper as its stack refuses it; one seam where a stack runs it

BLOCK_PAIRS = {
    "block_1x128_128x128": (F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128),
    "block_128x128_1x128": (F.ScalingType.BlockWise128x128, F.ScalingType.BlockWise1x128),
    "block_1x128_1x128": (F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise1x128),
}


def _blockwise_scales(pair, M, N, K):
    """torch's layouts (ScaledBlas.cpp's v2 checks): 1x128 scales [rows, K/128] with strides (1, rows); 128x128
    scales [K/128 rounded up to 4, rows/128] with strides (1, K/128 rounded up to 4)."""
    kb = K // 128
    one_a = torch.ones(kb, M).t()
    one_b = torch.ones(kb, N).t()
    if pair == "block_1x128_128x128":
        return one_a, torch.ones(N // 128, -(-kb // 4) * 4).t()
    if pair == "block_128x128_1x128":
        return torch.ones(M // 128, -(-kb // 4) * 4).t(), one_b
    return one_a, one_b


@pytest.mark.parametrize("pair", sorted(BLOCK_PAIRS))
def test_blockwise_is_refused_on_hopper_as_its_stack_refuses_it(pair):
    M, N, K = 128, 128, 256
    a, w = fp8((M, K), 18), fp8((N, K), 19)
    sa, sb = _blockwise_scales(pair, M, N, K)
    recipe_a, recipe_b = BLOCK_PAIRS[pair]
    with mmaemu.patch(profile="hopper") as log:
        with pytest.raises(ReferenceRejectsError, match="has no 1x128 / 128x128 block-wise scaling") as raised:
            F.scaled_mm(a, w.t(), sa, recipe_a, sb, recipe_b)
    assert "torch 2.7.1" in str(raised.value) and "cuBLASLt 12.8.3.14" in str(raised.value)
    assert "profile(s) ['hopper-cublaslt-blockwise-experimental'] compute it" in str(raised.value)
    assert log[0].recipe == pair and log[0].error.startswith("ReferenceRejectsError")


def _scales_like(template, seed):
    """Non-power-of-two scales of ``template``'s shape and strides (so the combine order shows in the bits)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.rand(template.t().shape, generator=g) * 0.75 + 0.5
    return values.t() if template.stride(0) == 1 else values.t().contiguous().t()


@pytest.mark.parametrize("pair", sorted(BLOCK_PAIRS))
def test_blockwise_f_scaled_mm_inside_patch_is_the_cublaslt_blockwise_recipe(pair):
    from mmaemu.blockwise_cublaslt import scaled_mm_blockwise

    M, N, K = 128, 128, 384
    a, w = fp8((M, K), 22), fp8((N, K), 23)
    ones_a, ones_b = _blockwise_scales(pair, M, N, K)
    sa, sb = _scales_like(ones_a, 1), _scales_like(ones_b, 2)
    recipe_a, recipe_b = BLOCK_PAIRS[pair]
    profile = "hopper-cublaslt-blockwise-experimental"
    blocks = {"block_1x128_1x128": ((1, 128), (1, 128)), "block_1x128_128x128": ((1, 128), (128, 128)),
              "block_128x128_1x128": ((128, 128), (1, 128))}[pair]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        with mmaemu.patch(profile=profile) as log:
            y = F.scaled_mm(a, w.t(), sa, recipe_a, sb, recipe_b)
        direct = scaled_mm_blockwise(a, w.t(), sa, sb, block_a=blocks[0], block_b=blocks[1],
                                     out_dtype=torch.bfloat16, profile=profile)
    assert_bitwise_equal(y, direct)
    assert log[0].entry_point == "torch._scaled_mm_v2" and log[0].recipe == pair and log[0].error is None


def test_blockwise_reaches_one_seam_on_a_stack_that_runs_it(monkeypatch):
    seen = []

    def seam(*args, pair, **kwargs):
        seen.append(pair)
        return "computed"

    monkeypatch.setattr(scaled_v2, "_blockwise_1x128", seam)
    M, N, K = 128, 128, 256
    a, w = fp8((M, K), 20), fp8((N, K), 21)
    for pair, (recipe_a, recipe_b) in sorted(BLOCK_PAIRS.items()):
        sa, sb = _blockwise_scales(pair, M, N, K)
        assert mmaemu.scaled_mm_v2(a, w.t(), sa, recipe_a, sb, recipe_b, profile=HOPPER_LT129) == "computed"
    assert seen == sorted(BLOCK_PAIRS)


def test_the_seam_computes_on_the_blockwise_profile_only():
    """A recorded 12.9 stack reaches the seam, whose recipe models the block-wise profile's stack alone: it
    refuses, naming that profile."""
    M, N, K = 128, 128, 256
    sa, sb = _blockwise_scales("block_1x128_128x128", M, N, K)
    with pytest.raises(ReferenceRejectsError, match="use profile='hopper-cublaslt-blockwise-experimental'"):
        mmaemu.scaled_mm_v2(fp8((M, K), 22), fp8((N, K), 23).t(), sa, F.ScalingType.BlockWise1x128, sb,
                            F.ScalingType.BlockWise128x128, profile=HOPPER_LT129)


# ---------------------------------------------------------------------------------------------------------------
# Row-wise on a cuBLAS >= 12.9 stack: cuBLASLt's unrecorded epilogue, refused naming the probe


def test_rowwise_on_a_cublaslt_12_9_stack_is_refused_naming_the_probe():
    a, w = fp8((64, 128), 24), fp8((64, 128), 25)
    sa, sb = scales((64, 1), 26), scales((1, 64), 27)
    for call in (lambda: mmaemu.scaled_mm_v2(a, w.t(), sa, RW, sb, RW, profile=HOPPER_LT129),
                 lambda: mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, profile=HOPPER_LT129)):
        with pytest.raises(UnsupportedFeatureError, match="cuBLASLt row-wise OUTER_VEC_32F") as raised:
            call()
        assert kernel_families.ROWWISE_CUBLASLT_PROBE in str(raised.value)
    assert kernel_families.ROWWISE_CUBLASLT_PROBE in (DOCS / "limitations.md").read_text()


def test_explain_names_the_kernel_family_and_why():
    a, w = fp8((64, 128), 28), fp8((64, 128), 29)
    plan = mmaemu.explain(a, w.t(), scales((64, 1), 30), scales((1, 64), 31), out_dtype=torch.bfloat16)
    assert plan.kernel_family == "cutlass rowwise" and "CUTLASS kernel f8f8bf16_rowwise" in plan.kernel_reason
    plan = mmaemu.explain(a, w.t(), torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.bfloat16, splitk=1)
    assert plan.kernel_family == "cuBLASLt tensor-wise" and "cuBLASLt" in plan.kernel_reason
    refused = mmaemu.explain(a, w.t(), scales((64, 1), 30), scales((1, 64), 31), out_dtype=torch.bfloat16,
                             profile=HOPPER_LT129)
    assert "cuBLASLt row-wise OUTER_VEC_32F" in refused.validation[1]
