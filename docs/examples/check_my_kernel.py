"""Test your own FP8 GEMM kernel against golden bits that mmaemu produced on a machine without a GPU.

The workflow this example walks through:

1. On any machine (here: this CPU), build the test inputs, quantise them to E4M3 as Transformer Engine does, and
   compute the golden outputs with ``mmaemu.scaled_mm`` for each reference GPU (profiles ``hopper`` = H100 PCIe
   cuBLAS, ``ada`` = RTX 4060 cuBLAS). Save inputs, scales and golden bits to one file.
2. Wherever the kernel under test runs, load the file, run the kernel on the stored inputs and compare with
   ``mmaemu.testing.assert_bitwise_equal``, which reports every mismatch class and the first ten elements.

The "kernels under test" are written below, in plain numpy/torch:

* ``naive_kernel``  - the textbook FP8 GEMM: products summed in fp32, one rounding per addition. It does not
                      give the tensor core's bits, and the report shows how.
* ``block_kernel``  - a model of the tensor-core accumulation (blocks of 32 or 16 products aligned to the
                      block's largest exponent and truncated to 13 fraction bits, the accumulator inside the
                      alignment). With 32-product blocks it matches ``hopper``, with 16 ``ada``.

If this machine has a CUDA GPU, ``torch._scaled_mm`` itself is checked against the golden file too, under the
profile whose reference GPU it is (when it is one of them).

The golden calls use ``splitk=1``: the kernels under test are single-pass kernels (one chain over all of K), so
the unsplit reference is the right oracle for them, and the shape (16 x 32 x 256) need not be in a recorded
split-K table.

Run:  python docs/examples/check_my_kernel.py [--short] [--golden PATH]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

import mmaemu
from mmaemu.quantize import amax_scale, quantize_e4m3, scale_inv
from mmaemu.testing import assert_bitwise_equal, bits

PROFILES = {"hopper": 32, "ada": 16}  # profile -> products per tensor-core block
OUT_DTYPE = torch.bfloat16


# ------------------------------------------------------------------------------------------------------------------
# 1. Golden bits, produced without a GPU


def make_inputs(M, N, K, seed=0):
    """Activations and weights quantised per tensor as TE does; returns FP8 codes and the inverse scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * 3.0
    w = torch.randn(N, K, generator=g) * 0.05
    sx, sw = amax_scale(x), amax_scale(w)  # 448 / amax, in fp32
    return quantize_e4m3(x, sx), quantize_e4m3(w, sw), scale_inv(sx), scale_inv(sw)


def make_golden(path, M, N, K):
    a, w, sa, sb = make_inputs(M, N, K)
    golden, plans = {}, {}
    for profile in PROFILES:
        args = (a, w.t(), sa, sb)
        options = dict(out_dtype=OUT_DTYPE, use_fast_accum=True, profile=profile, splitk=1)
        golden[profile] = mmaemu.scaled_mm(*args, **options)
        plans[profile] = repr(mmaemu.explain(*args, **options))
    torch.save({"a_codes": a.view(torch.uint8), "w_codes": w.view(torch.uint8), "scale_a": sa, "scale_b": sb,
                "out_dtype": str(OUT_DTYPE), "use_fast_accum": True, "golden": golden, "plans": plans,
                "mmaemu": mmaemu.__version__}, path)
    return path


# ------------------------------------------------------------------------------------------------------------------
# 2. Kernels under test (yours would be CUDA; these are numpy so that the example runs anywhere)


def _epilogue(acc, scale_a, scale_b, out_dtype):
    """cuBLAS-style epilogue: alpha = fp32(scale_a * scale_b); y = fp32(acc * alpha + 0); then out_dtype."""
    alpha = np.float32(np.float64(scale_a) * np.float64(scale_b))
    y = (acc.astype(np.float64) * np.float64(alpha) + 0.0).astype(np.float32)  # the product is exact in float64
    return torch.from_numpy(y).to(out_dtype)


def naive_kernel(a, w, scale_a, scale_b, out_dtype):
    """Products summed in fp32 from k = 0 upwards, one IEEE rounding per addition."""
    av = a.float().numpy()
    wv = w.float().numpy()
    acc = np.zeros((av.shape[0], wv.shape[0]), np.float32)
    for k in range(av.shape[1]):
        acc += np.outer(av[:, k], wv[:, k]).astype(np.float32)  # each FP8 x FP8 product is exact in fp32
    return _epilogue(acc, float(scale_a), float(scale_b), out_dtype)


