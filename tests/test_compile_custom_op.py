"""``torch.compile`` of code that calls ``torch._scaled_mm`` inside ``mmaemu.patch``: the custom op
``torch.ops.mmaemu.scaled_mm`` (mmaemu/torch_ops.py) is one opaque node of the graph, traced on fake tensors and
run on the real ones, so ``fullgraph=True`` compiles and every backend returns the eager patched bits.

Covered: a compiled function calling ``torch._scaled_mm`` directly, a compiled ``EmulatedFP8Linear``, and forward
and backward of a torchao 0.18.0 float8 training step (``convert_to_float8_training``, the tensor-wise, row-wise
and row-wise-with-high-precision-grad-weight recipes: torchao calls
``torch._scaled_mm`` inside its tensor subclass, which AOTAutograd traces on fake tensors); the op's fake
implementation (shape, dtype, strides, the eager errors); the refusal to compute on fake tensors; dynamo's caches
around a block; and the logical K of packed FP4 operands in the log and in explain (issue 34 items 1 and 5).
"""

from __future__ import annotations

import copy
import warnings

import numpy
import pytest
import torch

import mmaemu
import oracle
from test_block_quantize import _torchao
from mmaemu.testing import assert_bitwise_equal, bits

if not hasattr(torch, "compile") or not hasattr(torch, "_dynamo"):
    pytest.skip("torch.compile is not available in this torch", allow_module_level=True)
if hasattr(torch.compiler, "is_dynamo_supported") and not torch.compiler.is_dynamo_supported():
    pytest.skip("torch.compile (dynamo) is not supported on this Python/platform", allow_module_level=True)

import torch._dynamo.testing  # noqa: E402  (CompileCounterWithBackend)
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import mmaemu.torch_ops  # noqa: E402,F401  (registers torch.ops.mmaemu.scaled_mm)

# Inductor compiles C++ (gcc): tens of seconds a graph on a 2-core machine.
BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
SETTINGS = dict(profile="ada", splitk=1)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.UnverifiedSplitWarning)
        yield
    torch._dynamo.reset()


def _fp8(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)


def _operands(seed=3, M=16, N=32, K=64):
    return _fp8(M, K, seed), _fp8(N, K, seed + 100), torch.tensor(0.5)


def _layer(x, w, s):
    """Somebody else's code: ops around a torch._scaled_mm call."""
    y = torch._scaled_mm(x, w.t(), s * 2.0, s, out_dtype=torch.bfloat16, use_fast_accum=True)
    return y.float() * 3.0


def _v2_layer(x, w, s):
    """F.scaled_mm (torch._scaled_mm_v2), tensor-wise, with ops around it."""
    from torch.nn.functional import ScalingType, SwizzleType, scaled_mm

    y = scaled_mm(x, w.t(), s * 2.0, ScalingType.TensorWise, s, ScalingType.TensorWise,
                  swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE,
                  output_dtype=torch.bfloat16, use_fast_accum=True)
    return y.float() * 3.0


#: The same layer through each traced entry point.
LAYERS = {"torch._scaled_mm": _layer, "torch._scaled_mm_v2": _v2_layer}


def _oracle_layer(x, w, s):
    """_layer's bits from the independent oracle (tests/oracle.py) on the ada preset, S = 1."""
    rows = lambda t: bits(t).tolist()  # noqa: E731
    one, half = 0x3F800000, 0x3F000000
    y = oracle.scaled_mm(rows(x), rows(w), "e4m3", "e4m3", one, half, "bfloat16", oracle.PRESETS["ada"], True)
    return torch.from_numpy(numpy.array(y, dtype=numpy.uint16)).view(torch.bfloat16).float() * 3.0


# --- the op --------------------------------------------------------------------------------------------------------


def _op(x, w, s, out_dtype=torch.bfloat16, profile="ada", splitk="1", backend="auto", observer=""):
    return torch.ops.mmaemu.scaled_mm.default(x, w.t(), s, s, None, None, out_dtype, False, None, None, profile,
                                              splitk, backend, observer)


def test_the_op_computes_what_scaled_mm_computes():
    x, w, s = _operands()
    expected = mmaemu.scaled_mm(x, w.t(), s, s, out_dtype=torch.bfloat16, profile="ada", splitk=1)
    assert_bitwise_equal(_op(x, w, s), expected)
    assert "mmaemu::scaled_mm(Tensor input, Tensor mat2" in str(torch.ops.mmaemu.scaled_mm.default._schema)


