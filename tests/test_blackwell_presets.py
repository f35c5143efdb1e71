"""The experimental Blackwell presets (tcgen05_f8f6f4, sm120_mma_sync), their profiles, and the prototyping path
(``Preset.variant``, ``profile_from_preset``).

Bit-exactness against MMA-Sim's models is in ``test_mmasim_oracle.py`` (optional dependency); here, without it:
the independent Fraction oracle (``tests/oracle.py``) on the adversarial instruction cases and on small GEMMs, the
fast CPU path against the reference loop, the relation to ``b200_mma_sync`` and its hardware vectors, and the
API around the presets (names, maturity, warnings, errors and their ways out).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from instruction_cases import instruction_cases

import mmaemu
import oracle
from mmaemu.cpu import accumulate_codes
from mmaemu.model import presets
from mmaemu.platform import profiles
from mmaemu.testing import assert_bitwise_equal
from vectors import km_cases

BLACKWELL = [presets.TCGEN05_F8F6F4, presets.SM120_MMA_SYNC]
PROFILE_OF = {"tcgen05_f8f6f4": "tcgen05-f8f6f4-experimental", "sm120_mma_sync": "sm120-mma-sync-experimental"}
PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
pytestmark = pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")


def _t(codes, fmt):
    return torch.from_numpy(np.ascontiguousarray(codes)).view(DTYPE[fmt])


def _oracle_preset(preset):
    return SimpleNamespace(name=preset.name, nfma=preset.nfma, frac=preset.frac, frac_out=preset.frac_out,
                                  min_exp=preset.min_exp, late_c=preset.late_c, slow_chunk=preset.slow_chunk)


# ----------------------------------------------------------------------------------------------------------------
# Names, maturity, warnings


def test_registered_with_their_maturity():
    assert mmaemu.list_presets() == ["ada", "b200_mma_sync", "hopper", "sm120_mma_sync", "sm120_mxf4nvf4", "sm120_mxf8f6f4", "tcgen05_f8f6f4",
            "tcgen05_mxf4nvf4", "tcgen05_mxf8f6f4"]
    assert mmaemu.list_presets(with_maturity=True) == {
        "ada": "validated", "b200_mma_sync": "experimental", "hopper": "validated",
        "sm120_mma_sync": "experimental", "sm120_mxf4nvf4": "experimental", "sm120_mxf8f6f4": "experimental",
        "tcgen05_f8f6f4": "experimental", "tcgen05_mxf4nvf4": "experimental", "tcgen05_mxf8f6f4": "experimental"}
    for preset in BLACKWELL:
        assert mmaemu.get_preset(preset.name.upper(), warn=False) is preset
        assert (preset.nfma, preset.frac, preset.frac_out, preset.min_exp, preset.late_c, preset.slow_chunk) == \
            (32, 25, 23, -133, False, None)
        assert "no hardware recording here" in preset.validated_scope
        assert any("MMA-Sim" in e for e in preset.evidence)


@pytest.mark.parametrize("name", ["sm_120", "SM120", "rtx_blackwell", "RTX-Blackwell", "rtx5070ti", "rtx_5070_ti"])
def test_refused_names_point_to_the_instruction_presets(name):
    with pytest.raises(KeyError) as info:
        mmaemu.get_preset(name)
    text = str(info.value)
    for part in ("sm_120", "'sm120_mma_sync'", "'sm120-mma-sync-experimental'", "'tcgen05_f8f6f4'"):
        assert part in text


@pytest.mark.filterwarnings("default::mmaemu.ExperimentalPresetWarning")
@pytest.mark.parametrize("preset", BLACKWELL, ids=lambda p: p.name)
def test_warning_names_the_evidence_once(preset):
    mmaemu.warn.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            mmaemu.get_preset(preset.name)
    messages = [str(w.message) for w in caught if issubclass(w.category, mmaemu.ExperimentalPresetWarning)]
    assert len(messages) == 1
    assert "is experimental" in messages[0] and "MMA-Sim" in messages[0]
    assert "no hardware recording here" in messages[0]


@pytest.mark.filterwarnings("default::mmaemu.ExperimentalPresetWarning")
def test_the_blackwell_alias_says_which_instruction_it_is():
    with pytest.warns(mmaemu.ExperimentalPresetWarning, match="tcgen05_f8f6f4.*sm120_mma_sync"):
        assert mmaemu.get_preset("blackwell") is presets.B200_MMA_SYNC


# ----------------------------------------------------------------------------------------------------------------
# Arithmetic without MMA-Sim: the independent oracle, the fast path, b200_mma_sync


@pytest.mark.parametrize("preset", BLACKWELL, ids=lambda p: p.name)
def test_dot_matches_the_fraction_oracle(preset):
    """Single instructions (K = 32) and chains (K = 96) on every kind of adversarial case, every format pair."""
    ref = _oracle_preset(preset)
    for index, (fa, fb) in enumerate(PAIRS):
        for K, n in ((32, 220), (96, 44)):
            a, b, c, kinds = instruction_cases(fa, fb, K, n, preset.frac, seed=300 + 10 * index + K)
            got = mmaemu.model.dot(_t(a, fa), _t(b, fb), torch.from_numpy(c.view(np.float32).copy()), preset=preset)
            expected = [oracle.dot(a[r].tolist(), b[r].tolist(), fa, fb, int(c[r]), ref) for r in range(n)]
            assert_bitwise_equal(got, torch.tensor(np.array(expected, np.uint32).view(np.float32)),
                                 msg=f"{preset.name} {fa} x {fb} K={K}")


@pytest.mark.parametrize("preset", BLACKWELL, ids=lambda p: p.name)
def test_gemm_matches_the_fraction_oracle(preset):
    ref = _oracle_preset(preset)
    for index, (fa, fb) in enumerate(PAIRS):
        a = instruction_cases(fa, fb, 200, 11, preset.frac, seed=400 + index)[0][:, :200]
        b = instruction_cases(fa, fb, 200, 22, preset.frac, seed=500 + index)[1][::3]
        got = mmaemu.accumulate(_t(a, fa), _t(b, fb), use_fast_accum=True, profile=PROFILE_OF[preset.name], splitk=1)
        expected = oracle.accumulate(a.tolist(), b.tolist(), fa, fb, ref, True)
        assert_bitwise_equal(got, torch.tensor(np.array(expected, np.uint32).view(np.float32)).reshape(got.shape),
                             msg=f"{preset.name} {fa} x {fb}")


@pytest.mark.parametrize("preset", BLACKWELL, ids=lambda p: p.name)
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_fast_path_equals_reference(preset, fa, fb):
    """The lane formulation (int64 lanes for 25 fraction bits) against the reference loop: several panels of B,
    ragged K, NaN/Inf rows, every adversarial kind."""
    for K in (40, 333):
        a = instruction_cases(fa, fb, K, 22, preset.frac, seed=600 + K)[0]
        b = instruction_cases(fa, fb, K, 300, preset.frac, seed=700 + K)[1][::2]
        want = accumulate_codes(a, b, fa, fb, preset, True, reference=True)
        got = accumulate_codes(a, b, fa, fb, preset, True)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"K={K}")


def test_tcgen05_is_b200_mma_sync_from_a_zero_accumulator_but_not_its_hardware():
    """The two differ only in where c enters (aligned with the products, or added late with one fp32 add): from
    c = +0 they agree; the recorded B200 mma.sync vectors (c != 0) tell them apart."""
    for fa, fb in PAIRS:
        a, b, _, kinds = instruction_cases(fa, fb, 32, 5500, 25, seed=800)
        finite = kinds != "nonfinite"
        a, b = _t(a[finite], fa), _t(b[finite], fb)
        assert_bitwise_equal(mmaemu.model.dot(a, b, preset="tcgen05_f8f6f4"),
                             mmaemu.model.dot(a, b, preset="b200_mma_sync"))
    for fmt in ("E4M3", "E5M2"):
        a, b, c, d = km_cases("B200", fmt)
        a, b, c = _t(a, fmt.lower()), _t(b, fmt.lower()), torch.from_numpy(c.view(np.float32).copy())
        recorded = torch.from_numpy(d.view(np.float32).copy())
        assert_bitwise_equal(mmaemu.model.dot(a, b, c, preset="b200_mma_sync"), recorded)
        tcgen05 = mmaemu.model.dot(a, b, c, preset="tcgen05_f8f6f4")
        assert (tcgen05.view(torch.int32) != recorded.view(torch.int32)).sum() > len(recorded) // 5


# ----------------------------------------------------------------------------------------------------------------
# Profiles: order, what they refuse and the ways out


def test_profiles_are_listed_last_in_the_contract_order():
    assert mmaemu.list_profiles() == ["ada", "ada-te", "ada-ws0", "hopper", "hopper-te", "hopper-ws0",
                                      "hopper-experimental", "b200-mma-sync-experimental",
                                      "tcgen05-f8f6f4-experimental", "sm120-mma-sync-experimental",
                                      "b200-mx-experimental", "hopper-cublaslt-blockwise-experimental"]
    for name, capability in (("tcgen05-f8f6f4-experimental", (10, 0)), ("sm120-mma-sync-experimental", (12, 0))):
        p = mmaemu.get_profile(name)
        assert (p.gpu_name, p.splitk_table, p.workspace_bytes, p.maturity, p.splitk_maturity, p.rejects) == \
            (None, None, None, "experimental", "none", ())
        assert p.capability == capability and p.preset_name in PROFILE_OF


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
@pytest.mark.parametrize("name", sorted(PROFILE_OF.values()))
def test_profile_errors_name_the_way_out(name):
    x = torch.zeros(16, 64, dtype=torch.float8_e4m3fn)
    w = torch.zeros(32, 64, dtype=torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    with pytest.raises(mmaemu.SplitKUnknownError) as info:
        mmaemu.scaled_mm(x, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, profile=name)
    assert "splitk=1" in str(info.value) and "python -m mmaemu record" in str(info.value)
    with pytest.raises(mmaemu.UnsupportedFeatureError, match="slow accumulation"):
        mmaemu.scaled_mm(x, w.t(), one, one, out_dtype=torch.bfloat16, profile=name, splitk=1)
    with pytest.raises(mmaemu.UnsupportedFeatureError, match="split-K"):
        mmaemu.scaled_mm(x, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, profile=name,
                         splitk=(2, "serial"))
    plan = mmaemu.explain(x, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, profile=name, splitk=1)
    assert plan.validation == "ok" and plan.preset_maturity == "experimental"
    assert any("MMA-Sim" in w for w in plan.warnings)


def test_blackwell_next_to_the_h100_on_a_cpu():
    """The same FP8 GEMM as the H100 and as a B200's tcgen05 chain compute it: 25 kept bits are closer to the
    exact sum than 13 on (almost) every output, and never farther."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 512, generator=g) * 30).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(64, 512, generator=g) * 30).clamp(-448, 448).to(torch.float8_e4m3fn)
    exact = x.double() @ w.double().t()
    h100 = mmaemu.accumulate(x, w, use_fast_accum=True, profile="hopper", splitk=1).double()
    b200 = mmaemu.accumulate(x, w, use_fast_accum=True, profile="tcgen05-f8f6f4-experimental", splitk=1).double()
    assert ((b200 - exact).abs() <= (h100 - exact).abs()).all()
    assert ((b200 - exact).abs() < (h100 - exact).abs()).float().mean() > 0.9


