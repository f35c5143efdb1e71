"""The demo of the README: one FP8 GEMM of the Evo 2 1B projection shape under the ``hopper`` and ``ada`` profiles
(or any profiles you name, e.g. the experimental Blackwell ones next to the H100).

:func:`run_demo` builds seeded activations and weights, quantises them to E4M3 as Transformer Engine does
(per-tensor amax scaling to 448, the GEMM gets the inverse scales), runs ``mmaemu.scaled_mm`` (bf16 output,
``use_fast_accum=True``, ``splitk="auto"``) under each profile and compares the bits with

* an IEEE reference: the float64 matmul of the decoded FP8 values (exact values; the float64 sum of the K
  products is rounded once to fp32), followed by the very epilogue ``scaled_mm`` applies (fp32 scale product,
  fp32 multiply, bf16 rounding: :func:`mmaemu.cpu.epilogue_codes`), so that only the accumulation differs;
* each other (every profile against the first).

A profile without a split-K table (the experimental ones: no recorded platform) gets ``splitk=1``, stated by the
demo and reported as such, since ``"auto"`` has no evidence to decide from there. It returns plain data (a dict);
``python -m mmaemu demo [--profile NAME ...]`` prints it.
"""

from __future__ import annotations

import time
from typing import Dict, Sequence

__all__ = ["run_demo", "EVO2_1B_SHAPE", "QUICK_N"]

#: Evo 2 1B projection GEMM (M tokens x N outputs x K inputs) as run in FP8 by Transformer Engine.
EVO2_1B_SHAPE = (64, 5760, 1920)
#: N of ``--quick`` (the table holds S = 1 for (64, 256, 1920) bf16 fast under both reference profiles).
QUICK_N = 256
E4M3_MAX = 448.0
REFERENCE_TEXT = ("IEEE reference: float64 matmul of the decoded FP8 values rounded once to fp32, then the same "
                  "epilogue as scaled_mm (fp32 scale product, fp32 multiply, bf16 rounding)")


