"""Plans kept per call signature (mmaemu.plan.cache): a hit gives the bits, warnings and errors of a fresh plan,
and every part of the signature that changes a decision changes the plan."""

import threading
import warnings

import pytest
import torch

import mmaemu
from mmaemu import warn
from mmaemu.errors import (AssumedUnsplitWarning, ExperimentalPresetWarning, MmaemuError, ReferenceRejectsError,
                           SplitKUnknownError, UnsupportedFeatureError)
from mmaemu.plan import cache, planner

ONE = torch.tensor(1.0)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """An empty cache, free once-slots, and a count of the planner's runs (``fresh.calls``)."""
    warn.reset()
    cache.clear()
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return planner.plan_scaled_mm(*args, **kwargs)

    def counting_accumulate(*args, **kwargs):
        calls.append(1)
        return planner.plan_accumulate(*args, **kwargs)

    monkeypatch.setattr(cache, "plan_scaled_mm", counting)
    monkeypatch.setattr(cache, "plan_accumulate", counting_accumulate)
    for name in ("MMAEMU_SPLITK_POLICY", "MMAEMU_BACKEND", "MMAEMU_PROFILE", "MMAEMU_SPLITK_STRICT"):
        monkeypatch.delenv(name, raising=False)
    yield calls
    cache.clear()
    warn.reset()