def test_the_fake_implementation_gives_the_results_metadata_and_computes_nothing():
    x, w, s = _operands(M=5, N=48, K=32)
    with FakeTensorMode() as mode:
        fx, fw, fs = (mode.from_tensor(t) for t in (x, w, s))
        y = _op(fx, fw, fs)
        default = _op(fx, fw, fs, out_dtype=None)  # the input's dtype, as torch._scaled_mm
    assert (tuple(y.shape), y.dtype, y.stride(), y.device.type) == ((5, 48), torch.bfloat16, (48, 1), "cpu")
    assert default.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("case", ["K % 16", "e5m2 x e5m2", "unknown profile"])
def test_a_call_refused_eagerly_is_refused_when_traced_with_the_same_error(case):
    x, w, s = _operands()
    kwargs = {}
    if case == "K % 16":
        x, w = _fp8(16, 24, 1), _fp8(32, 24, 2)
    elif case == "e5m2 x e5m2":
        x, w = x.to(torch.float8_e5m2), w.to(torch.float8_e5m2)
    elif case == "unknown profile":
        kwargs["profile"] = "no-such-gpu"
    with pytest.raises(Exception) as eager:
        _op(x, w, s, **kwargs)
    with FakeTensorMode() as mode, pytest.raises(Exception) as traced:
        _op(*(mode.from_tensor(t) for t in (x, w, s)), **kwargs)
    assert type(traced.value) is type(eager.value) and str(traced.value) == str(eager.value)


def test_a_refused_call_fails_compilation_with_the_eager_error_in_its_chain():
    """Dynamo wraps an error of fake propagation in its TorchRuntimeError (as it wraps torch's own: torch 2.13.0,
    torch/_dynamo/utils.py, get_fake_value); the eager call's error, class and message, is in the chain, raised
    while tracing, before anything runs."""
    x, s = _fp8(16, 24, 1), torch.tensor(1.0)

    def call(x, s):
        return torch._scaled_mm(x, x.t(), s, s, out_dtype=torch.float32)

    with mmaemu.patch(**SETTINGS) as log:
        with pytest.raises(mmaemu.ReferenceRejectsError) as eager:
            call(x, s)
        with pytest.raises(Exception) as compiled:
            torch.compile(call, backend="aot_eager", fullgraph=True)(x, s)
    chain, error = [], compiled.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    refused = [e for e in chain if isinstance(e, mmaemu.ReferenceRejectsError)]
    assert refused and str(refused[0]) == str(eager.value)
    assert len(log) == 1  # the eager call; the traced one ran nothing


def test_nothing_computes_on_fake_tensors():
    """mmaemu.scaled_mm and accumulate handed fake tensors (a tracer's stand-ins) refuse with the way out; they
    used to read the fake tensor's data (.numpy(): "not supported for tensor subclasses")."""
    x, w, s = _operands()
    with FakeTensorMode() as mode:
        fx, fw, fs = (mode.from_tensor(t) for t in (x, w, s))
        with pytest.raises(TypeError, match="fake tensor .*torch.ops.mmaemu.scaled_mm"):
            mmaemu.scaled_mm(fx, fw.t(), fs, fs, out_dtype=torch.float32, profile="ada", splitk=1)
        with pytest.raises(TypeError, match="accumulate: a is a fake tensor"):
            mmaemu.accumulate(fx, fw, use_fast_accum=True, profile="ada", splitk=1)
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    with FunctionalTensorMode():
        gx, gw, gs = (FunctionalTensor.to_functional(t) for t in (x, w, s))
        with pytest.raises(TypeError, match="input is a functional tensor"):
            mmaemu.scaled_mm(gx, gw.t(), gs, gs, out_dtype=torch.float32, profile="ada", splitk=1)
    meta = [t.to("meta") for t in (x, w, s)]
    with pytest.raises(TypeError, match="input is a meta tensor"):  # the op's meta kernel is its fake one
        _op(*meta)


def test_settings_that_are_no_op_argument_are_refused():
    from mmaemu.torch_ops import profile_argument, splitk_argument

    assert [splitk_argument(v) for v in ("auto", 1, (2, "serial"))] == ["'auto'", "1", "(2, 'serial')"]
    with pytest.raises(TypeError, match="no Python literal"):
        splitk_argument(object())
    assert profile_argument("ada") == "ada"
    custom = mmaemu.profile_from_preset("ada", base="ada")
    with pytest.raises(mmaemu.UnsupportedFeatureError, match="its name does not resolve to"):
        profile_argument(custom)


# --- a compiled function calling torch._scaled_mm ------------------------------------------------------------------


