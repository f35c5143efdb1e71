"""The device checks of a GPU validation run (marker ``cuda``; skipped where torch sees no CUDA device):
``scripts/gpu_check.py`` runs them with ``pytest -m cuda`` next to the timings of ``scripts/bench.py --cuda``.

On the device the tests find (``$MMAEMU_TEST_DEVICE``, default torch's current one):

* every kernel's self-test, forced (the cases of :mod:`mmaemu.cuda.verdicts.selftest`: random and adversarial GEMMs
  against the CPU reference, hopper and ada, fast, slow and split-K, mixed formats, NaN/Inf; the epilogue for every
  output dtype);
* ``cuda:native``'s instruction probe alone, for the device's own instruction (sm_90: the warpgroup MMA, hopper
  preset; sm_89: mma.sync, ada preset), failing with its first difference;
* every GEMM kernel against the CPU reference on larger GEMMs (:data:`COMPARE_CASES`, through the torch path the
  dispatcher uses; cases a kernel declines by design are not given to it);
* the whole ``mmaemu.scaled_mm`` path through each kernel (the device epilogue included) against ``backend="cpu"``.

A device that torch sees but the kernels cannot run on fails every test with the reason: that is news on a GPU
machine, not a skip. The cases' logic (operands, reference, comparison) runs without a GPU in
``tests/test_backends.py`` (the CPU reference on the shrunk cases), the kernels themselves under the simulator in
``tests/test_cuda_sim.py`` and ``tests/test_native_sim.py``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu import backends, formats
from mmaemu.cuda.verdicts.selftest import GemmCase
from mmaemu.model.presets import get_preset
from mmaemu.testing import assert_bitwise_equal

pytestmark = pytest.mark.cuda

E4, E5 = "e4m3", "e5m2"
# Larger GEMMs than the self-test's (which must stay quick at first use): every kernel against the CPU reference.
COMPARE_CASES = (
    GemmCase("random hopper fast 256x320x1920", "hopper", E4, E4, True, 1, "none", 256, 320, 1920, "random", 201),
    GemmCase("random hopper slow 200x136x2000", "hopper", E4, E4, False, 1, "none", 200, 136, 2000, "random", 202),
    GemmCase("adversarial hopper contiguous S=3 slow", "hopper", E4, E5, False, 3, "contiguous", 96, 80, 1500,
             "adversarial", 203),
    GemmCase("random ada fast 256x320x1920", "ada", E4, E4, True, 1, "none", 256, 320, 1920, "random", 204),
    GemmCase("adversarial ada serial S=6 fast", "ada", E4, E4, True, 6, "serial", 64, 240, 4096, "adversarial", 205),
    GemmCase("random ada pairwise S=3 slow", "ada", E5, E4, False, 3, "pairwise", 96, 96, 1600, "random", 206),
    GemmCase("NaN/Inf ada slow", "ada", E5, E5, False, 1, "none", 64, 64, 512, "nonfinite", 207),
)
GEMM_KERNELS = [k.name for k in backends.gemm_kernels()]
# (output dtype name, fast accumulation) of the scaled_mm checks.
SCALED_MM_CASES = (("bfloat16", True), ("float32", False), ("float8_e4m3fn", True))


def device_ordinal():
    """``$MMAEMU_TEST_DEVICE`` (a CUDA ordinal), or None: torch's current device."""
    value = os.environ.get("MMAEMU_TEST_DEVICE")
    return int(value) if value else None


@pytest.fixture(scope="module")
def info():
    """The device's facts (:class:`mmaemu.base.device_facts.DeviceFacts`); fails where the kernels cannot run on it."""
    from mmaemu.cuda import device

    try:
        return device.probe(device_ordinal())
    except device.DeviceUnavailable as exc:
        pytest.fail(f"torch sees a CUDA device but mmaemu's kernels cannot run on it: {exc}")


def _device(info):
    return torch.device("cuda", info.index)


def test_every_kernel_passes_its_selftest(info):
    results = backends.selftest(_device(info), force=True)
    verdict, reason = backends.selftest_verdict(results)
    failed = {name: gates[0].reason for name, gates in results.items() if gates[0].ran and not gates[0].passed}
    assert verdict == "PASS", f"{reason}: {failed}"


def test_native_instruction_probe_computes_the_presets_block(info):
    from mmaemu.cuda.catalog import NATIVE_INSTRUCTIONS
    from mmaemu.cuda.dispatch import engine, gating
    from mmaemu.cuda.verdicts import probe

    why = gating.device_skip("native", info)
    if why is not None:
        pytest.skip(f"cuda:native cannot run here: {why}")
    instruction, preset_name, _ = NATIVE_INSTRUCTIONS[tuple(info.capability)]
    with engine._OnDevice(_device(info)) as on:
        passed, details = probe.run_probe(probe.device_runner(instruction, on.stream),
                                          get_preset(preset_name, warn=False))
    assert passed, probe.summarize(details)


@pytest.mark.parametrize("kernel", GEMM_KERNELS)
def test_kernel_matches_the_cpu_reference_on_larger_gemms(info, kernel):
    from mmaemu.cuda.dispatch import gating
    from mmaemu.cuda.verdicts import selftest, store

    why = gating.device_skip(kernel, info)
    if why is not None:
        pytest.skip(f"cuda:{kernel} cannot run here: {why}")
    compute, skip = store.gemm_case_functions(kernel, info)  # as the kernel's self-test runs its cases
    passed, details = selftest.run_gemm_cases(compute, COMPARE_CASES, skip=skip)
    assert passed, selftest.summarize(details)
    assert any(not d.get("skipped") for d in details), "every case was skipped"


def _scaled_mm_operands(M=128, N=256, K=1920):
    rng = np.random.default_rng(7)
    x = torch.from_numpy(formats.random_codes(rng, (M, K), E4, spread=1.5, centre=5)).view(torch.float8_e4m3fn)
    w = torch.from_numpy(formats.random_codes(rng, (N, K), E4, spread=1.5, centre=5)).view(torch.float8_e4m3fn)
    return x, w


@pytest.mark.parametrize("out_name,fast", SCALED_MM_CASES)
@pytest.mark.parametrize("kernel", GEMM_KERNELS)
def test_scaled_mm_through_each_kernel_matches_the_cpu_backend(info, kernel, out_name, fast):
    """The whole path (NaN/Inf rule and epilogue on the device) through an explicitly named kernel: a kernel that
    fails its self-test raises here."""
    from mmaemu.cuda.dispatch import gating

    why = gating.device_skip(kernel, info, get_preset("hopper", warn=False))
    if why is not None:
        pytest.skip(f"cuda:{kernel} does not compute the hopper preset here: {why}")
    x, w = _scaled_mm_operands()
    one, half = torch.tensor(1.0), torch.tensor(0.5)
    dev = _device(info)
    kwargs = dict(out_dtype=getattr(torch, out_name), use_fast_accum=fast, splitk=1)
    want = mmaemu.scaled_mm(x, w.t(), half, one, backend="cpu", **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mmaemu.BackendFallbackWarning)  # the device epilogue must take it
        got = mmaemu.scaled_mm(x.to(dev), w.to(dev).t(), half.to(dev), one.to(dev), backend=f"cuda:{kernel}",
                               **kwargs)
    assert got.device.type == "cuda"
    assert_bitwise_equal(got.cpu(), want)