def _exponent(v):
    """floor(log2|v|) for nonzero v (exact, via frexp), clamped below at E4M3's emin = -6."""
    return np.maximum(np.frexp(v)[1] - 1, -6)


def _truncate(x, grid):
    return np.trunc(x / grid) * grid  # toward zero; exact for these power-of-two grids


def block_kernel(a, w, scale_a, scale_b, out_dtype, block=32):
    """Tensor-core accumulation model: per block, align every term to the largest exponent, truncate, sum."""
    av = a.float().numpy().astype(np.float64)
    wv = w.float().numpy().astype(np.float64)
    M, K = av.shape
    N = wv.shape[0]
    c = np.zeros((M, N))
    for start in range(0, K, block):
        pa, pw = av[:, None, start:start + block], wv[None, :, start:start + block]
        products = pa * pw  # [M, N, block], exact
        nonzero = products != 0
        exps = np.where(nonzero, _exponent(np.where(pa != 0, pa, 1.0)) + _exponent(np.where(pw != 0, pw, 1.0)),
                        -1000)
        c_exp = np.where(c != 0, np.frexp(c)[1] - 1, -1000)
        E = np.maximum(exps.max(axis=2), c_exp)
        grid = np.exp2(E - 13.0)[..., None]
        total = _truncate(products, grid).sum(axis=2) + _truncate(c, grid[..., 0])
        f = np.maximum(np.frexp(total)[1] - 1, -126)
        c = np.where(total != 0, _truncate(total, np.exp2(f - 13.0)), 0.0)  # 14 significant bits; zero is +0
    return _epilogue(c.astype(np.float32), float(scale_a), float(scale_b), out_dtype)


# ------------------------------------------------------------------------------------------------------------------
# 3. The check


def check(name, actual, expected):
    try:
        assert_bitwise_equal(actual, expected, msg=name)
    except AssertionError as report:
        print(f"FAIL {name}\n{report}\n")
        return False
    print(f"PASS {name}: all {expected.numel()} outputs bit-identical\n")
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="smaller K (CI)")
    parser.add_argument("--golden", help="where to write the golden file (default: a temporary directory)")
    args = parser.parse_args(argv)
    M, N, K = (16, 32, 128) if args.short else (16, 32, 256)

    with tempfile.TemporaryDirectory() as tmp:
        path = make_golden(args.golden or os.path.join(tmp, "golden.pt"), M, N, K)
        print(f"golden file written (no GPU needed): {path}")
        stored = torch.load(path)  # from here on, this is what the machine with the kernel does
        a = stored["a_codes"].view(torch.float8_e4m3fn)
        w = stored["w_codes"].view(torch.float8_e4m3fn)
        sa, sb = stored["scale_a"], stored["scale_b"]
        for profile, golden in stored["golden"].items():
            first = " ".join(f"{int(b) & 0xFFFF:04X}" for b in bits(golden)[0, :6])
            print(f"  {profile:<6} {tuple(golden.shape)} {golden.dtype}, row 0 starts {first} ...")
            print(f"         {stored['plans'][profile]}")
        print()

        results = {
            "naive fp32 kernel vs hopper": check("naive fp32 kernel vs hopper", naive_kernel(a, w, sa, sb, OUT_DTYPE),
                                                 stored["golden"]["hopper"]),
        }
        for profile, golden in stored["golden"].items():
            for block in sorted(set(PROFILES.values()), reverse=True):
                name = f"block kernel ({block}-product blocks) vs {profile}"
                results[name] = check(name, block_kernel(a, w, sa, sb, OUT_DTYPE, block), golden)

        if torch.cuda.is_available():
            for profile, golden in stored["golden"].items():
                if mmaemu.get_profile(profile).matches_device():
                    out = torch._scaled_mm(a.cuda(), w.cuda().t(), sa.cuda(), sb.cuda(), out_dtype=OUT_DTYPE,
                                           use_fast_accum=True)
                    results[f"torch._scaled_mm on this GPU vs {profile}"] = check(
                        f"torch._scaled_mm on this GPU vs {profile}", out.cpu(), golden)

    print("summary:")
    for name, ok in results.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    expected = {f"block kernel ({b}-product blocks) vs {p}": b == PROFILES[p] for p in PROFILES
                for b in PROFILES.values()}
    expected["naive fp32 kernel vs hopper"] = False
    surprises = [n for n, ok in expected.items() if results[n] != ok]
    if surprises:
        raise SystemExit(f"unexpected outcome for: {surprises}")
    return results


if __name__ == "__main__":
    main()