@pytest.mark.parametrize("entry_point", sorted(LAYERS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_scaled_mm_call_gives_the_eager_patched_bits_in_one_graph(backend, entry_point):
    layer = LAYERS[entry_point]
    x, w, s = _operands()
    with mmaemu.patch(**SETTINGS) as eager_log:
        eager = layer(x, w, s)
    direct = mmaemu.scaled_mm(x, w.t(), s * 2.0, s, out_dtype=torch.bfloat16, use_fast_accum=True, **SETTINGS)
    assert_bitwise_equal(eager, direct.float() * 3.0)
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    with mmaemu.patch(**SETTINGS) as log:
        first, second = compiled(x, w, s), compiled(x, w, s)
    assert_bitwise_equal(first, eager)
    assert_bitwise_equal(second, eager)
    assert counter.frame_count == 1  # one graph, no break, no recompilation
    # Each run of the compiled graph is recorded, as the eager call was, under the entry point it called.
    assert [r.line() for r in log] == [eager_log[0].line()] * 2
    assert {(r.entry_point, r.recipe) for r in log} == {(entry_point, "tensorwise_tensorwise")}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_each_shape_is_traced_with_its_own_plan(dynamic):
    """Symbolic sizes (automatic dynamic shapes after a second shape, or dynamic=True) are specialised by the
    op's fake implementation: the split-K decision and the kernel depend on M, N and K, so each shape is compiled
    on its own and gets its eager bits. (A symbolic M used to reach the split-K decision: "M must be an int".)"""
    w, s = _fp8(32, 64, 7), torch.tensor(0.5)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_layer, backend=counter, fullgraph=True, dynamic=dynamic)
    with mmaemu.patch(**SETTINGS) as log:
        for M in (16, 32, 48):
            x = _fp8(M, 64, M)
            assert_bitwise_equal(compiled(x, w, s), _layer(x, w, s))
    assert counter.frame_count == 3
    assert [r.input_shape[0] for r in log] == [16, 16, 32, 32, 48, 48]  # compiled and eager, per shape


def test_the_compiled_bits_are_the_oracles():
    x, w, s = _operands(seed=5)
    with mmaemu.patch(**SETTINGS):
        compiled = torch.compile(_layer, backend="aot_eager", fullgraph=True)(x, w, s)
    assert_bitwise_equal(compiled, _oracle_layer(x, w, s))


def test_aot_graph_holds_the_op_and_nothing_of_the_emulation():
    x, w, s = _operands()
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    with mmaemu.patch(**SETTINGS), torch.no_grad():
        torch.compile(_layer, backend=aot_autograd(fw_compiler=compiler), fullgraph=True)(x, w, s)
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert "mmaemu.scaled_mm.default" in targets, targets
    assert len(targets) <= 5, targets  # the scale's mul, the op, the cast and the mul: no arithmetic of mmaemu's


def test_entering_a_block_recompiles_and_leaving_it_reuses_the_earlier_graph():
    """Dynamo guards the identity of torch._scaled_mm where the compiled code calls it: entering a block makes the
    stand-in appear (a new graph), leaving it brings torch's function back (the first graph again)."""
    x, w, s = _operands()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_layer, backend=counter, fullgraph=True)
    torch_bits = compiled(x, w, s)
    with mmaemu.patch(**SETTINGS) as log:
        emulated = compiled(x, w, s)
    assert counter.frame_count == 2 and len(log) == 1
    assert_bitwise_equal(compiled(x, w, s), torch_bits)  # torch's CPU kernel, no recompilation
    with mmaemu.patch(**SETTINGS) as again:
        assert_bitwise_equal(compiled(x, w, s), emulated)
    assert counter.frame_count == 2 and len(again) == 1


def test_a_graph_traced_in_a_block_refuses_to_run_in_a_block_of_other_settings():
    x, w, s = _operands()
    compiled = torch.compile(_layer, backend="aot_eager", fullgraph=True)
    with mmaemu.patch(**SETTINGS):
        compiled(x, w, s)
    with mmaemu.patch(profile="hopper", splitk=1) as log, \
            pytest.raises(mmaemu.UnsupportedFeatureError, match=r"profile='ada'.*torch._dynamo.reset\(\)"):
        compiled(x, w, s)
    assert len(log) == 0
    torch._dynamo.reset()
    with mmaemu.patch(profile="hopper", splitk=1) as log:
        hopper = compiled(x, w, s)
    assert_bitwise_equal(hopper, _layer_in_block(x, w, s, profile="hopper", splitk=1))
    assert [r.profile for r in log] == ["hopper"]