# ----------------------------------------------------------------------------------------------------------------
# Prototyping: Preset.variant and profile_from_preset


def test_variant_is_custom_and_keeps_the_rest():
    p = mmaemu.get_preset("hopper").variant("hopper-frac16", frac=16, frac_out=16)
    assert (p.name, p.nfma, p.frac, p.frac_out, p.min_exp, p.late_c, p.slow_chunk) == \
        ("hopper-frac16", 32, 16, 16, -132, False, 128)
    assert (p.maturity, p.validated_scope, p.evidence) == ("custom", "", ())
    assert presets.HOPPER.frac == 13  # frozen: the shipped preset is untouched
    for name in ("hopper", "Blackwell", "sm_120"):
        with pytest.raises(ValueError, match="shipped preset"):
            presets.HOPPER.variant(name, frac=14)
    with pytest.raises(TypeError, match="multiple values"):
        presets.HOPPER.variant("x", name="y")
    with pytest.raises(ValueError, match="frac_out"):
        presets.HOPPER.variant("x", frac_out=24)


def test_profile_from_preset_keeps_the_platform():
    design = presets.HOPPER.variant("blocks64", nfma=64)
    profile = mmaemu.profile_from_preset(design)
    base = mmaemu.get_profile("hopper")
    assert profile.name == "blocks64@hopper" and profile.preset is design and profile.maturity == "custom"
    for field in ("gpu_name", "capability", "sm_count", "cublaslt_version", "caller", "workspace_bytes",
                  "splitk_table", "rejects", "splitk_maturity"):
        assert getattr(profile, field) == getattr(base, field), field
    assert profile.description == f"preset blocks64 on the platform of profile 'hopper' ({base.description}); " \
                                  "custom profile"
    assert isinstance(profile, mmaemu.Profile) and profile.base == "hopper"
    assert mmaemu.profile_from_preset("hopper").maturity == "validated"
    assert mmaemu.profile_from_preset("tcgen05_f8f6f4", base="ada", name="b200-arith").maturity == "experimental"
    assert mmaemu.get_profile(profile) is profile
    with pytest.raises(TypeError, match="profile_from_preset"):
        mmaemu.get_profile(design)
    with pytest.raises(KeyError):
        mmaemu.profile_from_preset(design, base="b300")


