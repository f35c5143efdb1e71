"""``mmaemu record`` without a GPU: a fake cuBLASLt and a fake GEMM (tests/fake_gpu.py), the bundle round trip,
refusal of damaged bundles, the replay comparison on CPU tensors, resume after an interruption, and
MMAEMU_PROFILE_PATH."""

import hashlib
import io
import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu.errors import ExperimentalPresetWarning, SplitKUnknownError, UnverifiedSplitWarning
from mmaemu.platform import bundles
from mmaemu.platform.bundles import BundleError
from mmaemu.platform.profiles import get_profile, list_profiles
from mmaemu import warn
from mmaemu.platform.splitk import resolve_splitk
from mmaemu.record import RecordError, record
from mmaemu.record.envelope import fit_envelope, held_out
from mmaemu.record.grid import GridError, parse_sweep, read_shapes_file
from mmaemu.record.progress import Progress
from mmaemu.record.replay import ReplayCase, run_replays, summarise
from mmaemu.record.trace import check_descriptor, parse_matmul_trace

from fake_gpu import (MiB, TE_WS, TORCH_WS, counting, decide, emulating_gpu, fake_machine, probe, split_shapes,
                      trace_line, answer)

NAME = "fake-h200-lt12.9.9.9"
TABLE = "rec_fake-h200-lt12.9.9.9"
KEYS = [(M, N, K, fa, fb, out, fast) for M, N, K in split_shapes() for fa, fb in
        (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")) for out in ("float32", "bfloat16", "float8_e4m3fn")
        for fast in (False, True)]


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    monkeypatch.delenv("MMAEMU_PROFILE_PATH", raising=False)
    bundles.forget_loaded_bundles()
    warn.reset()
    yield
    bundles.forget_loaded_bundles()
    warn.reset()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One recording of the fake GPU over the tiny grid (shared: the replays are the slow part)."""
    out = tmp_path_factory.mktemp("record")
    result = record(out, shapes=split_shapes(), machine=fake_machine(), quiet=True)
    return result


def copy_bundle(recorded, tmp_path, name="bundle"):
    target = tmp_path / name
    shutil.copytree(recorded.path, target)
    return target


def quiet_decide(profile, M, N, K, fa="e4m3", fb="e4m3", out="float32", fast=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resolve_splitk(M, N, K, a_dtype=fa, b_dtype=fb, out_dtype=out, use_fast_accum=fast, profile=profile)


# ---------------------------------------------------------------------------------------------------------------
# Recording and the round trip


def test_record_writes_a_bundle_whose_profiles_decide_as_the_gpu(recorded):
    assert recorded.complete and recorded.profiles == (NAME, f"{NAME}-te", f"{NAME}-ws0")
    assert (recorded.replays_passed, recorded.replays_failed, recorded.findings) == (recorded.replays_passed, 0, 0)
    assert recorded.replays_passed > 0
    assert not (recorded.path.parent / f"{NAME}.partial").exists()  # finished: the partial recording is removed
    profiles = mmaemu.load_profile(recorded.path)
    assert [p.name for p in profiles] == list(recorded.profiles) and list_profiles()[-3:] == list(recorded.profiles)
    torch_profile, te_profile, ws0 = profiles
    assert (torch_profile.workspace_bytes, te_profile.workspace_bytes, te_profile.align, ws0.workspace_bytes) == (
        TORCH_WS, TE_WS, 256, 0)
    assert (torch_profile.maturity, torch_profile.splitk_maturity, te_profile.splitk_maturity) == (
        "validated", "validated", "experimental")
    assert torch_profile.gpu_name == "NVIDIA Fake H200" and torch_profile.sm_count == 132
    for key in KEYS:
        for profile, ws in ((NAME, TORCH_WS), (f"{NAME}-te", TE_WS)):
            d = quiet_decide(profile, *key)
            want = decide(*key, ws)[1]["splitK"]
            assert (d.S, d.source, d.table_id) == (want, "table", TABLE), (profile, key)
            assert d.scheme == ("contiguous" if want > 1 else "none")
        assert quiet_decide(f"{NAME}-ws0", *key).source == "workspace0"


def test_recorded_split_decisions_are_verified_and_te_ones_warn(recorded):
    mmaemu.load_profile(recorded.path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = resolve_splitk(48, 64, 8192, a_dtype="e4m3", b_dtype="e5m2", out_dtype="bfloat16", use_fast_accum=True,
                           profile=NAME)
    assert (d.S, d.verified) == (3, True) and not caught
    with pytest.warns(UnverifiedSplitWarning, match="Transformer Engine"):
        resolve_splitk(48, 64, 8192, a_dtype="e4m3", b_dtype="e5m2", out_dtype="bfloat16", use_fast_accum=True,
                       profile=f"{NAME}-te")


def test_recorded_profile_computes_and_explains_on_the_cpu(recorded):
    mmaemu.load_profile(recorded.path)
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(16, 4096, generator=gen) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(64, 4096, generator=gen) * 4).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    plan = mmaemu.explain(a, b, one, one, out_dtype=torch.bfloat16, profile=NAME)
    assert plan.validation == "ok" and (plan.split.S, plan.split.source) == (2, "table")
    got = mmaemu.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, profile=NAME)
    want = mmaemu.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, profile="hopper", splitk=(2, "contiguous"))
    mmaemu.testing.assert_bitwise_equal(got, want)
    with pytest.raises(mmaemu.ReferenceRejectsError):
        mmaemu.scaled_mm(a, b, one, one, out_dtype=torch.float8_e5m2, profile=NAME)  # the fake GPU refused it


def test_the_bundle_files_follow_the_table_format(recorded):
    meta = json.loads((recorded.path / f"{TABLE}.json").read_text())
    assert meta["format"] == "mmaemu-splitk-table/1" and meta["codes"]["ws"] == [0, TORCH_WS, TE_WS]
    assert meta["profile_device"]["gpu"] == "NVIDIA Fake H200" and meta["workspaces"]["torch"] == TORCH_WS
    assert meta["descriptor_check"]["fast_attribute"] == "fastAccumulationMode"
    assert meta["codes"]["custom -> scheme"] == {"0": "contiguous", "1": "contiguous"}
    with np.load(recorded.path / f"{TABLE}.npz", allow_pickle=False) as npz:
        assert {k: str(npz[k].dtype) for k in npz.files} == meta["columns"]
        assert len(npz["M"]) == meta["rows"] and int((npz["splitK"] > 1).sum()) == meta["split_rows"]
    # queries the fake cuBLASLt refused (status 15) are counted, not stored; torch's refusals are listed
    assert meta["dropped"][0] == {"fmt_a": "e4m3", "fmt_b": "e4m3", "out": "float16", "rows": 3, "status": [15]}
    assert meta["rows"] == 6 * 84 - 9 and {(r["fmt_a"], r["fmt_b"], r["out"]) for r in meta["rejects"]} == {
        ("e4m3", "e4m3", "float8_e5m2")} | {("e5m2", "e5m2", out) for out in
                                           ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")}
    combos = json.loads((recorded.path / meta["verified_combos"]).read_text())
    assert combos["n_table_combos"] == combos["n_verified_table_combos"] > 0
    assert meta["envelope"]["kind"] == "k_grid" and set(meta["envelope"]["validation"]) == {str(TORCH_WS),
                                                                                          str(TE_WS)}


# ---------------------------------------------------------------------------------------------------------------
# Refusals


def rewrite(folder, name, blob):
    """Replace a bundle file and update the manifest's hash (a consistent but damaged bundle)."""
    (folder / name).write_bytes(blob)
    manifest = json.loads((folder / "profile.json").read_text())
    manifest["files"][name] = hashlib.sha256(blob).hexdigest()
    (folder / "profile.json").write_text(json.dumps(manifest))


def rewrite_npz(folder, change):
    """Rewrite the table npz with change(arrays) applied, keeping every hash consistent."""
    path = folder / f"{TABLE}.npz"
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    blob = buf.getvalue()
    meta = json.loads((folder / f"{TABLE}.json").read_text())
    meta["npz_sha256"] = hashlib.sha256(blob).hexdigest()
    meta["rows"] = len(arrays["M"])
    rewrite(folder, f"{TABLE}.npz", blob)
    rewrite(folder, f"{TABLE}.json", json.dumps(meta).encode())


def test_damaged_bundles_are_refused(recorded, tmp_path):
    cases = {
        "differs from the manifest": lambda f: (f / f"{TABLE}.npz").write_bytes(
            (f / f"{TABLE}.npz").read_bytes()[:-7] + b"tamper!"),
        "cannot read": lambda f: (f / "replays.json").unlink(),
        "missing \\['custom'\\]": lambda f: rewrite_npz(f, lambda a: a.pop("custom")),
        "column K is int64": lambda f: rewrite_npz(f, lambda a: a.update(K=a["K"].astype(np.int64))),
        "one-dimensional": lambda f: rewrite_npz(f, lambda a: a.update(M=np.stack([a["M"], a["M"]]))),
        "without pickles": lambda f: rewrite_npz(f, lambda a: a.update(M=a["M"].astype(object))),
        "duplicate keys": lambda f: rewrite_npz(f, lambda a: a.update({k: np.concatenate([v, v[:1]])
                                                                       for k, v in a.items()})),
        "not valid JSON": lambda f: rewrite(f, "replays.json", b"{not json"),
        "does not follow from the replays": lambda f: rewrite(f, "replays.json", json.dumps(
            dict(json.loads((f / "replays.json").read_text()), failed=1)).encode()),
        "plain file name": lambda f: _edit_manifest(f, lambda m: m["files"].update({"../x": "0" * 64})),
        "collides with a built-in": lambda f: _edit_manifest(f, lambda m: m["profiles"][0].update(name="hopper")),
        "unknown preset": lambda f: _edit_manifest(f, lambda m: m.update(preset="no-such-preset")),
    }
    for n, (message, damage) in enumerate(cases.items()):
        folder = copy_bundle(recorded, tmp_path, f"b{n}")
        damage(folder)
        with pytest.raises(BundleError, match=message):
            mmaemu.load_profile(folder)
    assert NAME not in list_profiles()


def _edit_manifest(folder, change):
    manifest = json.loads((folder / "profile.json").read_text())
    change(manifest)
    (folder / "profile.json").write_text(json.dumps(manifest))


def test_a_second_bundle_with_the_same_names_is_refused(recorded, tmp_path):
    mmaemu.load_profile(recorded.path)
    assert mmaemu.load_profile(recorded.path)[0].name == NAME  # the same bundle again: a no-op
    other = copy_bundle(recorded, tmp_path)
    _edit_manifest(other, lambda m: m.update(recorded_by="someone else"))
    with pytest.raises(BundleError, match="already"):
        mmaemu.load_profile(other)


def test_profile_path(recorded, tmp_path, monkeypatch):
    good = copy_bundle(recorded, tmp_path / "shelf", NAME)
    bad = copy_bundle(recorded, tmp_path / "shelf", "zz-damaged")
    _edit_manifest(bad, lambda m: m["files"].update({f"{TABLE}.npz": "0" * 64}))
    monkeypatch.setenv("MMAEMU_PROFILE_PATH", f"{tmp_path / 'nowhere'}:{tmp_path / 'shelf'}")
    with pytest.warns(RuntimeWarning, match="zz-damaged.*sha256"):
        names = list_profiles()
    assert names[-3:] == [NAME, f"{NAME}-te", f"{NAME}-ws0"]
    assert get_profile(NAME).splitk_table == TABLE
    with pytest.raises(KeyError, match="refused bundle"):
        get_profile("no-such-profile")
    from mmaemu.cli import diagnostics
    from mmaemu.context import for_call

    table = next(t for t in diagnostics._splitk_tables(for_call()) if t["table_id"] == TABLE)
    assert table["profiles"] == [NAME, f"{NAME}-te", f"{NAME}-ws0"] and table["index_rows"] == table["rows"]
    assert any("zz-damaged" in u["component"] for u in diagnostics._refused_bundles())
    bundles.forget_loaded_bundles()
    monkeypatch.setenv("MMAEMU_PROFILE_PATH", str(good))  # a bundle folder itself
    assert quiet_decide(NAME, 48, 64, 8192).S == 3


def test_info_reads_the_profile_path_as_the_loader_does(recorded, tmp_path, monkeypatch):
    from mmaemu.cli import diagnostics

    copy_bundle(recorded, tmp_path / "shelf", NAME)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MMAEMU_PROFILE_PATH", f"~/shelf{os.pathsep}{os.pathsep}~/nowhere")
    assert diagnostics.environment_problems() == {"MMAEMU_PROFILE_PATH": f"not a folder: {tmp_path / 'nowhere'}"}
    assert list_profiles()[-3:] == [NAME, f"{NAME}-te", f"{NAME}-ws0"]  # ~/shelf is loaded, so it is no problem


def test_the_profile_path_of_the_context_is_the_one_loaded(recorded, tmp_path, monkeypatch):
    """A context's MMAEMU_PROFILE_PATH is loaded while the process environment names none; a context whose value
    is empty ignores the process environment's."""
    from mmaemu import environment
    from mmaemu.context import Context

    copy_bundle(recorded, tmp_path / "shelf", NAME)
    shelf = Context(environment.snapshot({"MMAEMU_PROFILE_PATH": str(tmp_path / "shelf")}))
    assert NAME not in list_profiles()  # the process environment has no MMAEMU_PROFILE_PATH
    assert list_profiles(context=shelf)[-3:] == [NAME, f"{NAME}-te", f"{NAME}-ws0"]
    assert get_profile(NAME, context=shelf).splitk_table == TABLE
    bundles.forget_loaded_bundles()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = resolve_splitk(48, 64, 8192, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                           profile=NAME, context=shelf)
    assert (d.S, d.table_id) == (3, TABLE)
    bundles.forget_loaded_bundles()
    monkeypatch.setenv("MMAEMU_PROFILE_PATH", str(tmp_path / "shelf"))
    empty = Context(environment.snapshot({}))
    assert NAME not in list_profiles(context=empty)
    with pytest.raises(KeyError, match=f"unknown profile '{NAME}'"):
        get_profile(NAME, context=empty)
    assert NAME in list_profiles()  # read now: the process environment's value


def test_a_refused_bundle_warns_once_at_the_user_s_line(recorded, tmp_path, monkeypatch):
    """The skip warning of a refused bundle: once per path and reason, forgotten with the loaded bundles,
    attributed to the user's line, and emitted even when an ``explain`` meets it first (explain collects the
    call's notices, not this one)."""
    copy_bundle(recorded, tmp_path / "shelf", NAME)
    bad = copy_bundle(recorded, tmp_path / "shelf", "zz-damaged")
    _edit_manifest(bad, lambda m: m["files"].update({f"{TABLE}.npz": "0" * 64}))
    monkeypatch.setenv("MMAEMU_PROFILE_PATH", str(tmp_path / "shelf"))
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(16, 4096, generator=gen) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(64, 4096, generator=gen) * 4).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)

    def skip_warnings(fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        return [w for w in caught if issubclass(w.category, RuntimeWarning) and "found on" in str(w.message)]

    (first,) = skip_warnings(lambda: mmaemu.explain(a, b, one, one, out_dtype=torch.bfloat16, profile=NAME))
    assert "zz-damaged" in str(first.message) and "sha256" in str(first.message)
    assert first.filename == __file__
    assert skip_warnings(lambda: mmaemu.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, profile=NAME)) == []
    assert skip_warnings(list_profiles) == []
    bundles.forget_loaded_bundles()
    (again,) = skip_warnings(list_profiles)
    assert str(again.message) == str(first.message) and again.filename == __file__


