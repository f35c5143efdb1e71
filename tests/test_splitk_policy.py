"""splitk="assume-unsplit": S = 1 where the evidence does not decide, with its own source, note and warning; the
same decisions as "auto" wherever the evidence decides; refused in strict mode; never the default."""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu.cli import diagnostics
from mmaemu import environment, warn
from mmaemu.errors import AssumedUnsplitWarning, SplitKUnknownError, UnverifiedSplitWarning
from mmaemu.platform.splitk import SOURCES, resolve_splitk

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "splitk"
H100_ID = "heur_h100pcie_lt12.8.3.14"
OUTS = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
FMTS = ["e4m3", "e5m2"]
MiB = 1 << 20
# MiniLM's first GEMM with 20 sentences (issue 18): K = 384 lies below the H100 table's K grid and envelope.
MINILM = dict(M=380, N=384, K=384, fa="e4m3", fb="e4m3", out="bfloat16", fast=True)


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # tests/conftest.py


@pytest.fixture(autouse=True)
def no_policy_variables(monkeypatch):
    """The split policy of each test is its own: none of the caller's variables leaks in."""
    monkeypatch.delenv("MMAEMU_SPLITK_POLICY", raising=False)
    monkeypatch.delenv("MMAEMU_SPLITK_STRICT", raising=False)


def decide(profile, M, N, K, fa="e4m3", fb="e4m3", out="float32", fast=False, **kwargs):
    return resolve_splitk(M, N, K, a_dtype=fa, b_dtype=fb, out_dtype=out, use_fast_accum=fast, profile=profile,
                          **kwargs)


def quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return decide(*args, **kwargs)


def decide_both(*args, **kwargs):
    """(the "auto" decision or its exception type, the "assume-unsplit" decision)."""
    try:
        auto = quiet(*args, splitk="auto", **kwargs)
    except SplitKUnknownError:
        auto = SplitKUnknownError
    return auto, quiet(*args, splitk="assume-unsplit", **kwargs)


def recorded_setting(ws, out, fast, fa, fb):
    """(K, M*N, split?) of one H100 setting, read from the published npz (not from mmaemu's index)."""
    with np.load(DATA / f"{H100_ID}.npz", allow_pickle=False) as npz:
        cols = {k: npz[k].astype(np.int64) for k in ("M", "N", "K", "splitK", "ws", "out", "fast", "fa", "fb")}
    codes = json.loads((DATA / f"{H100_ID}.json").read_text())["codes"]  # ws list; out and fa/fb as OUTS, FMTS
    rows = ((cols["ws"] == codes["ws"].index(ws)) & (cols["out"] == OUTS.index(out))
            & (cols["fast"] == int(fast)) & (cols["fa"] == FMTS.index(fa)) & (cols["fb"] == FMTS.index(fb)))
    return cols["K"][rows], cols["M"][rows] * cols["N"][rows], cols["splitK"][rows] > 1


needs_data = pytest.mark.skipif(not (DATA / f"{H100_ID}.npz").exists(), reason="recorded tables not present")


def test_the_policy_is_a_source_and_a_warning_of_its_own():
    assert "assumed-unsplit" in SOURCES
    assert issubclass(AssumedUnsplitWarning, UnverifiedSplitWarning)
    assert mmaemu.AssumedUnsplitWarning is AssumedUnsplitWarning
    assert "AssumedUnsplitWarning" in mmaemu.errors.__all__


def test_auto_still_refuses_and_names_its_ways_out():
    with pytest.raises(SplitKUnknownError, match=r"K = 384 is outside the envelope's K range.*Ways out: pass "
                                                  r"splitk=1"):
        decide("hopper", **MINILM)


@needs_data
def test_an_undecided_shape_is_unsplit_with_the_tables_evidence():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = decide("hopper", **MINILM, splitk="assume-unsplit")
    assert (d.S, d.scheme, d.source, d.verified, d.table_id) == (1, "none", "assumed-unsplit", False, H100_ID)
    K, MN, split = recorded_setting(MiB, "bfloat16", True, "e4m3", "e4m3")
    first_split_K = int(K[split].min())
    largest_unsplit_K = int(K[K < first_split_K].max())
    largest_split_MN = int(MN[split].max())
    smallest_unsplit_MN = int(MN[MN > largest_split_MN].min())
    assert (first_split_K, largest_unsplit_K) == (5760, 5120)  # issue 18: "never split a call with K <= 5,120"
    assert f"{len(K):,} rows with K {int(K.min()):,} to {int(K.max()):,}" in d.note
    assert f"no row with K <= {largest_unsplit_K:,} splits (the first split is at K = {first_split_K:,})" in d.note
    assert f"no row with M*N >= {smallest_unsplit_MN:,} splits (the largest split M*N is {largest_split_MN:,})" \
        in d.note
    assert "K = 384 is outside the envelope's K range" in d.note  # why the evidence did not decide
    assert "this call's K = 384 is below every split K and below the recorded K range" in d.note
    [w] = caught
    assert w.category is AssumedUnsplitWarning and "source assumed-unsplit" in str(w.message)
    assert "M=380, N=384, K=384" in str(w.message) and d.note in str(w.message)


