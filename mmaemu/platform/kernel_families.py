"""Which kernel a scaled GEMM meets on a profile's stack, as data (docs/recipes.md).

torch sends a scaled GEMM to a kernel chosen by the recipe pair of its scales, its own version, the cuBLAS it
was built with and the GPU's compute capability. :data:`ROUTES` is that choice as a table: one
:class:`KernelRoute` per (entry point, recipe pair, torch versions, cuBLASLt versions, CUDA major), the first
matching row deciding. Each row names the :class:`KernelFamily` (the kernel, the mmaemu model that computes it and
its maturity) and says whether mmaemu computes the call or refuses it, and why. :func:`route` is the lookup, a
pure function of the profile's recorded stack (``Profile.torch_version``, ``cublaslt_version``, ``capability``).

Entry points: ``"scaled_mm"`` covers ``torch._scaled_mm`` and ``torch._scaled_mm_v2`` (``F.scaled_mm``), which
reach the same kernels (``_scaled_mm_out_cuda`` and ``_scaled_mm_cuda_v2_out``); ``"scaled_grouped_mm"`` covers
``torch._scaled_grouped_mm`` and ``torch._scaled_grouped_mm_v2`` (``F.scaled_grouped_mm``). Recipe pairs are named
as torch's dispatch tables name them (``scale_kernel_dispatch`` in ScaledBlas.cpp, ``scale_grouped_kernel_dispatch``
in GroupedBlas.cpp).

Sources (pytorch/pytorch): ``aten/src/ATen/native/cuda/ScaledBlas.cpp`` at 0174dfabc023f11a8f78c79c301b49c8d7e02c8b
(``_scaled_rowwise_rowwise``: CUTLASS ``f8f8bf16_rowwise`` when ``major < 9 || CUBLAS_VERSION < 120900 ||
cublasLtGetVersion() < 120900``, else cuBLASLt; ``_check_deepseek_support``: 1x128 / 128x128 scaling on sm_90 only and
only with cuBLASLt >= 12.9), ``aten/src/ATen/native/cuda/GroupedBlas.cpp`` at 00d4eaf9327928137f4cc437b17e5cf54623565f
(row-wise grouped -> ``f8f8bf16_grouped_mm``, MXFP8 grouped -> FBGEMM ``mx8mx8bf16_grouped_mm``), and the torch
2.7.1 facts of docs/semantics.md ("Row-wise scaling"). The cuBLASLt row-wise branch came with pytorch PR 166744
("NVIDIA uses CUTLASS for row-wise scaling prior to cuBLAS version 12.9"); the torch release that first carries it
is not pinned here (by its number it predates the 2.10 branch cut; the design note says >= 2.11), so torch 2.10 is
a row of its own that refuses row-wise as unknown.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

__all__ = ["KernelFamily", "KernelRoute", "FAMILIES", "ROUTES", "ENTRY_POINTS", "RECIPE_PAIRS", "route",
           "release", "COMPUTES", "REFERENCE_REJECTS", "UNSUPPORTED", "ROWWISE_CUBLASLT_PROBE", "BLOCKWISE_PROBE"]

ENTRY_POINTS = ("scaled_mm", "scaled_grouped_mm")
#: Recipe pairs as torch's dispatch tables name them.
RECIPE_PAIRS = ("tensorwise_tensorwise", "rowwise_rowwise", "block_1x128_128x128", "block_128x128_1x128",
                "block_1x128_1x128", "mxfp8_mxfp8", "nvfp4_nvfp4", "nvfp4_nvfp4_single_scale", "mxfp4_mxfp4")
BLOCKWISE_PAIRS = ("block_1x128_128x128", "block_128x128_1x128", "block_1x128_1x128")

#: The GPU probes of docs/limitations.md that would decide the refused cuBLASLt epilogues.
ROWWISE_CUBLASLT_PROBE = "cuBLASLt row-wise (OUTER_VEC_32F) epilogue probe"
BLOCKWISE_PROBE = "cuBLASLt block-wise (VEC128_32F / BLK128x128_32F) probe"


class KernelFamily(NamedTuple):
    """A kind of kernel the reference GPU's torch runs: its name, the mmaemu model that computes it (None: no
    model), and that model's maturity ("validated", "experimental", "none")."""

    name: str
    model: Optional[str]
    maturity: str


