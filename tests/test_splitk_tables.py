"""The packaged split-K tables (mmaemu/platform/data) answer exactly as the recorded originals (data/splitk).

The originals are read with the reference recipe of data/splitk/README.md section 3 (copied below), so the packaged
format, the lookups and the decisions are checked against an independent reading of the same files.
"""

import bisect
import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from mmaemu.errors import SplitKUnknownError
from mmaemu.platform import tables
from mmaemu.platform.profiles import get_profile
from mmaemu.platform.splitk import resolve_splitk
from mmaemu.platform.tables import SplitTable, SplitTableError, get_table

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "splitk"
PACKAGED = REPO / "mmaemu" / "platform" / "data"
H100_ID, RTX_ID = "heur_h100pcie_lt12.8.3.14", "heur_rtx4060_lt12.8.3.14"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not (DATA / f"{H100_ID}.npz").exists(), reason="recorded tables not present")

# ---------------------------------------------------------------------------------------------------------------
# The data README's reference recipe (section 3), verbatim apart from formatting

OUTS = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
FMT = {"e4m3": 0, "e5m2": 1}
FMTS = ["e4m3", "e5m2"]


class RecipeTable:
    def __init__(self, stem):
        self.meta = json.load(open(stem + ".json"))
        z = np.load(stem + ".npz", allow_pickle=False)
        cols = {k: z[k].astype(np.int64) for k in z.files}
        self.cols = cols
        packed = ((cols["ws"] << 60) | (cols["out"] << 57) | (cols["fast"] << 56) | (cols["fa"] << 55)
                  | (cols["fb"] << 54) | (cols["M"] << 33) | (cols["N"] << 12) | 0)
        self.order = np.lexsort((cols["K"], packed))
        self.packed, self.K = packed[self.order], cols["K"][self.order]
        vc_name = self.meta.get("verified_combos", "verified_split_combos.json")
        vc = json.load(open(stem.rsplit("/", 1)[0] + "/" + vc_name))
        self.verified = {(c["fast"], c["S"], c["scheme"], c["out"], c["fmt_pair"]) for c in vc["combos"]
                         if c["verified"]}

    def row(self, M, N, K, fa, fb, out, fast, ws):
        wl = self.meta["codes"]["ws"]
        if ws not in wl or max(M, N, K) >= 1 << 21:
            return None
        p = ((wl.index(ws) << 60) | (OUTS.index(out) << 57) | (int(fast) << 56) | (FMT[fa] << 55)
             | (FMT[fb] << 54) | (M << 33) | (N << 12))
        lo = np.searchsorted(self.packed, p, "left")
        hi = np.searchsorted(self.packed, p, "right")
        j = lo + np.searchsorted(self.K[lo:hi], K)
        if j < hi and self.K[j] == K:
            i = self.order[j]
            return {k: int(v[i]) for k, v in self.cols.items()}
        return None


