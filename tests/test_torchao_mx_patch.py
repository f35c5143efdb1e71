"""torchao 0.18.0's MX and NVFP4 inference workflows under mmaemu.patch (issue 34), eagerly and compiled.

MXFP4: its F.scaled_mm calls (torch._scaled_mm_v2, BlockWise1x32 E8M0 scales, FP4 operands) are routed onto
mmaemu.scaled_mm and give the bits of mmaemu's own MXFP4 layer. MXFP8, MXFP4 and NVFP4 compiled with torch.compile
inside a block (backends eager, aot_eager, inductor) give the eager patched run's bits, every GEMM computed by mmaemu
(the log records it); inductor's CPU code generator of torch 2.13 cannot compile torchao's MX and NVFP4 casts at
all (no float8_e8m0fnu in its C++ types, no promotion of float8 types), with or without mmaemu, which the last test
shows (on a GPU inductor generates Triton code instead: not testable here). torchao's NVFP4 workflow asks whether the GPU is an sm_100 one: the test answers yes (the
profile emulates a B200), as torchao's own tests do on such a GPU.

torchao's inference config defaults to ScaleCalculationMode.RCEIL, which mmaemu.block_quantize refuses (torchao's
floating log2); the test uses FLOOR, the rule mmaemu's MXFP4Linear casts with. No bias: torchao passes it to
F.scaled_mm, whose sm_100 MXFP4 kernel (FBGEMM f4f4bf16) is handed none in the pinned torch source, and
mmaemu.scaled_mm refuses a block-scaled bias.
"""

import warnings

import pytest
import torch
import torch._dynamo

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


BACKENDS = ["eager", "aot_eager"]


def _workflow_config(workflow, monkeypatch):
    from test_block_quantize import _torchao

    _torchao()
    import torchao.prototype.mx_formats.inference_workflow as inference_workflow
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    if workflow == "nvfp4":
        monkeypatch.setattr(inference_workflow, "is_sm_at_least_100", lambda: True)  # the emulated GPU is a B200
        return inference_workflow.NVFP4DynamicActivationNVFP4WeightConfig(use_triton_kernel=False)
    dtype = torch.float8_e4m3fn if workflow == "mxfp8" else torch.float4_e2m1fn_x2
    return inference_workflow.MXDynamicActivationMXWeightConfig(activation_dtype=dtype, weight_dtype=dtype,
                                                                scaling_mode=ScaleCalculationMode.FLOOR)


RECIPES = {"mxfp8": "mxfp8_mxfp8", "mxfp4": "mxfp4_mxfp4", "nvfp4": "nvfp4_nvfp4_single_scale"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workflow", sorted(RECIPES))
def test_torchaos_inference_workflow_compiled_under_patch_gives_the_eager_patched_bits(workflow, backend,
                                                                                       monkeypatch):
    from torchao.quantization import quantize_

    config = _workflow_config(workflow, monkeypatch)
    torch.manual_seed(len(workflow) + len(backend))
    model = torch.nn.Sequential(torch.nn.Linear(128, 32, bias=False)).to(torch.bfloat16)
    quantize_(model, config)
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        with mmaemu.patch(profile=PROFILE, splitk=1) as eager_log, torch.no_grad():
            eager = model(x)
        with mmaemu.patch(profile=PROFILE, splitk=1) as log, torch.no_grad():
            compiled = torch.compile(model, backend=backend)(x)
    torch._dynamo.reset()
    assert torch.equal(compiled.view(torch.int16), eager.view(torch.int16))
    assert len(eager_log) == len(log) == 1  # one GEMM, computed by mmaemu in both runs
    assert [r.error for r in log] == [None] and log[0].recipe == eager_log[0].recipe == RECIPES[workflow]
    assert log[0].K == 128


@pytest.mark.slow
@pytest.mark.parametrize("workflow", sorted(RECIPES))
def test_inductor_on_the_cpu_cannot_compile_torchaos_casts_with_or_without_mmaemu(workflow, monkeypatch):
    """The limit is torch's: inductor refuses the model outside a block and inside one, where it fails on torchao's
    casts, not on mmaemu's op. When a torch compiles these casts, this test fails, and the backend joins the
    bit-for-bit test above."""
    from torch._inductor.exc import InductorError
    from torchao.quantization import quantize_

    config = _workflow_config(workflow, monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(128, 32, bias=False)).to(torch.bfloat16)
    quantize_(model, config)
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    messages = []
    for patched in (False, True):
        torch._dynamo.reset()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", ExperimentalPresetWarning)
            with pytest.raises(InductorError) as raised:
                if patched:
                    with mmaemu.patch(profile=PROFILE, splitk=1):
                        torch.compile(model, backend="inductor")(x)
                else:
                    torch.compile(model, backend="inductor")(x)
        messages.append(str(raised.value).splitlines()[0])
    torch._dynamo.reset()
    # Inside the block the GEMM is mmaemu's op, so what fails is the cast's code (outside it, torch's MXFP4 op may
    # fail first, in its own lowering).
    assert "float8_e8m0fnu missing" in messages[1] or "Promotion for Float8 Types" in messages[1]