def fp8(shape, seed, dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(dtype)


def record(fn, *args, **kwargs):
    """(result or exception, [(category, message)]) of one call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(*args, **kwargs)
        except Exception as error:  # the error is part of what is compared
            result = error
    return result, [(w.category, str(w.message)) for w in caught]


def same_outcome(a, b):
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and str(a) == str(b)
    return torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8)
                       if b.element_size() == 1 else b)


def sequence(call, repeats=3, reset_between=False, cached=True):
    """What ``repeats`` calls give (results, warnings), with the cache in use or cleared before each call."""
    outcomes = []
    for _ in range(repeats):
        if not cached:
            cache.clear()
        if reset_between:
            warn.reset()
        outcomes.append(record(call))
    return outcomes


def assert_same_sequences(call, **options):
    warn.reset()
    fresh_plans = sequence(call, cached=False, **options)
    warn.reset()
    cache.clear()
    kept_plans = sequence(call, cached=True, **options)
    for (r1, w1), (r2, w2) in zip(fresh_plans, kept_plans):
        assert same_outcome(r1, r2), (r1, r2)
        assert w1 == w2
    return kept_plans


# --------------------------------------------------------------------------------------------------------------
# Hits


def test_a_hit_skips_the_planner_and_gives_the_same_bits(fresh):
    a, w = fp8((3, 64), 1), fp8((48, 64), 2)
    first = mmaemu.scaled_mm(a, w.t(), ONE, torch.tensor(0.5), out_dtype=torch.bfloat16, splitk=1)
    second = mmaemu.scaled_mm(a, w.t(), ONE, torch.tensor(0.5), out_dtype=torch.bfloat16, splitk=1)
    assert len(fresh) == 1 and cache.stats().hits == 1
    assert torch.equal(first.view(torch.int16), second.view(torch.int16))
    other = fp8((3, 64), 9)  # new tensors of the same signature: the plan is bound to them
    got = mmaemu.scaled_mm(other, w.t(), ONE, ONE, out_dtype=torch.bfloat16, splitk=1)
    cache.clear()
    want = mmaemu.scaled_mm(other, w.t(), ONE, ONE, out_dtype=torch.bfloat16, splitk=1)
    assert len(fresh) == 2 and torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_hit_of_accumulate(fresh):
    a, b = fp8((2, 40), 3), fp8((5, 40), 4)
    first = mmaemu.accumulate(a, b, use_fast_accum=True, splitk=1)
    second = mmaemu.accumulate(a, b, use_fast_accum=True, splitk=1)
    assert len(fresh) == 1 and torch.equal(first.view(torch.int32), second.view(torch.int32))


def test_a_copied_input_is_copied_again_on_a_hit(fresh):
    base = fp8((4, 128), 5)
    a = base[:, ::2]  # neither row- nor column-major: torch computes on a contiguous copy
    w = fp8((16, 64), 6)
    first = mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    a2 = fp8((4, 128), 7)[:, ::2]
    got = mmaemu.scaled_mm(a2, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    want = mmaemu.scaled_mm(a2.contiguous(), w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    assert len(fresh) == 2 and first.shape == (4, 16) and torch.equal(got, want)


def _compiled_hit(a, mat2, scale_b=ONE, scale_result=None, out_dtype=torch.bfloat16, out=None):
    return cache.cached_plan_scaled_mm(a, mat2, ONE, scale_b, None, scale_result, out_dtype, True, out=out,
                                       splitk=1, compiled=True)


@pytest.mark.parametrize("case", ["bf16", "fp8 out with scale_result", "out=", "kept weight"])
def test_a_compiled_hit_is_the_kept_call_and_gives_the_bits_of_a_fresh_plan(fresh, case):
    """A hit asked for the compiled call (as scaled_mm and the layer ask) returns the plan's TensorwiseGemm, no
    bound plan; scaled_mm runs it on the call's tensors, with the bits (and out= handling) of a fresh plan."""
    from mmaemu.cpu.fused import TensorwiseGemm
    from mmaemu.cpu.prepared import WEIGHTS

    n, k = (160, 128) if case == "kept weight" else (48, 64)  # 20480 codes: B's panels kept
    a, w = fp8((3, k), 30), fp8((n, k), 31)
    options = dict(out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
    if case == "fp8 out with scale_result":
        options.update(out_dtype=torch.float8_e4m3fn, scale_result=torch.tensor(0.25))
    WEIGHTS.clear()

    def call(x, out=None):
        return mmaemu.scaled_mm(x, w.t(), ONE, torch.tensor(0.5), out=out, **options)

    call(a)
    found = _compiled_hit(a, w.t(), torch.tensor(0.5), options.get("scale_result"), options["out_dtype"])
    assert type(found) is TensorwiseGemm and cache.stats().hits == 1
    for seed in (32, 33, 34):  # new tensors of the signature, each a hit
        x = fp8((3, k), seed)
        out = torch.empty((3, n), dtype=options["out_dtype"]) if case == "out=" else None
        got = call(x, out)
        assert out is None or got is out
        cache.clear()
        want = call(x)
        assert same_outcome(got, want)
        call(x)  # kept again: the next round is a hit
    assert len(WEIGHTS) == (1 if case == "kept weight" else 0)


def test_a_rowwise_hit_is_a_bound_plan_with_the_bits_of_a_fresh_plan(fresh):
    """A kept row-wise plan carries a compiled call too (its scale vectors and the row-wise epilogue), which only its
    recipe's run may use: a compiled hit returns the bound plan, and repeated calls with new scales and operands
    give the bits of a fresh plan (a tensor-wise reading of the scale vectors would not)."""
    from mmaemu.plan.planner import Plan

    m, n, k = 4, 48, 64
    w = fp8((n, k), 40)

    def scales(rows, seed):
        return torch.rand((rows, 1), generator=torch.Generator().manual_seed(seed)) * 3.75 + 0.25

    def call(x, sa, sb):
        return mmaemu.scaled_mm(x, w.t(), sa, sb.t(), out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)

    a = fp8((m, k), 42)
    call(a, scales(m, 43), scales(n, 44))
    found = cache.cached_plan_scaled_mm(a, w.t(), scales(m, 43), scales(n, 44).t(), None, None, torch.bfloat16,
                                        True, splitk=1, compiled=True)
    assert type(found) is Plan and found.call.recipe.name == "rowwise" and cache.stats().hits == 1
    for seed in (45, 46, 47):
        x, sa, sb = fp8((m, k), seed), scales(m, seed + 10), scales(n, seed + 20)
        got = call(x, sa, sb)
        cache.clear()
        want = call(x, sa, sb)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), seed
        call(x, sa, sb)  # kept again: the next round is a hit


def test_a_compiled_hit_needs_plain_tensors_and_an_uncopied_input(fresh):
    """Where the kept call does not apply (a functional tensor, a copied neither-major input) a hit returns the
    bound plan: the functional tensor is refused and the copy made, as without the compiled call."""
    from mmaemu.base._untraced import plain_tensor
    from mmaemu.plan.planner import Plan

    a, w = fp8((2, 64), 35), fp8((16, 64), 36)
    mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
    functional = torch._to_functional_tensor(a)
    assert type(functional) is torch.Tensor and not plain_tensor(functional)
    assert type(_compiled_hit(functional, w.t())) is Plan and cache.stats().hits == 1  # a hit, not the kept call
    with pytest.raises(TypeError, match="functional tensor"):
        mmaemu.scaled_mm(functional, w.t(), ONE, ONE, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
    strided = fp8((2, 128), 37)[:, ::2]  # neither-major: planned with a copy
    mmaemu.scaled_mm(strided, w.t(), ONE, ONE, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
    assert type(_compiled_hit(strided, w.t())) is Plan


def test_an_environment_change_between_compiled_hits_takes_effect(fresh, monkeypatch):
    """The compiled call is found through the same key: a variable set between two calls plans the call again."""
    a, w = fp8((1, 64), 38), fp8((16, 64), 39)

    def call():
        return mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)

    call(), call()
    assert len(fresh) == 1 and cache.stats().hits == 1
    monkeypatch.setenv("MMAEMU_BACKEND", "reference")
    got = call()
    assert len(fresh) == 2
    plan = _compiled_hit(a, w.t())
    assert plan.backend == "reference" and not hasattr(plan, "cpu_gemm")  # no compiled call for this plan
    monkeypatch.delenv("MMAEMU_BACKEND")
    assert torch.equal(call().view(torch.int16), got.view(torch.int16))  # the reference's bits are the engine's
    assert len(fresh) == 2  # the first plan, kept, is found again


# --------------------------------------------------------------------------------------------------------------
# Warnings and errors as without the cache


def test_warnings_of_every_call_are_as_without_the_cache(fresh):
    a, w = fp8((1, 512), 8), fp8((16, 512), 9)
    out = torch.empty((2, 2))

    def call():
        return mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, profile="hopper-experimental",
                                splitk=1, out=out.resize_(2, 2))

    outcomes = assert_same_sequences(call)
    categories = [[c for c, _ in ws] for _, ws in outcomes]
    # once per process for the maturity warning, every call for the resize of out
    assert categories == [[ExperimentalPresetWarning, UserWarning], [UserWarning], [UserWarning]]
    outcomes = assert_same_sequences(call, reset_between=True)  # the registry decides, also on a hit
    assert all([c for c, _ in ws] == [ExperimentalPresetWarning, UserWarning] for _, ws in outcomes)


def test_assumed_unsplit_warns_once_with_or_without_the_cache(fresh, monkeypatch):
    a, w = fp8((1, 64), 10), fp8((64, 64), 11)
    monkeypatch.setenv("MMAEMU_SPLITK_POLICY", "assume-unsplit")
    outcomes = assert_same_sequences(lambda: mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16))
    assert [[c for c, _ in ws] for _, ws in outcomes] == [[AssumedUnsplitWarning], [], []]