def _quantise_e4m3(x):
    """Transformer Engine's per-tensor current scaling: scale = 448 / amax (fp32), codes = e4m3(x * scale)
    (saturating), and the inverse scale 1 / scale (fp32) that the GEMM receives."""
    import torch

    amax = x.abs().max().to(torch.float32)
    scale = torch.tensor(E4M3_MAX, dtype=torch.float32) / amax
    codes = (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, torch.reciprocal(scale).reshape(()), float(amax)


def _ieee_reference(a, b, scale_a, scale_b):
    """bf16 output of the IEEE reference (see the module docstring) and its fp32 accumulator."""
    import torch

    from ..cpu.engine import epilogue_codes

    acc = (a.to(torch.float64) @ b.to(torch.float64).t()).to(torch.float32)
    bits = epilogue_codes(acc.numpy(), _fp32_bits(scale_a), _fp32_bits(scale_b), None, "bfloat16")
    return torch.from_numpy(bits.view("int16")).view(torch.bfloat16)


def _fp32_bits(t) -> int:
    import torch

    return int(t.reshape(()).view(torch.int32).item()) & 0xFFFFFFFF


def _compare(x, y, reference) -> dict:
    """Bit differences of two bf16 tensors: how many, their largest absolute difference (also as a fraction of the
    largest magnitude of ``reference``) and their largest difference relative to ``reference``."""
    import torch

    differ = int((x.view(torch.int16) != y.view(torch.int16)).sum())
    xd, yd, rd = x.to(torch.float64), y.to(torch.float64), reference.to(torch.float64)
    diff = (xd - yd).abs()
    nonzero = rd != 0
    max_rel = float((diff[nonzero] / rd[nonzero].abs()).max()) if bool(nonzero.any()) else 0.0
    max_abs = float(diff.max()) if diff.numel() else 0.0
    largest = float(rd.abs().max()) if rd.numel() else 0.0
    return {"differ": differ, "max_abs_diff": max_abs, "max_abs_diff_of_largest": max_abs / largest if largest else 0.0,
            "max_rel_diff": max_rel}


def run_demo(*, quick: bool = False, seed: int = 0, profiles: Sequence[str] = ("hopper", "ada"),
             activation_std: float = 1.0, weight_std: float = 0.02) -> Dict:
    """Run the demo GEMM (M=64, N=5760, K=1920; N=256 with ``quick``) and return what it found.

    Keys: ``shape``, ``quick``, ``seed``, ``inputs`` (distributions, amax, inverse scales), ``call``,
    ``reference`` (how the IEEE reference is computed), ``outputs`` (M*N), ``profiles`` (per profile: GPU,
    split decision, ``seconds``, ``first_call`` (that call includes Numba compilation or cache loading),
    ``vs_ieee``: {differ, max_abs_diff, max_abs_diff_of_largest (max_abs_diff over the largest |reference|),
    max_rel_diff}, ``maturity``, ``splitk_stated``: S = 1 given by the demo
    because the profile has no split-K table), ``between`` (first two profiles compared), ``versus_first`` (every
    later profile against the first) and ``reference_seconds``. Relative differences are relative to the IEEE
    reference (outputs where it is 0 are left out).
    """
    import torch

    import mmaemu

    M, N, K = EVO2_1B_SHAPE
    if quick:
        N = QUICK_N
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen, dtype=torch.float32) * activation_std
    w = torch.randn(N, K, generator=gen, dtype=torch.float32) * weight_std
    x8, x_scale_inv, x_amax = _quantise_e4m3(x)
    w8, w_scale_inv, w_amax = _quantise_e4m3(w)
    call = dict(out_dtype=torch.bfloat16, use_fast_accum=True, splitk="auto")

    start = time.perf_counter()
    reference = _ieee_reference(x8, w8, x_scale_inv, w_scale_inv)
    reference_seconds = time.perf_counter() - start

    results, outputs = {}, {}
    for i, name in enumerate(profiles):
        profile = mmaemu.get_profile(name)
        stated = profile.splitk_table is None and profile.workspace_bytes != 0
        profile_call = dict(call, splitk=1) if stated else call
        plan = mmaemu.explain(x8, w8.t(), x_scale_inv, w_scale_inv, profile=name, **profile_call)
        start = time.perf_counter()
        y = mmaemu.scaled_mm(x8, w8.t(), x_scale_inv, w_scale_inv, profile=name, **profile_call)
        seconds = time.perf_counter() - start
        outputs[name] = y
        split = plan.split
        results[name] = {
            "gpu": profile.gpu_name,
            "preset": plan.preset,
            "maturity": plan.preset_maturity if plan.preset_maturity != "validated" else profile.maturity,
            "split": None if split is None else {"S": split.S, "scheme": split.scheme, "source": split.source,
                                                 "verified": split.verified},
            "splitk_stated": stated,
            "backend": plan.backend,
            "seconds": seconds,
            "first_call": i == 0,
            "vs_ieee": _compare(y, reference, reference),
        }
    versus_first = [{"profiles": [profiles[0], name], **_compare(outputs[profiles[0]], outputs[name], reference)}
                    for name in profiles[1:]]
    between = versus_first[0] if versus_first else None
    return {
        "shape": {"M": M, "N": N, "K": K},
        "quick": quick,
        "seed": seed,
        "inputs": {
            "activations": f"randn * {activation_std}", "weights": f"randn * {weight_std}", "format": "e4m3",
            "quantisation": "per-tensor amax scaling to 448 (Transformer Engine), inverse scales to the GEMM",
            "amax_a": x_amax, "amax_b": w_amax,
            "scale_inv_a": float(x_scale_inv), "scale_inv_b": float(w_scale_inv),
        },
        "call": {"out_dtype": "bfloat16", "use_fast_accum": True, "splitk": "auto"},
        "reference": REFERENCE_TEXT,
        "outputs": M * N,
        "profiles": results,
        "between": between,
        "versus_first": versus_first,
        "reference_seconds": reference_seconds,
    }
