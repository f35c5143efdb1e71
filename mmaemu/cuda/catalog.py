"""What the CUDA backend offers, as plain metadata: its kernels, their self-test results and a selection.

Nothing here compiles or probes anything (no numba, no torch): :mod:`mmaemu.backends` and the CLI read it to
describe the kernels, :mod:`.gating` to choose among them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """A CUDA kernel of :mod:`mmaemu.cuda` (metadata only; nothing is compiled here)."""

    name: str
    kind: str  # "gemm" (computes accumulators) or "epilogue"
    priority: int  # GEMM kernels are tried from the highest priority down
    summary: str
    gated: bool = False  # True: its bits are the hardware's, so an instruction probe gates it (cuda:native)
    validated_on: Tuple[Tuple[int, int], ...] = ()
    min_cc: Optional[Tuple[int, int]] = None  # whatever the installed CUDA toolkit compiles for

    @property
    def backend(self) -> str:
        return f"cuda:{self.name}"


KERNELS: Dict[str, KernelInfo] = {
    k.name: k
    for k in (
        KernelInfo("native", "gemm", 60, "the GPU's own FP8 tensor-core instruction computes every block (sm_90: the "
                   "warpgroup MMA, hopper preset, with numba-cuda; sm_89: mma.sync m16n8k32, ada preset; inline PTX), "
                   "mmaemu walks the chains, slow restarts and split-K (mmaemu.cuda.native.kernel); used after the "
                   "instruction probe and the self-test pass on the device", gated=True, min_cc=(8, 9)),
        KernelInfo("offset", "gemm", 50, "128x64 outputs per thread block, an 8x4 register tile per thread; FP8 codes "
                   "packed once into k-major panels (value, exponent, lowest-bit and sign bytes), staged 32 k at a "
                   "time with 16-byte loads; the formulation of mmaemu.arith.offset (each product one fp32 fused "
                   "multiply-add rounding toward zero into an offset accumulator, plus an exact count of the "
                   "products it floors too far); every schedule of hopper/ada-like presets (others go to the next "
                   "kernel)"),
        KernelInfo("simple", "gemm", 10, "one thread per output calls mmaemu.arith.schedule.accumulate_one on its rows "
                   "in global memory: the GPU reference, every preset and schedule"),
        KernelInfo("epilogue", "epilogue", 0, "scaled_mm's epilogue (mmaemu.arith.epilogue.epilogue_one) on the "
                   "device, so CUDA results never leave it"),
    )
}


def gemm_kernels() -> List[KernelInfo]:
    """The GEMM kernels in the order "auto"/"cuda" try them."""
    return sorted((k for k in KERNELS.values() if k.kind == "gemm"), key=lambda k: -k.priority)


@dataclasses.dataclass(frozen=True)
class GateResult:
    """One self-test of a kernel on a device. ``ran`` is False when it could not run (no usable device)."""

    name: str
    passed: bool
    reason: str
    details: object
    seconds: float
    cached: bool
    ran: bool = True


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can compute on a device, and why (see :func:`backends_status`)."""

    name: str
    available: bool
    source: Optional[str]
    validated_here: bool
    gates: List[GateResult]
    reason: str


@dataclasses.dataclass(frozen=True)
class Selection:
    """The engine chosen for a call, why the faster ones before it were not used, and the warnings of the choice
    (:class:`mmaemu.warn.Notice`, reported by :func:`mmaemu.backends.select`; not part of the comparison)."""

    name: str
    fallbacks: List[str]
    notices: Tuple = dataclasses.field(default=(), compare=False, repr=False)


# cuda:native: the FP8 MMA instruction each compute capability runs natively, the preset whose block it computes
# (the instruction probe checks that on each device) and the target it is compiled for (an architecture-specific
# one, sm_90a, needs numba-cuda). Nowhere else: FP8 mma.sync on sm_90/sm_100 is rewritten by ptxas with fp16 MMAs
# (other numerics), and no recording says what sm_120's computes. The instructions: mmaemu.cuda.native.wgmma, .mma_sync.
NATIVE_INSTRUCTIONS = {(9, 0): ("wgmma", "hopper", "sm_90a"), (8, 9): ("mma_sync", "ada", "sm_89")}

# Kernels that take the FP8 codes and decode them themselves, and decline schedules they do not walk.
CODES_KERNELS = ("native", "offset")