FAMILIES = {
    "cublaslt-tensorwise": KernelFamily(
        "cuBLASLt tensor-wise", "mmaemu.scaled_mm: the profile's preset and split-K table (docs/semantics.md)",
        "the profile's"),
    "cutlass-rowwise": KernelFamily(
        "cutlass rowwise", "mmaemu.scaled_mm row-wise: torch 2.7.1's f8f8bf16_rowwise on sm_90 "
        "(mmaemu.platform.rowwise)", "experimental"),
    "cutlass-rowwise-sm89": KernelFamily("cutlass rowwise sm_89 (CUTLASS 2.x, stream-K)", None, "none"),
    "cutlass-rowwise-sm100": KernelFamily("cutlass rowwise sm_100", None, "none"),
    "cublaslt-rowwise": KernelFamily("cuBLASLt row-wise OUTER_VEC_32F", None, "none"),
    "cublaslt-blockwise": KernelFamily(
        "cuBLASLt block-wise VEC128_32F / BLK128x128_32F", "mmaemu.scaled_v2's block-wise seam "
        "(_blockwise_1x128)", "modelled from a public zero-tolerance reference, not recorded"),
    "cublaslt-block-scaled": KernelFamily(
        "cuBLASLt block-scaled (B200 tcgen05.mma block_scale)", "mmaemu.scaled_mm MXFP8 / NVFP4 "
        "(mmaemu.platform.block_scaled)", "experimental"),
    "cutlass-grouped-rowwise": KernelFamily(
        "cutlass grouped rowwise (f8f8bf16_grouped_mm)", "mmaemu.scaled_grouped_mm: per group the hopper "
        "preset's chain and the grouped epilogue (mmaemu.grouped)", "experimental"),
    "fbgemm-mxfp4": KernelFamily(
        "FBGEMM CUTLASS MXFP4 (f4f4bf16)", "mmaemu.scaled_mm MXFP4: one tcgen05 kind::mxf4 chain per output "
        "(mmaemu.platform.block_scaled)", "experimental"),
    "fbgemm-grouped-mxfp8": KernelFamily("FBGEMM CUTLASS grouped MXFP8 (mx8mx8bf16_grouped_mm)", None, "none"),
    "fbgemm-grouped-fp4": KernelFamily("FBGEMM CUTLASS grouped FP4 (f4f4bf16_grouped_mm)", None, "none"),
    "unknown": KernelFamily("unknown", None, "none"),
}

_ANY = (None, None)
COMPUTES, REFERENCE_REJECTS, UNSUPPORTED = "computes", "reference-rejects", "unsupported"
Version = Optional[Tuple[int, int]]


class KernelRoute(NamedTuple):
    """One row of :data:`ROUTES`: for ``entry`` and ``pair``, torch (major, minor) in ``torch`` = (lo, hi)
    inclusive (None: open; a profile without a torch version matches only (None, None)), cuBLASLt (major, minor)
    in ``cublaslt`` likewise, CUDA major ``cuda_major`` (None: any), the kernel ``family`` (a key of
    :data:`FAMILIES`), the ``verdict`` (:data:`COMPUTES`; :data:`REFERENCE_REJECTS`: the stack itself refuses the
    call, an error torch raises there; :data:`UNSUPPORTED`: the GPU computes it, mmaemu cannot say how) and
    ``why``."""

    entry: str
    pairs: Tuple[str, ...]
    torch: Tuple[Version, Version]
    cublaslt: Tuple[Version, Version]
    cuda_major: Optional[int]
    family: str
    verdict: str
    why: str

    @property
    def kernel(self) -> KernelFamily:
        return FAMILIES[self.family]

    @property
    def computes(self) -> bool:
        return self.verdict == COMPUTES


_MM, _GROUPED = ENTRY_POINTS
_BLOCK_SCALED = ("mxfp8_mxfp8", "nvfp4_nvfp4", "nvfp4_nvfp4_single_scale")

