"""CUDA kernels without a GPU.

* Simulator: the kernels of mmaemu.cuda run under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, which must be
  set before numba.cuda is imported, so they run in a subprocess) on tiny shapes and must equal the CPU reference
  bit for bit: the offset kernel on hopper / ada, fast, slow and every split scheme (padding tiles and splits that
  own none), mixed formats, NaN/Inf codes, several thread blocks and several packed panels; the reference kernel
  (``simple``) on every self-test case including b200_mma_sync; the epilogue kernel for every output dtype.
* PTX: every kernel is compiled to PTX for sm_89, sm_90 and sm_120 without a device, and the PTX must hold no fused
  multiply-add other than the round-toward-zero ones the offset kernels ask for (``fma.rz``: present there, and no
  float64 emulation of them) and the power sums' ``fma.rn.bf16x2`` (only in ``offset_powers``), no flush-to-zero and
  no approximate instruction. The worker compiles through
  :func:`mmaemu.cuda.offline.compile_ptx` (a fake current device of the target capability - in this test's
  subprocess only); it needs libNVVM (a CUDA toolkit) and, with numba-cuda, NVRTC.
* SASS gate: ``ptxas -v`` assembles every kernel for each target (no kernel may spill) and ``nvdisasm -c``
  disassembles the offset kernels, whose block loops must stay within :data:`BUDGETS` (hopper; :data:`ADA_BUDGETS`
  ada) SASS instructions per product (:func:`mmaemu.cuda.sass.block_loop_cost`). A mutated loop and a mutated budget
  must fail the gate. Without ptxas or nvdisasm these tests skip and say which tool is missing; with
  ``MMAEMU_TEST_REQUIRE_SASS=1`` (set by ``.ci/run``) they fail instead.

Both workers start at once (this file run as a script) and the tests read their JSON reports.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time

import pytest
from subprocess_workers import offline_ptx, sass_tools_missing, skip_sass, workers_fixture

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGETS = ((8, 9), (9, 0), (12, 0))
# SASS instructions per product of the offset kernels' block loops, hopper: the issue's 3.6 everywhere for E4M3 x
# E4M3 (offset_powers, bf16x2 power sums); the add-max kernel of the other pairs keeps it on sm_90, while sm_89 and
# sm_120 lack the fused packed add-maximum (an add and a maximum per two products): a regression bound there.
BUDGETS = {"offset_powers": {"sm_90": 3.6, "sm_89": 3.6, "sm_120": 3.6},
           "offset": {"sm_90": 3.6, "sm_89": 3.8, "sm_120": 3.8}}
# ada (16-product blocks: twice the block start and end per product) - regression bounds at the counts reached.
ADA_BUDGETS = {"offset_powers": {"sm_90": 3.8, "sm_89": 3.8, "sm_120": 3.85},
               "offset": {"sm_90": 3.95, "sm_89": 4.4, "sm_120": 4.45}}
OFFSET_KERNELS = tuple(BUDGETS)
PRESET_NFMA = {"hopper": 32, "ada": 16}


# ----------------------------------------------------------------------------------------------------------------
# Workers (run as: python tests/test_cuda_sim.py sim|ptx)


# The offset kernel under the simulator costs about its thread count times its stages (each of the 256 threads of a
# block is a Python thread; the decode kernel packs whole 128- and 64-row thread blocks), whatever M and N up to one
# block. So each path is reached once, on the fewest stages that reach it: {label: K}. Together they cover both
# presets fast and slow, both exponent passes (power sums: E4M3 x E4M3; add-max), every format pair, every split
# scheme (an unsplit fast chain, which is one range from k = 0, and an unsplit slow one), splits that own no tile
# and tiles past K, splits whose partials are all nonzero (serial and pairwise, K = 96 over 64-wide tiles),
# adversarial operands, NaN/Inf codes, a stage ragged in K and a block cut short by K (K = 40 for ada's 16-k
# blocks, 48 for hopper's 32-k ones), and one row of outputs with a split that is not pairwise (the split
# combination must not touch the slot array). Where another case reaches the same paths a self-test case is left
# out here (the reference kernel runs all of them); b200_mma_sync is declined by the offset kernel by design.
OFFSET_CASES = {"random ada fast, ragged K": 40, "hopper contiguous S=4 fast, empty split": 64,
                "ada serial S=3 fast, padding tile": 96, "ada pairwise S=5 slow e5m2 x e4m3": 96,
                "hopper slow e5m2 x e5m2": 48, "NaN/Inf e4m3 x e5m2 ada serial S=2": 40, "b200_mma_sync fast": 96}
ONE_ROW_CASE = "hopper contiguous S=4 fast, empty split"  # run on a 1 x 3 output


def _offset_case(case):
    """The offset kernel's version of a shrunk self-test case: K of OFFSET_CASES, one row for ONE_ROW_CASE."""
    rows, cols = (1, 3) if case.label == ONE_ROW_CASE else (case.M, case.N)
    return dataclasses.replace(case, M=rows, N=cols, K=OFFSET_CASES[case.label])


