"""torchao 0.18.0's MXFP4 inference workflow under mmaemu.patch (issue 34 item 2): its F.scaled_mm calls
(torch._scaled_mm_v2, BlockWise1x32 E8M0 scales, FP4 operands) are routed onto mmaemu.scaled_mm, and give the bits
of mmaemu's own MXFP4 layer.

torchao's inference config defaults to ScaleCalculationMode.RCEIL, which mmaemu.block_quantize refuses (torchao's
floating log2); the test uses FLOOR, the rule mmaemu's MXFP4Linear casts with. No bias: torchao passes it to
F.scaled_mm, whose sm_100 MXFP4 kernel (FBGEMM f4f4bf16) is handed none in the pinned torch source, and
mmaemu.scaled_mm refuses a block-scaled bias.
"""

import warnings

import pytest
import torch

import mmaemu
from mmaemu.errors import ExperimentalPresetWarning

PROFILE = "b200-mx-experimental"


@pytest.mark.parametrize("K", [128, 96])
def test_torchaos_mxfp4_workflow_under_patch_is_mmaemus_mxfp4_layer(K):
    from test_block_quantize import _torchao

    _torchao()
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.inference_workflow import MXDynamicActivationMXWeightConfig
    from torchao.quantization import quantize_

    torch.manual_seed(K)
    linear = torch.nn.Linear(K, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(6, K, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        ours = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="mxfp4")
        with torch.no_grad():
            want = ours(x)
        model = torch.nn.Sequential(linear)
        fp4 = torch.float4_e2m1fn_x2
        quantize_(model, MXDynamicActivationMXWeightConfig(activation_dtype=fp4, weight_dtype=fp4,
                                                           scaling_mode=ScaleCalculationMode.FLOOR))
        with mmaemu.patch(profile=PROFILE, splitk="assume-unsplit") as log:
            with torch.no_grad():
                got = model(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert len(log) >= 1  # the GEMM was computed by mmaemu (the patch log records it)
