"""The CUDA kernels on the Blackwell presets and on prototyped designs, without a GPU (numba's CUDA simulator).

Every GEMM kernel either computes a preset bit for bit like the CPU reference, or declines it by design with a
reason (``mmaemu.cuda.schedule_skip``), in which case the dispatcher hands the call to the next kernel: the
``native`` kernel issues the instructions whose blocks are hopper's and ada's only; the 25-fraction-bit Blackwell
presets need block sums wider than the one fp32 binade the ``offset`` kernel sums a block in, so the reference
kernel ``simple`` computes them. The prototype designs of the guide (16 kept bits; 64-product
blocks) are run too. Tiny shapes, adversarial data with NaN/Inf rows, ragged K; the simulator
must be enabled before numba.cuda is imported, so the worker runs in a subprocess (this file run as a script).
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from subprocess_workers import bit_mismatches, workers_fixture

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS = ("simple", "offset", "native")


def _designs():
    from mmaemu.model import presets

    hopper = presets.HOPPER
    return [presets.TCGEN05_F8F6F4, presets.SM120_MMA_SYNC,
            hopper.variant("hopper-frac16", frac=16, frac_out=16), hopper.variant("hopper-blocks64", nfma=64)]


def _worker():
    import numpy as np
    from numba.core import config

    assert config.ENABLE_CUDASIM, "the worker needs NUMBA_ENABLE_CUDASIM=1"
    sys.path.insert(0, str(ROOT / "tests"))
    from instruction_cases import instruction_cases

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import schedule_skip
    from mmaemu.cuda.dispatch import engine

    runs = []
    for index, preset in enumerate(_designs()):
        for fa, fb, K in (("e4m3", "e4m3", 96), ("e5m2", "e4m3", 70)):
            # one row of each kind of instruction_cases: one-huge, boundary, subnormal, NaN/Inf (A); gaussian,
            # cancel, NaN/Inf (B)
            a = instruction_cases(fa, fb, K, 11, preset.frac, seed=90 + index)[0][[4, 6, 2, 10]]
            b = instruction_cases(fa, fb, K, 11, preset.frac, seed=95 + index)[1][[1, 5, 10]]
            want = accumulate_codes(a, b, fa, fb, preset, True, reference=True)
            for kernel in KERNELS:
                entry = {"preset": preset.name, "formats": [fa, fb], "K": K, "kernel": kernel}
                skip = schedule_skip(kernel, preset, fa, fb, True)
                if skip is not None:
                    runs.append({**entry, "declined": skip})
                    continue
                got = engine.accumulate_numpy(kernel, a, b, fa, fb, preset, True)
                runs.append({**entry, **bit_mismatches(got, want)})
    print(json.dumps(runs))


# Every test here reads the report of a worker subprocess.
pytestmark = pytest.mark.subprocess

workers = workers_fixture(__file__, {"sim": {"NUMBA_ENABLE_CUDASIM": "1"}})


@pytest.mark.sim
def test_every_kernel_computes_or_declines_with_a_reason(workers):
    runs = workers("sim")
    assert len(runs) == len(_designs()) * 2 * len(KERNELS)
    computed = [r for r in runs if "mismatches" in r]
    bad = [r for r in computed if r["mismatches"]]
    assert not bad, bad
    assert all(r["declined"].strip() for r in runs if "declined" in r)
    assert any(r["nonfinite"] for r in computed)  # the NaN/Inf rule ran on the device side too


@pytest.mark.sim
def test_who_computes_what(workers):
    by = {(r["preset"], r["kernel"]): r for r in workers("sim") if r["formats"] == ["e4m3", "e4m3"]}
    for name in ("tcgen05_f8f6f4", "sm120_mma_sync", "hopper-frac16", "hopper-blocks64"):
        assert "mismatches" in by[name, "simple"]
    for name in ("tcgen05_f8f6f4", "sm120_mma_sync", "hopper-frac16"):
        assert "binade" in by[name, "offset"]["declined"]        # 16 bits already outgrow the fp32 window
    assert "nfma=64" in by["hopper-blocks64", "offset"]["declined"]
    for name in ("tcgen05_f8f6f4", "sm120_mma_sync", "hopper-frac16", "hopper-blocks64"):
        assert by[name, "native"]["declined"].startswith("computes the blocks of the FP8 MMA instructions")


if __name__ == "__main__":
    {"sim": _worker}[sys.argv[1]]()