def _gemm_cases():
    """(case, kernel) pairs of the simulator run: every self-test case shrunk on the reference kernel, those of
    OFFSET_CASES on the offset kernel."""
    from mmaemu.cuda import selftest

    shrunk = [c.shrunk() for c in selftest.GEMM_CASES]
    return [(c, "simple") for c in shrunk] + [(_offset_case(c), "offset") for c in shrunk if c.label in OFFSET_CASES]


def _run_gemm(kernel, case, report):
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import engine, launch, schedule_skip, selftest
    from mmaemu.model.presets import get_preset

    preset = get_preset(case.preset, warn=False)
    skip = schedule_skip(kernel, preset, case.fmt_a, case.fmt_b, case.fast, case.splits, case.scheme)
    if skip is not None:
        report["skipped"].append({"case": case.label, "kernel": kernel, "preset": case.preset,
                                  "splits": case.splits, "reason": skip})
        return
    a, b = selftest.gemm_operands(case)
    want = accumulate_codes(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme,
                            reference=True)
    start = time.perf_counter()
    got = engine.accumulate_numpy(kernel, a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme)
    count, first = selftest.compare_bits(got, want)
    method = launch._exponent_method(case.fmt_a, case.fmt_b, preset.nfma) if kernel == "offset" else None
    report["gemm"].append({"case": case.label, "kernel": kernel, "method": method, "shape": [case.M, case.N, case.K],
                           "preset": case.preset, "fast": case.fast, "splits": case.splits, "scheme": case.scheme,
                           "formats": [case.fmt_a, case.fmt_b], "data": case.data,
                           "nonfinite_outputs": int(np.count_nonzero(~np.isfinite(want))),
                           "mismatches": count, "first": first, "seconds": round(time.perf_counter() - start, 2)})


