"""Grouped GEMMs (mmaemu.grouped): F.scaled_grouped_mm / torch._scaled_grouped_mm(_v2) row-wise on sm_90, group by
group, against mmaemu.scaled_mm calls of the same operands (a hand-written 3-expert MoE layer) and against the
independent oracle (the grouped epilogue: scale_a first, no bias node, -0 kept); refusals."""

import struct

import pytest
import torch
import torch.nn.functional as F

import mmaemu
import oracle
from mmaemu.errors import ExperimentalPresetWarning, ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.platform.rowwise import scale_order
from mmaemu.testing import assert_bitwise_equal

RW = F.ScalingType.RowWise
E4M3 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def fp8(shape, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-3, 3, shape, generator=g).float())
    return (values * 16).clamp(-448, 448).to(E4M3)


def pow2_scales(shape, seed):
    """Power-of-two fp32 scales, as torchao's float8 MoE recipe rounds them."""
    g = torch.Generator().manual_seed(seed)
    return torch.exp2(torch.randint(-6, 3, shape, generator=g).float())


def rowwise_quantize(t):
    """fp8 rows of ``t`` with power-of-two per-row scales (the inverse scales returned, [rows])."""
    amax = t.abs().amax(dim=1).clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2(448.0 / amax)))
    return (t * scale[:, None]).clamp(-448, 448).to(E4M3), (1.0 / scale).float()


def _ends(counts):
    return torch.tensor(torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)


class ThreeExpertMoE:
    """A hand-written MoE layer of 3 experts: tokens sorted by expert, up projection (2-D x 3-D grouped GEMM),
    ReLU, row-wise requantisation, down projection; its weight gradient (2-D x 2-D grouped GEMM along tokens)."""

    def __init__(self, K=128, H=64, seed=0):
        self.w_up, self.w_down = fp8((3, H, K), seed), fp8((3, K, H), seed + 1)
        self.s_up, self.s_down = pow2_scales((3, H), seed + 2), pow2_scales((3, K), seed + 3)

    def forward(self, x, sx, offs, fast):
        h = F.scaled_grouped_mm(x, self.w_up.transpose(-2, -1), sx, RW, self.s_up, RW, offs=offs,
                                use_fast_accum=fast)
        h8, sh = rowwise_quantize(torch.relu(h.float()))
        y = F.scaled_grouped_mm(h8, self.w_down.transpose(-2, -1), sh, RW, self.s_down, RW, offs=offs,
                                use_fast_accum=fast)
        return h, h8, sh, y


def _per_group(a, b_groups, sa, sb_groups, ends, fast):
    """mmaemu.scaled_mm (row-wise, hopper) of each group's rows, stacked: the expected grouped result."""
    rows, start = [], 0
    for g, end in enumerate(ends.tolist()):
        if end > start:
            rows.append(mmaemu.scaled_mm(a[start:end], b_groups[g].t(), sa[start:end, None], sb_groups[g][None, :],
                                         out_dtype=BF16, use_fast_accum=fast, profile="hopper"))
        start = end
    return torch.cat(rows)


@pytest.mark.parametrize("fast", [True, False])
def test_three_expert_moe_forward_under_patch_matches_scaled_mm_group_by_group(fast):
    moe = ThreeExpertMoE()
    x8, sx = rowwise_quantize(torch.randn(64, 128, generator=torch.Generator().manual_seed(5)) * 3)
    offs = _ends([16, 0, 48])  # expert 1 receives no token
    with mmaemu.patch(profile="hopper") as log:
        h, h8, sh, y = moe.forward(x8, sx, offs, fast)
    assert_bitwise_equal(h, _per_group(x8, moe.w_up, sx, moe.s_up, offs, fast))
    assert_bitwise_equal(y, _per_group(h8, moe.w_down, sh, moe.s_down, offs, fast))
    assert [(r.entry_point, r.recipe, r.error) for r in log] == [("torch._scaled_grouped_mm_v2", "rowwise_rowwise",
                                                                   None)] * 2