def test_profile_from_preset_runs_every_entry_point():
    """scaled_mm with the base's recorded split-K decision; the base's own preset gives the base's bits; the
    custom design warns custom and is a different arithmetic."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(48, 5760, generator=g) * 20).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(64, 5760, generator=g) * 20).clamp(-448, 448).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    call = dict(out_dtype=torch.float32, use_fast_accum=False)
    same = mmaemu.profile_from_preset("hopper")
    plan = mmaemu.explain(x, w.t(), one, one, profile=same, **call)
    assert plan.split.source == "table" and plan.split.S == 2 and plan.profile == "hopper@hopper"
    assert_bitwise_equal(mmaemu.scaled_mm(x, w.t(), one, one, profile=same, **call),
                         mmaemu.scaled_mm(x, w.t(), one, one, profile="hopper", **call))
    design = mmaemu.profile_from_preset(presets.HOPPER.variant("frac16-proto", frac=16, frac_out=16))
    with pytest.warns(mmaemu.ExperimentalPresetWarning, match="custom"):
        y = mmaemu.scaled_mm(x, w.t(), one, one, profile=design, **call)
    assert (y.view(torch.int32) != mmaemu.scaled_mm(x, w.t(), one, one, profile="hopper", **call)
            .view(torch.int32)).any()


def test_demo_compares_a_blackwell_profile_with_the_h100():
    import json

    from click.testing import CliRunner

    from mmaemu import cli

    args = ["demo", "--quick", "--profile", "hopper", "--profile", "sm120-mma-sync-experimental", "--json", "-"]
    result = CliRunner().invoke(cli.cli, args, catch_exceptions=False)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    rtx50 = data["profiles"]["sm120-mma-sync-experimental"]
    assert rtx50["splitk_stated"] and rtx50["split"]["S"] == 1 and rtx50["split"]["source"] == "explicit"
    assert rtx50["maturity"] == "experimental" and rtx50["gpu"] is None
    assert not data["profiles"]["hopper"]["splitk_stated"]
    assert data["versus_first"][0]["profiles"] == ["hopper", "sm120-mma-sync-experimental"]
    # 25 kept bits: far closer to the IEEE reference than the H100's 13 on the same GEMM
    assert rtx50["vs_ieee"]["differ"] < data["profiles"]["hopper"]["vs_ieee"]["differ"]
    text = CliRunner().invoke(cli.cli, args[:-2], catch_exceptions=False).stdout
    assert "stated by the demo: no split-K table for this profile" in text
    assert "hopper vs sm120-mma-sync-experimental:" in text
    bad = CliRunner().invoke(cli.cli, ["demo", "--quick", "--profile", "rtx5090"])
    assert bad.exit_code == 2 and "unknown profile" in bad.output


def test_a_design_profile_runs_in_layers_and_patches():
    """EmulatedFP8Linear keeps the profile object (its name is not listed) and mmaemu.patch takes it as it is."""
    from mmaemu.nn import EmulatedFP8Linear

    design = mmaemu.profile_from_preset(presets.HOPPER.variant("frac20-layer", frac=20, frac_out=20))
    torch.manual_seed(4)
    linear = torch.nn.Linear(256, 64, bias=False)
    layer = EmulatedFP8Linear.from_linear(linear, profile=design, splitk=1, out_dtype=torch.float32)
    assert layer.profile is design and "frac20-layer@hopper" in repr(layer)
    assert EmulatedFP8Linear.from_linear(linear, profile="ada").profile == "ada"
    x = torch.randn(5, 256)
    with torch.no_grad():
        y = layer(x)
    x8 = mmaemu.quantize_e4m3(x, mmaemu.quantize.amax_scale(x))
    want = mmaemu.scaled_mm(x8, layer.weight.t(), mmaemu.quantize.scale_inv(mmaemu.quantize.amax_scale(x)),
                            layer.weight_scale_inv, out_dtype=torch.float32, use_fast_accum=True, profile=design,
                            splitk=1)
    assert_bitwise_equal(y, want)
    with mmaemu.patch(profile=design, splitk=1) as log:
        got = torch._scaled_mm(x8, layer.weight.t(), mmaemu.quantize.scale_inv(mmaemu.quantize.amax_scale(x)),
                               layer.weight_scale_inv, out_dtype=torch.float32, use_fast_accum=True)
    assert_bitwise_equal(got, want)
    assert "profile=frac20-layer@hopper" in log.summary()