# ---------------------------------------------------------------------------------------------------------------
# Resume, findings, descriptor probe


def test_an_interrupted_recording_resumes_without_losing_rows(recorded, tmp_path):
    answer_fn, state = counting(answer, stop_after=140 + 84 * 2 + 40)  # probe, two shapes, part of the third
    with pytest.raises(KeyboardInterrupt):
        record(tmp_path, shapes=split_shapes(), machine=fake_machine(answer_fn=answer_fn), quiet=True, replay=False)
    partial = tmp_path / f"{NAME}.partial"
    answers = partial / "answers.bin"
    assert answers.stat().st_size == 2 * 84 * 13  # complete shapes only
    with open(answers, "ab") as fh:
        fh.write(b"\x01" * 100)  # a torn write of the interrupted shape
    answer_fn, state = counting(answer)
    result = record(tmp_path, shapes=split_shapes(), machine=fake_machine(answer_fn=answer_fn), quiet=True,
                    replay=False)
    assert result.complete and state["calls"] == 4 * 84 + 140  # four shapes left, plus the probe's 140 checks
    resumed = (result.path / f"{TABLE}.npz").read_bytes()
    assert resumed == (recorded.path / f"{TABLE}.npz").read_bytes()  # the same table as an uninterrupted recording
    assert json.loads((result.path / "profile.json").read_text())["maturity"] == "experimental"  # no replays