@pytest.mark.parametrize("case", ["undecided", "rejected", "scope", "grad"])
def test_a_call_that_raises_raises_again_and_is_never_kept(fresh, case):
    a, w = fp8((1, 64), 12), fp8((64, 64), 13)
    calls = {
        "undecided": lambda: mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16),
        "rejected": lambda: mmaemu.scaled_mm(fp8((1, 40), 1), fp8((64, 40), 2).t(), ONE, ONE, splitk=1,
                                             out_dtype=torch.bfloat16),
        "scope": lambda: mmaemu.scaled_mm(a, w.t(), ONE, ONE, bias=torch.zeros(64, dtype=torch.bfloat16),
                                          out_dtype=torch.bfloat16, splitk=1),
        "grad": lambda: mmaemu.scaled_mm(a, w.t(), ONE.clone().requires_grad_(), ONE, splitk=1,
                                         out_dtype=torch.bfloat16),
    }
    outcomes = assert_same_sequences(calls[case], repeats=2)
    errors = [result for result, _ in outcomes]
    expected = {"undecided": SplitKUnknownError, "rejected": (ReferenceRejectsError, UnsupportedFeatureError),
                "scope": UnsupportedFeatureError, "grad": UnsupportedFeatureError}[case]
    assert all(isinstance(e, expected) for e in errors), errors
    assert cache.stats().size == 0


