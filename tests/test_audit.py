"""mmaemu.nn.audit: every distinct GEMM of a forward with its split decision, source and verification; undecided
splits are listed, never raised; a converted model's SplitKUnknownError names the layer and the audit."""

import warnings

import pytest
import torch

import mmaemu
from mmaemu.errors import SplitKUnknownError
from mmaemu.nn import EmulatedFP8Linear, ModelAudit, audit, convert_linears

pytestmark = pytest.mark.usefixtures("fresh_warnings")  # tests/conftest.py


@pytest.fixture(autouse=True)
def no_policy_variables(monkeypatch):
    """The split policy of each test is its own: none of the caller's variables leaks in."""
    monkeypatch.delenv("MMAEMU_SPLITK_POLICY", raising=False)


class Branches(torch.nn.Module):
    """Four linear layers on separate inputs, chosen so that each split step decides one of them on hopper (bf16
    output, fast accumulation, 1 MiB workspace), read from the H100 table: 16 x 5760 -> 64 is a recorded split row
    (S = 2, customOption 1), 16 x 1024 -> 64 a recorded unsplit row; 40 x 1024 -> 1024 has M*N = 40,960 above
    the envelope bound 15,360 (K <= 5,120); 40 x 384 -> 384 has K below the envelope's K range (undecided)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.split = torch.nn.Linear(5760, 64)
        self.unsplit = torch.nn.Linear(1024, 64)
        self.wide = torch.nn.Linear(1024, 1024, bias=False)
        self.small = torch.nn.Linear(384, 384)
        self.outputs = None

    def forward(self, a, b, c, *, d):
        self.outputs = (self.split(a), self.unsplit(b), self.wide(c), self.small(d), self.small(d))
        return self.outputs

    def embed(self, a, b, c, d):
        return self(a, b, c, d=d)


def inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(16, 5760, generator=g), torch.randn(2, 8, 1024, generator=g),
            torch.randn(40, 1024, generator=g), torch.randn(40, 384, generator=g))


def converted(**options):
    return convert_linears(Branches(), profile="hopper", out_dtype=torch.bfloat16, use_fast_accum=True, **options)


EXPECTED = [  # layer, M, N, K, S, source, status
    ("split", 16, 64, 5760, 2, "table", "verified"),
    ("unsplit", 16, 64, 1024, 1, "table", "verified"),
    ("wide", 40, 1024, 1024, 1, "envelope", "verified"),
    ("small", 40, 384, 384, None, None, "undecided"),
]


def summary(result):
    return [(g.layer, g.M, g.N, g.K, g.S, g.source, g.status) for g in result]


def test_the_audit_lists_every_gemm_and_never_raises_for_an_undecided_split():
    model = converted()
    a, b, c, d = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = audit(model, a, b, c, d=d)
    assert isinstance(result, ModelAudit) and summary(result) == EXPECTED
    assert [g.calls for g in result] == [1, 1, 1, 2]  # the small layer runs twice with one shape
    small = result[3]
    assert (small.a, small.b, small.out, small.fast, small.profile) == ("e4m3", "e4m3", "bfloat16", True, "hopper")
    assert small.error.startswith("SplitKUnknownError") and "outside the envelope's K range" in small.error
    assert result.undecided == (small,) and result.unverified == ()
    assert result.counts() == {"table": 2, "envelope": 1, "undecided": 1}
    assert result.shapes_text() == "40 384 384\n"
    assert result.shapes_text("all") == "16 64 5760\n16 64 1024\n40 1024 1024\n40 384 384\n"
    data = result.to_dict()
    assert data["undecided"] == 1 and [g["status"] for g in data["gemms"]] == [e[-1] for e in EXPECTED]
    assert data["gemms"][0]["scheme"] == "contiguous" and "customOption 1" in data["gemms"][0]["note"]
    text = str(result)
    for layer, M, N, K, *_ in EXPECTED:
        assert any(line.split()[:4] == [layer, str(M), str(N), str(K)] for line in text.splitlines()), text
    assert "small (M=40, N=384, K=384): the key is not in the recorded table" in text
    assert "4 distinct GEMMs (5 calls)" in text and "assume-unsplit" in text and "mmaemu record" in text


def test_decided_layers_compute_as_in_a_plain_forward_and_the_layers_are_restored():
    model = converted()
    a, b, c, d = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        audit(model, a, b, c, d=d)
        audited = model.outputs
        plain = [model.split(a), model.unsplit(b), model.wide(c)]
    for got, want in zip(audited[:3], plain):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert audited[3].shape == (40, 384) and audited[3].dtype == torch.bfloat16
    assert all("forward" not in m.__dict__ for m in model.modules() if isinstance(m, EmulatedFP8Linear))
    with pytest.raises(SplitKUnknownError):
        model(a, b, c, d=d)


def test_a_dry_run_computes_nothing_and_decides_the_same(monkeypatch):
    model = converted()
    a, b, c, d = inputs()

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run must not emulate a GEMM")

    monkeypatch.setattr(mmaemu.api, "scaled_mm", refuse)
    result = audit(model, a, b, c, d=d, dry_run=True)
    assert summary(result) == EXPECTED and result.dry_run and "(dry run)" in str(result)


def test_the_policy_turns_undecided_gemms_into_unverified_ones():
    model = converted(splitk="assume-unsplit")
    a, b, c, d = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = audit(model.embed, a, b, c, d)  # a bound method of the model
    assert [(g.layer, g.S, g.source, g.status) for g in result][3] == ("small", 1, "assumed-unsplit", "unverified")
    assert summary(result)[:3] == EXPECTED[:3] and result.undecided == ()
    assert "no row with K <= 5,120 splits" in result[3].note


def test_the_layers_error_names_the_layer_the_audit_and_the_ways_out():
    model = converted()
    a, b, c, d = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SplitKUnknownError) as info:
            model(a, b, c, d=d)
    message = str(info.value)
    assert message.startswith("layer 'small': cannot decide split-K for M=40, N=384, K=384")
    assert "mmaemu.nn.audit(model, *inputs)" in message
    assert "splitk='assume-unsplit'" in message and "MMAEMU_SPLITK_POLICY=assume-unsplit" in message
    assert "python -m mmaemu record --shapes FILE" in message
    layer = EmulatedFP8Linear.from_linear(torch.nn.Linear(384, 384), profile="hopper")
    with pytest.raises(SplitKUnknownError, match=r"^layer 'EmulatedFP8Linear\(in_features=384, "):
        layer(d)


def test_padding_is_the_m_the_audit_reports():
    model = convert_linears(torch.nn.Sequential(torch.nn.Linear(384, 384)), profile="hopper", pad_m_to=16)
    result = audit(model, torch.randn(3, 7, 384), dry_run=True)
    assert [(g.layer, g.M) for g in result] == [("0", 32)]


def test_other_errors_propagate_and_restore_the_layers():
    model = converted()

    with pytest.raises(ValueError, match="expected input"):
        audit(model, *inputs()[:3], d=torch.randn(4, 5), dry_run=True)
    assert all("forward" not in m.__dict__ for m in model.modules() if isinstance(m, EmulatedFP8Linear))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        audit(lambda x: x, 1)


class Recipes(torch.nn.Module):
    """One layer of each recipe of mmaemu.nn_recipes, each on its own input (K = 128: every recipe's block)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.rowwise, self.blockwise, self.mxfp8, self.nvfp4 = (
            EmulatedFP8Linear.from_linear(torch.nn.Linear(128, 64), recipe=recipe)
            for recipe in ("rowwise", "blockwise", "mxfp8", "nvfp4"))

    def forward(self, x):
        return [layer(x) for layer in (self.rowwise, self.blockwise, self.mxfp8, self.nvfp4)]


