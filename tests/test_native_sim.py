"""``cuda:native`` without a GPU: the kernel under numba's CUDA simulator (with the instructions' CPU twins), and
its SASS for sm_90a.

* Simulator (``NUMBA_ENABLE_CUDASIM=1``, a subprocess): the native GEMM kernel on the shrunk hopper self-test
  cases (fast, slow, contiguous split-K, every format pair, NaN/Inf) and on several thread blocks with ragged
  M, N, K, through mmaemu.cuda.engine (padding, stage plan, split combination, NaN/Inf override), bit for bit
  against the CPU reference; the instruction probe end to end on two format pairs; and the probe catching a
  kernel whose descriptors disagree with its staging layout.
* SASS (a second subprocess, numba-cuda only): every native kernel compiles for sm_90a; ptxas assembles it without
  spills or serialised wgmma; the SASS holds the format pair's QGMMA and no other floating-point instruction in
  the accumulation path (fast: none at all; slow: exactly the 64 FADDs that add each chain into the partial).
  Skipped, with the reason, where numba-cuda, NVRTC/libNVVM, ptxas or cuobjdump/nvdisasm are missing.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 600
FLOAT_OPS = {"FADD", "FFMA", "FMUL", "FMNMX", "FSET", "FSETP", "FCHK", "FRND", "F2F", "HADD2", "HFMA2", "HMUL2",
             "HMMA", "DADD", "DFMA", "DMUL", "MUFU"}


def _sim_worker():
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import engine, probe, probe_kernel, selftest
    from mmaemu.model.presets import get_preset

    report = {"gemm": [], "probe": None, "mutated_probe": None, "declined": None}
    # The shrunk hopper self-test cases, and cases with slow chain restarts (K > 128) across several thread blocks
    # along M and along N.
    cases = [c.shrunk() for c in selftest.GEMM_CASES if c.preset == "hopper"]
    cases.append(selftest.GemmCase("native multi-block ragged, slow restarts, e5m2 x e4m3", "hopper", "e5m2",
                                   "e4m3", False, 1, "none", 130, 6, 300, "random", 301))
    cases.append(selftest.GemmCase("native multi-block, contiguous S=2 fast", "hopper", "e4m3", "e4m3", True, 2,
                                   "contiguous", 3, 131, 300, "adversarial", 302))
    import time

    start = time.perf_counter()
    for case in cases:
        a, b = selftest.gemm_operands(case)
        preset = get_preset(case.preset, warn=False)
        want = accumulate_codes(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme,
                                reference=True)
        got = engine.accumulate_numpy("native", a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits,
                                      case.scheme)
        count, first = selftest.compare_bits(got, want)
        report["gemm"].append({"case": case.label, "shape": [case.M, case.N, case.K], "fast": case.fast,
                               "splits": case.splits, "formats": [case.fmt_a, case.fmt_b],
                               "nonfinite_outputs": int(np.count_nonzero(~np.isfinite(want))),
                               "mismatches": count, "first": first})
    report["gemm_seconds"] = round(time.perf_counter() - start, 1)
    start = time.perf_counter()
    tiles = probe.probe_tiles(pairs=(("e5m2", "e4m3"),))
    passed, details = probe.run_probe(probe.device_runner(), tiles)
    report["probe_seconds"] = round(time.perf_counter() - start, 1)
    report["probe"] = {"passed": passed, "tiles": details["tiles"], "summary": probe.summarize(details)}
    # A kernel whose descriptors say the K-adjacent core matrices lie elsewhere than its staging put them.
    saved = probe_kernel.LEADING_BYTES
    probe_kernel.LEADING_BYTES = saved // 2
    try:
        passed, details = probe.run_probe(probe.device_runner(), tiles[:1])
    finally:
        probe_kernel.LEADING_BYTES = saved
    report["mutated_probe"] = {"passed": passed, "summary": probe.summarize(details)}
    try:
        z = np.zeros((1, 64), np.uint8)
        engine.accumulate_numpy("native", z, z, "e4m3", "e4m3", get_preset("ada", warn=False), True)
    except RuntimeError as exc:
        report["declined"] = str(exc)
    print(json.dumps(report))


def _sass_worker():
    report = {"skipped": None, "kernels": {}}
    try:
        from mmaemu.cuda import launch, offline, shim
    except Exception as exc:  # pragma: no cover - numba.cuda missing
        report["skipped"] = f"numba.cuda cannot be imported: {exc}"
        print(json.dumps(report))
        return
    if shim.cuda_implementation() != "numba-cuda":
        report["skipped"] = ("cuda:native targets sm_90a, which only numba-cuda compiles (pip install "
                             "'mmaemu[cuda]'); this environment has numba's built-in CUDA target")
        print(json.dumps(report))
        return
    sys.path.insert(0, str(ROOT / "scripts"))
    import tempfile

    import sass_report

    try:
        for tool in ("ptxas", "cuobjdump", "nvdisasm"):
            sass_report._tool(tool)
    except SystemExit as exc:
        report["skipped"] = f"no CUDA binary tools: {exc}"
        print(json.dumps(report))
        return
    with tempfile.TemporaryDirectory() as folder:
        for name, (kernel, signature) in launch.native_signatures().items():
            try:
                ptx = offline.compile_ptx(kernel, signature, (9, 0, "a"))
            except Exception as exc:
                text = " ".join(str(exc).split())
                if any(s in text for s in ("NVVM", "nvvm", "nvrtc", "NVRTC", "libdevice", "Failure finding")):
                    report["skipped"] = f"no CUDA compiler libraries: {type(exc).__name__}: {text[:300]}"
                    print(json.dumps(report))
                    return
                raise
            path = pathlib.Path(folder) / f"{name}.ptx"
            path.write_text(ptx)
            run = subprocess.run([sass_report._tool("ptxas"), "-arch=sm_90a", "-v", str(path), "-o",
                                  str(path.with_suffix(".cubin"))], capture_output=True, text=True)
            if run.returncode:
                report["kernels"][name] = {"ptxas_error": run.stderr[-1500:]}
                continue
            sass = subprocess.run([sass_report._tool("cuobjdump"), "-sass", str(path.with_suffix(".cubin"))],
                                  capture_output=True, text=True, check=True).stdout
            ops = [m.group(3) for m in map(sass_report.SASS_LINE.match, sass.splitlines()) if m]
            report["kernels"][name] = {
                "target": re.findall(r"^\.target (\S+)", ptx, re.M),
                "gmma": sorted(set(re.findall(r"\b([QH]GMMA\.[0-9A-Za-z_.]+)", sass))),
                "dummy_gmma": sum(1 for line in sass.splitlines() if "HGMMA" in line and "RZ, gdesc[URZ], RZ" in line),
                "float_ops": {op: sum(1 for o in ops if o.split(".")[0] == op) for op in FLOAT_OPS
                              if any(o.split(".")[0] == op for o in ops)},
                "spills": re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", run.stderr),
                "registers": [int(v) for v in re.findall(r"Used (\d+) registers", run.stderr)],
                "serialized": "serialized" in run.stderr,
            }
    print(json.dumps(report))


def _spawn(mode, simulator):
    env = dict(os.environ)
    env["NUMBA_ENABLE_CUDASIM"] = "1" if simulator else "0"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.Popen([sys.executable, __file__, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(ROOT))


@pytest.fixture(scope="module")
def workers():
    procs = {"sim": _spawn("sim", True), "sass": _spawn("sass", False)}
    reports = {}

    def get(mode):
        if mode not in reports:
            try:
                out, err = procs[mode].communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                procs[mode].kill()
                pytest.fail(f"{mode} worker timed out after {TIMEOUT_S} s")
            if procs[mode].returncode != 0:
                pytest.fail(f"{mode} worker failed (exit {procs[mode].returncode}):\n{err[-4000:]}")
            reports[mode] = json.loads(out.strip().splitlines()[-1])
        return reports[mode]

    yield get
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_simulated_native_kernel_equals_cpu_reference(workers):
    runs = workers("sim")["gemm"]
    bad = [r for r in runs if r["mismatches"]]
    assert not bad, json.dumps(bad[:3], indent=1)
    assert {r["fast"] for r in runs} == {True, False}
    assert {r["splits"] for r in runs} >= {1, 2, 3, 4}
    assert {tuple(r["formats"]) for r in runs} == {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"),
                                                   ("e5m2", "e5m2")}
    assert any(r["nonfinite_outputs"] for r in runs)
    # Several thread blocks (128 x 128 outputs each) along M and along N, ragged K.
    assert any(r["shape"][0] > 128 for r in runs) and any(r["shape"][1] > 128 for r in runs)
    assert any(r["shape"][2] % 64 for r in runs)


def test_simulated_probe_passes_and_catches_a_layout_bug(workers):
    report = workers("sim")
    assert report["probe"]["passed"], report["probe"]["summary"]
    assert report["probe"]["tiles"] == 15
    assert not report["mutated_probe"]["passed"]
    assert report["mutated_probe"]["summary"].startswith("instruction probe: 1 of 1 tiles differ")
    assert report["declined"].startswith("the native kernel computes the block of the sm_90 warpgroup MMA")


def test_sass_for_sm90a_holds_qgmma_and_no_other_float_instruction(workers):
    report = workers("sass")
    if report["skipped"]:
        pytest.skip(report["skipped"])
    kernels = report["kernels"]
    assert len(kernels) == 12
    for name, entry in kernels.items():
        assert "ptxas_error" not in entry, (name, entry)
        fmt_a, fmt_b = name.split("_")[-2:]
        assert entry["target"] == ["sm_90a"], name
        assert entry["gmma"] in ([f"QGMMA.64x128x32.F32.{fmt_a.upper()}.{fmt_b.upper()}"],
                                 ["HGMMA.64x8x16.F16", f"QGMMA.64x128x32.F32.{fmt_a.upper()}.{fmt_b.upper()}"]), \
            (name, entry["gmma"])
        # ptxas closes an empty wgmma group with an HGMMA that reads and writes nothing (RZ): never a result.
        assert entry["dummy_gmma"] == ("HGMMA.64x8x16.F16" in entry["gmma"]), (name, entry)
        assert all(s == ["0", "0"] for s in map(list, entry["spills"])), (name, entry["spills"])
        assert not entry["serialized"], name
        if name.startswith("native_slow"):
            assert entry["float_ops"] == {"FADD": 64}, (name, entry["float_ops"])
        else:
            assert entry["float_ops"] == {}, (name, entry["float_ops"])
    assert max(kernels["native_fast_e4m3_e4m3"]["registers"]) <= 128  # two thread blocks per SM


if __name__ == "__main__":
    {"sim": _sim_worker, "sass": _sass_worker}[sys.argv[1]]()