def test_the_warning_comes_once_per_shape_and_setting_and_every_time_when_collected():
    def count(**kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decide("hopper", **dict(MINILM, **kwargs), splitk="assume-unsplit")
        return sum(w.category is AssumedUnsplitWarning for w in caught)

    assert count() == 1
    assert count() == 0  # same shape and setting
    assert count(M=381) == 1  # another shape
    assert count(out="float32") == 1  # another setting
    def collected():
        with warn.collecting() as notices:
            assert count(M=382) == 0  # nothing is emitted while collecting
        return sum(n.category is AssumedUnsplitWarning for n in notices)

    assert collected() == 1 and collected() == 1
    assert count(M=382) == 1  # collecting used no slot


def test_a_split_the_table_shows_is_not_assumed_where_the_rows_split():
    d = quiet("ada", 100, 100, 4096, out="bfloat16", fast=True, splitk="assume-unsplit")
    assert d.source == "assumed-unsplit"
    assert "rows split already at the smallest K = 16" in d.note
    assert "lies where rows of the setting split: the table does not support the assumption there" in d.note


@needs_data
def test_where_the_evidence_decides_both_policies_agree():
    rng = np.random.default_rng(18)
    with np.load(DATA / f"{H100_ID}.npz", allow_pickle=False) as npz:
        cols = {k: npz[k].astype(np.int64) for k in ("M", "N", "K", "splitK", "ws", "out", "fast", "fa", "fb")}
    split_rows = np.flatnonzero((cols["splitK"] > 1) & (cols["ws"] == 1))
    unsplit_rows = np.flatnonzero((cols["splitK"] <= 1) & (cols["ws"] == 1))
    picked = np.concatenate([rng.choice(split_rows, 40, replace=False), rng.choice(unsplit_rows, 40, replace=False)])
    for i in picked:
        key = dict(M=int(cols["M"][i]), N=int(cols["N"][i]), K=int(cols["K"][i]), fa=FMTS[cols["fa"][i]],
                   fb=FMTS[cols["fb"][i]], out=OUTS[cols["out"][i]], fast=bool(cols["fast"][i]))
        auto, assumed = decide_both("hopper", **key)
        assert auto == assumed and assumed.source == "table", key
    for profile, key in [("hopper", dict(M=1000, N=1000, K=4096, out="bfloat16", fast=True)),  # envelope
                         ("hopper-te", dict(M=1000, N=1000, K=4096)),  # unvalidated envelope
                         ("ada", dict(M=300, N=1000, K=777)),  # max-split-MN envelope
                         ("hopper-ws0", MINILM), ("ada-ws0", MINILM)]:  # workspace 0
        auto, assumed = decide_both(profile, **key)
        assert auto == assumed and assumed.source != "assumed-unsplit", (profile, key)


@pytest.mark.parametrize("splitk", [1, (2, "contiguous")])
def test_explicit_splits_are_not_policies(splitk):
    auto = quiet("hopper", **MINILM, splitk=splitk)
    assert auto.source == "explicit"


def test_strict_mode_refuses_the_assumption(monkeypatch):
    with pytest.raises(SplitKUnknownError, match="strict mode .* refuses splitk='assume-unsplit'"):
        decide("hopper", **MINILM, splitk="assume-unsplit", strict=True)
    monkeypatch.setenv("MMAEMU_SPLITK_STRICT", "1")
    with pytest.raises(SplitKUnknownError, match="refuses splitk='assume-unsplit'"):
        decide("hopper", **MINILM, splitk="assume-unsplit")
    # strict refuses envelope inferences as before; table rows still decide
    with pytest.raises(SplitKUnknownError):
        decide("hopper", 1000, 1000, 4096, out="bfloat16", fast=True, splitk="assume-unsplit")


def test_a_profile_without_a_table_assumes_with_no_evidence():
    d = quiet("hopper-experimental", **MINILM, splitk="assume-unsplit")
    assert (d.S, d.source, d.verified) == (1, "assumed-unsplit", False)
    assert "no reference platform and no split-K table" in d.note
    assert "profile hopper-experimental has no split-K table, nothing was recorded" in d.note


def test_the_environment_variable_replaces_auto(monkeypatch):
    assert "MMAEMU_SPLITK_POLICY" in environment.NAMES
    monkeypatch.setenv("MMAEMU_SPLITK_POLICY", "assume-unsplit")
    assert quiet("hopper", **MINILM).source == "assumed-unsplit"
    assert quiet("hopper", **MINILM, splitk=1).source == "explicit"
    assert diagnostics.environment_problems() == {}
    monkeypatch.setenv("MMAEMU_SPLITK_POLICY", "auto")
    with pytest.raises(SplitKUnknownError):
        decide("hopper", **MINILM)
    monkeypatch.setenv("MMAEMU_SPLITK_POLICY", "unsplit")
    with pytest.raises(ValueError, match="MMAEMU_SPLITK_POLICY='unsplit' is not a split-K policy"):
        decide("hopper", **MINILM)
    assert "MMAEMU_SPLITK_POLICY" in diagnostics.environment_problems()


def test_other_strings_stay_refused():
    with pytest.raises(TypeError, match="'assume-unsplit'"):
        decide("hopper", **MINILM, splitk="unsplit")


# ----------------------------------------------------------------------------------------------------------------
# The entry points


def operands(M=40, N=384, K=384, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, generator=g) * 4).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    return a, b.t(), one, one