RECIPE_ROWS = [  # layer, M, N, K, a, b, out, S, source, status, profile
    ("rowwise", 6, 64, 128, "e4m3", "e4m3", "bfloat16", 1, "kernel", "unverified", "hopper"),
    ("blockwise", 6, 64, 128, "e4m3", "e4m3", "bfloat16", 1, "kernel", "unverified", "none"),
    ("mxfp8", 6, 64, 128, "e4m3", "e4m3", "bfloat16", 1, "kernel", "unverified", "b200-mx-experimental"),
    ("nvfp4", 6, 64, 128, "e2m1", "e2m1", "bfloat16", 1, "kernel", "unverified", "b200-mx-experimental"),
]


def test_the_recipe_layers_are_listed_with_the_kernels_no_split(monkeypatch):
    """Issue 28 item 5: the recipe layers are audited (not skipped with "0 distinct GEMMs"); their kernels never
    split K, so each GEMM has S = 1 from the source "kernel"; decided layers compute as in a plain forward."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Recipes()
        x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        with torch.no_grad():
            plain = model(x)
        result = audit(model, x)
    assert [(g.layer, g.M, g.N, g.K, g.a, g.b, g.out, g.S, g.source, g.status, g.profile) for g in result] == \
        RECIPE_ROWS
    assert result.counts() == {"kernel": 4} and "4 distinct GEMMs (4 calls)" in str(result)
    assert "never split K (each CTA loops over all of K)" in result[1].note
    assert all(g.error is None and g.scheme == "none" for g in result)
    for got, want in zip(model.forward(x), plain):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run must not emulate a GEMM")

    from mmaemu import deepgemm

    monkeypatch.setattr(mmaemu.api, "scaled_mm", refuse)
    monkeypatch.setattr(deepgemm, "fp8_gemm_nt", refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dry = audit(model, x, dry_run=True)
    assert [(g.layer, g.S, g.source) for g in dry] == [(row[0], 1, "kernel") for row in RECIPE_ROWS]
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_compiled_model_is_audited_under_the_models_layer_names():
    """Issue 28 item 7: torch.compile's wrapper names its layers '_orig_mod.0'; the audit names them as the model
    (and the layers' errors) do."""
    model = convert_linears(torch.nn.Sequential(torch.nn.Linear(384, 384)), profile="hopper")
    compiled = torch.compile(model)
    assert [name for name, _ in compiled.named_modules()][1:] == ["_orig_mod", "_orig_mod.0"]
    result = audit(compiled, torch.randn(40, 384), dry_run=True)
    assert [(g.layer, g.status) for g in result] == [("0", "undecided")]
    with pytest.raises(SplitKUnknownError, match="^layer '0': "):
        model(torch.randn(40, 384))
