"""Split-K decisions (platform.md section 3) against the recorded tables in data/splitk/."""

import dataclasses
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from mmaemu import warn
from mmaemu.errors import (SplitKUnknownError, UnsupportedFeatureError, UnvalidatedEnvelopeWarning,
                           UnverifiedSplitWarning)
from mmaemu.platform import heuristic
from mmaemu.platform.profiles import Profile, get_profile
from mmaemu.platform.splitk import (SplitDecision, SplitK, check_scheme_for_preset, layout_caveats,
                                    resolve_splitk)
from mmaemu.platform.tables import get_table

from fake_cublaslt import config, fake_api

DATA = Path(__file__).resolve().parents[1] / "data" / "splitk"
H100_ID, RTX_ID = "heur_h100pcie_lt12.8.3.14", "heur_rtx4060_lt12.8.3.14"
FMTS = ["e4m3", "e5m2"]
OUTS = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
MiB = 1 << 20

pytestmark = [pytest.mark.skipif(not (DATA / f"{H100_ID}.npz").exists(), reason="recorded tables not present"),
              pytest.mark.usefixtures("fresh_warnings")]  # tests/conftest.py


def meta_of(table_id):
    return json.loads((DATA / f"{table_id}.json").read_text())


@pytest.fixture(scope="module")
def recorded():
    """The original columns of both tables, loaded as the data README says (allow_pickle=False)."""
    out = {}
    for table_id in (H100_ID, RTX_ID):
        with np.load(DATA / f"{table_id}.npz", allow_pickle=False) as npz:
            out[table_id] = {k: npz[k].astype(np.int64) for k in npz.files}
    return out


def decide(profile, M, N, K, fa="e4m3", fb="e4m3", out="float32", fast=False, **kwargs):
    return resolve_splitk(M, N, K, a_dtype=fa, b_dtype=fb, out_dtype=out, use_fast_accum=fast, profile=profile,
                          **kwargs)


