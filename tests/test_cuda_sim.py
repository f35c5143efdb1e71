"""CUDA kernels without a GPU.

* Simulator: the kernels of mmaemu.cuda run under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, which must be
  set before numba.cuda is imported, so they run in a subprocess) on tiny shapes and must equal the CPU reference
  bit for bit: hopper / ada / b200_mma_sync, fast, slow and split-K, mixed formats, NaN/Inf codes, the tiled
  kernel's chunk-to-chunk carry and multi-block launches, and the epilogue kernel for every output dtype.
* PTX: every kernel is compiled to PTX for sm_89, sm_90 and sm_120 without a device, and the PTX must hold no fused
  multiply-add other than the round-toward-zero ones the biased kernel asks for (``fma.rz``: present there, and no
  float64 emulation of them), no flush-to-zero and no approximate instruction; ptxas (if installed) assembles it.
  The worker compiles through :func:`mmaemu.cuda.offline.compile_ptx` (a fake current device of the target
  capability - in this test's subprocess only). It needs
  libNVVM (a CUDA toolkit) and, with numba-cuda, NVRTC; without them the test is skipped with the reason.

Both workers start at once (this file run as a script) and the tests read their JSON reports.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from subprocess_workers import workers_fixture

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------------------------
# Workers (run as: python tests/test_cuda_sim.py sim|ptx)


def _sim_worker():
    import numpy as np
    from numba.core import config

    assert config.ENABLE_CUDASIM, "the simulator worker needs NUMBA_ENABLE_CUDASIM=1"
    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import engine, kernels, launch, schedule_skip, selftest
    from mmaemu.model.presets import get_preset

    report = {"gemm": [], "skipped": [], "epilogue": None, "implementation": None}
    from mmaemu.cuda import shim

    report["implementation"] = shim.cuda_implementation()
    from mmaemu.cuda import biased_kernel

    report["lanes_geometry"] = [kernels.LANES_M, kernels.LANES_N, kernels.LANES_ROWS, kernels.LANES_COLS]
    report["biased_geometry"] = [biased_kernel.BIASED_M, biased_kernel.BIASED_N, biased_kernel.BIASED_ROWS,
                                 biased_kernel.BIASED_COLS, biased_kernel.BIASED_K]
    cases = [c.shrunk() for c in selftest.GEMM_CASES]
    # The tiled kernel across several thread blocks (M, N > 16), and a K that needs several chunks.
    cases.append(selftest.GemmCase("multi-block tiled hopper slow", "hopper", "e4m3", "e5m2", False, 1, "none",
                                   18, 20, 40, "random", 101))
    # The lanes kernel's slow chains restarting every 128 k, across its stages (K beyond the tiny cases' 96).
    lanes_only = [selftest.GemmCase("lanes hopper slow, chain restarts", "hopper", "e4m3", "e5m2", False, 1, "none",
                                    3, 2, 300, "adversarial", 102),
                  selftest.GemmCase("lanes ada slow, chain restarts", "ada", "e5m2", "e4m3", False, 1, "none",
                                    2, 3, 270, "random", 103),
                  # Several thread blocks of LANES_M x LANES_N outputs each way, M and N not multiples of the
                  # per-thread register tile (LANES_ROWS x LANES_COLS) nor of the block's, K not of nfma.
                  selftest.GemmCase("lanes multi-block ragged hopper fast", "hopper", "e5m2", "e4m3", True, 1,
                                    "none", kernels.LANES_M + 3, kernels.LANES_N + 5, 72, "random", 104),
                  # The same for the biased kernel's larger blocks, with NaN/Inf codes on the way.
                  selftest.GemmCase("biased multi-block ragged ada fast", "ada", "e4m3", "e4m3", True, 1,
                                    "none", biased_kernel.BIASED_M + 3, biased_kernel.BIASED_N + 5, 40, "adversarial",
                                    105)]
    cases += lanes_only
    seen = set()
    for case in cases:
        if case in seen:
            continue
        seen.add(case)
        a, b = selftest.gemm_operands(case)
        preset = get_preset(case.preset, warn=False)
        want = accumulate_codes(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme,
                                reference=True)
        runs = [("simple", None), ("tiled", None), ("tiled", preset.nfma)]  # chunk = nfma: every block a stage
        if case.M > 4:
            runs = [("tiled", None)]
        runs = [] if case in lanes_only else runs
        runs += [("lanes", preset.nfma)] + ([("lanes", None)] if case.M > 4 or case in lanes_only else [])
        runs += [("biased", None)]
        for kernel, chunk in runs:
            skip = schedule_skip(kernel, preset, case.fmt_a, case.fmt_b, case.fast, case.splits, case.scheme)
            if skip is not None:
                report["skipped"].append({"case": case.label, "kernel": kernel, "preset": case.preset,
                                          "splits": case.splits, "reason": skip})
                continue
            start = time.perf_counter()
            got = engine.accumulate_numpy(kernel, a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits,
                                          case.scheme, chunk=chunk)
            count, first = selftest.compare_bits(got, want)
            report["gemm"].append({"case": case.label, "kernel": kernel, "chunk": chunk,
                                   "shape": [case.M, case.N, case.K], "preset": case.preset,
                                   "fast": case.fast, "splits": case.splits, "scheme": case.scheme,
                                   "formats": [case.fmt_a, case.fmt_b], "data": case.data,
                                   "nonfinite_outputs": int(np.count_nonzero(~np.isfinite(want))),
                                   "mismatches": count, "first": first,
                                   "seconds": round(time.perf_counter() - start, 2)})
    start = time.perf_counter()
    passed, details = selftest.run_epilogue_cases(engine.epilogue_numpy, size="tiny")
    report["epilogue"] = {"passed": passed, "cases": len(details),
                          "bad": [d for d in details if d["mismatches"]][:3],
                          "seconds": round(time.perf_counter() - start, 2)}
    # The biased kernel with operands cut into several decoded panels each way and a decode grid smaller than K
    # (its limits shrunk so that tiny shapes reach them).
    panels = []
    limits = (launch.MAX_GRID_Y, launch.PANEL_BYTES)
    launch.MAX_GRID_Y, launch.PANEL_BYTES = 2, 12 * 224 * 32
    try:
        for fast, splits, scheme in ((True, 1, "none"), (False, 2, "contiguous")):
            case = selftest.GemmCase("biased panels", "hopper", "e4m3", "e5m2", fast, splits, scheme, 40, 70, 200,
                                     "random", 106)
            a, b = selftest.gemm_operands(case)
            preset = get_preset("hopper", warn=False)
            want = accumulate_codes(a, b, "e4m3", "e5m2", preset, fast, splits, scheme, reference=True)
            got = engine.accumulate_numpy("biased", a, b, "e4m3", "e5m2", preset, fast, splits, scheme)
            panels.append({"fast": fast, "splits": splits, "mismatches": selftest.compare_bits(got, want)[0],
                           "rows_a": launch._panel_rows(200, biased_kernel.BIASED_M),
                           "rows_b": launch._panel_rows(200, biased_kernel.BIASED_N)})
    finally:
        launch.MAX_GRID_Y, launch.PANEL_BYTES = limits
    report["biased_panels"] = panels
    # The schedule-length guard of the tiled kernel and an unknown kernel name fail loudly.
    errors = {}
    for kernel, schedule in (("tiled", (64, 1, 0, 0, 0)), ("nope", (64, 1, 0, 0, 0, 0))):
        try:
            z = np.zeros((1, 64), np.int8)
            launch.launch_gemm(kernel, z, z.astype(np.int16), z, z.astype(np.int16), schedule, (32,) + (0,) * 6,
                                np.zeros((1, 1), np.float32))
            errors[kernel] = None
        except Exception as exc:
            errors[kernel] = type(exc).__name__
    # The lanes kernel refuses a split schedule (the dispatcher never gives it one).
    try:
        z = np.zeros((1, 256), np.uint8)
        launch.launch_lanes(z, z, "e4m3", "e4m3", (128, 2, 0, 0, 0, 1), (32, 7, 0, 13, 13, -132, 0),
                             np.zeros((1, 1), np.float32))
        errors["lanes"] = None
    except Exception as exc:
        errors["lanes"] = type(exc).__name__
    # The biased kernel refuses a late-accumulator preset (b200_mma_sync's parameters).
    try:
        z = np.zeros((1, 256), np.uint8)
        launch.launch_codes("biased", z, z, "e4m3", "e4m3", (256, 1, 0, 0, 0, 0), (32, 19, 0, 25, 23, -133, 1),
                             np.zeros((1, 1), np.float32))
        errors["biased"] = None
    except Exception as exc:
        errors["biased"] = type(exc).__name__
    report["errors"] = errors
    print(json.dumps(report))


def _ptx_worker():
    report = {"skipped": None, "targets": {}}
    try:
        import numba.cuda  # noqa: F401
    except Exception as exc:
        report["skipped"] = f"numba.cuda cannot be imported: {exc}"
        print(json.dumps(report))
        return

    from mmaemu.cuda import launch, offline, shim

    implementation = shim.cuda_implementation()
    report["implementation"] = implementation
    ptxas = None
    for candidate in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = pathlib.Path(candidate or "/nonexistent") / "bin" / "ptxas"
        if path.is_file():
            ptxas = str(path)
            break
    report["ptxas"] = ptxas
    for cc in ((8, 9), (9, 0), (12, 0)):
        target = {}
        for name, (kernel, signature) in launch.signatures().items():
            try:
                ptx = offline.compile_ptx(kernel, signature, cc)
            except Exception as exc:
                text = " ".join(str(exc).split())
                if any(s in text for s in ("NVVM", "libnvvm", "nvrtc", "NVRTC", "libdevice", "CUDA_HOME",
                                           "cudadevrt", "Failure finding")):
                    report["skipped"] = f"no CUDA compiler libraries: {type(exc).__name__}: {text[:300]}"
                    print(json.dumps(report))
                    return
                raise
            lines = ptx.splitlines()
            entry = {
                "bytes": len(ptx),
                "target": [ln.split()[1] for ln in lines if ln.startswith(".target")],
                # fma.rz: the explicit round-toward-zero ones of the biased formulation (fma_toward_zero);
                # any other fma would be a contraction of a multiply and an add.
                "fma": sum(1 for ln in lines if "fma." in ln and "fma.rz." not in ln
                           and not ln.lstrip().startswith("//")),
                "fma_rz": sum(1 for ln in lines if "fma.rz.f32" in ln and not ln.lstrip().startswith("//")),
                "f64": sum(1 for ln in lines if ".f64" in ln and not ln.lstrip().startswith("//")),
                "ftz": sum(1 for ln in lines if ".ftz" in ln and not ln.lstrip().startswith("//")),
                "approx": sum(1 for ln in lines if ".approx" in ln and not ln.lstrip().startswith("//")),
            }
            if ptxas:
                sm = f"sm_{cc[0]}{cc[1]}"
                path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"mmaemu-{os.getpid()}-{name}-{sm}.ptx"
                path.write_text(ptx)
                run = subprocess.run([ptxas, f"-arch={sm}", str(path), "-o", os.devnull], capture_output=True,
                                     text=True)
                path.unlink()
                entry["ptxas"] = run.returncode
                entry["ptxas_error"] = run.stderr[-300:] if run.returncode else ""
            target[name] = entry
        report["targets"][f"sm_{cc[0]}{cc[1]}"] = target
    print(json.dumps(report))


# ----------------------------------------------------------------------------------------------------------------
# Tests


workers = workers_fixture(__file__, {"sim": {"NUMBA_ENABLE_CUDASIM": "1"}, "ptx": {"NUMBA_ENABLE_CUDASIM": "0"}})


def test_simulated_kernels_equal_cpu_reference(workers):
    report = workers("sim")
    bad = [r for r in report["gemm"] if r["mismatches"]]
    assert not bad, json.dumps(bad[:5], indent=1)
    runs = report["gemm"]
    # What was covered: every preset, fast / slow / each split scheme, mixed formats, NaN/Inf outputs, both
    # kernels, the tiled kernel's chunk carry and a multi-block launch.
    assert {r["preset"] for r in runs} == {"hopper", "ada", "b200_mma_sync"}
    assert {r["kernel"] for r in runs} == {"simple", "tiled", "lanes", "biased"}
    lanes = [r for r in runs if r["kernel"] == "lanes"]
    # The lanes kernel: hopper and ada, fast and slow (chains restarting across stages), every format pair,
    # NaN/Inf outputs, several stages and a multi-block launch; split-K and b200_mma_sync skipped by design.
    assert {(r["preset"], r["fast"]) for r in lanes} == {("hopper", True), ("hopper", False), ("ada", True),
                                                         ("ada", False)}
    assert {tuple(r["formats"]) for r in lanes} == {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"),
                                                    ("e5m2", "e5m2")}
    assert any(r["nonfinite_outputs"] for r in lanes)
    assert any(not r["fast"] and r["shape"][2] > 256 and r["chunk"] is None for r in lanes)
    assert any(r["shape"][0] > 16 and r["shape"][1] > 16 for r in lanes)
    # Several thread blocks each way, M and N not multiples of the per-thread register tile.
    block_m, block_n, rows, cols = report["lanes_geometry"]
    assert any(r["shape"][0] > block_m and r["shape"][1] > block_n and r["shape"][0] % rows
               and r["shape"][1] % cols for r in lanes)
    # The biased kernel: the same coverage, several stages of BIASED_K and several thread blocks each way.
    biased = [r for r in runs if r["kernel"] == "biased"]
    assert {(r["preset"], r["fast"]) for r in biased} == {("hopper", True), ("hopper", False), ("ada", True),
                                                          ("ada", False)}
    assert {r["scheme"] for r in biased} == {"none", "contiguous", "serial", "pairwise"}
    assert {tuple(r["formats"]) for r in biased} == {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"),
                                                     ("e5m2", "e5m2")}
    assert any(r["nonfinite_outputs"] for r in biased)
    block_m, block_n, rows, cols, stage = report["biased_geometry"]
    assert any(not r["fast"] and r["shape"][2] > 128 for r in biased)
    assert any(r["shape"][0] > block_m and r["shape"][1] > block_n and r["shape"][0] % rows
               and r["shape"][1] % cols and r["shape"][2] % stage for r in biased)
    skipped = report["skipped"]
    assert skipped and {s["kernel"] for s in skipped} == {"lanes", "biased"}
    assert {s["preset"] for s in skipped if s["splits"] == 1} == {"b200_mma_sync"}
    assert all(s["splits"] > 1 or s["preset"] == "b200_mma_sync" for s in skipped)
    assert {s["preset"] for s in skipped if s["kernel"] == "biased"} == {"b200_mma_sync"}
    assert {r["scheme"] for r in runs} == {"none", "contiguous", "serial", "pairwise"}
    assert {r["fast"] for r in runs} == {True, False}
    assert {tuple(r["formats"]) for r in runs} >= {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"),
                                                    ("e5m2", "e5m2")}
    assert any(r["nonfinite_outputs"] for r in runs)
    assert any(r["kernel"] == "tiled" and r["chunk"] and r["shape"][2] > r["chunk"] for r in runs)
    assert any(r["shape"][0] > 16 and r["shape"][1] > 16 for r in runs)
    assert all(max(r["shape"][:2]) <= 4 and (r["shape"][2] <= 96 or "chain restarts" in r["case"])
               for r in runs if r["shape"][0] <= 16)


def test_simulated_epilogue_equals_cpu(workers):
    report = workers("sim")
    epilogue = report["epilogue"]
    assert epilogue["passed"], json.dumps(epilogue["bad"], indent=1)
    assert epilogue["cases"] >= 5 * 5  # five scale settings x five output dtypes


def test_simulated_biased_kernel_across_decoded_panels(workers):
    panels = workers("sim")["biased_panels"]
    assert len(panels) == 2 and all(p["mismatches"] == 0 for p in panels), panels
    # 40 rows of A in panels of 32 (a thread block), 70 rows of B in panels of 64: two panels each way.
    assert {(p["rows_a"], p["rows_b"]) for p in panels} == {(32, 64)}


def test_simulated_launch_guards(workers):
    errors = workers("sim")["errors"]
    assert errors == {"tiled": "RuntimeError", "nope": "ValueError", "lanes": "RuntimeError", "biased": "RuntimeError"}


def test_ptx_for_sm89_sm90_sm120_without_a_device(workers):
    report = workers("ptx")
    if report["skipped"]:
        pytest.skip(report["skipped"])
    assert set(report["targets"]) == {"sm_89", "sm_90", "sm_120"}
    for sm, kernels in report["targets"].items():
        assert set(kernels) == {"biased", "biased_split", "decode", "lanes", "simple", "tiled", "override",
                                "epilogue"}
        # The biased kernels run the GPU's own fma.rz, not the float64 emulation of fma_toward_zero.
        for name in ("biased", "biased_split"):
            assert kernels[name]["fma_rz"] >= 4 and kernels[name]["f64"] == 0, (name, kernels[name])
        for name, entry in kernels.items():
            assert entry["target"] == [sm], (sm, name, entry["target"])
            assert entry["fma"] == 0, f"{name} {sm}: fused multiply-add (a contraction) in the PTX"
            assert name.startswith("biased") or entry["fma_rz"] == 0, f"{name} {sm}: fma.rz outside the biased kernels"
            assert entry["ftz"] == 0, f"{name} {sm}: flush-to-zero in the PTX"
            assert entry["approx"] == 0, f"{name} {sm}: approximate instruction in the PTX"
            if report.get("ptxas"):
                assert entry["ptxas"] == 0, f"ptxas rejected {name} for {sm}: {entry['ptxas_error']}"


if __name__ == "__main__":
    {"sim": _sim_worker, "ptx": _ptx_worker}[sys.argv[1]]()
