"""torch's CUTLASS row-wise kernel (``f8f8bf16_rowwise``, ``aten/src/ATen/native/cuda/RowwiseScaledMM.cu``) as
data: which platforms run it, the kernel's fixed facts, and the shape rule that decides the order of the two scale
multiplies (docs/semantics.md, "Row-wise scaling"; docs/limitations.md names the sources read and the probe that
would validate it).

The kernel is CUTLASS ``GemmUniversal`` in ``kGemm`` mode with the persistent tile scheduler: every output is
computed by one CTA over all of K (no split-K, no stream-K), so no split table is needed. Its mainloop is the
hopper preset's wgmma chain: one chain over all K with ``use_fast_accum=True`` (the ``...FP8FastAccum``
schedules), else 128-k promotion chunks combined by fp32 adds (CUTLASS ``GmmaFP8Accumulation``, promotion
interval 4 wgmma k32 instructions), which is the slow chain structure of semantics.md c.2.

The epilogue multiplies the accumulator by the scale of the problem's own rows (``XScale``, a column broadcast)
first and then by the scale of its columns (``WScale``). The dispatch
``dispatch_fp8_rowwise_kernel_on_cluster_size_and_transpose`` runs some shapes as the transposed problem
(``W^T X^T``), which swaps the two scale vectors: then ``w_scale[n]`` is applied first. :func:`runs_transposed`
is that dispatch, and :data:`X_SCALE_FIRST_UNTRANSPOSED` keys the untransposed order by torch version because it
changed between versions (older torch: ``x_scale * (w_scale * acc)``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from . import kernel_families

__all__ = ["KERNEL", "NO_SPLIT_REASON", "RowwiseOrder", "runs_transposed", "scale_order", "supported_torch_versions",
           "X_SCALE_FIRST_UNTRANSPOSED", "platform_refusal"]

KERNEL = "cutlass rowwise"
NO_SPLIT_REASON = ("cutlass rowwise: GemmUniversal kGemm, persistent scheduler, no split-K (each output is one "
                   "CTA's chain over all of K)")

#: Whether the untransposed problem multiplies by x_scale[m] before w_scale[n], by torch version (the
#: ``AccumScale`` tree of RowwiseScaledMM.cu). torch 2.7.1: ``Multiply(WScale, Multiply(XScale, Accum))``.
X_SCALE_FIRST_UNTRANSPOSED = {"2.7.1": True}


def supported_torch_versions() -> tuple:
    return tuple(X_SCALE_FIRST_UNTRANSPOSED)


def _round_up_64(x: int) -> int:
    return -(-x // 64) * 64


def runs_transposed(M: int, N: int) -> bool:
    """True if torch 2.7.1's sm_90 dispatch runs the row-wise call [M, K] x [K, N] as the transposed problem.

    M and N are first rounded up to multiples of 64; then, in order (the first matching rule decides):
    M = 64 and N >= 3072: no; N = 64 and M >= 3072: yes; M = 192 and N >= 4096: yes; N = 192 and M >= 4096: no;
    if M * N <= 4096^2: M % 256 > 0 and N % 256 == 0: yes, N % 256 > 0 and M % 256 == 0: no;
    if M % 256 > 0 and N % 256 > 0: yes iff (M <= N) xor (M * N <= 1024^2);
    M >= 4096 and N >= 4096: yes iff M < N; otherwise: yes (both remaining branches transpose).
    """
    M, N = _round_up_64(M), _round_up_64(N)
    if M == 64 and N >= 3072:
        return False
    if N == 64 and M >= 3072:
        return True
    if M == 192 and N >= 4096:
        return True
    if N == 192 and M >= 4096:
        return False
    if M * N <= 4096 * 4096:
        if M % 256 > 0 and N % 256 == 0:
            return True
        if N % 256 > 0 and M % 256 == 0:
            return False
    if M % 256 > 0 and N % 256 > 0:
        return (M <= N) != (M * N <= 1024 * 1024)
    if M >= 4096 and N >= 4096:
        return M < N
    return True


@dataclasses.dataclass(frozen=True)
class RowwiseOrder:
    """The order of the two scale multiplies of one call: ``x_first`` (x_scale[m] then w_scale[n]) and why."""

    transposed: bool
    x_first: bool

    @property
    def note(self) -> str:
        problem = "the transposed problem (W^T X^T)" if self.transposed else "the problem as given"
        order = "x_scale[m] first, then w_scale[n]" if self.x_first else "w_scale[n] first, then x_scale[m]"
        return f"{KERNEL} runs {problem}: epilogue multiplies {order}"


def scale_order(M: int, N: int, torch_version: str = "2.7.1") -> RowwiseOrder:
    """The scale order of a row-wise call of shape (M, N) on sm_90 under ``torch_version``."""
    if torch_version not in X_SCALE_FIRST_UNTRANSPOSED:
        raise KeyError(f"no row-wise kernel data for torch {torch_version}; known: {supported_torch_versions()}")
    transposed = runs_transposed(M, N)
    return RowwiseOrder(transposed, X_SCALE_FIRST_UNTRANSPOSED[torch_version] != transposed)


def _torch_release(version: Optional[str]) -> Optional[str]:
    """'2.7.1' of '2.7.1+cu128'."""
    return None if version is None else version.split("+")[0]


def platform_refusal(profile) -> Optional[str]:
    """Why row-wise scaling is not modelled on ``profile`` (None when it is: torch's caller on an sm_90 reference
    GPU with a torch version this module has data for)."""
    capability = tuple(getattr(profile, "capability", None) or ())
    caller = getattr(profile, "caller", None)
    if capability == (8, 9):
        return ("on sm_89 torch 2.7.1 runs row-wise scaling in a different kernel (f8f8bf16_rowwise_impl_sm89: a "
                "CUTLASS 2.x GEMM with the stream-K threadblock swizzle, so an output may be split across CTAs "
                "depending on the GPU's SM count, and its own promotion of the mma.sync chain), which mmaemu does "
                "not model; the Hopper model is not used in its place")
    if caller != "torch._scaled_mm":
        return (f"profile {profile.name!r} describes {caller or 'no caller'}'s cuBLASLt calls; row-wise scales are "
                "modelled only for torch._scaled_mm's CUTLASS kernel (profiles 'hopper', 'hopper-ws0')")
    route = kernel_families.route("scaled_mm", "rowwise_rowwise", profile)
    if route.family == "cublaslt-rowwise":  # cuBLAS >= 12.9: the stack runs cuBLASLt's row-wise epilogue instead
        return f"{route.kernel.name}: {route.why}"
    if capability != (9, 0) or getattr(profile, "gpu_name", None) is None:
        return (f"profile {profile.name!r} has no sm_90 reference platform; row-wise scales are modelled only for "
                "torch 2.7.1's sm_90 CUTLASS kernel (profiles 'hopper', 'hopper-ws0')")
    release = _torch_release(getattr(profile, "torch_version", None))
    if release not in X_SCALE_FIRST_UNTRANSPOSED:
        return (f"profile {profile.name!r} runs torch {profile.torch_version}; the row-wise kernel is modelled for "
                f"torch {', '.join(supported_torch_versions())} only")
    return None


MATURITY = "experimental"
MATURITY_MESSAGE = (
    "mmaemu row-wise scaled_mm (torch 2.7.1's CUTLASS kernel f8f8bf16_rowwise on sm_90) is experimental: modelled "
    "from pinned public source (pytorch aten/src/ATen/native/cuda/RowwiseScaledMM.cu and Blas.cpp, NVIDIA CUTLASS "
    "GmmaFP8Accumulation), not validated against hardware; docs/limitations.md names the probe that would "
    "validate it"
)
_MATURITY_KEY = "rowwise:torch-2.7.1-sm90"


def rowwise_maturity_notice():
    """The row-wise ExperimentalPresetWarning, once per process, as data (:class:`mmaemu.warn.Notice`, under the
    maturity warnings' class, so in their once-per-process registry)."""
    from ..errors import ExperimentalPresetWarning
    from ..warn import Notice

    return Notice(ExperimentalPresetWarning, MATURITY_MESSAGE, (_MATURITY_KEY,))
