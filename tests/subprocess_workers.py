"""Test workers in subprocesses, for tests that need a fresh interpreter: numba's CUDA simulator must be switched on
before numba.cuda is imported, and offline compilation (tools.ptx_offline) changes numba process-wide.

A test file that uses them runs itself as a script, ``python tests/test_x.py MODE``, whose last line of output is
a JSON report; :func:`workers_fixture` starts every mode at once (the machine's cores work in parallel) and hands
the tests the reports, each read on first use. Those workers compile kernels offline too, so the switch that
makes their SASS checks mandatory lives here (:func:`skip_sass`).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 600


def spawn(script, mode, env_updates):
    """Start ``python script mode`` in the repository root with ``env_updates`` and the repository importable."""
    env = dict(os.environ)
    env.update(env_updates)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(ROOT))


def collect(proc, mode, timeout_s=TIMEOUT_S):
    """The JSON report a worker printed last; the test fails with the worker's stderr if it timed out or failed."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{mode} worker timed out after {timeout_s} s; stderr tail: {err[-2000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{mode} worker failed (exit {proc.returncode}); stderr tail:\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def workers_fixture(script, modes):
    """A module-scoped fixture ``workers`` for the test file ``script``: ``modes`` maps each mode to the
    environment variables its worker needs; ``workers(mode)`` returns that worker's report."""

    @pytest.fixture(scope="module")
    def workers():
        procs = {mode: spawn(script, mode, env) for mode, env in modes.items()}
        reports = {}

        def get(mode):
            if mode not in reports:
                reports[mode] = collect(procs[mode], mode)
            return reports[mode]

        yield get
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    return workers


# The offline SASS checks (tests/test_cuda_sim.py: the offset kernel's gate; tests/test_native_sim.py: cuda:native's
# instructions) skip, with the reason, where libNVVM, ptxas or nvdisasm is missing; CI sets this switch to "1"
# (.ci/run), which turns such a skip into a failure. A test-only switch: the package never reads it.
REQUIRE_SASS_ENV = "MMAEMU_TEST_REQUIRE_SASS"


def sass_required() -> bool:
    """Whether the SASS checks must run here (``MMAEMU_TEST_REQUIRE_SASS=1``)."""
    return os.environ.get(REQUIRE_SASS_ENV) == "1"


def skip_sass(reason):
    """Skip a SASS check that cannot run here, or fail it where :func:`sass_required`."""
    if sass_required():
        pytest.fail(f"{REQUIRE_SASS_ENV}=1 but the SASS check cannot run: {reason}")
    pytest.skip(f"SASS check not run: {reason}")


# What an offline compilation raises where libNVVM, NVRTC or libdevice (a CUDA toolkit) is missing.
COMPILER_MISSING = ("NVVM", "nvvm", "nvrtc", "NVRTC", "libdevice", "CUDA_HOME", "cudadevrt", "Failure finding")


def offline_ptx(kernel, signature, cc, report):
    """:func:`tools.ptx_offline.compile_ptx` in a worker; None, with the reason in ``report["skipped"]``, where
    the CUDA compiler libraries are missing (other errors propagate)."""
    from tools import ptx_offline as offline

    try:
        return offline.compile_ptx(kernel, signature, cc)
    except Exception as exc:
        text = " ".join(str(exc).split())
        if not any(s in text for s in COMPILER_MISSING):
            raise
        report["skipped"] = f"no CUDA compiler libraries: {type(exc).__name__}: {text[:300]}"
        return None


def sass_tools_missing():
    """Why SASS cannot be made here (ptxas or nvdisasm not found, :func:`tools.sass.find_tool`), or None."""
    from tools import sass

    missing = [name for name in ("ptxas", "nvdisasm") if sass.find_tool(name) is None]
    if not missing:
        return None
    return f"{' and '.join(missing)} not found (a CUDA toolkit; `pip install nvidia-cuda-nvdisasm`)"


def bit_mismatches(got, want) -> dict:
    """A worker's report of two fp32 arrays compared bit for bit: how many outputs differ, how many expected
    outputs are not finite (the report shows the comparison met them) and the first three differences in hex."""
    import numpy as np

    got_bits, want_bits = got.view(np.uint32).ravel(), want.view(np.uint32).ravel()
    bad = np.flatnonzero(got_bits != want_bits)
    return {"mismatches": int(bad.size), "nonfinite": int(np.count_nonzero(~np.isfinite(want))),
            "first": [f"{int(got_bits[i]):08X} != {int(want_bits[i]):08X}" for i in bad[:3]]}