def _panels(report):
    """The offset kernel on several thread blocks each way, with operands cut into several packed panels each way
    and a packing grid smaller than K (the launcher's limits shrunk so that small shapes reach them); pairwise
    split-K, so that the slot array is cut into panels too; E4M3 x E4M3, so that the power sums' paired rows meet
    odd row counts and panel starts."""
    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import engine, launch, offset_kernel, selftest
    from mmaemu.model.presets import get_preset

    limits = (launch.MAX_GRID_Y, launch.PANEL_BYTES)
    K = 40  # 10 groups of four k: more than MAX_GRID_Y x DECODE_BLOCK[1] = 8, ragged in its last stage
    launch.MAX_GRID_Y, launch.PANEL_BYTES = 1, launch.PACKED_BYTES * 64 * 64  # panels of 64 rows (Kp = 64)
    try:
        case = selftest.GemmCase("offset panels, pairwise S=2 hopper slow", "hopper", "e4m3", "e4m3", False, 2,
                                 "pairwise", offset_kernel.BLOCK_M + 3, offset_kernel.BLOCK_N + 5, K, "adversarial",
                                 106)
        a, b = selftest.gemm_operands(case)
        preset = get_preset("hopper", warn=False)
        want = accumulate_codes(a, b, "e4m3", "e4m3", preset, False, 2, "pairwise", reference=True)
        start = time.perf_counter()
        got = engine.accumulate_numpy("offset", a, b, "e4m3", "e4m3", preset, False, 2, "pairwise")
        report["panels"] = {"shape": [case.M, case.N, K], "mismatches": selftest.compare_bits(got, want)[0],
                            "rows": [launch._panel_rows(K, offset_kernel.BLOCK_M),
                                     launch._panel_rows(K, offset_kernel.BLOCK_N)],
                            "groups": -(-K // 4), "grid_groups": launch.MAX_GRID_Y * offset_kernel.DECODE_BLOCK[1],
                            "seconds": round(time.perf_counter() - start, 2)}
    finally:
        launch.MAX_GRID_Y, launch.PANEL_BYTES = limits


def _launch_errors():
    """Exception names of launches that must fail loudly: an unknown kernel, codes to the decoded-operand launcher,
    and a preset the offset kernel declines."""
    import numpy as np

    from mmaemu.cuda import launch

    attempts = {
        "unknown": lambda z: launch.launch_gemm("nope", z, z, z, z, (64, 1, 0, 0, 0, 0), (32,) + (0,) * 6,
                                                np.zeros((1, 1), np.float32)),
        "codes to launch_gemm": lambda z: launch.launch_gemm("offset", z, z, z, z, (64, 1, 0, 0, 0, 0),
                                                             (32,) + (0,) * 6, np.zeros((1, 1), np.float32)),
        "late accumulator": lambda z: launch.launch_codes("offset", z.view(np.uint8), z.view(np.uint8), "e4m3",
                                                          "e4m3", (256, 1, 0, 0, 0, 0), (32, 19, 0, 25, 23, -133, 1),
                                                          np.zeros((1, 1), np.float32)),
    }
    errors = {}
    for name, attempt in attempts.items():
        try:
            attempt(np.zeros((1, 64), np.int8))
            errors[name] = None
        except Exception as exc:
            errors[name] = type(exc).__name__
    return errors


def _sim_worker():
    from numba.core import config

    assert config.ENABLE_CUDASIM, "the simulator worker needs NUMBA_ENABLE_CUDASIM=1"
    from mmaemu.cuda import engine, offset_kernel, selftest, shim

    report = {"gemm": [], "skipped": [], "implementation": shim.cuda_implementation(),
              "offset_block": [offset_kernel.BLOCK_M, offset_kernel.BLOCK_N]}
    for case, kernel in _gemm_cases():
        _run_gemm(kernel, case, report)
    start = time.perf_counter()
    passed, details = selftest.run_epilogue_cases(engine.epilogue_numpy, size="tiny")
    report["epilogue"] = {"passed": passed, "cases": len(details), "bad": [d for d in details if d["mismatches"]][:3],
                          "seconds": round(time.perf_counter() - start, 2)}
    _panels(report)
    report["errors"] = _launch_errors()
    print(json.dumps(report))


def _ptx_entry(ptx, sm):
    lines = [ln for ln in ptx.splitlines() if not ln.lstrip().startswith("//")]
    return {
        "bytes": len(ptx),
        "target": [ln.split()[1] for ln in lines if ln.startswith(".target")],
        # fma.rz: the explicit round-toward-zero ones of the offset formulation (fma_toward_zero); any other fma
        # would be a contraction of a multiply and an add.
        "fma": sum(1 for ln in lines if "fma." in ln and "fma.rz." not in ln and "fma.rn.bf16x2" not in ln),
        "fma_rz": sum(1 for ln in lines if "fma.rz.f32" in ln),
        "fma_bf16x2": sum(1 for ln in lines if "fma.rn.bf16x2" in ln),  # the power sums' (offset_powers)
        "f64": sum(1 for ln in lines if ".f64" in ln),
        "ftz": sum(1 for ln in lines if ".ftz" in ln),
        "approx": sum(1 for ln in lines if ".approx" in ln),
    }


def _sass_entry(kernel, ptx, sm):
    """ptxas's resources of one kernel and, for the offset kernels, their block loop's cost per preset and SASS."""
    from mmaemu.cuda import offset_kernel, sass

    assembly = sass.assemble(ptx, sm, getattr(kernel, "targetoptions", {}).get("max_registers"))
    entry = {"registers": assembly.registers, "spills": assembly.spills, "stack": assembly.stack_bytes}
    if kernel in (offset_kernel.gemm_offset, offset_kernel.gemm_offset_powers):
        entry["sass"] = "\n".join(line.rstrip() for line in assembly.sass.splitlines())
        entry["per_product"] = {name: sass.block_loop_cost(assembly.sass, offset_kernel.block_loop_trips(nfma),
                                                           offset_kernel.products_per_stage()).per_product
                                for name, nfma in PRESET_NFMA.items()}
    return entry


def _ptx_worker():
    report = {"skipped": None, "targets": {}, "sass": {}, "sass_skipped": None}
    try:
        import numba.cuda  # noqa: F401
    except Exception as exc:
        report["skipped"] = f"numba.cuda cannot be imported: {exc}"
        print(json.dumps(report))
        return

    from mmaemu.cuda import launch, shim

    report["implementation"] = shim.cuda_implementation()
    report["sass_skipped"] = sass_tools_missing()
    for cc in TARGETS:
        sm = f"sm_{cc[0]}{cc[1]}"
        target, assembled = {}, {}
        for name, (kernel, signature) in launch.signatures().items():
            ptx = offline_ptx(kernel, signature, cc, report)
            if ptx is None:
                print(json.dumps(report))
                return
            target[name] = _ptx_entry(ptx, sm)
            if not report["sass_skipped"]:
                assembled[name] = _sass_entry(kernel, ptx, sm)
        report["targets"][sm] = target
        report["sass"][sm] = assembled
    print(json.dumps(report))


# ----------------------------------------------------------------------------------------------------------------
# Tests


# Every test here reads the report of a worker subprocess.
pytestmark = pytest.mark.subprocess

workers = workers_fixture(__file__, {"sim": {"NUMBA_ENABLE_CUDASIM": "1"}, "ptx": {"NUMBA_ENABLE_CUDASIM": "0"}})


FORMAT_PAIRS = {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")}


@pytest.mark.sim
def test_simulated_kernels_equal_cpu_reference(workers):
    report = workers("sim")
    bad = [r for r in report["gemm"] if r["mismatches"]]
    assert not bad, json.dumps(bad[:5], indent=1)
    runs = report["gemm"]
    assert {r["kernel"] for r in runs} == {"simple", "offset"}
    # The reference kernel: every self-test case, every preset, scheme and format pair, NaN/Inf outputs.
    simple = [r for r in runs if r["kernel"] == "simple"]
    assert {r["preset"] for r in simple} == {"hopper", "ada", "b200_mma_sync"}
    assert {r["scheme"] for r in simple} == {"none", "contiguous", "serial", "pairwise"}
    assert {tuple(r["formats"]) for r in simple} == FORMAT_PAIRS and any(r["nonfinite_outputs"] for r in simple)
    # The offset kernel: hopper and ada, fast, slow and every split scheme (a split that owns no tile, a padding
    # tile), every format pair, adversarial operands, NaN/Inf outputs; b200_mma_sync declined by design.
    offset = [r for r in runs if r["kernel"] == "offset"]
    assert {(r["preset"], r["fast"]) for r in offset} == {("hopper", True), ("hopper", False), ("ada", True),
                                                          ("ada", False)}
    assert {r["scheme"] for r in offset} == {"none", "contiguous", "serial", "pairwise"}
    assert {tuple(r["formats"]) for r in offset} == FORMAT_PAIRS and any(r["nonfinite_outputs"] for r in offset)
    assert {r["data"] for r in offset} == {"random", "adversarial", "nonfinite"}
    assert {r["method"] for r in offset} == {"add-max", "power sums"}  # both exponent passes (both kernels)
    assert any("empty split" in r["case"] for r in offset) and any("padding tile" in r["case"] for r in offset)
    assert any(r["shape"][0] == 1 and r["splits"] > 1 and r["scheme"] != "pairwise" for r in offset)
    assert any(r["shape"][2] % 32 for r in offset)  # a stage ragged in K
    assert {r["case"] for r in offset} | {s["case"] for s in report["skipped"]} == set(OFFSET_CASES)
    assert [(s["kernel"], s["preset"]) for s in report["skipped"]] == [("offset", "b200_mma_sync")]
    assert all(max(r["shape"][:2]) <= 4 and r["shape"][2] <= 96 for r in runs)


@pytest.mark.sim
def test_simulated_epilogue_equals_cpu(workers):
    epilogue = workers("sim")["epilogue"]
    assert epilogue["passed"], json.dumps(epilogue["bad"], indent=1)
    assert epilogue["cases"] >= 5 * 5  # five scale settings x five output dtypes


@pytest.mark.sim
def test_simulated_offset_kernel_across_thread_blocks_and_packed_panels(workers):
    report = workers("sim")
    panels, (block_m, block_n) = report["panels"], report["offset_block"]
    assert panels["mismatches"] == 0, panels
    # 131 x 69 outputs: two thread blocks each way, ragged; A in panels of 128 rows, B in panels of 64, each
    # packed by a grid of fewer groups of four k than K has.
    M, N, K = panels["shape"]
    assert M > block_m and N > block_n and M % 8 and N % 4
    assert panels["rows"] == [block_m, block_n] and panels["groups"] > panels["grid_groups"]


@pytest.mark.sim
def test_simulated_launch_guards(workers):
    assert workers("sim")["errors"] == {"unknown": "ValueError", "codes to launch_gemm": "ValueError",
                                        "late accumulator": "RuntimeError"}


def test_ptx_for_sm89_sm90_sm120_without_a_device(workers):
    report = workers("ptx")
    if report["skipped"]:
        pytest.skip(report["skipped"])
    assert set(report["targets"]) == {f"sm_{a}{b}" for a, b in TARGETS}
    for sm, kernels in report["targets"].items():
        assert set(kernels) == {"offset", "offset_powers", "offset_decode", "simple", "override", "epilogue",
                                "rowwise_epilogue"}
        # The offset kernels run the GPU's own fma.rz, not the float64 emulation of fma_toward_zero; the power sums
        # the GPU's fma.rn.bf16x2, not the float64 twin.
        for name in OFFSET_KERNELS:
            assert kernels[name]["fma_rz"] >= 4 and kernels[name]["f64"] == 0, kernels[name]
        assert kernels["offset_powers"]["fma_bf16x2"] >= 16, kernels["offset_powers"]
        for name, entry in kernels.items():
            assert entry["target"] == [sm], (sm, name, entry["target"])
            assert entry["fma"] == 0, f"{name} {sm}: fused multiply-add (a contraction) in the PTX"
            assert name in OFFSET_KERNELS or entry["fma_rz"] == 0, f"{name} {sm}: fma.rz outside the offset kernels"
            assert name == "offset_powers" or entry["fma_bf16x2"] == 0, f"{name} {sm}: fma.rn.bf16x2 in the PTX"
            assert entry["ftz"] == 0, f"{name} {sm}: flush-to-zero in the PTX"
            assert entry["approx"] == 0, f"{name} {sm}: approximate instruction in the PTX"


def _sass_report(workers):
    report = workers("ptx")
    reason = report["skipped"] or report["sass_skipped"]
    if reason:
        skip_sass(reason)
    return report["sass"]


def budget_failures(entry, sm, budget, preset="hopper"):
    """Why one target's offset kernel fails the gate for a preset (empty if it passes)."""
    failures = [f"{sm}: {entry['spills']} bytes of spills"] if entry["spills"] else []
    cost = entry["per_product"][preset]
    if cost > budget:
        failures.append(f"{sm}: {cost:.3f} SASS instructions per product in the block loop, {preset} (budget "
                        f"{budget})")
    return failures


def test_offset_block_loop_within_budget_and_no_spills(workers):
    """The CI gate: SASS instructions per product of the offset kernels' block loops within BUDGETS (hopper) and
    ADA_BUDGETS, and no kernel spills registers, on every target."""
    sass = _sass_report(workers)
    assert set(sass) == set(BUDGETS["offset"])
    failures = []
    for sm, kernels in sass.items():
        for name in OFFSET_KERNELS:
            failures += [f"{name} {f}" for f in budget_failures(kernels[name], sm, BUDGETS[name][sm])]
            failures += [f"{name} {f}" for f in budget_failures(dict(kernels[name], spills=0), sm,
                                                               ADA_BUDGETS[name][sm], "ada")]
        failures += [f"{sm} {name}: {entry['spills']} bytes of spills" for name, entry in kernels.items()
                     if entry["spills"]]
    assert not failures, failures
    # ada runs two blocks per stage: its block start and end weigh twice as much, the loops the same.
    for sm, kernels in sass.items():
        for name in OFFSET_KERNELS:
            per_product = kernels[name]["per_product"]
            assert per_product["hopper"] < per_product["ada"] < per_product["hopper"] + 1.0, (sm, name, per_product)


def _with_longer_product_loop(text, extra):
    """The SASS with ``extra`` more FFMA lines inside the product loop (copies of its first one)."""
    from mmaemu.cuda import sass

    product = sass.block_loop_nest(text)[3]
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = sass.INSTRUCTION.match(line)
        if match and int(match.group(1), 16) >= product.start and match.group(3).startswith("FFMA"):
            return "\n".join(lines[:i] + [line] * extra + lines[i:])
    raise AssertionError("no FFMA in the product loop")


def test_gate_fails_a_longer_loop_and_a_lower_budget(workers):
    """The gate is not vacuous: a product loop made longer until the count passes the budget, a budget just below
    the measured count, or a spill fails it; the lengthened SASS is weighed as the loop trips say."""
    from mmaemu.cuda import offset_kernel
    from mmaemu.cuda import sass as sass_module

    entry = _sass_report(workers)["sm_90"]["offset_powers"]
    measured, budget = entry["per_product"]["hopper"], BUDGETS["offset_powers"]["sm_90"]
    assert not budget_failures(entry, "sm_90", budget)
    assert budget_failures(entry, "sm_90", round(measured - 0.01, 2))
    assert budget_failures(dict(entry, spills=8), "sm_90", budget)
    trips, products = offset_kernel.block_loop_trips(PRESET_NFMA["hopper"]), offset_kernel.products_per_stage()
    extra = int((budget - measured) * products / trips[2]) + 32  # FFMAs per pass that take it past the budget
    longer = sass_module.block_loop_cost(_with_longer_product_loop(entry["sass"], extra), trips, products)
    assert longer.per_product == pytest.approx(measured + extra * trips[2] / products)
    assert budget_failures(dict(entry, per_product={"hopper": longer.per_product}), "sm_90", budget)


if __name__ == "__main__":
    {"sim": _sim_worker, "ptx": _ptx_worker}[sys.argv[1]]()