ROUTES = (
    KernelRoute(_MM, ("tensorwise_tensorwise",), _ANY, _ANY, None, "cublaslt-tensorwise", COMPUTES,
                "torch sends tensor-wise fp32 scales to cuBLASLt (_scaled_gemm) in every version; the scales enter "
                "cuBLASLt's alpha"),
    KernelRoute(_MM, ("rowwise_rowwise",), ((2, 0), (2, 9)), _ANY, 9, "cutlass-rowwise", COMPUTES,
                "this torch has no cuBLASLt row-wise branch: row-wise scales run its own CUTLASS kernel "
                "f8f8bf16_rowwise on sm_90"),
    KernelRoute(_MM, ("rowwise_rowwise",), ((2, 10), (2, 10)), _ANY, 9, "unknown", UNSUPPORTED,
                "whether torch 2.10 carries pytorch PR 166744 (row-wise to cuBLASLt with cuBLAS >= 12.9) is not "
                "pinned, so which kernel runs the call is unknown"),
    KernelRoute(_MM, ("rowwise_rowwise",), ((2, 11), None), ((12, 9), None), 9, "cublaslt-rowwise",
                UNSUPPORTED,
                "with cuBLAS >= 12.9 on sm_90 torch sends row-wise scales to cuBLASLt (OUTER_VEC_32F scale mode, "
                "pytorch PR 166744), whose epilogue and split-K are not recorded; a GPU would record them with the "
                f"{ROWWISE_CUBLASLT_PROBE} of docs/limitations.md"),
    KernelRoute(_MM, ("rowwise_rowwise",), ((2, 11), None), (None, (12, 8)), 9, "cutlass-rowwise", COMPUTES,
                "cuBLAS < 12.9 has no row-wise scale mode: torch runs its CUTLASS kernel f8f8bf16_rowwise"),
    KernelRoute(_MM, ("rowwise_rowwise",), _ANY, _ANY, 8, "cutlass-rowwise-sm89", UNSUPPORTED,
                "on sm_89 torch runs row-wise scaling in a CUTLASS 2.x stream-K kernel that mmaemu does not model"),
    KernelRoute(_MM, ("rowwise_rowwise",), _ANY, _ANY, 10, "cutlass-rowwise-sm100", UNSUPPORTED,
                "on sm_100 torch runs row-wise scaling in its sm_100 CUTLASS kernel, which mmaemu does not model"),
    KernelRoute(_MM, BLOCKWISE_PAIRS, ((2, 0), (2, 8)), _ANY, None, "unknown", REFERENCE_REJECTS,
                "this torch's _scaled_mm has no 1x128 / 128x128 block-wise scaling (it rejects such scales: "
                "'Invalid scaling configuration')"),
    KernelRoute(_MM, BLOCKWISE_PAIRS, ((2, 9), None), ((12, 9), None), 9, "cublaslt-blockwise", COMPUTES,
                "on sm_90 with cuBLASLt >= 12.9 torch sends 1x128 / 128x128 scales to cuBLASLt's block-wise scale "
                "modes (VEC128_32F, BLK128x128_32F)"),
    KernelRoute(_MM, BLOCKWISE_PAIRS, ((2, 9), None), (None, (12, 8)), 9, "unknown", REFERENCE_REJECTS,
                "torch refuses it: 'DeepSeek style (1x128, 128x128) scaling requires cublasLt >= 12.9'"),
    KernelRoute(_MM, BLOCKWISE_PAIRS, ((2, 9), None), _ANY, None, "unknown", REFERENCE_REJECTS,
                "torch refuses it: 'DeepSeek style (1x128, 128x128) scaling only supported in CUDA for SM90'"),
    KernelRoute(_MM, _BLOCK_SCALED, _ANY, _ANY, None, "cublaslt-block-scaled", COMPUTES,
                "torch sends MXFP8 / NVFP4 block scales to cuBLASLt's block-scaled kernels (sm_100)"),
    KernelRoute(_MM, ("mxfp4_mxfp4",), _ANY, _ANY, None, "fbgemm-mxfp4", COMPUTES,
                "torch's _scaled_mm_v2 sends MXFP4 to FBGEMM's CUTLASS kernel f4f4bf16 (pytorch ScaledBlas.cpp "
                "@0174dfab; alpha 1, beta 0, no split-K: FBGEMM f4f4bf16_common.cuh @471f0041), whose CUTLASS "
                "builder selects kind::mxf4nvf4 for FP4 x FP4 K-major operands (cutlass sm1xx_common.inl "
                "@41c55641, blockscaled::select_instr); the bias is not handed to that kernel, so a bias is "
                "refused"),
    KernelRoute(_GROUPED, ("rowwise_rowwise",), _ANY, _ANY, 9, "cutlass-grouped-rowwise", COMPUTES,
                "torch runs row-wise grouped GEMMs in its CUTLASS kernel f8f8bf16_grouped_mm (kGrouped, one "
                "problem per group) on sm_90"),
    KernelRoute(_GROUPED, ("mxfp8_mxfp8",), _ANY, _ANY, None, "fbgemm-grouped-mxfp8", UNSUPPORTED,
                "torch runs MXFP8 grouped GEMMs in FBGEMM's mx8mx8bf16_grouped_mm, whose chain and per-group "
                "scale layout mmaemu does not model"),
    KernelRoute(_GROUPED, ("nvfp4_nvfp4", "mxfp4_mxfp4"), _ANY, _ANY, None, "fbgemm-grouped-fp4", UNSUPPORTED,
                "torch runs FP4 grouped GEMMs in FBGEMM's f4f4bf16_grouped_mm, which mmaemu does not model"),
    KernelRoute(_GROUPED, ("rowwise_rowwise",), _ANY, _ANY, None, "unknown", UNSUPPORTED,
                "torch's grouped row-wise kernel is modelled on sm_90 only"),
)

