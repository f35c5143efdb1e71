"""``cuda:native`` without a GPU: the kernels under numba's CUDA simulator (with the instructions' CPU twins), and
their SASS for sm_90a (warpgroup MMA) and sm_89 (mma.sync).

* Simulator (``NUMBA_ENABLE_CUDASIM=1``, a subprocess): the native GEMM kernel on the shrunk hopper self-test cases
  (the warpgroup MMA) and the shrunk ada ones (mma.sync): fast, slow, every split scheme, every format pair,
  NaN/Inf, and cases over several thread blocks with ragged M, N, K, through mmaemu.cuda.engine (padding, stage
  plan, split combination, NaN/Inf override), bit for bit against the CPU reference; the instruction probe end to
  end for both instructions; the probe catching a kernel whose instruction reads the staged operands with the
  wrong layout (core matrices half as far apart in K as staged).
* SASS (a second subprocess): every native kernel compiles to PTX (with numba's built-in target too: sm_90a code is
  compiled for sm_90 and the ``.target`` renamed, :func:`mmaemu.cuda.offline.compile_ptx`), ptxas assembles it for
  its target without spills, and ``nvdisasm -c`` shows the format pair's tensor-core instruction (``QGMMA`` on
  sm_90a, ``QMMA.16832`` on sm_89), as many as the kernel issues, and no other floating-point instruction
  (:func:`native_sass_problems`, on the instructions :mod:`mmaemu.cuda.sass` reads; the allowances: ptxas's empty
  ``HGMMA`` closing a wgmma group, and the slow kernels' 64 ``FADD`` that add each chain into the split's
  partial). The same mma.sync compiled for sm_90 is
  shown not to be native there. With numba-cuda, its direct sm_90a compilation gives the same SASS as the
  renamed target. Skipped, with the reason, only where libNVVM, ptxas or nvdisasm is missing; CI
  (``MMAEMU_TEST_REQUIRE_SASS=1``) fails instead.

``scripts/gpu_check.py --dry-run`` runs the native stages on the simulator in ``tests/test_backends.py``.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
from subprocess_workers import offline_ptx, sass_tools_missing, skip_sass, workers_fixture

# Opcodes that compute with floating-point values (SASS of sm_89/sm_90); the MMA ones are counted apart.
FLOAT_OPS = {"FADD", "FFMA", "FMUL", "FMNMX", "FSET", "FSETP", "FSEL", "FCHK", "FRND", "FSWZADD", "F2F", "F2FP",
             "F2I", "I2F", "HADD2", "HFMA2", "HMUL2", "HMNMX2", "HSET2", "HSETP2", "DADD", "DFMA", "DMUL", "DSETP",
             "MUFU"}
MMA_OPS = {"HMMA", "HGMMA", "QMMA", "QGMMA", "IMMA", "IGMMA", "BMMA", "BGMMA", "DMMA", "OMMA"}
# ptxas closes an empty wgmma group with an HGMMA that reads and writes nothing (RZ): never a result.
EMPTY_HGMMA = ("HGMMA.64x8x16.F16", "RZ, gdesc[URZ], RZ, !UPT, gsb0")
MMAS_PER_STEP = {"wgmma": 1, "mma_sync": 16}  # a group's 64 x 128 outputs per 32 k: one m64n128k32, 16 m16n8k32
STEPS = {"fast": 2, "slow": 2, "probe": 1}  # a stage of 64 k in the GEMM kernels, one 32-k step in the probe
PROBE_FAMILIES = ("chained", "chained from an accumulator", "NaN/Inf")


def instructions(listing):
    """[(opcode with modifiers, operands)] of a SASS listing (``nvdisasm -c``), as :mod:`mmaemu.cuda.sass` reads it."""
    from mmaemu.cuda import sass

    return [(i.opcode, i.operands) for i in sass.instructions(listing)[0]]


def native_sass_problems(name, sass):
    """What is wrong with the SASS of native kernel ``name`` (``<instruction>_<fast|slow|probe>_<fmt_a>_<fmt_b>``):
    the expected tensor-core instruction, as many as the kernel issues, and no other floating-point instruction
    (slow kernels: exactly the 64 FADD of the chain sum; wgmma: the empty HGMMA). [] if nothing."""
    from mmaemu.cuda import native_kernel

    instruction, kind, fmt_a, fmt_b = re.fullmatch(r"(\w+?)_(fast|slow|probe)_(e\dm\d)_(e\dm\d)", name).groups()
    form = native_kernel.INSTRUCTIONS[instruction].SASS_MMA.format(a=fmt_a.upper(), b=fmt_b.upper())
    problems, mmas, floats = [], 0, {}
    for opcode, operands in instructions(sass):
        base = opcode.split(".")[0]
        if base in MMA_OPS:
            if opcode == form:
                mmas += 1
            elif (opcode, operands) != EMPTY_HGMMA or instruction != "wgmma":
                problems.append(f"{opcode} {operands}: not the expected {form}")
        elif base in FLOAT_OPS:
            floats[base] = floats.get(base, 0) + 1
    want = STEPS[kind] * MMAS_PER_STEP[instruction]
    if mmas != want:
        problems.append(f"{mmas} {form}, expected {want}")
    allowed = {"FADD": 64} if kind == "slow" else {}
    if floats != allowed:
        problems.append(f"floating-point instructions {floats}, allowed {allowed}")
    return problems


# ----------------------------------------------------------------------------------------------------------------
# Workers (run as: python tests/test_native_sim.py sim|sass)


def _sim_worker():
    import dataclasses
    import time

    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import engine, launch, native_kernel, probe, selftest
    from mmaemu.model.presets import get_preset

    report = {"gemm": [], "probe": {}, "mutated_probe": {}, "declined": None}
    # Shrunk self-test cases of the hopper (warpgroup MMA) and ada (mma.sync) presets that together cover fast and
    # slow, every split scheme, every format pair and NaN/Inf, and cases with slow chain restarts (K > 128) or
    # splits across several thread blocks along M and along N. The simulator's cost is its thread blocks (256
    # Python threads each; one per split) times their 64-k stages, so each path is reached once: {label: K}. The
    # empty-split case needs one stage (K = 64: its splits but the first own no k); NaN/Inf codes ride on a
    # multi-block case of each preset (hopper's with E5M2 x E4M3 and two splits that both hold data), and ada's
    # serial scheme on its ragged fast case (S = 2: two splits with data). Each split is a thread block of its own
    # (grid z) and the partials are combined by one kernel whatever S, so S is as small as the path allows: the
    # empty-split case runs S = 2 (self-test: 4), the pairwise one S = 3 (self-test: 5; still an unpaired last
    # split, and two splits with data).
    chosen = {"hopper contiguous S=4 fast, empty split": (64, 2), "hopper contiguous S=3 slow e4m3 x e5m2": (96, 3),
              "random ada fast, ragged K": (72, 2), "ada pairwise S=5 slow e5m2 x e4m3": (96, 3)}
    cases = [c.shrunk() for c in selftest.GEMM_CASES if c.label in chosen]
    assert len(cases) == len(chosen)
    cases = [dataclasses.replace(c, label=f"{c.label} (here K={chosen[c.label][0]}, S={chosen[c.label][1]})",
                                 K=chosen[c.label][0], splits=chosen[c.label][1],
                                 scheme="serial" if c.scheme == "none" else c.scheme) for c in cases]
    cases += [selftest.GemmCase("native multi-block ragged, slow restarts, e5m2 x e5m2", "hopper", "e5m2", "e5m2",
                                False, 1, "none", 130, 6, 136, "random", 301),
              selftest.GemmCase("native multi-block, contiguous S=2 fast, NaN/Inf e5m2 x e4m3", "hopper", "e5m2",
                                "e4m3", True, 2, "contiguous", 3, 131, 136, "nonfinite", 302),
              selftest.GemmCase("native multi-block ragged ada slow, NaN/Inf e4m3 x e5m2", "ada", "e4m3", "e5m2",
                                False, 1, "none", 131, 5, 136, "nonfinite", 303),
              # Unsplit: the split combination does not depend on the instruction (hopper's multi-block S=2 has it).
              selftest.GemmCase("native multi-block ada fast, e5m2 x e5m2", "ada", "e5m2", "e5m2", True, 1, "none",
                                4, 133, 100, "random", 304)]
    start = time.perf_counter()
    for case in cases:
        a, b = selftest.gemm_operands(case)
        preset = get_preset(case.preset, warn=False)
        want = accumulate_codes(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme,
                                reference=True)
        got = engine.accumulate_numpy("native", a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits,
                                      case.scheme)
        count, first = selftest.compare_bits(got, want)
        report["gemm"].append({"case": case.label, "preset": case.preset, "shape": [case.M, case.N, case.K],
                               "fast": case.fast, "splits": case.splits, "scheme": case.scheme,
                               "formats": [case.fmt_a, case.fmt_b],
                               "nonfinite_outputs": int(np.count_nonzero(~np.isfinite(want))),
                               "mismatches": count, "first": first})
    report["gemm_seconds"] = round(time.perf_counter() - start, 1)
    start = time.perf_counter()
    for instruction, pair in (("wgmma", ("e5m2", "e4m3")), ("mma_sync", ("e4m3", "e5m2"))):
        preset = native_kernel.INSTRUCTIONS[instruction].PRESET
        # The tiles that exercise most of the machinery: several steps, an accumulator, NaN/Inf codes.
        tiles = [t for t in probe.probe_tiles(preset, pairs=(pair,)) if t.label.split(" (")[0] in PROBE_FAMILIES]
        passed, details = probe.run_probe(probe.device_runner(instruction), preset, tiles)
        report["probe"][instruction] = {"passed": passed, "tiles": details["tiles"],
                                        "summary": probe.summarize(details)}
        # An instruction told that the K-adjacent core matrices lie elsewhere than the staging put them.
        wrong = native_kernel.LEADING_BYTES // 2
        passed, details = probe.run_probe(lambda t: launch.launch_probe(t, instruction, leading_bytes=wrong),
                                          preset, tiles[:1])
        report["mutated_probe"][instruction] = {"passed": passed, "summary": probe.summarize(details)}
    report["probe_seconds"] = round(time.perf_counter() - start, 1)
    try:
        z = np.zeros((1, 64), np.uint8)
        engine.accumulate_numpy("native", z, z, "e4m3", "e4m3", get_preset("b200_mma_sync", warn=False), True)
    except RuntimeError as exc:
        report["declined"] = str(exc)
    print(json.dumps(report))


def _assemble(ptx, sm):
    """What the SASS check reads of one PTX module assembled for ``sm`` (:func:`mmaemu.cuda.sass.assemble`)."""
    from mmaemu.cuda import sass

    try:
        assembly = sass.assemble(ptx, sm)
    except RuntimeError as exc:  # ptxas failed
        return {"ptxas_error": str(exc)[-1500:]}
    return {"target": re.findall(r"^\.target (\S+)", ptx, re.M), "sass": assembly.sass,
            "spills": assembly.spills, "registers": assembly.registers}


def _sass_worker():
    report = {"skipped": None, "kernels": {}, "mma_sync_on_sm90": None, "numba_cuda_same_sass": None}
    from mmaemu.cuda import launch, native_kernel, offline, shim

    report["skipped"] = sass_tools_missing()
    if report["skipped"]:
        print(json.dumps(report))
        return
    report["implementation"] = shim.cuda_implementation()
    for instruction, module in native_kernel.INSTRUCTIONS.items():
        target = module.TARGET
        sm = "sm_{}{}{}".format(*target, *([""] if len(target) == 2 else []))
        for name, (kernel, signature) in launch.native_signatures(instruction).items():
            ptx = offline_ptx(kernel, signature, target, report)
            if ptx is None:
                print(json.dumps(report))
                return
            report["kernels"][name] = _assemble(ptx, sm)
    # FP8 mma.sync is not a native FP8 instruction on sm_90: what ptxas makes of it there.
    kernel, signature = launch.native_signatures("mma_sync")["mma_sync_fast_e4m3_e4m3"]
    entry = _assemble(offline.compile_ptx(kernel, signature, (9, 0)), "sm_90")
    report["mma_sync_on_sm90"] = sorted({op for op, _ in instructions(entry.get("sass", ""))
                                         if op.split(".")[0] in MMA_OPS | FLOAT_OPS})
    if report["implementation"] == "numba-cuda":  # its own sm_90a against the renamed sm_90 target
        kernel, signature = launch.native_signatures("wgmma")["wgmma_slow_e4m3_e5m2"]
        renamed = offline.suffixed_target(offline.compile_ptx(kernel, signature, (9, 0)), "a")
        entry = _assemble(renamed, "sm_90a")
        report["numba_cuda_same_sass"] = (  # instruction by instruction (symbol names differ)
            instructions(entry.get("sass", "")) == instructions(report["kernels"]["wgmma_slow_e4m3_e5m2"]["sass"]))
    print(json.dumps(report))


# Every test here reads the report of a worker subprocess.
pytestmark = pytest.mark.subprocess

workers = workers_fixture(__file__, {"sim": {"NUMBA_ENABLE_CUDASIM": "1"}, "sass": {"NUMBA_ENABLE_CUDASIM": "0"}})


# ----------------------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.sim
def test_simulated_native_kernel_equals_cpu_reference(workers):
    runs = workers("sim")["gemm"]
    bad = [r for r in runs if r["mismatches"]]
    assert not bad, json.dumps(bad[:3], indent=1)
    pairs = {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")}
    for preset in ("hopper", "ada"):  # the warpgroup MMA and mma.sync
        mine = [r for r in runs if r["preset"] == preset]
        assert {r["fast"] for r in mine} == {True, False}
        assert {tuple(r["formats"]) for r in mine} == pairs
        assert any(r["nonfinite_outputs"] for r in mine)
        # Several thread blocks (128 x 128 outputs each) along M and along N, ragged K.
        assert any(r["shape"][0] > 128 for r in mine) and any(r["shape"][1] > 128 for r in mine)
        assert any(r["shape"][2] % 64 for r in mine)
    assert {r["splits"] for r in runs if r["preset"] == "hopper"} == {1, 2, 3}
    assert {r["scheme"] for r in runs if r["preset"] == "ada"} == {"none", "serial", "pairwise"}


@pytest.mark.sim
def test_simulated_probe_passes_and_catches_a_layout_bug(workers):
    report = workers("sim")
    for instruction in ("wgmma", "mma_sync"):
        assert report["probe"][instruction]["passed"], report["probe"][instruction]["summary"]
        assert report["probe"][instruction]["tiles"] == len(PROBE_FAMILIES)
        mutated = report["mutated_probe"][instruction]
        assert not mutated["passed"] and mutated["summary"].startswith("instruction probe: 1 of 1 tiles differ")
    assert report["declined"].startswith("the native kernel computes the blocks of the FP8 MMA instructions")


def _sass_report(workers):
    report = workers("sass")
    if report["skipped"]:
        skip_sass(report["skipped"])
    return report


def test_sass_holds_the_native_mma_and_no_other_float_instruction(workers):
    kernels = _sass_report(workers)["kernels"]
    assert len(kernels) == 24
    for name, entry in kernels.items():
        assert "ptxas_error" not in entry, (name, entry)
        assert entry["target"] == (["sm_90a"] if name.startswith("wgmma") else ["sm_89"]), name
        assert native_sass_problems(name, entry["sass"]) == [], name
        assert entry["spills"] == 0, (name, entry["spills"])
    for name in ("wgmma_fast_e4m3_e4m3", "mma_sync_fast_e4m3_e4m3"):
        assert kernels[name]["registers"] <= 128, name  # two thread blocks of 256 threads per SM


def test_the_sass_check_rejects_what_it_must(workers):
    from mmaemu.cuda import sass

    kernels = _sass_report(workers)["kernels"]
    for name in ("wgmma_fast_e5m2_e4m3", "mma_sync_slow_e4m3_e5m2", "mma_sync_probe_e5m2_e5m2"):
        listing = kernels[name]["sass"]
        lines = listing.splitlines()
        at = next(i for i, line in enumerate(lines) if sass.INSTRUCTION.match(line))
        extra = "        /*0000*/                   FFMA R1, R2, R3, R4 ;"
        assert native_sass_problems(name, "\n".join(lines[:at] + [extra] + lines[at:])), name
        mma = next(line for line in lines if re.search(r"\bQG?MMA\b", line))
        assert native_sass_problems(name, listing.replace(mma, mma.replace(".F32.", ".F16.", 1), 1)), name
        assert native_sass_problems(name, listing.replace(mma, "", 1)), name  # one MMA missing
    slow = kernels["wgmma_slow_e4m3_e4m3"]["sass"]
    fadd = next(line for line in slow.splitlines() if re.search(r"\bFADD\b", line))
    assert native_sass_problems("wgmma_slow_e4m3_e4m3", slow.replace(fadd, fadd + "\n" + fadd))


def test_mma_sync_is_not_native_fp8_on_sm90(workers):
    # ptxas converts the FP8 operands to fp16 and adds c after HMMA.16816: other numerics than the ada block, so
    # cuda:native never issues it there (mmaemu.cuda.catalog.NATIVE_INSTRUCTIONS).
    ops = _sass_report(workers)["mma_sync_on_sm90"]
    assert "HMMA.16816.F32" in ops and "FADD" in ops and any(op.startswith("F2FP") for op in ops), ops
    assert not any(op.startswith("QMMA") for op in ops), ops


def test_numba_cuda_sm90a_equals_the_renamed_sm90_target(workers):
    report = _sass_report(workers)
    if report["implementation"] != "numba-cuda":
        pytest.skip("needs numba-cuda (its own sm_90a compilation); CI checks the renamed target only")
    assert report["numba_cuda_same_sass"] is True


if __name__ == "__main__":
    {"sim": _sim_worker, "sass": _sass_worker}[sys.argv[1]]()
