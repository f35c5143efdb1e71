"""``cuda:simple`` computes the block-scaled GEMMs (MXFP8 ``kind::mxf8f6f4``, MXFP4 ``kind::mxf4``, NVFP4
``kind::mxf4nvf4``) bit for bit like the CPU reference, without a GPU (numba's CUDA simulator, enabled before
numba.cuda is imported: the worker runs in a subprocess, this file run as a script). Tiny shapes with the
adversarial rows of the MMA-Sim test (NaN scales, NaN/Inf elements, overflow, underflow, zero groups)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from subprocess_workers import bit_mismatches, workers_fixture

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = [("tcgen05_mxf8f6f4", "e4m3", "e5m2", 64, 32, "ue8m0"), ("tcgen05_mxf8f6f4", "e2m1", "e3m2", 64, 32, "ue8m0"),
         ("tcgen05_mxf4nvf4", "e2m1", "e2m1", 128, 16, "ue4m3"), ("sm120_mxf4nvf4", "e2m1", "e2m1", 64, 32, "ue8m0"),
         ("tcgen05_mxf4nvf4", "e2m1", "e2m1", 128, 32, "ue8m0")]  # the last: MXFP4 (kind::mxf4) on the B200


def _worker():
    import numpy as np
    from numba.core import config

    assert config.ENABLE_CUDASIM, "the worker needs NUMBA_ENABLE_CUDASIM=1"
    sys.path.insert(0, str(ROOT / "tests"))
    from test_mmasim_block_scale import make_cases

    from mmaemu.cpu.block_scaled import accumulate_block_scaled
    from mmaemu.cuda.block_scaled.kernel import accumulate_block_scaled_numpy
    from mmaemu.model.presets import get_preset

    runs = []
    for index, (name, fa, fb, K, block, scale_fmt) in enumerate(CASES):
        preset = get_preset(name, warn=False)
        a = make_cases(fa, fb, K, block, scale_fmt, 5, 40 + index)
        b = make_cases(fb, fa, K, block, scale_fmt, 6, 50 + index)
        want = accumulate_block_scaled(a.a, b.a, fa, fb, a.sa, b.sa, scale_fmt, preset, reference=True)
        got = accumulate_block_scaled_numpy(a.a, b.a, fa, fb, a.sa, b.sa, scale_fmt, preset)
        runs.append({"case": [name, fa, fb, K, block, scale_fmt], **bit_mismatches(got, want)})
    print(json.dumps(runs))


# Every test here reads the report of a worker subprocess.
pytestmark = pytest.mark.subprocess

workers = workers_fixture(__file__, {"sim": {"NUMBA_ENABLE_CUDASIM": "1"}})


@pytest.mark.sim
def test_cuda_simple_computes_block_scaled_gemms_like_the_cpu_reference(workers):
    runs = workers("sim")
    assert len(runs) == len(CASES)
    bad = [r for r in runs if r["mismatches"]]
    assert not bad, bad
    assert any(r["nonfinite"] for r in runs)  # NaN scales / elements reached the device path


if __name__ == "__main__":
    {"sim": _worker}[sys.argv[1]]()