_NO_ROUTE = ("no row of mmaemu.platform.kernel_families.ROUTES covers this call on the profile's stack, so which "
             "kernel the reference GPU runs is unknown")


def release(version: Optional[str]) -> Version:
    """(major, minor) of a version text ('2.7.1+cu128' -> (2, 7), '12.8.3.14' -> (12, 8)); None for None."""
    if version is None:
        return None
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _within(value: Version, bounds) -> bool:
    lo, hi = bounds
    if bounds == _ANY:
        return True
    if value is None:
        return False
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _stack_of(profile) -> Tuple[Optional[str], Optional[str]]:
    """(torch version, cuBLASLt version) of ``profile``'s stack: the recorded ones, or for the block-wise cuBLASLt
    profile, which records none, the stack whose rules it models (:data:`mmaemu.platform.blockwise.MODELLED_STACK`)."""
    from .blockwise import MODELLED_STACK, is_blockwise_profile

    if is_blockwise_profile(profile):
        return MODELLED_STACK
    return getattr(profile, "torch_version", None), getattr(profile, "cublaslt_version", None)


def route(entry: str, pair: str, profile) -> KernelRoute:
    """The row of :data:`ROUTES` for ``entry`` and recipe ``pair`` on ``profile``'s stack (its torch version,
    cuBLASLt version and compute capability), or a refusing row of family "unknown" when none matches."""
    if entry not in ENTRY_POINTS:
        raise ValueError(f"unknown entry point {entry!r}; known: {ENTRY_POINTS}")
    if pair not in RECIPE_PAIRS:
        raise ValueError(f"unknown recipe pair {pair!r}; known: {RECIPE_PAIRS}")
    torch_release, cublaslt = (release(version) for version in _stack_of(profile))
    major = tuple(getattr(profile, "capability", None) or (None,))[0]
    for row in ROUTES:
        if (row.entry == entry and pair in row.pairs and _within(torch_release, row.torch)
                and _within(cublaslt, row.cublaslt) and (row.cuda_major is None or row.cuda_major == major)):
            return row
    return KernelRoute(entry, (pair,), _ANY, _ANY, None, "unknown", UNSUPPORTED, _NO_ROUTE)