def test_three_expert_moe_weight_gradient_2d_2d_matches_scaled_mm_group_by_group():
    moe = ThreeExpertMoE(seed=7)
    counts = [16, 32, 16]
    grad_out = fp8((64, 128), 8)  # [tokens, K]: the gradient of y
    h8 = fp8((64, 64), 9)  # [tokens, H]
    s_grad, s_h = pow2_scales((128 * 3,), 10), pow2_scales((64 * 3,), 11)
    a = grad_out.t().contiguous()  # [K, tokens] row-major
    b = h8.t().contiguous().t()  # [tokens, H] column-major
    with mmaemu.patch(profile="hopper"):
        dw = F.scaled_grouped_mm(a, b, s_grad, RW, s_h, RW, offs=_ends(counts))
    assert dw.shape == (3, 128, 64)
    start = 0
    for g, count in enumerate(counts):
        end = start + count
        expected = mmaemu.scaled_mm(a[:, start:end], b[start:end], s_grad[g * 128:(g + 1) * 128, None],
                                    s_h[g * 64:(g + 1) * 64][None, :], out_dtype=BF16, profile="hopper")
        assert_bitwise_equal(dw[g], expected)
        start = end
    assert moe.w_up.shape == (3, 64, 128)


def test_3d_3d_and_the_v1_entry_point_agree_with_scaled_mm():
    a, w = fp8((3, 32, 64), 12), fp8((3, 48, 64), 13)
    sa, sb = pow2_scales((3, 32), 14), pow2_scales((3, 48), 15)
    with mmaemu.patch(profile="hopper") as log:
        v2 = F.scaled_grouped_mm(a, w.transpose(-2, -1), sa, RW, sb, RW)
        v1 = torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb, out_dtype=BF16)
    for g in range(3):
        expected = mmaemu.scaled_mm(a[g], w[g].t(), sa[g][:, None], sb[g][None, :], out_dtype=BF16,
                                    profile="hopper")
        assert_bitwise_equal(v2[g], expected)
    assert_bitwise_equal(v1, v2)
    assert [r.entry_point for r in log] == ["torch._scaled_grouped_mm_v2", "torch._scaled_grouped_mm"]
    assert [r.out_dtype for r in log] == ["bfloat16", "bfloat16"] and log[1].recipe == "rowwise_rowwise"


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _oracle_group(a, w, sa, sb, fast):
    """bf16 bits of the grouped kernel's epilogue, restated: bf16(RN(sb * RN(sa * acc))) of the oracle's chain."""
    acc = oracle.accumulate(a.view(torch.uint8).tolist(), w.view(torch.uint8).tolist(), "e4m3", "e4m3",
                            oracle.PRESETS["hopper"], fast)
    xs = sa.view(torch.int32).tolist()
    ws = sb.view(torch.int32).tolist()
    return [[oracle.int_fp32_to_bf16(oracle.int_fp32_mul(ws[n] & 0xFFFFFFFF,
                                                         oracle.int_fp32_mul(xs[m] & 0xFFFFFFFF, acc[m][n])))
             for n in range(len(ws))] for m in range(len(xs))]


@pytest.mark.parametrize("fast", [True, False])
def test_the_grouped_epilogue_against_the_oracle_on_adversarial_scales(fast, fresh_warnings):
    """Non-power-of-two scales (the two multiply orders differ) and scales that underflow a negative product to
    -0, which the grouped kernel keeps (no bias node) and the non-grouped kernel turns into +0."""
    K, N = 160, 16
    x, w = fp8((24, K), 16), fp8((2, N, K), 17)
    g = torch.Generator().manual_seed(18)
    sx = (torch.rand(24, generator=g) * 3 + 0.1)
    sx[:4] = 2.0 ** -100  # with sw = 2^-80 below: |RN(sx * acc) * sw| < 2^-150 rounds to a signed zero
    sw = (torch.rand(2, N, generator=g) * 3 + 0.1)
    sw[0, :] = 2.0 ** -80
    offs = _ends([8, 16])
    with pytest.warns(ExperimentalPresetWarning, match="scaled_grouped_mm"):
        out = mmaemu.scaled_grouped_mm(x, w.transpose(-2, -1), sx, RW, sw, RW, offs=offs, use_fast_accum=fast)
    bits = out.view(torch.int16).to(torch.int32) & 0xFFFF
    expected = _oracle_group(x[:8], w[0], sx[:8], sw[0], fast) + _oracle_group(x[8:], w[1], sx[8:], sw[1], fast)
    assert bits.tolist() == expected
    negative_zeros = (bits[:4] == 0x8000).sum().item()
    assert negative_zeros > 0  # the adversarial rows reached -0
    rowwise = mmaemu.scaled_mm(x[:8], w[0].t(), sx[:8, None], sw[0][None, :], out_dtype=BF16, use_fast_accum=fast)
    assert ((rowwise.view(torch.int16)[:4].to(torch.int32) & 0xFFFF) == 0x8000).sum().item() == 0


