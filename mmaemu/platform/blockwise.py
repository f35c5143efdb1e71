"""cuBLASLt's block-wise FP8 GEMM on sm_90 (torch's ``BlockWise1x128`` / ``BlockWise128x128`` scales) as data: the
profile that models it, the kernel family, what the model assumes, and which profiles refuse it.

torch sends a call with 1x128 / 128x128 fp32 scales to cuBLASLt with the ``VEC128_32F`` / ``BLK128x128_32F`` scale
modes, on sm_90 only and only with cuBLAS/cuBLASLt >= 12.9 (pytorch/pytorch ``aten/src/ATen/native/cuda/
ScaledBlas.cpp`` at commit 0174dfabc023f11a8f78c79c301b49c8d7e02c8b, ``_check_deepseek_support``: "DeepSeek style
(1x128, 128x128) scaling requires cublasLt >= 12.9"). The profile ``hopper`` records torch 2.7.1 with cuBLASLt
12.8.3.14, a stack without these scale modes: there the call is refused as torch 2.7.1 refuses it ("Invalid scaling
configuration"), naming :data:`PROFILE`.

The arithmetic (:mod:`mmaemu.model.chunked`, ``CUBLASLT_SM90_*``) is Transformer Engine's zero-tolerance reference
of cuBLASLt (``CuBLASRefBlockwiseGemm``): modelled from a public zero-tolerance reference, not recorded.
"""

from __future__ import annotations

__all__ = ["PROFILE", "MODELLED_STACK", "KERNEL", "MATURITY_NOTE", "ASSUMPTIONS", "NO_SPLIT_REASON", "is_blockwise_profile",
           "maturity_message"]

#: The built-in profile of torch's block-wise GEMMs through cuBLASLt >= 12.9 on an H100.
PROFILE = "hopper-cublaslt-blockwise-experimental"
#: The (torch, cuBLASLt) versions whose rules :data:`PROFILE` models where it records no stack of its own: torch
#: 2.13's validation (the installed torch's sources) with the first cuBLASLt that has the block-wise scale modes.
#: :func:`mmaemu.platform.kernel_families.route` reads it to choose the kernel family of the profile's calls.
MODELLED_STACK = ("2.13.0", "12.9")
KERNEL = "cuBLASLt block-wise (sm_90, VEC128_32F / BLK128x128_32F scales)"
MATURITY_NOTE = "modelled from a public zero-tolerance reference, not recorded"
NO_SPLIT_REASON = ("no split-K table is recorded for cuBLASLt >= 12.9: every output is assumed to be one CTA's loop "
                   "over all 128-k blocks (S = 1), as Transformer Engine's zero-tolerance reference computes it")
#: What the profile assumes beyond the reference (docs/limitations.md names the probe that would decide each).
ASSUMPTIONS = ("no split-K at any shape (the reference has none; its tests cover M, N <= 4096, K <= 4096)",
               "K not a multiple of 128: the last block is a fresh partial of the remaining k (the tests cover "
               "K = 64 only)",
               "use_fast_accum=False only (torch and cuBLASLt refuse fast accumulation with block scales)",
               "the bias is added in fp32 before the cast to the output dtype, an accumulated output after it "
               "(the reference's order)")


def is_blockwise_profile(profile) -> bool:
    """Whether ``profile`` computes torch's block-wise (1x128 / 128x128) calls: the built-in :data:`PROFILE`."""
    return getattr(profile, "name", None) == PROFILE


def maturity_message(pair: str) -> str:
    """The ExperimentalPresetWarning text of a block-wise call (``pair``: "1x128 x 128x128", ...)."""
    return (f"mmaemu: {KERNEL}, {pair}: {MATURITY_NOTE} (Transformer Engine's CuBLASRefBlockwiseGemm, checked with "
            f"atol = rtol = 0 against cuBLASLt); assumed: {'; '.join(ASSUMPTIONS)} (docs/limitations.md names the "
            "probe that would validate it)")
