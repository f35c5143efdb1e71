"""``mmaemu.scaled_mm``, ``accumulate`` and ``explain`` are excluded from ``torch.compile`` tracing
(platform.md section 6): dynamo breaks the graph at the call and runs the emulation eagerly, so a compiled model
gets exactly the eager bits (a compiler must not trace into, or re-round, the emulation).
"""

from __future__ import annotations

import pytest
import torch

import mmaemu
from mmaemu.testing import assert_bitwise_equal

if not hasattr(torch, "compile") or not hasattr(torch, "_dynamo"):
    pytest.skip("torch.compile is not available in this torch", allow_module_level=True)
if hasattr(torch.compiler, "is_dynamo_supported") and not torch.compiler.is_dynamo_supported():
    pytest.skip("torch.compile (dynamo) is not supported on this Python/platform", allow_module_level=True)


def _operands(seed=1, M=16, N=32, K=64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    return x, w, torch.tensor(0.5)


def _gemm(x, w, s):
    scale_a = s * 2.0  # traced before the break
    y = mmaemu.scaled_mm(x, w.t(), scale_a, s, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
    return y.float() * 3.0  # traced after the break


def _accumulate(x, w, s):
    factor = s * 4.0
    acc = mmaemu.accumulate(x, w, use_fast_accum=False, splitk=1)
    return acc * factor


def _explain(x, w, s):
    plan = mmaemu.explain(x, w.t(), s * 2.0, s, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
    return plan, s + 1.0


class CountingBackend:
    """A torch.compile backend that records the FX graphs dynamo hands over and runs them eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def targets(self):
        return [str(node.target) for gm in self.graphs for node in gm.graph.nodes
                if node.op in ("call_function", "call_method", "call_module")]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_scaled_mm_returns_the_eager_bits(backend):
    x, w, s = _operands()
    eager = _gemm(x, w, s)
    compiled = torch.compile(_gemm, backend=backend, fullgraph=False)(x, w, s)
    assert_bitwise_equal(compiled, eager)
    assert compiled.dtype == torch.float32 and compiled.shape == (16, 32)


def _break_reasons(explanation):
    return [str(getattr(r, "reason", r)) for r in explanation.break_reasons]


@pytest.mark.parametrize("fn", [_gemm, _accumulate, _explain], ids=["scaled_mm", "accumulate", "explain"])
def test_dynamo_breaks_the_graph_at_the_call(fn):
    x, w, s = _operands()
    explanation = torch._dynamo.explain(fn)(x, w, s)
    assert explanation.graph_break_count >= 1
    assert explanation.graph_count == 2  # the ops before the call, and those after it
    reasons = " ".join(_break_reasons(explanation)).lower()
    assert "disable" in reasons or "skip" in reasons, reasons
    # Nothing of the emulation is in the captured graphs: they hold only the few ops around the call.
    assert explanation.op_count <= 3


def test_dynamo_does_not_trace_into_the_emulation():
    x, w, s = _operands()
    counter = CountingBackend()
    compiled = torch.compile(_gemm, backend=counter)
    first = compiled(x, w, s)
    assert len(counter.graphs) == 2  # the graph before the call and the graph after it
    targets = counter.targets()
    assert len(targets) <= 5, targets
    assert not any("mmaemu" in t or "scaled_mm" in t for t in targets), targets
    # Re-running hits the compiled graphs again (no recompilation), and the bits still match eager.
    again = compiled(x, w, s)
    assert len(counter.graphs) == 2
    assert_bitwise_equal(again, first)
    assert_bitwise_equal(first, _gemm(x, w, s))


def test_compiled_accumulate_and_explain_match_eager():
    x, w, s = _operands(seed=2)
    assert_bitwise_equal(torch.compile(_accumulate, backend="eager")(x, w, s), _accumulate(x, w, s))
    plan, t = torch.compile(_explain, backend="eager")(x, w, s)
    eager_plan, eager_t = _explain(x, w, s)
    assert plan == eager_plan and plan.validation == "ok"
    assert_bitwise_equal(t, eager_t)


def test_entry_points_are_marked_disabled():
    """The decorator itself, as dynamo records it on the wrapper (checked only where this torch exposes it): the
    entry points that compute on the host, the block-wise recipe's and DeepGEMM's included."""
    from mmaemu import deepgemm
    from mmaemu.blockwise_cublaslt import scaled_mm_blockwise

    for fn in (mmaemu.scaled_mm, mmaemu.accumulate, mmaemu.explain, scaled_mm_blockwise, deepgemm.fp8_gemm_nt,
               deepgemm.fp8_gemm_nn, deepgemm.fp8_gemm_tn, deepgemm.fp8_gemm_tt,
               deepgemm.m_grouped_fp8_gemm_nt_contiguous, deepgemm.m_grouped_fp8_gemm_nn_contiguous,
               deepgemm.m_grouped_fp8_gemm_nt_masked):
        marker = getattr(fn, "_torchdynamo_disable", None)
        if marker is None:
            pytest.skip("this torch does not expose the torch.compiler.disable marker")
        assert marker


FRESH_PROCESS_PATCH_COMPILE = r"""
import torch, mmaemu
from mmaemu.testing import assert_bitwise_equal

g = torch.Generator().manual_seed(3)
x = (torch.randn(16, 64, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
w = (torch.randn(32, 64, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
s = torch.tensor(0.5)

def layer(x, w, s):
    y = torch._scaled_mm(x, w.t(), s * 2.0, s, out_dtype=torch.bfloat16, use_fast_accum=True)
    return y.float() * 3.0

graphs = []
def backend(gm, example_inputs):
    graphs.append(gm)
    return gm.forward

with mmaemu.patch(profile="ada", splitk=1) as log:  # nothing of mmaemu ran before: a fresh process
    compiled = torch.compile(layer, backend=backend, fullgraph=True)(x, w, s)
expected = mmaemu.scaled_mm(x, w.t(), s * 2.0, s, out_dtype=torch.bfloat16, use_fast_accum=True, profile="ada",
                            splitk=1).float() * 3.0
assert_bitwise_equal(compiled, expected)
assert [r.profile for r in log] == ["ada"], log.summary()
targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
# One graph: the ops around the call and the patch's stand-in as one opaque call; nothing of the emulation.
assert len(graphs) == 1 and len(targets) == 3 and "function _scaled_mm" in targets[1], targets

torch._dynamo.reset()  # again, now that dynamo's rules and mmaemu's modules are loaded
graphs.clear()
with mmaemu.patch(profile="ada", splitk=1):
    again = torch.compile(layer, backend=backend, fullgraph=True)(x, w, s)
assert_bitwise_equal(again, expected)
assert len(graphs) == 1

torch._dynamo.reset()  # after the block: torch's own function, in the graph as torch's op
graphs.clear()
torch.compile(layer, backend=backend, fullgraph=True)(x, w, s)
targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
assert len(graphs) == 1 and "built-in method _scaled_mm" in targets[1], targets
print("ok")
"""


@pytest.mark.subprocess
def test_compile_inside_patch_in_a_fresh_process(tmp_path):
    """torch.compile of a function calling torch._scaled_mm inside mmaemu.patch, with no eager mmaemu call first
    (dynamo records torch._scaled_mm's tracing rule the first time it compiles: inside the block here): one graph
    (fullgraph=True) with the patch's stand-in in it (the custom op mmaemu::scaled_mm once AOTAutograd traces it:
    tests/test_compile_custom_op.py), and torch's own op in a graph compiled after the block."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS_PATCH_COMPILE], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _layer_and_input(seed=4):
    from mmaemu.nn import EmulatedFP8Linear

    torch.manual_seed(seed)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(seed)) * 3
    return EmulatedFP8Linear.from_linear(lin, splitk=1), x


class _Around(torch.nn.Module):
    """A model with compiled ops around the emulated layer."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x * 2.0).float().relu() + 1.0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad", "plain"])
def test_compiled_layer_returns_the_eager_bits_under_every_grad_mode(backend, mode):
    """torch.compile of an EmulatedFP8Linear under torch.inference_mode() used to crash in dynamo (it traced the
    quantiser); the layer's forward is a graph break now, run eagerly, bit for bit."""
    import contextlib

    layer, x = _layer_and_input()
    grad_mode = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad,
                 "plain": contextlib.nullcontext}[mode]
    model = _Around(layer)
    with grad_mode():
        eager_layer, eager_model = layer(x), model(x)
        compiled_layer = torch.compile(layer, backend=backend)(x)
        compiled_model = torch.compile(model, backend=backend)(x)
    assert_bitwise_equal(compiled_layer, eager_layer)
    assert_bitwise_equal(compiled_model, eager_model)
    static, _ = _layer_and_input()
    static.register_buffer("input_scale", torch.tensor(8.0))
    static.register_buffer("input_scale_inv", torch.tensor(0.125))
    with grad_mode():
        assert_bitwise_equal(torch.compile(static, backend=backend)(x), static(x))


def test_fullgraph_names_the_graph_break_and_the_way_out():
    import inspect

    if "reason" not in inspect.signature(torch.compiler.disable).parameters:
        pytest.skip("this torch's torch.compiler.disable takes no reason to show")
    layer, x = _layer_and_input()
    for context in (torch.inference_mode, torch.no_grad):
        torch._dynamo.reset()
        with context(), pytest.raises(Exception) as info:
            torch.compile(_Around(layer), backend="eager", fullgraph=True)(x)
        message = str(info.value)
        assert "EmulatedFP8Linear" in message and "graph break" in message, message
        assert "fullgraph=False" in message and "on purpose" in message, message


def test_the_layer_is_one_graph_break_and_nothing_of_it_is_traced():
    layer, x = _layer_and_input()
    counter = CountingBackend()
    with torch.inference_mode():
        torch.compile(_Around(layer), backend=counter)(x)
    targets = counter.targets()
    assert len(counter.graphs) == 2 and len(targets) <= 4, targets  # x * 2 before; float, relu, + 1 after
    assert not any(name in t for t in targets for name in ("abs", "amax", "max", "round", "clamp")), targets


class _Records(__import__("logging").Handler):
    def __init__(self):
        super().__init__(level=0)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _fp8_model():
    from mmaemu.nn import convert_linears

    class TwoLayers(torch.nn.Module):  # explicit calls (dynamo does not resume inside nn.Sequential's loop)
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.down(torch.nn.functional.gelu(self.up(x * 0.5))) * 2.0

    torch.manual_seed(0)
    return convert_linears(TwoLayers(), profile="hopper", splitk=1)  # current scaling: the input scale is per call


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_fp8_model_is_quiet_and_returns_the_eager_bits(backend, capfd):
    """No graph-break warning from mmaemu's quantiser (its host-side scale arithmetic is never traced: the
    layer runs eagerly behind a graph break, as scaled_mm does), and exactly the eager bits."""
    import logging
    import warnings

    model = _fp8_model()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        eager = model(x)
    handler = _Records()
    dynamo_logger = logging.getLogger("torch._dynamo")  # where dynamo logs its graph-break warnings
    dynamo_logger.addHandler(handler)
    capfd.readouterr()
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            compiled = torch.compile(model, backend=backend)(x)
    finally:
        dynamo_logger.removeHandler(handler)
    printed = capfd.readouterr()
    noise = handler.messages + [str(w.message) for w in caught] + printed.err.splitlines() + printed.out.splitlines()
    assert not [m for m in noise if "graph break" in m.lower() or "item()" in m], noise
    assert compiled.dtype == torch.float32
    assert_bitwise_equal(compiled, eager)


def test_compiled_fp8_model_traces_only_what_is_between_the_layers():
    model = _fp8_model()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(8))
    counter = CountingBackend()
    with torch.no_grad():
        compiled = torch.compile(model, backend=counter)(x)
        assert_bitwise_equal(compiled, model(x))
    targets = counter.targets()
    assert any("gelu" in t for t in targets), targets  # the activation between the layers is compiled
    # Nothing of the layers' emulation (amax, quantisation, GEMM) is in the captured graphs.
    assert not any(op in t for t in targets for op in ("abs", "round", "max", "cat", "mmaemu")), targets


FIRST_CALL_WITHOUT_DYNAMO = r"""
import sys
import torch, mmaemu
x = (torch.randn(16, 32) * 8).to(torch.float8_e4m3fn)
one = torch.tensor(1.0)
mmaemu.scaled_mm(x, x.t(), one, one, out_dtype=torch.float32, splitk=1)
mmaemu.explain(x, x.t(), one, one, out_dtype=torch.float32)
mmaemu.accumulate(x, x, use_fast_accum=True, splitk=1)
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.subprocess
def test_a_process_that_never_compiles_never_imports_dynamo(tmp_path):
    """The entry points defer torch.compiler.disable (whose import of torch._dynamo costs seconds) until dynamo is
    imported by something else: the first scaled_mm / explain / accumulate of a process leaves it unimported."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FIRST_CALL_WITHOUT_DYNAMO], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"