def _layer_in_block(x, w, s, **settings):
    with mmaemu.patch(**settings):
        return _layer(x, w, s)


def test_out_is_refused_under_compile():
    x, w, s = _operands()

    def into(x, w, s, out):
        return torch._scaled_mm(x, w.t(), s, s, out_dtype=torch.float32, out=out)

    with mmaemu.patch(**SETTINGS), pytest.raises(Exception, match="out=.*cannot be traced"):
        torch.compile(into, backend="aot_eager", fullgraph=True)(x, w, s, torch.empty(16, 32))


def _nvfp4_operands(M=8, N=16, K=128, seed=1):
    """Packed float4_e2m1fn_x2 operands [M, K/2], [N, K/2] and their swizzled UE4M3 block scales (one per 16)."""
    from mmaemu.scale_layout import to_blocked

    rng = numpy.random.default_rng(seed)
    packed = lambda rows: torch.from_numpy(rng.integers(0, 256, (rows, K // 2)).astype(numpy.uint8))  # noqa: E731
    scales = lambda rows: to_blocked(torch.from_numpy(  # noqa: E731
        rng.integers(0x30, 0x40, (rows, K // 16)).astype(numpy.uint8)).view(torch.float8_e4m3fn))
    a, w = (packed(rows).view(torch.float4_e2m1fn_x2) for rows in (M, N))
    return a, w, scales(M), scales(N)


def _nvfp4_layer(a, w, sa, sb):
    return torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16).float() + 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_nvfp4_call_gives_the_eager_patched_bits(backend):
    operands = _nvfp4_operands()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        with mmaemu.patch(profile="b200-mx-experimental", splitk=1) as log:
            eager = _nvfp4_layer(*operands)
            compiled = torch.compile(_nvfp4_layer, backend=backend, fullgraph=True)(*operands)
    assert_bitwise_equal(compiled, eager)
    assert [r.line() for r in log[1:]] == [log[0].line()] and log[0].K == 128


def _blockwise_v2_layer(a, w, sa, sb):
    from torch.nn.functional import ScalingType, scaled_mm

    return scaled_mm(a, w.t(), sa, ScalingType.BlockWise1x128, sb, ScalingType.BlockWise1x128).float() + 1.0


def test_a_compiled_blockwise_f_scaled_mm_breaks_the_graph_and_gives_the_eager_bits():
    """Block-wise v2 calls are not put into a graph: dynamo breaks it there (fullgraph refuses) and the call runs
    eagerly inside the block, recorded and with the eager bits."""
    M, N, K = 128, 128, 256
    a, w = _fp8(M, K, 41), _fp8(N, K, 42)
    g = torch.Generator().manual_seed(43)
    sa = (torch.rand(K // 128, M, generator=g) + 0.5).t()  # 1x128 scales [M, K/128], strides (1, M)
    sb = (torch.rand(K // 128, N, generator=g) + 0.5).t()
    settings = dict(profile="hopper-cublaslt-blockwise-experimental")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        with mmaemu.patch(**settings) as eager_log:
            eager = _blockwise_v2_layer(a, w, sa, sb)
        with mmaemu.patch(**settings) as log:
            compiled = torch.compile(_blockwise_v2_layer, backend="eager")(a, w, sa, sb)
            with pytest.raises(Exception, match="_scaled_mm_v2"):
                torch._dynamo.reset()
                torch.compile(_blockwise_v2_layer, backend="eager", fullgraph=True)(a, w, sa, sb)
    assert_bitwise_equal(compiled, eager)
    assert [r.line() for r in log] == [eager_log[0].line()]
    assert log[0].recipe == "block_1x128_1x128" and log[0].error is None


# --- a compiled EmulatedFP8Linear ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_emulated_linear_gives_the_eager_bits(backend):
    """The layer runs eagerly behind its graph break (tests/test_compile_graph_break.py); the ops around it are
    compiled by every backend."""
    from mmaemu.nn import EmulatedFP8Linear

    torch.manual_seed(4)
    layer = EmulatedFP8Linear.from_linear(torch.nn.Linear(64, 32), profile="ada", splitk=1)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(4))

    def model(x):
        return layer(x * 2.0).float().relu() + 1.0

    with torch.no_grad():
        assert_bitwise_equal(torch.compile(model, backend=backend)(x), model(x))


# --- torchao float8 training ------------------------------------------------------------------------------------------


def _torchao_float8():
    """torchao's convert_to_float8_training, or the skip (the failure under MMAEMU_TEST_REQUIRE_TORCHAO=1) of
    test_block_quantize's pinned torchao."""
    _torchao()
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _float8_mlp(recipe="tensorwise"):
    """The MLP converted by torchao for ``recipe`` (torchao's Float8LinearConfig.from_recipe_name): fp32 weights for
    tensor-wise scaling, bf16 for the row-wise recipes (torch's row-wise kernel gives bf16 only)."""
    convert = _torchao_float8()
    from torchao.float8 import Float8LinearConfig

    torch.manual_seed(0)
    model = _MLP() if recipe == "tensorwise" else _MLP().to(torch.bfloat16)
    return convert(model, config=Float8LinearConfig.from_recipe_name(recipe))


def _training_step(model, run):
    """(output, input grad, weight grads) of one step: forward, a loss, backward."""
    dtype = next(model.parameters()).dtype
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_(True)
    y = run(x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


TORCHAO_PATCH = dict(profile="hopper", splitk="assume-unsplit")
#: Scaled GEMMs of one step: output, grad_input and grad_weight of each of the two layers (grad_weight in high
#: precision, torch.mm, with rowwise_with_gw_hp).
RECIPE_GEMMS = {"tensorwise": 6, "rowwise": 6, "rowwise_with_gw_hp": 4}


@pytest.mark.parametrize("recipe", sorted(RECIPE_GEMMS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_torchao_float8_training_step_gives_the_eager_bits(backend, recipe):
    """Forward and backward, each scaled GEMM computed by mmaemu (the log), with the eager step's bits.
    torch.compile of this model inside patch used to fail in dynamo with "RuntimeError when making fake tensor
    call" (mmaemu computed on the fake tensors)."""
    model = _float8_mlp(recipe)
    twin = copy.deepcopy(model)
    with mmaemu.patch(**TORCHAO_PATCH) as eager_log:
        eager = _training_step(model, model)
    with mmaemu.patch(**TORCHAO_PATCH) as log:
        compiled = _training_step(twin, torch.compile(twin, backend=backend, fullgraph=True))
    for got, expected in zip(compiled, eager):
        assert_bitwise_equal(got, expected)
    assert len(eager_log) == RECIPE_GEMMS[recipe]
    assert sorted(r.line() for r in log) == sorted(r.line() for r in eager_log)


def test_a_torchao_model_compiled_before_a_block_keeps_torchs_op_and_one_compiled_inside_refuses_outside():
    """torchao calls torch._scaled_mm below dynamo (AOTAutograd traces it): dynamo holds no guard on it, so the
    compiled graph keeps what it traced until torch._dynamo.reset()."""
    model = _float8_mlp()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        torch_bits = compiled(x)
        with mmaemu.patch(**TORCHAO_PATCH) as log:
            kept = compiled(x)
        assert len(log) == 0  # torch's op ran: nothing was emulated
        assert_bitwise_equal(kept, torch_bits)
        torch._dynamo.reset()
        with mmaemu.patch(**TORCHAO_PATCH) as log:
            emulated = compiled(x)
            assert_bitwise_equal(emulated, model(x))
        assert len(log) == 4  # two runs of the two forward GEMMs
        with pytest.raises(mmaemu.UnsupportedFeatureError, match="no mmaemu.patch block is open"):
            compiled(x)


# --- the logical K of packed FP4 -------------------------------------------------------------------------------------


def test_log_and_explain_give_the_logical_k_of_packed_fp4():
    from mmaemu.scale_layout import to_blocked

    M, N, K = 4, 16, 64
    packed = lambda rows: torch.zeros(rows, K // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)  # noqa: E731
    scales = lambda rows: to_blocked(torch.zeros(rows, K // 16, dtype=torch.uint8).view(torch.float8_e4m3fn))  # noqa
    a, w, sa, sb = packed(M), packed(N), scales(M), scales(N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        with mmaemu.patch(profile="b200-mx-experimental", splitk=1) as log:
            torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)
    record = log[0]
    assert record.input_shape == (4, 32) and record.K == 64
    assert "M=4 N=16 K=64 float4_e2m1fn_x2" in record.line()
    plan = mmaemu.explain(a, w.t(), sa, sb, out_dtype=torch.bfloat16, profile="b200-mx-experimental")
    assert "K = 64 elements" in plan.split.note
    x, w8, s = _operands()
    with mmaemu.patch(**SETTINGS) as log:
        torch._scaled_mm(x, w8.t(), s, s, out_dtype=torch.float32)
    assert log[0].K == 64 and "K=64 float8_e4m3fn" in log[0].line()