def test_the_grouped_kernel_applies_scale_a_first_whatever_the_shape():
    """acc = 1.41015625 with x_scale = 0.1, w_scale = 10: RN(w * RN(x * acc)) and RN(x * RN(w * acc)) differ in
    bf16 (0x3FB5 and 0x3FB4, restated by the oracle); the grouped kernel has no transposed dispatch, so every
    group, of any shape, gives the first."""
    K, N = 32, 16
    a = torch.zeros(K, dtype=torch.float32)
    b = torch.zeros(K, dtype=torch.float32)
    a[:5] = 1.0
    b[:5] = torch.tensor([1.0, 2.0 ** -2, 2.0 ** -3, 2.0 ** -5, 2.0 ** -8])  # sum 1.41015625, exact in the chain
    rows = torch.stack([a] * 192).to(E4M3)
    w = torch.stack([torch.stack([b] * N)] * 2).to(E4M3)
    sx, sw = torch.full((192,), 0.1), torch.full((2, N), 10.0)
    x_first = oracle.int_fp32_to_bf16(oracle.int_fp32_mul(_bits(10.0), oracle.int_fp32_mul(
        _bits(0.1), _bits(1.41015625))))
    w_first = oracle.int_fp32_to_bf16(oracle.int_fp32_mul(_bits(0.1), oracle.int_fp32_mul(
        _bits(10.0), _bits(1.41015625))))
    assert (x_first, w_first) == (0x3FB5, 0x3FB4)
    assert [scale_order(m, N).x_first for m in (64, 128)] == [True, False]  # the non-grouped kernel: both orders
    out = mmaemu.scaled_grouped_mm(rows, w.transpose(-2, -1), sx, RW, sw, RW, offs=_ends([64, 128]))
    assert set((out.view(torch.int16).to(torch.int32) & 0xFFFF).flatten().tolist()) == {x_first}
    transposed = mmaemu.scaled_mm(rows[64:], w[1].t(), sx[64:, None], sw[1][None, :], out_dtype=BF16)
    assert set((transposed.view(torch.int16).to(torch.int32) & 0xFFFF).flatten().tolist()) == {w_first}


def test_f_scaled_grouped_mm_has_no_cpu_kernel_outside_patch():
    a, w = fp8((32, 64), 19), fp8((2, 16, 64), 20)
    with pytest.raises(NotImplementedError):
        F.scaled_grouped_mm(a, w.transpose(-2, -1), torch.ones(32), RW, torch.ones(2, 16), RW, offs=_ends([16, 16]))


def _call(**changes):
    args = dict(mat_a=fp8((32, 64), 21), mat_b=fp8((2, 16, 64), 22).transpose(-2, -1), scale_a=torch.ones(32),
                scale_recipe_a=RW, scale_b=torch.ones(2, 16), scale_recipe_b=RW, offs=_ends([16, 16]))
    settings = {key: changes.pop(key) for key in ("profile", "splitk") if key in changes}
    args.update(changes)
    return mmaemu.scaled_grouped_mm(**args, **settings)


@pytest.mark.parametrize("changes, error, match", [
    (dict(bias=torch.zeros(16, dtype=BF16)), ReferenceRejectsError, "Bias not supported yet"),
    (dict(output_dtype=torch.float32), ReferenceRejectsError, "Only bf16"),
    (dict(mat_a=fp8((32, 64), 23).to(torch.float8_e5m2)), ReferenceRejectsError, "Float8_e4m3"),
    (dict(mat_b=fp8((2, 64, 16), 24)), ReferenceRejectsError, "Expected mat2 to be transposed"),
    (dict(scale_a=torch.ones(31)), ReferenceRejectsError, "scale for arg 0"),
    (dict(offs=None), ReferenceRejectsError, "Have to provide offsets"),
    (dict(offs=_ends([16, 8])), UnsupportedFeatureError, "ends at 24"),
    (dict(profile="ada"), UnsupportedFeatureError, "scaled_grouped_mm with rowwise_rowwise scales"),
    (dict(splitk=(2, "contiguous")), UnsupportedFeatureError, "never splits K"),
    (dict(scale_recipe_a=F.ScalingType.BlockWise1x32, scale_recipe_b=F.ScalingType.BlockWise1x32,
          profile="b200-mx-experimental"), UnsupportedFeatureError, "mx8mx8bf16_grouped_mm"),
])
def test_refusals(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)


def test_a_2d_2d_group_off_a_multiple_of_16_is_refused():
    a, b = fp8((16, 48), 25), fp8((32, 48), 26).t()
    with pytest.raises(UnsupportedFeatureError, match="multiple of 16"):
        mmaemu.scaled_grouped_mm(a, b, torch.ones(32), RW, torch.ones(64), RW, offs=_ends([8, 40]))