def test_a_partial_recording_of_another_plan_is_refused(tmp_path):
    answer_fn, _ = counting(answer, stop_after=84 + 140)
    with pytest.raises(KeyboardInterrupt):
        record(tmp_path, shapes=split_shapes(), machine=fake_machine(answer_fn=answer_fn), quiet=True, replay=False)
    with pytest.raises(Exception, match="another plan"):
        record(tmp_path, shapes=split_shapes()[:3], machine=fake_machine(), quiet=True, replay=False)


def test_a_differing_replay_is_a_finding(tmp_path):
    gpu = emulating_gpu(corrupt=lambda case: case.S == 3 and case.fast and case.out == "float32")
    shapes = np.array([(48, 64, 8192), (16, 64, 4096)])
    result = record(tmp_path, shapes=shapes, machine=fake_machine(gpu_gemm=gpu), quiet=True)
    assert result.findings == 3 * 2 and result.replays_failed > 0  # 3 format pairs x 2 data kinds
    manifest = json.loads((result.path / "profile.json").read_text())
    report = json.loads((result.path / "replays.json").read_text())
    assert manifest["maturity"] == "experimental" and report["custom_to_scheme"] == {"0": "contiguous"}
    finding = next(r for r in report["replays"] if r.get("finding"))
    with np.load(result.path / "findings.npz", allow_pickle=False) as npz:
        prefix = finding["finding"]
        gpu_bits, emulated = npz[f"{prefix}/gpu"], npz[f"{prefix}/emulated_contiguous"]
        assert npz[f"{prefix}/a"].shape == (48, 8192) and npz[f"{prefix}/b"].shape == (64, 8192)
        assert int((gpu_bits != emulated).sum()) == 1
    (profile, *_) = mmaemu.load_profile(result.path)
    assert profile.maturity == "experimental"
    warn.reset()
    with pytest.warns(ExperimentalPresetWarning):
        mmaemu.platform.warn_profile_maturity(profile)
    d = quiet_decide(NAME, 48, 64, 8192, fast=True)
    assert d.S == 3 and not d.verified and "never recorded" in d.note  # customOption 1 has no scheme