def test_warnings_reported_before_an_error_are_emitted_each_time(fresh):
    a, b = fp8((2, 64), 3), fp8((2, 64), 4)

    def call():
        return mmaemu.accumulate(a, b, use_fast_accum=False, profile="b200-mma-sync-experimental", splitk=1)

    outcomes = assert_same_sequences(call, repeats=2, reset_between=True)
    assert all(isinstance(r, UnsupportedFeatureError) and [c for c, _ in ws] == [ExperimentalPresetWarning]
               for r, ws in outcomes)


def test_a_hit_still_refuses_a_thread_that_flushes_subnormals(fresh):
    a, w = fp8((2, 32), 5), fp8((16, 32), 6)
    mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        with pytest.raises(MmaemuError, match="set_flush_denormal"):
            mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    finally:
        torch.set_flush_denormal(False)
    assert cache.stats().hits == 1


# --------------------------------------------------------------------------------------------------------------
# Every part of the signature


def _base():
    a, w = fp8((1, 2048), 20), fp8((64, 2048), 21)
    return dict(input=a, mat2=w.t(), scale_a=ONE, scale_b=ONE, out_dtype=torch.bfloat16, use_fast_accum=True,
                splitk=1, profile="hopper", backend="auto")


def _plan(**call):
    return cache.cached_plan_scaled_mm(
        call["input"], call["mat2"], call["scale_a"], call["scale_b"], call.get("bias"), None, call["out_dtype"],
        call["use_fast_accum"], out=call.get("out"), profile=call["profile"], splitk=call["splitk"],
        backend=call["backend"])


def _padded(w):
    """w [N, K] in a storage whose rows are 8 codes longer (a leading dimension cuBLASLt refuses)."""
    storage = torch.zeros((w.shape[0], w.shape[1] + 8), dtype=torch.uint8)
    view = storage[:, : w.shape[1]].view(w.dtype)
    view.copy_(w)
    return view


VARIANTS = {
    "input shape": lambda c: dict(c, input=fp8((40, 2048), 22)),
    "input dtype": lambda c: dict(c, input=fp8((1, 2048), 22, torch.float8_e5m2)),
    "mat2 strides": lambda c: dict(c, mat2=_padded(c["mat2"].t()).t()),
    "mat2 offset": lambda c: dict(c, mat2=fp8((64 * 2048 + 8,), 23)[8:].view(64, 2048).t()),
    "out dtype": lambda c: dict(c, out_dtype=torch.float32),
    "fast": lambda c: dict(c, use_fast_accum=False),
    "splitk": lambda c: dict(c, splitk=(2, "contiguous")),
    "splitk type": lambda c: dict(c, splitk=True),
    "backend": lambda c: dict(c, backend="reference"),
    "profile": lambda c: dict(c, profile="hopper-experimental"),
    "profile object": lambda c: dict(c, profile=mmaemu.profile_from_preset("hopper", base="ada")),
    "requires grad": lambda c: dict(c, scale_a=ONE.clone().requires_grad_()),
    "out": lambda c: dict(c, out=torch.empty((2, 2), dtype=torch.bfloat16)),
}
# (value of the first call, value of the second); the first call's plan is kept, the second must not reuse it
ENVIRONMENT = {
    "MMAEMU_BACKEND": (None, "reference"), "MMAEMU_SPLITK_POLICY": ("assume-unsplit", "auto"),
    "MMAEMU_PROFILE": (None, "ada"), "MMAEMU_SPLITK_STRICT": (None, "1"),
}


def _describe(call):
    """The plan as explain shows it, with the call's shape, formats and flags; or the error."""
    try:
        plan = _plan(**call)
    except Exception as error:
        return (type(error).__name__, str(error))
    c = plan.call
    return plan.describe(), (c.M, c.N, c.K, c.fmt_a, c.fmt_b, c.out_dtype, c.use_fast_accum, c.layout_std)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_argument_is_in_the_signature(fresh, variant):
    base = _base()
    if variant == "splitk":
        base["splitk"] = "auto"  # an auto decision, then an explicit split
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = _describe(base)
        calls = len(fresh)
        changed = VARIANTS[variant](base)
        kept = _describe(changed)
        assert len(fresh) == calls + 1  # planned again
        cache.clear()
        assert _describe(changed) == kept  # as a fresh plan
    assert kept != before


