"""The engine, through the public API, reproduces every recorded vector bit for bit.

* every entry of the contract's vectors.json (block, chain, split, epilogue, special values, dense vectors) and
  its ten full GEMMs;
* the Khattak-Mikaitis hardware vectors (one FP8 tensor-core instruction, K = 32): H100/H200 wgmma with
  ``hopper`` and c = 0 (the recording ignores c), Ada mma.sync with ``ada`` and the given c, B200 mma.sync with
  ``b200_mma_sync`` and the given c - 5000 of 5000 in each file.
"""

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu.testing import assert_bitwise_equal
from vectors import km_cases, spec_gemms, spec_vectors

DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OUT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
       "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
BITS = {4: torch.int32, 2: torch.int16, 1: torch.uint8}


def fp8(codes, fmt):
    return torch.tensor(np.asarray(codes, np.uint8)).view(DTYPE[fmt])


def fp32(bits):
    return torch.tensor(np.array([bits], np.uint32).view(np.float32)[0])


def result_bits(t):
    return int(t.reshape(-1)[0].view(BITS[t.element_size()]).item()) & ((1 << (8 * t.element_size())) - 1)


def splitk_arg(v):
    return 1 if v["S"] == 1 else (v["S"], v["scheme"])


def _ids(kind):
    return [v["id"] for v in spec_vectors() if v["api"] == kind]


@pytest.mark.parametrize("vid", _ids("accumulate"))
def test_accumulate_vector(vid):
    v = next(x for x in spec_vectors() if x["id"] == vid)
    a = fp8(v["a"], v["fmt_a"]).reshape(1, -1)
    b = fp8(v["b"], v["fmt_b"]).reshape(1, -1)
    acc = mmaemu.accumulate(a, b, use_fast_accum=v["fast"], profile=v["profile"], splitk=splitk_arg(v))
    assert acc.dtype == torch.float32 and acc.shape == (1, 1)
    assert result_bits(acc) == v["result"], f"{vid}: 0x{result_bits(acc):08X} != 0x{v['result']:08X}"


@pytest.mark.parametrize("vid", _ids("scaled_mm"))
def test_scaled_mm_vector(vid):
    v = next(x for x in spec_vectors() if x["id"] == vid)
    a = fp8(v["a"], v["fmt_a"]).reshape(1, v["K"])
    w = fp8(v["b"] * 16, v["fmt_b"]).reshape(16, v["K"])
    sr = None if v["scale_result"] is None else fp32(v["scale_result"])
    out = mmaemu.scaled_mm(a, w.t(), fp32(v["sa"]), fp32(v["sb"]), scale_result=sr, out_dtype=OUT[v["out"]],
                           use_fast_accum=v["fast"], profile=v["profile"], splitk=1)
    assert out.shape == (1, 16) and out.dtype == OUT[v["out"]]
    got = {result_bits(out[:, n]) for n in range(16)}
    assert got == {v["result"]}, f"{vid}: {[hex(g) for g in got]} != {v['result']:#x}"


def test_dot_vector():
    (v,) = [x for x in spec_vectors() if x["api"] == "dot"]
    r = mmaemu.model.dot(fp8(v["a"], v["fmt_a"]), fp8(v["b"], v["fmt_b"]), preset=v["preset"])
    assert r.shape == () and result_bits(r) == v["result"]


@pytest.mark.parametrize("g", spec_gemms(), ids=lambda g: g["id"])
def test_full_gemm(g):
    a = fp8(g["a"], g["fmt_a"])
    w = fp8(g["w"], g["fmt_b"])
    out = mmaemu.scaled_mm(a, w.t(), fp32(g["scale_a"]), fp32(g["scale_b"]), out_dtype=OUT[g["out"]],
                           use_fast_accum=g["fast"], profile=g["profile"], splitk=1 if g["S"] == 1 else
                           (g["S"], g["scheme"]))
    width = out.element_size()
    expected = torch.tensor(np.array(g["result"], dtype={4: np.uint32, 2: np.uint16, 1: np.uint8}[width]))
    assert_bitwise_equal(out, expected.view(out.dtype), msg=g["id"])


KM_FILES = [("H100", "E4M3", "hopper", False), ("H100", "E5M2", "hopper", False),
            ("H200", "E4M3", "hopper", False), ("H200", "E5M2", "hopper", False),
            ("Ada", "E4M3", "ada", True), ("Ada", "E5M2", "ada", True),
            ("B200", "E4M3", "b200_mma_sync", True), ("B200", "E5M2", "b200_mma_sync", True)]


@pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")
@pytest.mark.parametrize("gpu,fmt,preset,uses_c", KM_FILES, ids=lambda x: str(x))
def test_khattak_mikaitis_hardware_vectors(gpu, fmt, preset, uses_c):
    a, b, c, d = km_cases(gpu, fmt)
    assert len(d) == 5000
    f = fmt.lower()
    c32 = torch.from_numpy(np.asarray(c, np.uint32).view(np.float32).copy())
    if not uses_c:
        c32 = torch.zeros_like(c32)  # the H100/H200 recordings ran wgmma with a zero accumulator
    r = mmaemu.model.dot(fp8(a, f), fp8(b, f), c32, preset=preset)
    assert_bitwise_equal(r, torch.from_numpy(np.asarray(d, np.uint32).view(np.float32).copy()),
                         msg=f"{gpu} {fmt} with {preset}")