def test_the_descriptor_check_reads_torch_s_calls():
    calls, traced, _ = probe()
    session_answers = {}

    def answer_of(q):
        from mmaemu.platform.heuristic import HeuristicAnswer
        key = (q.b.cols, q.a.cols, q.a.rows, next(f for f, t in (("e4m3", "CUDA_R_8F_E4M3"), ("e5m2", "CUDA_R_8F_E5M2"))
                                                  if t == q.b.dtype))
        session_answers[key] = True
        fmt = {"CUDA_R_8F_E4M3": "e4m3", "CUDA_R_8F_E5M2": "e5m2"}
        outs = {"CUDA_R_32F": "float32", "CUDA_R_16BF": "bfloat16", "CUDA_R_16F": "float16",
                "CUDA_R_8F_E4M3": "float8_e4m3fn", "CUDA_R_8F_E5M2": "float8_e5m2"}
        cfg = decide(q.b.cols, q.a.cols, q.a.rows, fmt[q.b.dtype], fmt[q.a.dtype], outs[q.d.dtype], q.fast_accum,
                     q.workspace_bytes)[1]
        return HeuristicAnswer(**cfg)

    names = {("tile", 20): "TILE_64x64", ("tile", 209): "TILE_128x128", ("stages", 36): "STAGES_128xAUTO",
             ("reduction", 2): "COMPUTE_TYPE", ("reduction", 0): "NONE"}
    from mmaemu.platform.heuristic import build_query

    def query_of(c, ws):
        return build_query(c.M, c.N, c.K, c.fa, c.fb, c.out, c.fast, ws, None)

    check = check_descriptor(calls, traced, query_of, answer_of, lambda f, v: names.get((f, v)))
    assert check.problems == [] and check.workspace_bytes == TORCH_WS and check.split_calls > 0
    assert check.compared_algo_fields == ["algoId", "customOption", "tile", "stages", "split", "reduction"]
    # a descriptor attribute the recorder does not set, another algorithm, a missing trace line
    for kwargs, message in (({"extra": " epilogue=EPILOGUE_BIAS"}, "epilogue=EPILOGUE_BIAS"),
                            ({"custom_delta": 1}, "torch ran customOption"),
                            ({"ws": 32 * MiB}, None)):
        calls2, traced2, _ = probe(**kwargs)
        check = check_descriptor(calls2, traced2, query_of, answer_of, lambda f, v: names.get((f, v)))
        if message:
            assert any(message in p for p in check.problems), check.problems[:3]
        else:
            assert check.workspace_bytes == 32 * MiB
    # a log that also shows the attribute at 0 on the slow calls
    calls3, traced3, _ = probe()
    for c, t in zip([c for c in calls3 if c.error is None], traced3):
        t.descriptor.setdefault("fastAccumulationMode", "0")
    check = check_descriptor(calls3, traced3, query_of, answer_of, lambda f, v: names.get((f, v)))
    assert check.problems == [] and check.fast_attribute == "fastAccumulationMode"
    check = check_descriptor(calls, traced[:-1], query_of, answer_of, lambda f, v: None)
    assert "trace lines" in check.problems[0]


def test_a_recording_is_refused_when_torch_s_descriptor_differs(tmp_path):
    machine = fake_machine(probe_fn=lambda: probe(extra=" smCountTarget=66"))
    with pytest.raises(RecordError, match="smCountTarget=66"):
        record(tmp_path, shapes=split_shapes(), machine=machine, quiet=True)
    with pytest.raises(RecordError, match="no preset"):
        record(tmp_path, shapes=split_shapes(), machine=fake_machine(capability=[12, 0]), quiet=True)


def test_trace_lines_parse():
    line = trace_line(mmaemu.record.trace.ProbeCall(48, 64, 5760, "e4m3", "e5m2", "bfloat16", True))
    (t,) = parse_matmul_trace("noise\n" + line + "\n[Api][cublasLtMatmulDescCreate] x=1")
    assert t.layouts["Adesc"] == {"type": "R_8F_E5M2", "rows": "5760", "cols": "64", "ld": "5760"}
    assert t.descriptor["fastAccumulationMode"] == "1" and t.algo["splitK"] == "2"
    assert t.workspace_bytes == TORCH_WS


# ---------------------------------------------------------------------------------------------------------------
# Pieces: comparison logic, envelope, grid, progress, error text


def test_replay_comparison_on_cpu_tensors():
    """run_replays/summarise with fake GEMMs: which scheme reproduces the GPU, and what is kept when none does."""
    cases = [ReplayCase(3, 7, "float32", False, "e4m3", "e4m3", 4, 8, 512, MiB, data, 1 + i)
             for i, data in enumerate(("random", "adversarial"))]
    cases.append(ReplayCase(1, 0, "bfloat16", True, "e4m3", "e5m2", 4, 8, 256, MiB, "random", 9))

    def emulate(case, a, b, sa, sb, splitk):
        # stand-ins for two reduction orders: the exact dot products as float32 bits, "pairwise" one ulp off
        base = (a.astype(np.int64) @ b.T.astype(np.int64)).astype(np.float32).view(np.uint32)
        return base + np.uint32(1 if splitk == (3, "pairwise") else 0)

    gpu = lambda case, a, b, sa, sb: emulate(case, a, b, sa, sb, 1 if case.S == 1 else (case.S, "serial"))
    results = run_replays(cases, "ada", lambda S: ["none"] if S == 1 else ["serial", "pairwise"], gpu, emulate)
    assert [r.matched for r in results] == [["serial"], ["serial"], ["none"]]
    summary = summarise(results, ["serial", "pairwise"])
    assert summary["custom_to_scheme"] == {"7": "serial"} and (summary["passed"], summary["failed"]) == (3, 0)
    wrong = lambda case, a, b, sa, sb: emulate(case, a, b, sa, sb, 1) + np.uint32(5)
    results = run_replays(cases[:1], "ada", lambda S: ["serial", "pairwise"], wrong, emulate)
    assert results[0].matched == [] and set(results[0].kept) >= {"a", "b", "gpu", "emulated_serial",
                                                                  "emulated_pairwise"}
    assert summarise(results, ["serial", "pairwise"])["failed"] == 1
    boom = run_replays(cases[:1], "ada", lambda S: ["serial"], lambda *a: 1 / 0, emulate)
    assert boom[0].gpu_error.startswith("ZeroDivisionError")