@pytest.mark.parametrize("name", sorted(ENVIRONMENT))
def test_each_environment_variable_is_in_the_signature(fresh, monkeypatch, name):
    base = dict(_base(), profile=None, backend="auto")
    if name == "MMAEMU_SPLITK_POLICY":  # undecided: an error, then an assumption
        base.update(splitk="auto", input=fp8((1, 64), 24), mat2=fp8((64, 64), 25).t())
    if name == "MMAEMU_SPLITK_STRICT":  # an envelope inference, then its refusal
        zeros = torch.zeros((8192, 4096), dtype=torch.float8_e4m3fn)
        base.update(splitk="auto", input=zeros[:4096], mat2=zeros.t())
    first, second = ENVIRONMENT[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if first is not None:
            monkeypatch.setenv(name, first)
        before = _describe(base)
        assert cache.stats().size == 1
        monkeypatch.setenv(name, second)
        kept = _describe(base)
        cache.clear()
        assert _describe(base) == kept
    assert kept != before


def test_grad_mode_is_in_the_signature(fresh):
    call = dict(_base(), scale_a=ONE.clone().requires_grad_())
    with torch.no_grad():
        accepted = _describe(call)
    refused = _describe(call)
    assert refused[0] == "UnsupportedFeatureError" and accepted[0].backend == "cpu"


def test_out_storage_is_in_the_signature(fresh):
    base = _base()
    growable = torch.empty((2, 2), dtype=torch.bfloat16)
    fixed = torch.from_numpy(__import__("numpy").zeros((2, 2), "float32")).to(torch.bfloat16)
    lent = torch.frombuffer(bytearray(8), dtype=torch.bfloat16).view(2, 2)  # memory that cannot grow
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _describe(dict(base, out=growable))[0].backend == "cpu"
        assert fixed.shape == (2, 2)
        refused = _describe(dict(base, out=lent))
    assert refused[0] == "ReferenceRejectsError" and "not resizable" in refused[1]


def test_other_tensor_kinds_are_planned_every_time(fresh):
    class Marked(torch.Tensor):
        pass

    a, w = fp8((2, 32), 1), fp8((16, 32), 2)
    marked = a.as_subclass(Marked)
    for _ in range(2):
        mmaemu.scaled_mm(marked, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    assert len(fresh) == 2 and cache.stats().size == 0


def test_a_tensor_where_a_flag_belongs_is_planned_every_time(fresh):
    a, w = fp8((2, 32), 1), fp8((16, 32), 2)
    for _ in range(2):
        with pytest.raises(TypeError, match="use_fast_accum"):
            mmaemu.scaled_mm(a, w.t(), ONE, ONE, use_fast_accum=torch.tensor(True), splitk=1)
    assert len(fresh) == 2 and cache.stats().uncached == 2


def test_the_cache_is_bounded(fresh, monkeypatch):
    monkeypatch.setattr(cache, "MAX_PLANS", 3)
    w = fp8((16, 32), 2)
    for m in range(1, 7):
        mmaemu.scaled_mm(fp8((m, 32), m), w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    assert cache.stats().size == 3
    mmaemu.scaled_mm(fp8((6, 32), 0), w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)  # most recent: kept
    mmaemu.scaled_mm(fp8((1, 32), 0), w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)  # dropped: planned
    assert len(fresh) == 7


def test_threads_share_the_cache(fresh):
    w = fp8((32, 64), 3)
    inputs = [fp8((m % 3 + 1, 64), m) for m in range(24)]
    want = [mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1) for a in inputs]
    got = [None] * len(inputs)

    def work(lo):
        for i in range(lo, len(inputs), 4):
            got[i] = mmaemu.scaled_mm(inputs[i], w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)

    threads = [threading.Thread(target=work, args=(lo,)) for lo in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, x) for g, x in zip(got, want))
    assert len(fresh) == 3