def test_scaled_mm_accumulate_explain_and_patch_accept_the_policy():
    a, b, sa, sb = operands()
    kwargs = dict(out_dtype=torch.bfloat16, use_fast_accum=True, profile="hopper")
    with pytest.raises(SplitKUnknownError):
        mmaemu.scaled_mm(a, b, sa, sb, **kwargs)
    with pytest.warns(AssumedUnsplitWarning):
        y = mmaemu.scaled_mm(a, b, sa, sb, **kwargs, splitk="assume-unsplit")
    assert torch.equal(y.view(torch.int16), mmaemu.scaled_mm(a, b, sa, sb, **kwargs, splitk=1).view(torch.int16))
    with pytest.warns(AssumedUnsplitWarning):
        acc = mmaemu.accumulate(a, b.t(), use_fast_accum=True, profile="hopper", splitk="assume-unsplit")
    assert torch.equal(acc, mmaemu.accumulate(a, b.t(), use_fast_accum=True, profile="hopper", splitk=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # explain emits nothing, it reports
        plan = mmaemu.explain(a, b, sa, sb, **kwargs, splitk="assume-unsplit")
    assert plan.validation == "ok" and plan.split.source == "assumed-unsplit"
    assert any("source assumed-unsplit" in w for w in plan.warnings)
    warn.reset()  # scaled_mm above took this shape's once-per-process slot
    with pytest.warns(AssumedUnsplitWarning):
        with mmaemu.patch(profile="hopper", splitk="assume-unsplit") as log:
            torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    assert log[0].source == "assumed-unsplit"


def test_the_layers_accept_the_policy():
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 384)
    x = torch.randn(40, 384)
    layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, profile="hopper", splitk="assume-unsplit")
    assert layer.explain(x).split.source == "assumed-unsplit"
    model = mmaemu.nn.convert_linears(torch.nn.Sequential(torch.nn.Linear(384, 384)), profile="hopper",
                                      splitk="assume-unsplit")
    with torch.no_grad(), pytest.warns(AssumedUnsplitWarning):
        model(x)


@pytest.mark.subprocess
def test_the_cli_explains_the_policy():
    done = subprocess.run([sys.executable, "-m", "mmaemu", "explain", "380", "384", "384", "--out", "bfloat16",
                           "--fast", "--profile", "hopper", "--splitk", "assume-unsplit", "--device", "cpu"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"'source': 'assumed-unsplit'", done.stdout), done.stdout
    assert "no row with K <= 5,120 splits" in done.stdout
    refused = subprocess.run([sys.executable, "-m", "mmaemu", "explain", "380", "384", "384", "--out", "bfloat16",
                              "--fast", "--profile", "hopper", "--device", "cpu"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert refused.returncode == 1 and "SplitKUnknownError" in refused.stdout


def test_row_wise_calls_take_the_policy_as_one_split():
    """torch's row-wise kernel never splits K: the policy, like "auto" and 1, asks for nothing else."""
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(32, 64, generator=g) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(48, 64, generator=g) * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(32, 1, generator=g) + 0.5, torch.rand(1, 48, generator=g) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        assumed = mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, splitk="assume-unsplit")
        stated = mmaemu.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, splitk=1)
    assert torch.equal(assumed.view(torch.int16), stated.view(torch.int16))