def quiet(profile, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return decide(profile, *args, **kwargs)


def caught_warnings(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [w for w in caught if issubclass(w.category, UnverifiedSplitWarning)]


def custom_profile(base, ws):
    return dataclasses.replace(get_profile(base), name=f"{base}-ws{ws}-test", workspace_bytes=ws)


# The profile answering each (table, workspace index); workspaces without a shipped profile use a copy.
PROFILE_OF = {
    (H100_ID, 0): "hopper-ws0", (H100_ID, 1): "hopper", (H100_ID, 2): ("hopper", 4 * MiB), (H100_ID, 3): "hopper-te",
    (RTX_ID, 0): "ada-ws0", (RTX_ID, 1): "ada", (RTX_ID, 2): "ada-te", (RTX_ID, 3): ("ada", 32 * MiB),
}


def profile_for(table_id, ws_index):
    spec = PROFILE_OF[(table_id, ws_index)]
    return get_profile(spec) if isinstance(spec, str) else custom_profile(*spec)


def expected_scheme(meta, S, custom):
    if S <= 1:
        return "none"
    codes = meta["codes"]
    return codes["custom -> scheme"].get(str(custom), codes.get("custom -> scheme, unlisted", "serial"))


# ---------------------------------------------------------------------------------------------------------------
# SplitK / SplitDecision values


def test_splitk_values():
    assert SplitK() == SplitK(1, "none")
    assert SplitK(np.int64(3), "serial").S == 3 and type(SplitK(np.int64(3), "serial").S) is int
    for S, scheme in [(2, "serial"), (2, "pairwise"), (24, "contiguous")]:
        assert SplitK(S, scheme).scheme == scheme
    with pytest.raises(dataclasses.FrozenInstanceError):
        SplitK().S = 2


@pytest.mark.parametrize("S, scheme", [(True, "none"), (0, "none"), (-1, "none"), (2.0, "serial"), ("2", "serial"),
                                       (1, "serial"), (2, "none"), (2, "tree"), (3, None)])
def test_splitk_refuses(S, scheme):
    with pytest.raises(ValueError):
        SplitK(S, scheme)


def test_split_decision():
    d = SplitDecision(2, "contiguous", "table", True, H100_ID, "n")
    assert d.splitk == SplitK(2, "contiguous")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.S = 1


# ---------------------------------------------------------------------------------------------------------------
# 3.1 Explicit


def test_explicit_one():
    for value in (1, np.int64(1), SplitK()):
        d = decide("hopper", 16, 256, 128, splitk=value)
        assert d == SplitDecision(1, "none", "explicit", True, None, "given by the caller")


def test_explicit_int_above_one_needs_a_scheme():
    with pytest.raises(ValueError, match=re.escape("(4, 'contiguous')")):
        decide("hopper", 16, 256, 128, splitk=4)
    with pytest.raises(ValueError, match=re.escape("(4, 'serial'|'pairwise')")):
        decide("ada", 16, 256, 128, splitk=4)


@pytest.mark.parametrize("value", [0, -2])
def test_explicit_int_below_one(value):
    with pytest.raises(ValueError):
        decide("hopper", 16, 256, 128, splitk=value)


@pytest.mark.parametrize("value", [True, False, "1", "none", "AUTO", [2, "serial"], (2,), (2, "serial", 1), 2.0, None])
def test_explicit_other_forms_are_type_errors(value):
    with pytest.raises(TypeError):
        decide("hopper", 16, 256, 128, splitk=value)


def test_explicit_tuple_bad_values():
    with pytest.raises(ValueError):
        decide("hopper", 16, 256, 128, splitk=(2, "none"))
    with pytest.raises(ValueError):
        decide("hopper", 16, 256, 128, splitk=(0, "contiguous"))


def _recorded_max_splits(table_id):
    """The largest numSplitsK of a table's rows and of its replayed live calls, read from the shipped json."""
    meta = meta_of(table_id)
    combos = json.loads((DATA / meta.get("verified_combos", "verified_split_combos.json")).read_text())["combos"]
    return max([S for s in meta["settings"] for S in s["S_values"]] + [c["S"] for c in combos])


def test_recorded_split_maxima():
    assert (_recorded_max_splits(H100_ID), _recorded_max_splits(RTX_ID)) == (24, 32)
    assert (get_table(H100_ID).max_recorded_splits, get_table(RTX_ID).max_recorded_splits) == (24, 32)


@pytest.mark.parametrize("profile,K,scheme,bound", [
    ("hopper", 384, "contiguous", 24),  # 3 k-tiles: the recorded maximum of the H100 (empty splits allowed)
    ("hopper", 128 * 40, "contiguous", 40),  # 40 k-tiles of 128: one per split
    ("ada", 384, "serial", 32),  # 6 k-tiles of 64: the recorded maximum of the RTX 4060
    ("ada", 64 * 33 + 1, "pairwise", 34),  # 34 k-tiles (the last one ragged)
    ("hopper-experimental", 256, "contiguous", 32),  # no recordings of its own: the largest of any reference GPU
])
def test_explicit_split_count_is_bounded_by_k_tiles_or_the_recorded_maximum(profile, K, scheme, bound):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert decide(profile, 16, 256, K, splitk=(bound, scheme)).S == bound
    with pytest.raises(ValueError, match=rf"at most {bound} .*k-tiles") as info:
        decide(profile, 16, 256, K, splitk=(bound + 1, scheme))
    assert f"splitk=({bound + 1}, '{scheme}')" in str(info.value)


@pytest.mark.parametrize("S", [2**40, 2**63, 2**64 + 3])
def test_absurd_split_counts_are_refused_at_once(S):
    import torch

    import mmaemu

    with pytest.raises(ValueError, match="k-tiles"):
        decide("hopper", 16, 256, 1024, splitk=(S, "contiguous"))
    a = torch.zeros(16, 1024, dtype=torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    plan = mmaemu.explain(a, a[:32].t(), one, one, splitk=(S, "contiguous"))
    assert plan.validation[0] == "ValueError" and "k-tiles" in plan.validation[1]
    with pytest.raises(ValueError, match="k-tiles"):
        mmaemu.accumulate(a, a, use_fast_accum=True, profile="ada", splitk=(S, "serial"))


def test_explicit_verified_combination_is_silent():
    d, caught = caught_warnings(decide, "hopper", 48, 64, 5760, splitk=(2, "contiguous"))
    assert (d.S, d.scheme, d.source, d.verified, d.table_id) == (2, "contiguous", "explicit", True, None)
    assert caught == []


def test_explicit_empty_split_caveat():
    d, caught = caught_warnings(decide, "hopper", 16, 256, 384, splitk=(4, "contiguous"))
    assert d.verified is False
    assert d.note == "given by the caller; S = 4 leaves a split without k-tiles (K = 384, 3 k-tiles; never recorded)"
    assert len(caught) == 1 and "never recorded" in str(caught[0].message)


def test_explicit_unreplayed_combination_warns_and_is_not_checked_against_the_preset():
    d, caught = caught_warnings(decide, "hopper", 16, 256, 4096, splitk=(2, "serial"))  # the planner refuses it
    assert (d.S, d.scheme, d.verified) == (2, "serial", False)
    assert len(caught) == 1 and "never replayed" in str(caught[0].message)


def test_explicit_h100_contiguous_beyond_262144_is_silent():
    # Peer exception (3.1): no live split call had K > 262,144; still no warning (ragged K is validated on H100).
    d, caught = caught_warnings(decide, "hopper", 16, 256, 300_000, splitk=(2, "contiguous"))
    assert d.verified is True and caught == []


def test_explicit_wins_over_workspace0_and_missing_table():
    assert decide("hopper-ws0", 16, 256, 4096, splitk=(2, "contiguous")).source == "explicit"
    d, caught = caught_warnings(decide, "hopper-experimental", 16, 256, 4096, splitk=(2, "contiguous"))
    assert (d.source, d.verified) == ("explicit", False) and len(caught) == 1
    assert decide("b200-mma-sync-experimental", 16, 256, 4096, splitk=1).verified is True


def test_explicit_on_experimental_split_profile_warns_even_if_verified():
    d, caught = caught_warnings(decide, "ada-te", 1, 16, 16, splitk=(3, "pairwise"))
    assert d.verified is True and len(caught) == 1 and "experimental" in str(caught[0].message)


def test_ragged_k_caveat_without_verified_ragged_layouts():
    assert layout_caveats(2, "contiguous", 200, ragged_k_verified=True) == []
    assert layout_caveats(2, "contiguous", 200, ragged_k_verified=False) == [
        "K = 200 is not a multiple of 128 (ragged last k-tile; never recorded)"]
    assert layout_caveats(7, "contiguous", 384, True) == [
        "S = 7 leaves a split without k-tiles (K = 384, 3 k-tiles; never recorded)"]
    assert layout_caveats(4, "serial", 384, False) == [] and layout_caveats(1, "none", 7, False) == []


# ---------------------------------------------------------------------------------------------------------------
# 3.2 / 3.3


def test_workspace0_notes():
    d = decide("hopper-ws0", 48, 64, 5760)
    assert d == SplitDecision(1, "none", "workspace0", True, H100_ID, meta_of(H100_ID)["workspace0_note"])
    d = decide("ada-ws0", 1, 16, 16)
    assert (d.S, d.source, d.table_id) == (1, "workspace0", RTX_ID) and "209,712" in d.note


@pytest.mark.parametrize("name", ["hopper-experimental", "b200-mma-sync-experimental"])
def test_no_table_is_unknown(name):
    with pytest.raises(SplitKUnknownError, match="no reference platform and no split-K table") as info:
        decide(name, 16, 256, 4096)
    assert "splitk=1" in str(info.value)
    with pytest.raises(SplitKUnknownError):  # 3.3 order: no table before zero size
        decide(name, 0, 256, 4096)


@pytest.mark.parametrize("shape", [(0, 5, 7), (5, 0, 7), (5, 7, 0)])
def test_zero_size(shape):
    d = decide("hopper", *shape)
    assert d == SplitDecision(1, "none", "envelope", True, H100_ID, "zero-size GEMM: nothing is accumulated")


# ---------------------------------------------------------------------------------------------------------------
# 3.4 Table rows: the decisions of a large sample equal the recorded S and scheme, every table and workspace


@pytest.mark.parametrize("table_id", [H100_ID, RTX_ID])
@pytest.mark.parametrize("ws_index", [0, 1, 2, 3])
def test_sampled_rows_decide_as_recorded(recorded, table_id, ws_index):
    cols, meta = recorded[table_id], meta_of(table_id)
    profile = profile_for(table_id, ws_index)
    assert profile.workspace_bytes == meta["codes"]["ws"][ws_index]
    rows = np.flatnonzero(cols["ws"] == ws_index)
    split = rows[cols["splitK"][rows] > 1]
    rng = np.random.default_rng(1000 + ws_index)
    sample = np.concatenate([rng.choice(rows, 2500, replace=False),
                             rng.choice(split, min(600, len(split)), replace=False)])
    assert ws_index != 0 or len(split) == 0  # workspace 0 never split
    for i in sample:
        M, N, K = int(cols["M"][i]), int(cols["N"][i]), int(cols["K"][i])
        fa, fb, out, fast = FMTS[cols["fa"][i]], FMTS[cols["fb"][i]], OUTS[cols["out"][i]], bool(cols["fast"][i])
        d = quiet(profile, M, N, K, fa, fb, out, fast)
        S = int(cols["splitK"][i])
        assert (d.S, d.scheme) == (S, expected_scheme(meta, S, int(cols["custom"][i]))), (M, N, K, fa, fb, out, fast)
        assert d.source == ("workspace0" if ws_index == 0 else "table")
        assert d.table_id == table_id


# ---------------------------------------------------------------------------------------------------------------
# Worked examples (platform.md 3.4, 3.9, data README section 3)


def test_example_hopper_split_row():
    d, caught = caught_warnings(decide, "hopper", 48, 64, 5760, "e4m3", "e4m3", "float32", False)
    assert (d.S, d.scheme, d.source, d.verified, d.table_id) == (2, "contiguous", "table", True, H100_ID)
    assert d.note.endswith("numSplitsK 2, customOption 3") and caught == []


def test_example_hopper_unsplit_row():
    d = decide("hopper", 2048, 5760, 1920, "e4m3", "e4m3", "bfloat16", True)
    assert d == SplitDecision(1, "none", "table", True, H100_ID,
                              "table row: algo 66, tile 209, numSplitsK 1, customOption 4")


@pytest.mark.parametrize("profile, M, N, K, out, fast, S, scheme", [
    ("ada", 16, 240, 16384, "float32", True, 6, "serial"),
    ("ada", 1, 16, 16, "float32", False, 3, "pairwise"),
    ("ada", 1, 512, 8192, "bfloat16", False, 2, "serial"),
])
def test_examples_ada_rows(profile, M, N, K, out, fast, S, scheme):
    d, caught = caught_warnings(decide, profile, M, N, K, "e4m3", "e4m3", out, fast)
    assert (d.S, d.scheme, d.source, d.verified) == (S, scheme, "table", True) and caught == []


def test_example_ada_custom2_is_serial():
    assert "customOption 2" in decide("ada", 1, 512, 8192, out="bfloat16").note


def test_example_ada_te_warns():
    d, caught = caught_warnings(decide, "ada-te", 12, 512, 8192, "e4m3", "e4m3", "float32", True)
    assert (d.S, d.scheme, d.source) == (3, "serial", "table")
    assert len(caught) == 1 and caught[0].category is UnverifiedSplitWarning


def test_example_hopper_te_unlisted_custom_option():
    d, caught = caught_warnings(decide, "hopper-te", 105, 8192, 28672, "e4m3", "e5m2", "float8_e4m3fn", False)
    assert (d.S, d.scheme, d.source, d.verified) == (2, "contiguous", "table", False)
    assert "customOption 4 was never recorded on a split call (recorded: 0, 1, 2, 3)" in d.note
    assert len(caught) == 1 and "customOption 4" in str(caught[0].message)
    # out_dtype None means a_dtype
    assert quiet("hopper-te", 105, 8192, 28672, "e4m3", "e5m2", None, False) == d


def test_example_hopper_envelope():
    d = decide("hopper", 1000, 1000, 4096, "e4m3", "e4m3", "bfloat16", True)
    assert (d.S, d.scheme, d.source, d.verified, d.table_id) == (1, "none", "envelope", True, H100_ID)
    with pytest.raises(SplitKUnknownError):
        decide("hopper", 100, 100, 4096, "e4m3", "e4m3", "bfloat16", True)


def test_example_ada_envelope():
    d = decide("ada", 300, 1000, 777, "e4m3", "e4m3", "float32", True)
    assert (d.S, d.source, d.verified) == (1, "envelope", True)
    assert "2 x 100,352 = 200,704" in d.note
    with pytest.raises(SplitKUnknownError):
        decide("ada", 300, 300, 777, "e4m3", "e4m3", "float32", True)


def test_example_ada_e4m3_out_bound():
    setting = next(s for s in meta_of(RTX_ID)["settings"] if (s["ws"], s["out"], s["fast"], s["fmt_a"], s["fmt_b"])
                   == (MiB, "float8_e4m3fn", True, "e4m3", "e4m3"))
    assert 2 * setting["max_split_MN"] == 262_144


def test_example_default_profile_small_k(monkeypatch):
    monkeypatch.delenv("MMAEMU_PROFILE", raising=False)
    with pytest.raises(SplitKUnknownError) as info:
        decide(None, 16, 256, 128)
    message = str(info.value)
    for part in ("M=16, N=256, K=128", "'hopper'", "K = 128 is outside the envelope's K range", "splitk=1",
                 "(S, 'contiguous')", "NVIDIA H100 PCIe"):
        assert part in message


def test_unknown_error_names_the_presets_schemes():
    with pytest.raises(SplitKUnknownError, match=re.escape("(S, 'serial'|'pairwise')")):
        decide("ada", 300, 300, 777, fast=True)


# ---------------------------------------------------------------------------------------------------------------
# 3.9 Envelopes: decisions just above and at each bound, bounds read from the json


def absent_key(table, M, N, K, fa, fb, out, fast, ws):
    if table.lookup(M, N, K, fa, fb, out, fast, ws) is None:
        return M, N
    assert table.lookup(N, M, K, fa, fb, out, fast, ws) is None
    return N, M


def test_k_grid_envelope_bounds():
    meta, table = meta_of(H100_ID), get_table(H100_ID)
    env = meta["envelope"]
    grid = env["K_grid"]
    profiles = {MiB: get_profile("hopper"), 32 * MiB: get_profile("hopper-te")}
    assert len(env["bounds"]) == 60
    for entry in env["bounds"]:
        profile = profiles[entry["ws"]]
        setting = (entry["fmt_a"], entry["fmt_b"], entry["out"], entry["fast"])
        validated = env["validation"][str(entry["ws"])]["status"] == "validated"
        for i, B in enumerate(entry["B"]):
            for K in {grid[i], grid[i - 1] + 1 if i else grid[0]}:  # K rounds up to grid[i]
                M, N = absent_key(table, 1, B + 1, K, *setting, entry["ws"])
                d = quiet(profile, M, N, K, *setting)
                assert (d.S, d.source, d.verified) == (1, "envelope", validated), (entry, K)
                M, N = absent_key(table, 1, B, K, *setting, entry["ws"])
                with pytest.raises(SplitKUnknownError, match="not above the envelope bound"):
                    quiet(profile, M, N, K, *setting)


def test_k_grid_envelope_k_range():
    env = meta_of(H100_ID)["envelope"]
    big = 10**7
    assert decide("hopper", 1, big, env["K_min"] + 1).source == "envelope"
    assert decide("hopper", 1, big, env["K_max"]).source == "envelope"
    for K in (env["K_min"] - 1, env["K_max"] + 1):
        with pytest.raises(SplitKUnknownError, match="outside the envelope's K range"):
            decide("hopper", 1, big, K)


def test_k_grid_envelope_1mib_values_from_the_spec():
    # platform.md 3.9: the 1 MiB bounds as K ranges (K rounded up to the grid)
    recorded_ks = set(meta_of(H100_ID)["K_grid"])
    for K, out, pair, B in [(5000, "float32", ("e4m3", "e4m3"), 15360), (5121, "float32", ("e4m3", "e4m3"), 256642),
                            (8193, "float32", ("e4m3", "e4m3"), 268004), (5744, "bfloat16", ("e5m2", "e4m3"), 235342),
                            (5745, "bfloat16", ("e5m2", "e4m3"), 256642),
                            (5744, "float8_e4m3fn", ("e4m3", "e4m3"), 245760),
                            (2_000_000, "float8_e5m2", ("e4m3", "e4m3"), 15360)]:
        assert K not in recorded_ks
        assert decide("hopper", 1, B + 1, K, *pair, out, True).source == "envelope"
        with pytest.raises(SplitKUnknownError):
            decide("hopper", 1, B, K, *pair, out, True)


def test_k_grid_envelope_has_no_bound_for_4mib():
    with pytest.raises(SplitKUnknownError, match="no bound for the setting"):
        decide(custom_profile("hopper", 4 * MiB), 1, 10**7, 4096)


def rtx_absent_k(recorded):
    ks = set(np.unique(recorded[RTX_ID]["K"]).tolist())
    return next(k for k in range(1000, 2000) if k not in ks)


def test_max_split_mn_envelope_bounds(recorded):
    K = rtx_absent_k(recorded)
    profiles = {MiB: get_profile("ada"), 4 * MiB: get_profile("ada-te"), 32 * MiB: custom_profile("ada", 32 * MiB)}
    for s in meta_of(RTX_ID)["settings"]:
        if s["ws"] == 0:
            continue
        setting = (s["fmt_a"], s["fmt_b"], s["out"], s["fast"])
        profile = profiles[s["ws"]]
        if not s["split_rows"]:
            assert decide(profile, 1, 1, K, *setting).source == "envelope"
            continue
        bound = 2 * s["max_split_MN"]
        d = decide(profile, 1, bound + 1, K, *setting)
        assert (d.S, d.scheme, d.source, d.verified) == (1, "none", "envelope", True)
        assert "[setting entry" in d.note
        with pytest.raises(SplitKUnknownError, match="not above the inference bound"):
            decide(profile, 1, bound, K, *setting)


def test_max_split_mn_union_fallback(recorded):
    K = rtx_absent_k(recorded)
    settings = meta_of(RTX_ID)["settings"]
    key = lambda s: (s["ws"], s["out"], s["fast"], s["fmt_a"], s["fmt_b"])  # noqa: E731
    assert (MiB, "float8_e5m2", True, "e4m3", "e4m3") not in {key(s) for s in settings}
    union = [s for s in settings if (s["ws"], s["fast"], s["fmt_a"], s["fmt_b"]) == (MiB, True, "e4m3", "e4m3")]
    bound = 2 * max(s["max_split_MN"] for s in union if s["split_rows"])
    d = decide("ada", 1, bound + 1, K, "e4m3", "e4m3", "float8_e5m2", True)
    assert d.source == "envelope" and "union" in d.note
    with pytest.raises(SplitKUnknownError):
        decide("ada", 1, bound, K, "e4m3", "e4m3", "float8_e5m2", True)
    with pytest.raises(SplitKUnknownError, match="no rows for this setting"):
        decide("ada", 1000, 1000, K, "e5m2", "e5m2", "float32", True)


# ---------------------------------------------------------------------------------------------------------------
# Strict mode


def test_strict_mode(monkeypatch):
    monkeypatch.setenv("MMAEMU_SPLITK_STRICT", "1")
    for profile, args in [("hopper", (1000, 1000, 4096)), ("ada", (300, 1000, 777))]:
        with pytest.raises(SplitKUnknownError, match="strict mode"):
            decide(profile, *args, fast=True)
        assert decide(profile, *args, fast=True, strict=False).source == "envelope"
    # tables, workspace 0, explicit splits and zero sizes are unaffected
    assert decide("hopper", 48, 64, 5760).source == "table"
    assert decide("hopper-ws0", 1000, 1000, 4096).source == "workspace0"
    assert decide("hopper", 1000, 1000, 4096, splitk=1).source == "explicit"
    for value in ("true", "Yes", "ON"):  # one boolean parser (issue 23.14): not only "1"
        monkeypatch.setenv("MMAEMU_SPLITK_STRICT", value)
        with pytest.raises(SplitKUnknownError, match="strict mode"):
            decide("hopper", 1000, 1000, 4096, fast=True)
    for value in ("0", "false", "off"):
        monkeypatch.setenv("MMAEMU_SPLITK_STRICT", value)
        assert decide("hopper", 1000, 1000, 4096, fast=True).source == "envelope"
    monkeypatch.setenv("MMAEMU_SPLITK_STRICT", "maybe")  # not a boolean: refused, never silently not strict
    with pytest.raises(ValueError, match="MMAEMU_SPLITK_STRICT='maybe'"):
        decide("hopper", 1000, 1000, 4096, fast=True)
    monkeypatch.delenv("MMAEMU_SPLITK_STRICT")
    with pytest.raises(SplitKUnknownError, match="strict mode"):
        decide("hopper", 1000, 1000, 4096, fast=True, strict=True)


# ---------------------------------------------------------------------------------------------------------------
# Layouts (section 2)


def test_non_standard_layout_skips_the_table():
    assert decide("hopper", 48, 64, 5760).source == "table"
    with pytest.raises(SplitKUnknownError, match="non-standard layout"):
        decide("hopper", 48, 64, 5760, layout_std=False)
    d = decide("hopper", 2048, 5760, 1920, out="bfloat16", fast=True, layout_std=False)
    assert d.source == "envelope"


def test_column_major_out_key_swap_is_the_callers(recorded):
    """A column-major out= of shape [M, N] is looked up as (N, M, K, fmt of mat2, fmt of mat1): the caller swaps."""
    cols = recorded[H100_ID]
    table = get_table(H100_ID)
    picks = np.flatnonzero((cols["ws"] == 1) & (cols["splitK"] > 1) & (cols["fa"] != cols["fb"])
                           & (cols["M"] != cols["N"]))
    found = 0
    for i in picks:
        M, N, K = int(cols["M"][i]), int(cols["N"][i]), int(cols["K"][i])
        fa, fb, out, fast = FMTS[cols["fa"][i]], FMTS[cols["fb"][i]], OUTS[cols["out"][i]], bool(cols["fast"][i])
        transposed = table.lookup(N, M, K, fb, fa, out, fast, MiB)
        if transposed is None or transposed.splitK == cols["splitK"][i]:
            continue
        # The call: result [N, M] with mat1 of fb and mat2 of fa, written to a column-major out → key (M, N, fa, fb).
        call_M, call_N, call_a, call_b = N, M, fb, fa
        d = decide("hopper", call_N, call_M, K, call_b, call_a, out, fast)  # swapped by the caller
        assert d.S == cols["splitK"][i]
        assert decide("hopper", call_M, call_N, K, call_a, call_b, out, fast).S == transposed.splitK != d.S
        found += 1
        if found == 5:
            break
    assert found == 5


# ---------------------------------------------------------------------------------------------------------------
# Warnings: once per process per key; collected (not emitted, no slot used) inside warn.collecting()


WARNING_TEXT = re.compile(r"^mmaemu split-K S=\d+ scheme=\w+ \((fast|slow) accumulation, out \w+, e\dm\dxe\dm\d, "
                          r"source [\w-]+, profile [\w-]+\): .+")


def test_unverified_warning_once_per_key():
    _, first = caught_warnings(decide, "ada-te", 12, 512, 8192, fast=True)
    _, second = caught_warnings(decide, "ada-te", 12, 512, 8192, fast=True)
    assert len(first) == 1 and second == []
    assert WARNING_TEXT.match(str(first[0].message)), str(first[0].message)
    assert str(first[0].message).startswith("mmaemu split-K S=3 scheme=serial (fast accumulation, out float32, "
                                            "e4m3xe4m3, source table, profile ada-te): ")


def test_collecting_records_every_time_and_keeps_the_slot():
    for _ in range(3):
        with warn.collecting() as sink:
            _, caught = caught_warnings(decide, "ada-te", 12, 512, 8192, fast=True)
        assert caught == [] and len(sink) == 1 and sink[0].category is UnverifiedSplitWarning
    _, caught = caught_warnings(decide, "ada-te", 12, 512, 8192, fast=True)
    assert len(caught) == 1 and str(caught[0].message) == sink[0].message  # the slot was still free
    _, caught = caught_warnings(decide, "ada-te", 12, 512, 8192, fast=True)
    assert caught == []


def test_no_warning_for_unsplit_decisions_on_experimental_profiles():
    d, caught = caught_warnings(decide, "ada-te", 2000, 2000, 777, fast=True)
    assert d.S == 1 and caught == []


def test_unvalidated_envelope_warning_once_per_setting():
    _, first = caught_warnings(decide, "hopper-te", 1000, 1000, 4096, out="bfloat16", fast=True)
    _, same_setting = caught_warnings(decide, "hopper-te", 2000, 1000, 8000, out="bfloat16", fast=True)
    _, other_out = caught_warnings(decide, "hopper-te", 1000, 1000, 4096, out="float16", fast=True)
    assert len(first) == 1 and first[0].category is UnvalidatedEnvelopeWarning
    assert same_setting == [] and len(other_out) == 1
    assert "77,518" in str(first[0].message)
    with warn.collecting() as collected:
        d, caught = caught_warnings(decide, "hopper-te", 1000, 1000, 4096, out="bfloat16", fast=True)
    assert d.verified is False and caught == [] and len(collected) == 1
    _, caught = caught_warnings(decide, "hopper", 1000, 1000, 4096, out="bfloat16", fast=True)
    assert caught == []  # 1 MiB envelope validated: silent


# ---------------------------------------------------------------------------------------------------------------
# Argument normalisation


def test_torch_dtypes_are_accepted():
    torch = pytest.importorskip("torch")
    d = resolve_splitk(48, 64, 5760, a_dtype=torch.float8_e4m3fn, b_dtype=torch.float8_e4m3fn,
                       out_dtype=torch.float32, use_fast_accum=np.bool_(False), profile=get_profile("hopper"))
    assert (d.S, d.scheme) == (2, "contiguous")


@pytest.mark.parametrize("kwargs, error", [
    (dict(out_dtype="int8"), TypeError), (dict(out_dtype="fp32"), TypeError),
    (dict(a_dtype="float8_e4m3fnuz"), TypeError), (dict(b_dtype="float16"), TypeError),
    (dict(use_fast_accum=1), TypeError), (dict(M=-1), ValueError), (dict(K=2.0), TypeError),
    (dict(profile="nope"), KeyError),
])
def test_argument_errors(kwargs, error):
    args = dict(M=48, N=64, K=5760, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                profile="hopper")
    args.update(kwargs)
    M, N, K = args.pop("M"), args.pop("N"), args.pop("K")
    with pytest.raises(error):
        resolve_splitk(M, N, K, **args)


def test_profile_from_environment(monkeypatch):
    monkeypatch.setenv("MMAEMU_PROFILE", "ada")
    assert decide(None, 1, 16, 16).table_id == RTX_ID


# ---------------------------------------------------------------------------------------------------------------
# Scheme / preset compatibility (semantics.md d.3), used by the planner


def test_check_scheme_for_preset():
    from mmaemu.model.presets import HOPPER, Preset

    check_scheme_for_preset(SplitK(2, "contiguous"), "hopper")
    check_scheme_for_preset(SplitK(2, "serial"), "ada")
    check_scheme_for_preset(SplitK(2, "pairwise"), "ada")
    check_scheme_for_preset(SplitK(), "b200_mma_sync")
    check_scheme_for_preset(SplitDecision(1, "none", "table", True, None, ""), "hopper")
    for bad, preset in [(SplitK(2, "serial"), "hopper"), (SplitK(2, "pairwise"), "hopper"),
                        (SplitK(2, "contiguous"), "ada")]:
        with pytest.raises(ValueError):
            check_scheme_for_preset(bad, preset)
    with pytest.raises(UnsupportedFeatureError):
        check_scheme_for_preset(SplitK(2, "contiguous"), "b200_mma_sync")
    copy = dataclasses.replace(HOPPER)  # same name, not the registered object: custom
    custom = Preset("mine", nfma=8, frac=10, frac_out=10, min_exp=-126, late_c=False, slow_chunk=64)
    for preset in (copy, custom):
        for scheme in ("serial", "pairwise", "contiguous"):
            check_scheme_for_preset(SplitK(3, scheme), preset)
    with pytest.raises(TypeError):
        check_scheme_for_preset((2, "contiguous"), "hopper")


def test_one_owner_of_the_accepted_schemes_and_of_the_no_gemm_level_refusal():
    import torch

    import mmaemu
    from mmaemu.arith.params import schedule_params
    from mmaemu.model.presets import SPLIT_SCHEMES, get_preset, split_schemes
    from mmaemu.platform import splitk

    assert splitk.SCHEMES == ("none",) + SPLIT_SCHEMES and splitk.SPLIT_SCHEMES == SPLIT_SCHEMES
    assert split_schemes(get_preset("hopper")) == ("contiguous",)
    assert split_schemes(get_preset("ada")) == ("serial", "pairwise")
    b200 = get_preset("b200_mma_sync", warn=False)
    split_text = "preset 'b200_mma_sync' has no characterised GEMM level: split-K (S=2) is not modelled for it; " \
                 "use splitk=1"
    slow_text = "preset 'b200_mma_sync' has no characterised GEMM level: slow accumulation (use_fast_accum=False) " \
                "is not modelled for it; use use_fast_accum=True"
    with pytest.raises(UnsupportedFeatureError) as planned:
        check_scheme_for_preset(SplitK(2, "contiguous"), b200)
    with pytest.raises(UnsupportedFeatureError) as engine:
        schedule_params(b200, 256, True, 2, "contiguous")
    assert str(planned.value) == str(engine.value) == split_text
    with pytest.raises(UnsupportedFeatureError) as engine:
        schedule_params(b200, 256, False, 2, "contiguous")
    x = torch.zeros(16, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(UnsupportedFeatureError) as api, warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        mmaemu.accumulate(x, x, use_fast_accum=False, profile="b200-mma-sync-experimental", splitk=1)
    assert str(api.value) == str(engine.value) == slow_text


# ---------------------------------------------------------------------------------------------------------------
# 3.5 Live query through a fake of NVIDIA's cuBLASLt bindings


def answering(status=0, **cfg):
    """A fake API whose heuristic answers every problem with one configuration (or a status)."""
    return fake_api(lambda problem: (status, None if status else config(**cfg)))


def test_query_descriptor_torch_profile():
    api = answering(splitK=3, custom=2, algo=66, tile=17)
    query = heuristic.build_query(100, 200, 4096, "e4m3", "e5m2", "bfloat16", True, MiB, None)
    answer = heuristic.query_heuristic(api, query, 0xABC0)
    assert answer == heuristic.HeuristicAnswer(algo=66, tile=17, splitK=3, custom=2, stages=36, reduction=2)
    (problem,) = api.lt.problems
    assert (problem["compute"], problem["scale"]) == ("COMPUTE_32F", "CUDA_R_32F")
    assert {k: problem[k] for k in ("TRANSA", "TRANSB", "A_SCALE_POINTER", "B_SCALE_POINTER", "FAST_ACCUM")} == {
        "TRANSA": "T", "TRANSB": "N", "A_SCALE_POINTER": 0xABC0, "B_SCALE_POINTER": 0xABC0, "FAST_ACCUM": 1}
    assert set(problem) == {"compute", "scale", "TRANSA", "TRANSB", "A_SCALE_POINTER", "B_SCALE_POINTER",
                            "FAST_ACCUM", "a", "b", "c", "d", "pref", "count"}  # no D scale, SM target, epilogue
    # A = mat2 (e5m2, K x N, ld K), B = mat1 (e4m3, K x M, ld K), C = D = bf16, N x M, ld N
    assert [problem[x] for x in "abcd"] == [("CUDA_R_8F_E5M2", 4096, 200, 4096), ("CUDA_R_8F_E4M3", 4096, 100, 4096),
                                            ("CUDA_R_16BF", 200, 100, 200), ("CUDA_R_16BF", 200, 100, 200)]
    assert problem["pref"] == {"MAX_WORKSPACE_BYTES": MiB}  # torch sets no alignment preference
    assert problem["count"] == 1
    assert sorted(api.lt.destroyed) == sorted(api.lt.objects)  # every handle, layout, descriptor destroyed


def test_query_descriptor_te_profile_and_fp8_output():
    api = answering()
    profile = get_profile("hopper-te")
    query = heuristic.build_query(8, 16, 1024, "e5m2", "e4m3", "float8_e4m3fn", False, profile.workspace_bytes,
                                  profile.align)
    heuristic.query_heuristic(api, query, 0x10)
    (problem,) = api.lt.problems
    assert [problem["c"], problem["d"]] == [("CUDA_R_16F", 16, 8, 16), ("CUDA_R_8F_E4M3", 16, 8, 16)]
    assert problem["FAST_ACCUM"] == 0
    assert problem["pref"] == {"MAX_WORKSPACE_BYTES": 32 * MiB, "MIN_ALIGNMENT_A_BYTES": 256,
                               "MIN_ALIGNMENT_B_BYTES": 256, "MIN_ALIGNMENT_C_BYTES": 256,
                               "MIN_ALIGNMENT_D_BYTES": 256}


def test_query_without_answer():
    query = heuristic.build_query(1, 2, 3, "e4m3", "e4m3", "float32", False, MiB, None)
    assert heuristic.query_heuristic(answering(status=15), query, 0x10) is None
    assert heuristic.query_heuristic(fake_api(lambda problem: (0, None)), query, 0x10) is None
    with heuristic.HeuristicSession(answering(status=15), 0x10) as session:
        assert session.ask(query) == (15, None)


def test_a_session_reuses_descriptors_and_preferences():
    api = answering()
    with heuristic.HeuristicSession(api, 0x10) as session:
        for M in (16, 32):
            for fast in (False, True):
                for ws in (MiB, 32 * MiB):
                    session.ask(heuristic.build_query(M, 64, 1024, "e4m3", "e4m3", "float32", fast, ws, None))
            session.forget_layouts()
        assert len(api.lt.live("desc")) == 2 and len(api.lt.live("pref")) == 2 and not api.lt.live("layout")
    assert sorted(api.lt.destroyed) == sorted(api.lt.objects)


@pytest.fixture
def on_reference_gpu(monkeypatch):
    """Pretend the current device is every profile's reference GPU, with fake cuBLASLt bindings."""
    state = {"api": answering()}
    monkeypatch.setattr(Profile, "matches_device", lambda self, device=None, *, context=None: True)
    monkeypatch.setattr(heuristic, "nvmath_api", lambda: state["api"])
    monkeypatch.setattr(heuristic, "device_scale_pointer", lambda: 0x1000)
    return state


def test_live_query_decides_when_the_table_has_no_row(on_reference_gpu):
    on_reference_gpu["api"] = api = answering(splitK=3, custom=2, tile=40)
    d, caught = caught_warnings(decide, "hopper", 100, 100, 4096, out="bfloat16", fast=True)
    assert (d.S, d.scheme, d.source, d.table_id) == (3, "contiguous", "live-query", None)
    assert d.note == "live cuBLASLt query on NVIDIA H100 PCIe: algo 66, tile 40, numSplitsK 3, customOption 2"
    assert d.verified == get_table(H100_ID).is_verified(True, 3, "contiguous", "bfloat16", "e4m3", "e4m3")
    (problem,) = api.lt.problems
    assert problem["pref"] == {"MAX_WORKSPACE_BYTES": MiB} and problem["a"] == ("CUDA_R_8F_E4M3", 4096, 100, 4096)


def test_live_query_unlisted_custom_option(on_reference_gpu):
    on_reference_gpu["api"] = answering(splitK=2, custom=5)
    d, caught = caught_warnings(decide, "hopper-te", 100, 100, 4096)
    assert (d.S, d.scheme, d.source, d.verified) == (2, "contiguous", "live-query", False)
    assert "customOption 5 was never recorded" in d.note and len(caught) == 1


def test_live_query_ada_mapping(on_reference_gpu):
    for custom, scheme in [(0, "serial"), (1, "pairwise"), (2, "serial"), (7, "serial")]:
        on_reference_gpu["api"] = answering(splitK=4, custom=custom, algo=60)
        d = quiet("ada", 300, 300, 777, fast=True)
        assert (d.S, d.scheme, d.source) == (4, scheme, "live-query")
        assert "was never recorded" not in d.note  # the RTX json has no "unlisted" rule
    on_reference_gpu["api"] = api = answering(splitK=1, custom=0)
    assert decide("ada-te", 300, 300, 777).splitk == SplitK()
    assert api.lt.problems[0]["pref"]["MAX_WORKSPACE_BYTES"] == 4 * MiB
    assert api.lt.problems[0]["pref"]["MIN_ALIGNMENT_A_BYTES"] == 256


def test_live_query_failures_fall_through(on_reference_gpu):
    on_reference_gpu["api"] = answering(status=15)
    assert decide("hopper", 1000, 1000, 4096).source == "envelope"
    with pytest.raises(SplitKUnknownError):
        decide("hopper", 100, 100, 4096)


def test_live_query_is_not_asked_when_the_table_answers_or_the_layout_is_padded(on_reference_gpu):
    api = on_reference_gpu["api"] = answering(splitK=9, custom=0)
    assert decide("hopper", 48, 64, 5760).source == "table"
    assert decide("hopper", 1000, 1000, 4096, layout_std=False).source == "envelope"
    assert decide("hopper-ws0", 1000, 1000, 4096).source == "workspace0"
    assert api.lt.problems == [] and api.lt.objects == {}


def test_no_live_query_here():
    assert get_profile("hopper").matches_device() is False
    assert get_profile("ada").matches_device() is False


def test_combine_steps_follow_the_serial_and_pairwise_orders():
    """combine_step (which every engine walks) against the orders of semantics.md d.1/d.2 written out here:
    serial acc = ((0 + p0) + p1) + ...; pairwise acc = p[S-1], then slot = p[q] (+ p[q+h] if q + h < S - 1),
    acc = acc + slot for q < h = ceil(S/2). Also: every partial exactly once."""
    from mmaemu.arith.schedule import ACC_ADD, ACC_SET, SLOT_ADD, SLOT_SET, combine, combine_step

    for S in range(1, 26):
        serial = [tuple(int(v) for v in combine_step(S, 0, i)) for i in range(S)]
        assert serial == [(i, ACC_ADD, 0) for i in range(S)]
        pairwise = [tuple(int(v) for v in combine_step(S, 1, i)) for i in range(S)]
        if S == 1:
            assert pairwise == [(0, ACC_ADD, 0)]
            continue
        h = (S + 1) // 2
        want = [(S - 1, ACC_SET, 0)]
        for q in range(h):
            want += [(q, SLOT_SET, 0), (q + h, SLOT_ADD, 1)] if q + h < S - 1 else [(q, SLOT_SET, 1)]
        assert pairwise == want, S
        # The fp32 values: combining partials 1, 2, 4, ... * 2**-30 + 1 in the steps' order gives the same sum as
        # the order written out with numpy float32 adds.
        partials = [np.float32(1.0 + 2.0 ** (-30 + s)) for s in range(S)]
        acc, slot = np.float32(0.0), np.float32(0.0)
        for s, target, flush in pairwise:
            acc, slot = combine(acc, slot, partials[s], target, flush)
        expected = partials[S - 1]
        for q in range(h):
            pair = partials[q] if q + h >= S - 1 else np.float32(partials[q] + partials[q + h])
            expected = np.float32(expected + pair)
        assert acc == expected