def test_envelope_bounds_and_held_out_check():
    M = np.array([1, 2, 4, 8, 16, 32, 64, 128] * 3)
    K = np.repeat([1024, 2048, 4096], 8)
    N = np.full(24, 64)
    S = np.where(M * N * (K >= 2048) <= 1024, 2, 1) * (K >= 2048) + (K < 2048)
    cols = {"M": M, "N": N, "K": K, "splitK": S, "ws": np.ones(24, int), "out": np.zeros(24, int),
            "fast": np.zeros(24, int), "fa": np.zeros(24, int), "fb": np.zeros(24, int), "custom": np.zeros(24, int)}
    env = fit_envelope(cols, [0, MiB])
    (bound,) = env["bounds"]
    assert env["K_grid"] == [1024, 2048, 4096] and bound["B"] == [0, 2 * 16 * 64, 2 * 16 * 64]
    assert env["validation"][str(MiB)]["split_above_bound"] == 0
    hold = held_out(cols)
    assert hold.dtype == bool and hold.any() and not hold.all()


def test_grid_specs(tmp_path):
    grid = parse_sweep("M=1-8*2;N=16,32;K=1024-3072:1024")
    assert len(grid) == 4 * 2 * 3 and tuple(grid[0]) == (1, 16, 1024)
    for bad in ("M=1;N=16", "M=1;N=17;K=16", "M=a;N=16;K=16", "Q=1;N=16;K=16", "M=1-8*1;N=16;K=16"):
        with pytest.raises(GridError):
            parse_sweep(bad)
    path = tmp_path / "shapes.txt"
    path.write_text("# M N K\n1 16 1024\n2,32,2048  # comment\n1 16 1024\n")
    assert read_shapes_file(path).tolist() == [[1, 16, 1024], [2, 32, 2048]]
    path.write_text("1 16\n")
    with pytest.raises(GridError, match="shapes.txt:1"):
        read_shapes_file(path)


def test_progress_lines_for_logs():
    stream = io.StringIO()
    bar = Progress(10, "recording", "queries", stream=stream)
    bar.update(5, 50, force=True)
    bar.log("done")
    quiet = io.StringIO()
    Progress(10, "x", "q", quiet=True, stream=quiet).update(5, 5, force=True)
    text = stream.getvalue()
    assert "recording  50.0%" in text and "5/10" in text and "queries/s" in text and "left" in text
    assert text.endswith("done\n") and quiet.getvalue() == ""


def test_splitk_unknown_error_names_the_record_command():
    with pytest.raises(SplitKUnknownError, match="mmaemu record"):
        resolve_splitk(16, 256, 128, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False)
    with pytest.raises(SplitKUnknownError, match="mmaemu record"):
        resolve_splitk(16, 256, 1024, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                       profile="hopper-experimental")


def test_cli_record_without_a_gpu(tmp_path):
    from click.testing import CliRunner

    from mmaemu.cli import cli

    result = CliRunner().invoke(cli, ["record", "--out", str(tmp_path), "--quiet"])
    assert result.exit_code == 4 and "needs a CUDA GPU" in result.output
    result = CliRunner().invoke(cli, ["record", "--sweep", "M=1"])
    assert result.exit_code in (2, 4)


def test_cli_record_without_the_bindings_is_unavailable(tmp_path, monkeypatch):
    import mmaemu.record
    from click.testing import CliRunner

    from mmaemu.cli import cli
    from mmaemu.platform import heuristic
    from mmaemu.platform.cublaslt import CublasLtError
    from mmaemu.record import machine

    def no_bindings():
        raise CublasLtError(f"nvmath-python is not importable (no module): {heuristic.INSTALL_HINT}")

    monkeypatch.setattr(heuristic, "nvmath_api", no_bindings)
    with pytest.raises(machine.RecordUnavailableError, match="nvmath-python"):
        machine._bindings()
    monkeypatch.setattr(mmaemu.record, "cuda_machine", lambda device=None: machine._bindings())
    result = CliRunner().invoke(cli, ["record", "--out", str(tmp_path), "--quiet"])
    assert result.exit_code == 4 and "pip install 'mmaemu[record]'" in result.output


def test_bundles_shipped_in_the_package_are_loaded(recorded, monkeypatch, tmp_path):
    copy_bundle(recorded, tmp_path / "recorded", NAME)
    monkeypatch.setattr(bundles, "PACKAGED_ROOT", tmp_path / "recorded")
    assert bundles.packaged_bundle_folders() == [tmp_path / "recorded" / NAME]
    assert list_profiles()[-3:] == list(recorded.profiles) and get_profile(NAME).maturity == "validated"


# ---------------------------------------------------------------------------------------------------------------
# Hardening: concurrent recorders, hostile bundle files, the schema, names, usage errors, folder modes


def test_a_second_recorder_of_the_same_bundle_is_refused_naming_the_first(tmp_path):
    refusals = []

    def probe_while_another_starts():
        # the first recorder holds its lock from before its probe to its end: a second one started now is refused
        with pytest.raises(RecordError, match=f"another recorder \\(PID {os.getpid()}\\)") as refused:
            record(tmp_path, shapes=split_shapes(), machine=fake_machine(), quiet=True, replay=False)
        refusals.append(str(refused.value))
        return probe()

    result = record(tmp_path, shapes=split_shapes(), machine=fake_machine(probe_fn=probe_while_another_starts),
                    quiet=True, replay=False)
    assert result.complete and len(refusals) == 1 and "--name" in refusals[0]
    assert not (tmp_path / f"{NAME}.lock").exists()  # released and removed at the end
    from mmaemu.record.lock import recording_lock

    with recording_lock(tmp_path, NAME):  # free again
        assert (tmp_path / f"{NAME}.lock").read_text().strip() == str(os.getpid())


def _world_readable_copy(recorded, shelf, name):
    folder = copy_bundle(recorded, shelf, name)
    os.chmod(folder, 0o755)
    for path in folder.iterdir():
        os.chmod(path, 0o644)
    return folder