def recipe_decide(t, M, N, K, fa, fb, out, fast, ws):
    """(S, scheme, source, verified); raises LookupError when the recordings cannot decide."""
    if ws == 0:
        return 1, "none", "workspace0", True
    r = t.row(M, N, K, fa, fb, out, fast, ws)
    if r is not None:
        S = r["splitK"]
        if S == 1:
            return 1, "none", "table", True
        codes, c, caveat = t.meta["codes"], str(r["custom"]), False
        if c in codes["custom -> scheme"]:
            scheme = codes["custom -> scheme"][c]
        elif "custom -> scheme, unlisted" in codes:
            scheme, caveat = codes["custom -> scheme, unlisted"], True
        else:
            scheme = "serial"
        if scheme == "contiguous":
            T = -(-K // 128)
            ragged_ok = t.meta.get("split_layouts", {}).get("ragged_K", {}).get("verified", False)
            caveat |= (K % 128 != 0 and not ragged_ok) or (S - 1) * -(-T // S) >= T
        ok = not caveat and (bool(fast), S, scheme, out, f"{fa}x{fb}") in t.verified
        return S, scheme, "table", ok
    env = t.meta.get("envelope", {})
    if not env.get("inference", True):
        raise LookupError("no inference")
    if env.get("kind") == "k_grid":
        if not env["K_min"] <= K <= env["K_max"]:
            raise LookupError("K outside the envelope")
        b = [x for x in env["bounds"]
             if (x["ws"], x["out"], x["fast"], x["fmt_a"], x["fmt_b"]) == (ws, out, bool(fast), fa, fb)]
        if not b:
            raise LookupError("no bound for this setting")
        B = b[0]["B"][bisect.bisect_left(env["K_grid"], K)]
        if B is None or M * N <= B:
            raise LookupError("inside the envelope")
        return 1, "none", "envelope", env["validation"][str(ws)]["status"] == "validated"
    st = [s for s in t.meta["settings"]
          if (s["ws"], s["out"], s["fast"], s["fmt_a"], s["fmt_b"]) == (ws, out, bool(fast), fa, fb)]
    if not st:
        st = [s for s in t.meta["settings"] if (s["ws"], s["fast"], s["fmt_a"], s["fmt_b"]) == (ws, bool(fast), fa, fb)]
    if not st:
        raise LookupError("no rows for this setting")
    split = [s for s in st if s["split_rows"]]
    if not split or M * N > 2 * max(s["max_split_MN"] for s in split):
        return 1, "none", "envelope", True
    raise LookupError("inside the envelope")


# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recipe():
    return {table_id: RecipeTable(str(DATA / table_id)) for table_id in (H100_ID, RTX_ID)}


def key_of(cols, i):
    return (int(cols["M"][i]), int(cols["N"][i]), int(cols["K"][i]), FMTS[cols["fa"][i]], FMTS[cols["fb"][i]],
            OUTS[cols["out"][i]], bool(cols["fast"][i]), [0, MiB, 4 * MiB, 32 * MiB][cols["ws"][i]])


def values_of(cols, i):
    return tuple(int(cols[c][i]) for c in ("splitK", "custom", "algo", "tile"))


def as_tuple(row):
    return None if row is None else (row.splitK, row.custom, row.algo, row.tile)


@pytest.mark.parametrize("table_id", [H100_ID, RTX_ID])
def test_random_rows_equal_the_originals(recipe, table_id):
    cols, table = recipe[table_id].cols, get_table(table_id)
    rng = np.random.default_rng(20261016)
    for i in rng.choice(len(cols["M"]), 20_000, replace=False):
        key = key_of(cols, i)
        assert as_tuple(table.lookup(*key)) == values_of(cols, i), key
        recipe_row = recipe[table_id].row(*key)
        assert (recipe_row["splitK"], recipe_row["custom"], recipe_row["algo"], recipe_row["tile"]) == values_of(
            cols, i)


SPLIT_SETTINGS = [
    (H100_ID, 1, "float32", 0, "e4m3", "e4m3"), (H100_ID, 3, "float8_e4m3fn", 0, "e4m3", "e5m2"),
    (H100_ID, 3, "bfloat16", 1, "e5m2", "e4m3"), (RTX_ID, 1, "float32", 1, "e4m3", "e4m3"),
    (RTX_ID, 2, "bfloat16", 0, "e5m2", "e4m3"), (RTX_ID, 3, "float16", 1, "e4m3", "e5m2"),
]


@pytest.mark.parametrize("table_id, ws, out, fast, fa, fb", SPLIT_SETTINGS)
def test_all_split_rows_of_a_setting(recipe, table_id, ws, out, fast, fa, fb):
    cols, table = recipe[table_id].cols, get_table(table_id)
    mask = ((cols["ws"] == ws) & (cols["out"] == OUTS.index(out)) & (cols["fast"] == fast)
            & (cols["fa"] == FMT[fa]) & (cols["fb"] == FMT[fb]) & (cols["splitK"] > 1))
    rows = np.flatnonzero(mask)
    assert len(rows) > 0
    for i in rows:
        assert as_tuple(table.lookup(*key_of(cols, i))) == values_of(cols, i)


@pytest.mark.parametrize("table_id", [H100_ID, RTX_ID])
def test_whole_index_decodes_to_the_original_rows(recipe, table_id):
    """Every packaged row, decoded from the documented index format, is an original row, and vice versa."""
    cols = recipe[table_id].cols
    with np.load(PACKAGED / f"{table_id}.index.npz", allow_pickle=False) as npz:
        index = {k: npz[k] for k in npz.files}
    assert str(index["format"]) == tables.INDEX_FORMAT
    offsets = index["setting_offsets"]
    keys = np.cumsum(index["shape_key_delta"])
    codes = np.repeat(np.arange(tables.N_SETTING_CODES), np.diff(offsets))
    assert len(codes) == len(keys) == len(cols["M"]) == int(index["rows"])
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        assert np.all(np.diff(keys[lo:hi]) > 0)  # sorted and unique within each setting
    original_codes = tables.setting_code(cols["ws"], cols["out"], cols["fast"], cols["fa"], cols["fb"])
    original_keys = tables.shape_key(cols["M"], cols["N"], cols["K"])
    order = np.lexsort((original_keys, original_codes))
    assert np.array_equal(codes, original_codes[order])
    assert np.array_equal(keys, original_keys[order])
    for name in ("splitK", "custom", "algo", "tile"):
        assert np.array_equal(index[name], cols[name][order])


@pytest.mark.parametrize("table_id", [H100_ID, RTX_ID])
def test_absent_keys_are_absent(recipe, table_id):
    cols, table = recipe[table_id].cols, get_table(table_id)
    rng = np.random.default_rng(7)
    hits = 0
    for i in rng.choice(len(cols["M"]), 3000, replace=False):
        M, N, K, fa, fb, out, fast, ws = key_of(cols, i)
        for probe in [(M + 1, N, K), (M, N + 1, K), (M, N, K + 1), (N, M, K), (M, N, K * 2)]:
            key = (*probe, fa, fb, out, fast, ws)
            mine, theirs = table.lookup(*key), recipe[table_id].row(*key)
            assert (mine is None) == (theirs is None), key
            hits += mine is not None
    assert hits > 0  # some perturbed keys are recorded too
    assert table.lookup(1 << 21, 64, 1024, "e4m3", "e4m3", "float32", False, MiB) is None
    assert table.lookup(1, 64, 1024, "e4m3", "e4m3", "float32", False, 12345) is None


def test_row_counts_match_the_json():
    for table_id in (H100_ID, RTX_ID):
        meta = json.loads((DATA / f"{table_id}.json").read_text())
        table = get_table(table_id)
        assert len(table) == meta["rows"]
        assert int((table._split_k > 1).sum()) == meta["split_rows"]


# ---------------------------------------------------------------------------------------------------------------
# Decisions equal the recipe's, on table keys and off-table keys (envelope and unknown)

PROFILE_OF_WS = {H100_ID: {0: "hopper-ws0", MiB: "hopper", 4 * MiB: ("hopper", 4 * MiB), 32 * MiB: "hopper-te"},
                 RTX_ID: {0: "ada-ws0", MiB: "ada", 4 * MiB: "ada-te", 32 * MiB: ("ada", 32 * MiB)}}


def profile_for(table_id, ws):
    spec = PROFILE_OF_WS[table_id][ws]
    if isinstance(spec, str):
        return get_profile(spec)
    return dataclasses.replace(get_profile(spec[0]), name=f"{spec[0]}-ws{ws}-test", workspace_bytes=ws)


def mine(table_id, key):
    M, N, K, fa, fb, out, fast, ws = key
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = resolve_splitk(M, N, K, a_dtype=fa, b_dtype=fb, out_dtype=out, use_fast_accum=fast,
                               profile=profile_for(table_id, ws))
        return d.S, d.scheme, d.source, d.verified
    except SplitKUnknownError:
        return "unknown"


def theirs(recipe_table, key):
    try:
        return recipe_decide(recipe_table, *key)
    except LookupError:
        return "unknown"


@pytest.mark.parametrize("table_id", [H100_ID, RTX_ID])
def test_decisions_equal_the_recipe(recipe, table_id):
    cols, rng = recipe[table_id].cols, np.random.default_rng(3891)
    split = np.flatnonzero(cols["splitK"] > 1)
    keys = [key_of(cols, i) for i in rng.choice(len(cols["M"]), 2000, replace=False)]
    keys += [key_of(cols, i) for i in rng.choice(split, 2000, replace=False)]
    for _ in range(4000):  # mostly off-table keys: envelopes and unknowns
        keys.append((int(rng.integers(1, 16385)), int(rng.integers(16, 60000)),
                     int(rng.choice([16, 100, 777, 1000, 1024, 1500, 3000, 4097, 5745, 9000, 20000, 70000,
                                     300000, 5_000_000])),
                     FMTS[rng.integers(2)], FMTS[rng.integers(2)], OUTS[rng.integers(5)], bool(rng.integers(2)),
                     [0, MiB, 4 * MiB, 32 * MiB][rng.integers(4)]))
    outcomes = set()
    for key in keys:
        expected = theirs(recipe[table_id], key)
        assert mine(table_id, key) == expected, key
        outcomes.add(expected if expected == "unknown" else expected[2])
    assert outcomes == {"unknown", "workspace0", "table", "envelope"}


# ---------------------------------------------------------------------------------------------------------------
# Loading: lazy, fast, thread-safe, checked

FIRST_DECISION = r"""
import sys
from mmaemu.platform.splitk import resolve_splitk
from mmaemu.platform import tables
assert not tables._tables  # nothing loaded at import
d = resolve_splitk(48, 64, 5760, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                   profile="hopper")
assert (d.S, d.scheme, d.source) == (2, "contiguous", "table")
print(sorted(tables._tables), "torch" in sys.modules, "numba" in sys.modules)
"""


@pytest.mark.subprocess
def test_first_decision_in_a_fresh_process_loads_one_table_and_neither_torch_nor_numba():
    """What makes the first decision cheap (its time is measured by scripts/bench.py): only the table it reads
    is loaded, and neither torch nor Numba is imported."""
    out = subprocess.run([sys.executable, "-c", FIRST_DECISION], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout.strip()
    assert out == f"[{H100_ID!r}] False False", out


def test_later_decisions_do_not_reload_the_table(monkeypatch):
    """A loaded table is kept: later decisions look it up in memory (their cost is measured by
    scripts/bench.py)."""
    get_table(H100_ID)
    loads, real_load = [], tables._load

    def counting_load(table_id):
        loads.append(table_id)
        return real_load(table_id)

    monkeypatch.setattr(tables, "_load", counting_load)
    for _ in range(3):
        d = resolve_splitk(48, 64, 5760, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                           profile="hopper")
        assert (d.S, d.source) == (2, "table")
    assert loads == []


def test_concurrent_first_loads_load_once(monkeypatch):
    monkeypatch.setattr(tables, "_tables", {})
    loads, real_load = [], tables._load

    def counting_load(table_id):
        loads.append(table_id)
        return real_load(table_id)

    monkeypatch.setattr(tables, "_load", counting_load)
    barrier, results = threading.Barrier(8), []

    def worker():
        barrier.wait()
        results.append(get_table(RTX_ID))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == [RTX_ID] and len(results) == 8 and all(r is results[0] for r in results)


def test_inconsistent_index_is_refused():
    meta = json.loads((PACKAGED / f"{RTX_ID}.json").read_text())
    combos = json.loads((PACKAGED / "verified_split_combos.json").read_text())
    with np.load(PACKAGED / f"{RTX_ID}.index.npz", allow_pickle=False) as npz:
        index = {k: npz[k] for k in npz.files}
    SplitTable(meta, index, combos)  # consistent
    with pytest.raises(SplitTableError, match="npz_sha256"):
        SplitTable(dict(meta, npz_sha256="0" * 64), index, combos)
    with pytest.raises(SplitTableError, match="verified-combos"):
        SplitTable(meta, index, dict(combos, table_id=H100_ID))


# ---------------------------------------------------------------------------------------------------------------
# Package data and its build


def test_package_data_layout():
    names = sorted(p.name for p in PACKAGED.iterdir())
    assert all((PACKAGED / n).is_file() for n in names)  # flat: setup.cfg ships data/*
    for table_id in (H100_ID, RTX_ID):
        assert f"{table_id}.index.npz" in names and f"{table_id}.json" in names
        assert (PACKAGED / f"{table_id}.json").read_bytes() == (DATA / f"{table_id}.json").read_bytes()
    for name in ("LICENSE", "NOTICE", "verified_split_combos.json",
                 "verified_split_combos_h100pcie_lt12.8.3.14.json"):
        assert (PACKAGED / name).read_bytes() == (DATA / name).read_bytes()
    assert sum((PACKAGED / n).stat().st_size for n in names) < 3 * MiB
    assert {f["name"] for f in tables.packaged_files()} == set(names)


@pytest.mark.subprocess
def test_build_script_output_is_up_to_date():
    done = subprocess.run([sys.executable, "scripts/build_splitk_tables.py", "--check"], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.subprocess
def test_build_script_refuses_a_modified_npz(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DATA, src)
    npz = src / f"{RTX_ID}.npz"
    npz.chmod(0o644)
    npz.write_bytes(npz.read_bytes() + b"\0")
    done = subprocess.run([sys.executable, "scripts/build_splitk_tables.py", "--src", str(src), "--dst",
                           str(tmp_path / "dst")], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "npz_sha256" in done.stderr


def test_a_table_id_is_checked_against_the_packaged_ones_when_the_package_data_cannot_be_read(monkeypatch):
    """Issue 28 item 11: in a checkout inside a folder this user cannot enter, the package's data files cannot be
    stat'ed; a bundle's table still registers, and the built-in profiles' table ids are still refused (by name)."""
    from mmaemu.platform import tables

    def unreadable(name):
        class Closed:
            def is_file(self):
                raise PermissionError(13, "Permission denied", name)
        return Closed()

    monkeypatch.setattr(tables, "_data_file", unreadable)
    monkeypatch.setattr(tables, "_registered", dict(tables._registered))
    tables.register_table("rec_closed-checkout", lambda: None)
    assert "rec_closed-checkout" in tables._registered
    with pytest.raises(tables.SplitTableError, match="belongs to the packaged tables"):
        tables.register_table("heur_h100pcie_lt12.8.3.14", lambda: None)