def _world_readable_packaged_bundles(shelf):
    """A world-readable copy of the package's own bundle folder (:data:`mmaemu.platform.bundles.PACKAGED_ROOT`),
    which the unprivileged child scans: the checkout may live in a folder only its owner can enter (a home folder,
    ``mktemp -d``), where the child could not read the original."""
    copy = shelf / "packaged"
    if bundles.PACKAGED_ROOT.is_dir():
        shutil.copytree(bundles.PACKAGED_ROOT, copy)
    else:
        copy.mkdir()
    for path in [copy, *copy.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return copy


@pytest.mark.subprocess
def test_an_unreadable_bundle_folder_on_the_profile_path_is_skipped(recorded, monkeypatch):
    """Another user's bundle folder (mode 0700, here 0000) beside a good one: the lookup runs in a child process
    that is not root when the tests are (root reads any folder), and must warn, load the good bundle and keep
    answering later lookups. What the child reads, it reads from world-readable copies (the bundles, the package's
    bundle folder), wherever the checkout lives."""
    import tempfile
    from pathlib import Path

    shelf = Path(tempfile.mkdtemp(prefix="mmaemu-shelf-"))
    closed = shelf / "another-users"
    try:
        os.chmod(shelf, 0o755)  # the unprivileged child must reach the good bundle
        monkeypatch.setattr(bundles, "PACKAGED_ROOT", _world_readable_packaged_bundles(shelf))
        good = _world_readable_copy(recorded, shelf, NAME)
        _world_readable_copy(recorded, shelf, "another-users")
        monkeypatch.setenv("MMAEMU_PROFILE_PATH", str(good))
        assert quiet_decide(NAME, 48, 64, 8192).S == 3  # the child then needs no import that root alone can read
        bundles.forget_loaded_bundles()
        os.chmod(closed, 0)
        monkeypatch.setenv("MMAEMU_PROFILE_PATH", str(shelf))
        report = _in_unprivileged_child(_lookups_report)
    finally:
        if closed.exists():
            os.chmod(closed, 0o755)
        shutil.rmtree(shelf, ignore_errors=True)
    assert report.get("error") is None, report.get("error")
    assert report["first"] == report["second"] == [NAME, f"{NAME}-te", f"{NAME}-ws0"]
    assert report["S"] == 3 and report["unknown"] is not None and "refused bundle" in report["unknown"]
    (warning,) = [w for w in report["warnings"] if "another-users" in w]
    assert "cannot read it" in warning and "Permission denied" in warning


@pytest.mark.subprocess
def test_an_unreadable_packaged_bundle_folder_is_skipped(recorded, monkeypatch):
    """Issue 28 item 11: a checkout inside a folder the user cannot enter (mode 0700, as home folders and
    ``mktemp -d`` make them): the package's own bundle folder cannot be read by the (unprivileged) child; it is
    skipped with a warning, as an unreadable folder on the profile path is, and the lookups go on."""
    import tempfile
    from pathlib import Path

    shelf = Path(tempfile.mkdtemp(prefix="mmaemu-shelf-"))
    private = shelf / "home"
    try:
        os.chmod(shelf, 0o755)
        private.mkdir(mode=0o700)  # only its owner (root here) may enter
        monkeypatch.setattr(bundles, "PACKAGED_ROOT", _world_readable_packaged_bundles(private))
        good = _world_readable_copy(recorded, shelf, NAME)
        monkeypatch.setenv("MMAEMU_PROFILE_PATH", str(good))
        assert quiet_decide(NAME, 48, 64, 8192).S == 3  # the child then needs no import that root alone can read
        bundles.forget_loaded_bundles()
        report = _in_unprivileged_child(_lookups_report)
    finally:
        shutil.rmtree(shelf, ignore_errors=True)
    assert report.get("error") is None, report.get("error")
    assert report["first"] == report["second"] == [NAME, f"{NAME}-te", f"{NAME}-ws0"]
    if os.geteuid() != 0:
        pytest.skip("the folder's mode stops no one but another user: run as root to see the child refused")
    (warning,) = [w for w in report["warnings"] if "package's recorded bundles" in w]
    assert "cannot read them" in warning and "Permission denied" in warning and "the package's data" in warning


def _lookups_report():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = list_profiles()[-3:]
    second = list_profiles()[-3:]
    try:
        get_profile("no-such-profile")
        unknown = None
    except KeyError as exc:
        unknown = str(exc)
    return {"first": first, "second": second, "S": quiet_decide(NAME, 48, 64, 8192).S, "unknown": unknown,
            "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}


def _in_unprivileged_child(fn, timeout=60):
    """fn() in a forked child (as uid/gid 65534 when this process is root); its json-able result."""
    import select
    import traceback

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                report = fn()
            except BaseException:
                report = {"error": traceback.format_exc()}
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    try:
        while select.select([read_end], [], [], timeout)[0]:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, 9)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{"error": "the child gave no report (killed after the timeout)"}')


def _replace_with(folder, name, make):
    (folder / name).unlink()
    make(folder / name)


def test_bundle_files_are_read_as_regular_files_of_bounded_size(recorded, tmp_path, monkeypatch):
    import signal

    def alarm(signum, frame):
        raise TimeoutError("the loader blocked on a bundle file")

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.alarm(20)  # a loader that opens a FIFO would block here for ever
        cases = {
            "not a regular file": lambda f: _replace_with(f, "replays.json", os.mkfifo),
            "symbolic link": lambda f: _replace_with(f, "replays.json", lambda p: p.symlink_to("/dev/zero")),
            "symbolic link ": lambda f: _replace_with(f, "replays.json", lambda p: p.symlink_to(f / "profile.json")),
            "more than the": lambda f: _edit_manifest(f, lambda m: m["files"].update(
                {"huge.bin": hashlib.sha256(b"").hexdigest()})) or os.truncate(_touch(f / "huge.bin"),
                                                                               bundles.MAX_FILE_BYTES + 1),
            "nested deeper than 32": lambda f: rewrite(f, "replays.json", b"[" * 100_000 + b"]" * 100_000),
            "not valid JSON .*NaN": lambda f: rewrite(f, "replays.json", json.dumps(
                dict(json.loads((f / "replays.json").read_text()), passed=float("nan"))).encode()),
        }
        for n, (message, damage) in enumerate(cases.items()):
            folder = copy_bundle(recorded, tmp_path, f"b{n}")
            damage(folder)
            with pytest.raises(BundleError, match=message.strip()):
                mmaemu.load_profile(folder)
        monkeypatch.setattr(bundles, "MAX_NPZ_UNPACKED_BYTES", 1000)  # a zip bomb, scaled down
        with pytest.raises(BundleError, match="unpacks to"):
            mmaemu.load_profile(copy_bundle(recorded, tmp_path, "bomb"))
        monkeypatch.setattr(bundles, "MAX_BUNDLE_BYTES", 2000)  # many files of allowed size, too much together
        with pytest.raises(BundleError, match="for all files|more than the 2,000 bytes a bundle may have"):
            mmaemu.load_profile(copy_bundle(recorded, tmp_path, "heavy"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert NAME not in list_profiles()


def _touch(path):
    path.write_bytes(b"")
    return path


def _edit_json(folder, name, change):
    value = json.loads((folder / name).read_text())
    change(value)
    rewrite(folder, name, json.dumps(value).encode())


def _set(path, value):
    """change(document): set the field at ``path`` (keys and indices) to ``value``."""
    def change(document):
        for key in path[:-1]:
            document = document[key]
        document[path[-1]] = value
    return change


def test_every_field_the_loader_reads_is_checked_against_the_schema(recorded, tmp_path):
    combos = f"verified_split_combos_{TABLE}.json"
    cases = {  # hash-consistent bundles with one malformed field each: refused, naming the field
        "field platform.sm_count": ("profile.json", _set(["platform", "sm_count"], "132")),
        "field platform.capability\\[1\\]": ("profile.json", _set(["platform", "capability", 1], -1)),
        "field profiles\\[0\\].workspace_bytes": ("profile.json", _set(["profiles", 0, "workspace_bytes"], -1)),
        "field profiles\\[1\\].align": ("profile.json", _set(["profiles", 1, "align"], 0)),
        "field rejects\\[0\\].message": ("profile.json", _set(["rejects", 0, "message"], 7)),
        "field name must be a lowercase slug": ("profile.json", _set(["name"], "Fake")),
        "field settings\\[0\\].S_values\\[0\\]": (f"{TABLE}.json", _set(["settings", 0, "S_values"], ["x"])),
        "field settings\\[1\\].rows": (f"{TABLE}.json", _set(["settings", 1, "rows"], None)),
        "field codes.custom -> scheme\\['0'\\]": (f"{TABLE}.json", _set(["codes", "custom -> scheme", "0"],
                                                                         "diagonal")),
        "field codes.custom -> scheme, unlisted": (f"{TABLE}.json", _set(["codes", "custom -> scheme, unlisted"],
                                                                         3)),
        "field envelope.K_grid": (f"{TABLE}.json", _set(["envelope", "K_grid"], [4096, 1024])),
        "field envelope.bounds\\[0\\].B": (f"{TABLE}.json", _set(["envelope", "bounds", 0, "B"], [0])),
        "field envelope.validation\\['1048576'\\].tested": (f"{TABLE}.json", _set(
            ["envelope", "validation", str(TORCH_WS), "tested"], "many")),
        "field split_layouts.ragged_K.verified": (f"{TABLE}.json", _set(["split_layouts", "ragged_K", "verified"],
                                                                        "yes")),
        "field combos\\[0\\].S": (combos, _set(["combos", 0, "S"], "2")),
        "field passed": ("replays.json", _set(["passed"], "168")),
    }
    for n, (message, (name, change)) in enumerate(cases.items()):
        folder = copy_bundle(recorded, tmp_path, f"b{n}")
        _edit_json(folder, name, change)
        with pytest.raises(BundleError, match=message):
            mmaemu.load_profile(folder)
    folder = copy_bundle(recorded, tmp_path, "splitk0")
    rewrite_npz(folder, lambda a: a.update(splitK=np.zeros_like(a["splitK"])))
    with pytest.raises(BundleError, match="column splitK holds 0"):
        mmaemu.load_profile(folder)
    assert NAME not in list_profiles()


def _no_probe():
    raise AssertionError("the probe ran")


def test_record_names_are_checked_before_the_probe(recorded, tmp_path):
    from mmaemu.record import RecordUsageError, check_name

    machine = fake_machine(probe_fn=_no_probe)
    for name, message in (("../x", "not a lowercase slug"), ("Fake", "not a lowercase slug"),
                          ("x" * 77, "not a lowercase slug"), ("hopper", "built-in"), ("ada", "built-in")):
        with pytest.raises(RecordUsageError, match=message):
            record(tmp_path, name=name, shapes=split_shapes(), machine=machine, quiet=True)
    mmaemu.load_profile(recorded.path)
    with pytest.raises(RecordUsageError, match="loaded bundle"):
        record(tmp_path, name=NAME, shapes=split_shapes(), machine=machine, quiet=True)
    check_name(NAME, recorded.path.parent)  # recording the loaded bundle itself again is no clash
    assert list(tmp_path.iterdir()) == []  # nothing was written, inside --out or beside it
    assert not (tmp_path.parent / "x").exists()


def test_recording_a_reference_gpu_gives_a_bundle_that_loads(tmp_path):
    machine = fake_machine(gpu="NVIDIA H100 PCIe", cublaslt="12.8.3.14")
    result = record(tmp_path, shapes=split_shapes()[:3], machine=machine, quiet=True, replay=False)
    (profile, *_) = mmaemu.load_profile(result.path)
    assert profile.name == "h100-pcie-lt12.8.3.14" and profile.splitk_table == "rec_h100-pcie-lt12.8.3.14"
    assert get_profile("hopper").splitk_table == "heur_h100pcie_lt12.8.3.14"  # the shipped table is untouched
    assert quiet_decide("hopper", 48, 64, 8192).table_id == "heur_h100pcie_lt12.8.3.14"


def _cli(args, monkeypatch, machine=None):
    import mmaemu.record
    from click.testing import CliRunner

    from mmaemu.cli import cli

    ran = []

    def cuda_machine(device=None):
        ran.append(device)
        if machine is None:
            raise AssertionError("the GPU was opened")
        return machine

    monkeypatch.setattr(mmaemu.record, "cuda_machine", cuda_machine)
    return CliRunner().invoke(cli, ["record", *args]), ran


def test_cli_record_usage_errors_exit_2_before_anything_runs(tmp_path, monkeypatch):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1 16 1024\n1 17 1024\n")
    out = ["--out", str(tmp_path / "out")]
    for args, message in ((["--budget", "inf"], "budget"), (["--budget", "nan"], "budget"),
                          (["--replay-seconds", "nan"], "--replay-seconds nan"), (["--name", "../x"], "lowercase slug"),
                          (["--name", "hopper"], "built-in"),
                          (["--preset", "no-such-preset"], "unknown preset 'no-such-preset'"),
                          (["--sweep", "M=1;N=17;K=16"], "multiples of 16"), (["--shapes", str(shapes)], "shapes.txt:"),
                          (["--sweep", "M=1-1200:1;N=16-16000:16;K=16"], "1,200 x 1,000 x 1 = 1,200,000")):
        result, ran = _cli(out + args, monkeypatch)
        assert (result.exit_code, ran) == (2, []), (args, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_cli_record_refusals_are_one_line(tmp_path, monkeypatch):
    result, ran = _cli(["--out", str(tmp_path), "--quiet", "--sweep", "M=16;N=64;K=4096"], monkeypatch,
                       fake_machine(probe_fn=lambda: probe(extra=" smCountTarget=66")))
    assert result.exit_code == 1 and ran and isinstance(result.exception, SystemExit)
    assert len(result.output.strip().splitlines()) == 1 and "smCountTarget=66" in result.output
    answer_fn, _ = counting(answer, stop_after=140 + 84)
    with pytest.raises(KeyboardInterrupt):
        record(tmp_path, shapes=split_shapes(), machine=fake_machine(answer_fn=answer_fn), quiet=True, replay=False)
    result, _ = _cli(["--out", str(tmp_path), "--quiet", "--sweep", "M=16;N=64;K=4096"], monkeypatch,
                     fake_machine())  # a partial recording of another plan is in the way
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert len(result.output.strip().splitlines()) == 1 and "another plan" in result.output


@pytest.mark.parametrize("torn", [b'{"format": "mmaemu-record-plan/1", "platf', b"\xff\xfe", b"[1, 2]"])
def test_a_torn_plan_of_a_partial_recording_is_a_one_line_refusal(tmp_path, monkeypatch, torn):
    """Issue 28 item 9: a plan.json that a crash or a full disk tore is refused with the ways out (exit 1, the
    recorder's code for a partial recording in the way), never a JSONDecodeError traceback; the answers stay."""
    answer_fn, _ = counting(answer, stop_after=140 + 84)
    with pytest.raises(KeyboardInterrupt):
        record(tmp_path, shapes=split_shapes(), machine=fake_machine(answer_fn=answer_fn), quiet=True, replay=False)
    partial = tmp_path / f"{NAME}.partial"
    (partial / "plan.json").write_bytes(torn)
    answers = (partial / "answers.bin").read_bytes()
    with pytest.raises(RecordError, match="plan.json is unreadable .* remove that folder to start again"):
        record(tmp_path, shapes=split_shapes(), machine=fake_machine(), quiet=True, replay=False)
    result, ran = _cli(["--out", str(tmp_path), "--quiet", "--sweep", "M=16;N=64;K=4096"], monkeypatch,
                       fake_machine())
    assert result.exit_code == 1 and ran and isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "plan.json is unreadable" in lines[0] and "--out or --name" in lines[0]
    assert (partial / "answers.bin").read_bytes() == answers and (partial / "plan.json").read_bytes() == torn


def test_an_oversized_sweep_is_refused_before_it_is_expanded(monkeypatch):
    from mmaemu.record import grid

    with pytest.raises(GridError, match="2,097,151 x 131,071 x 131,071"):  # 3.6e16 shapes: never built
        parse_sweep("M=1-2097151:1;N=16-2097151:16;K=16-2097151:16")
    with pytest.raises(GridError, match="outside 1 <= value < 2\\*\\*21"):
        parse_sweep("M=1-99999999999:1;N=16;K=16")
    monkeypatch.setattr(grid, "MAX_SHAPES", 12)  # the bound is inclusive (scaled down from a million)
    assert len(parse_sweep("M=1-4:1;N=16,32,48;K=16")) == 12
    with pytest.raises(GridError, match="4 x 3 x 2 = 24"):
        parse_sweep("M=1-4:1;N=16,32,48;K=16,32")


def test_recorded_bundle_folders_have_the_umask_s_mode(recorded):
    mask = os.umask(0o022)
    os.umask(mask)  # read back (the module fixture recorded under this same umask)
    assert stat_mode(recorded.path) == 0o777 & ~mask
    assert all(stat_mode(p) == 0o666 & ~mask for p in recorded.path.iterdir())


def stat_mode(path):
    return os.stat(path).st_mode & 0o777


def test_bundles_that_others_can_write_or_own_warn_before_they_load(recorded, tmp_path):
    from mmaemu.errors import UnsafeBundleWarning

    folder = copy_bundle(recorded, tmp_path, "open")
    os.chmod(folder, 0o777)
    mode = "the folder can be written by other users \\(mode 0777\\)"
    with pytest.warns(UnsafeBundleWarning, match=mode) as caught:
        assert mmaemu.load_profile(folder)[0].name == NAME  # it loads, with the warning
    assert [w.filename for w in caught] == [__file__]  # at the caller's line
    bundles.forget_loaded_bundles()
    folder = copy_bundle(recorded, tmp_path, "open-file")
    os.chmod(folder / "replays.json", 0o666)
    with pytest.warns(UnsafeBundleWarning, match="replays.json can be written by other users"):
        mmaemu.load_profile(folder)
    bundles.forget_loaded_bundles()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsafeBundleWarning)
        mmaemu.load_profile(recorded.path)  # this user's own bundle: no warning


def test_a_bundle_another_user_owns_warns(recorded, tmp_path):
    from mmaemu.errors import UnsafeBundleWarning

    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root (os.chown)")
    folder = copy_bundle(recorded, tmp_path, "theirs")
    os.chown(folder, 12345, 12345)
    with pytest.warns(UnsafeBundleWarning, match="the folder is owned by another user \\(uid 12345\\)"):
        mmaemu.load_profile(folder)


@pytest.mark.subprocess
def test_a_recorder_in_another_process_holds_the_bundle(tmp_path):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from mmaemu.record.lock import recording_lock\n"
                               f"with recording_lock(sys.argv[1], {NAME!r}):\n"
                               "    print('locked', flush=True); sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RecordError, match=f"another recorder \\(PID {holder.pid}\\)"):
            record(tmp_path, shapes=split_shapes(), machine=fake_machine(probe_fn=_no_probe), quiet=True)
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0 and not (tmp_path / f"{NAME}.lock").exists()
    assert not (tmp_path / f"{NAME}.partial").exists()  # the refused recorder wrote nothing


def test_an_npz_member_claiming_more_than_it_holds_is_refused_before_allocation():
    """np.load allocates an array's header shape before reading: a tiny member claiming 10**10 int64 values is
    refused as a BundleError, never a MemoryError."""
    import io
    import zipfile

    from mmaemu.platform import bundles

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (10 ** 10,)})
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w") as archive:
        archive.writestr("M.npy", header.getvalue() + b"\0" * 16)
    with pytest.raises(bundles.BundleError, match="claims"):
        bundles._columns(blob.getvalue(), "bundle x", "t")


def test_names_with_a_trailing_newline_are_not_slugs():
    from mmaemu.platform.bundle_schema import FILE_PATTERN, NAME_PATTERN

    assert NAME_PATTERN.match("abc") and not NAME_PATTERN.match("abc\n")
    assert FILE_PATTERN.match("t.json") and not FILE_PATTERN.match("t.json\n")
