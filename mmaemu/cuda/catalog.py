"""The kernel registry of the CUDA backend: every kernel as one entry, as plain data, and their verdicts' types.

An entry (:class:`KernelInfo`) says what the kernel is (``name``, ``kind``: a GEMM or an epilogue, ``summary``),
which recipes it serves (``recipes``: "tensorwise", "rowwise", "blockwise", "block_scaled"), where it stands in the
choice (``priority``: the candidates of a recipe are tried from the highest down), why it declines a call by design
(``declines``: (schedule, block params) -> why or None; ``device_declines``: (device facts, preset or None) -> why or
None; ``recipe_declines``: why it does not serve the recipes it does not list), which self-test cases prove it on a
device (``selftest``: "gemm" for :data:`mmaemu.cuda.verdicts.selftest.GEMM_CASES`, "epilogue" for the epilogue
cases; None: it has no device self-test of its own, and ``vouched_by`` names the kernel whose verdict it runs under,
if any) and how it is launched (``launch``). The one rule that chooses among the candidates a recipe's call gets
(:func:`candidates`) is :func:`mmaemu.cuda.dispatch.gating.choose`.

The functions of an entry are :class:`Ref` values, imported on first use, so that reading the registry compiles,
probes and imports nothing (no numba, no torch): :mod:`mmaemu.backends` and the CLI read it to describe the kernels,
:mod:`mmaemu.cuda.dispatch.gating` to choose among them.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Dict, List, Mapping, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Ref:
    """A function named by its module and attribute, imported when first called (the registry imports nothing)."""

    module: str
    attribute: str

    def resolve(self):
        return getattr(importlib.import_module(self.module), self.attribute)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


# The recipes (mmaemu.recipes: one vocabulary) whose calls the CUDA kernels serve.
TENSORWISE, ROWWISE, BLOCKWISE, BLOCK_SCALED = "tensorwise", "rowwise", "blockwise", "block_scaled"
GEMM, EPILOGUE = "gemm", "epilogue"


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """A CUDA kernel of :mod:`mmaemu.cuda`: one entry of the registry (metadata; nothing is compiled here)."""

    name: str
    kind: str  # GEMM (computes accumulators) or EPILOGUE
    priority: int  # the candidates of a recipe are tried from the highest priority down
    summary: str
    gated: bool = False  # True: its bits are the hardware's, so an instruction probe gates it (cuda:native)
    validated_on: Tuple[Tuple[int, int], ...] = ()
    min_cc: Optional[Tuple[int, int]] = None  # whatever the installed CUDA toolkit compiles for
    recipes: Tuple[str, ...] = (TENSORWISE, ROWWISE)
    selftest: Optional[str] = None  # its device self-test's cases: "gemm", "epilogue"; None: none of its own
    vouched_by: Optional[str] = None  # without a self-test: the kernel whose verdict it runs under, by name only
    answers_to: Optional[str] = None  # the kernel name a caller asks for it by (None: its own)
    declines: Optional[Ref] = dataclasses.field(default=None, compare=False, repr=False)
    device_declines: Optional[Ref] = dataclasses.field(default=None, compare=False, repr=False)
    recipe_declines: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    launch: Optional[Ref] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def backend(self) -> str:
        return f"cuda:{self.answers_to or self.name}"


_ENGINE = "mmaemu.cuda.dispatch.engine"
_NATIVE_NOT_CHUNKED = ("the native tensor-core kernel is gated for cuBLASLt's chains only, not for chunked scaled "
                       "kernels")

REGISTRY: Dict[str, KernelInfo] = {
    k.name: k
    for k in (
        KernelInfo("native", GEMM, 60, "the GPU's own FP8 tensor-core instruction computes every block (sm_90: the "
                   "warpgroup MMA, hopper preset, with numba-cuda; sm_89: mma.sync m16n8k32, ada preset; inline PTX), "
                   "mmaemu walks the chains, slow restarts and split-K (mmaemu.cuda.native.kernel); used after the "
                   "instruction probe and the self-test pass on the device", gated=True, min_cc=(8, 9),
                   selftest=GEMM, declines=Ref("mmaemu.cuda.native.kernel", "native_decline"),
                   device_declines=Ref("mmaemu.cuda.native.devices", "device_decline"),
                   recipe_declines={BLOCKWISE: _NATIVE_NOT_CHUNKED},
                   launch=Ref(_ENGINE, "accumulate_tensors")),
        KernelInfo("offset", GEMM, 50, "128x64 outputs per thread block, an 8x4 register tile per thread; FP8 codes "
                   "packed once into k-major panels (value, exponent, lowest-bit and sign bytes), staged 32 k at a "
                   "time with 16-byte loads; the formulation of mmaemu.arith.offset (each product one fp32 fused "
                   "multiply-add rounding toward zero into an offset accumulator, plus an exact count of the "
                   "products it floors too far); every schedule of hopper/ada-like presets (others go to the next "
                   "kernel)", selftest=GEMM, declines=Ref("mmaemu.cuda.offset.kernel", "offset_decline"),
                   recipe_declines={BLOCKWISE: "the offset kernel keeps one fp32 accumulator per output over all of "
                                               "K (one fused multiply-add per product); a block-wise kernel needs "
                                               "each 128-k chunk's partial alone for its scaled combine"},
                   launch=Ref(_ENGINE, "accumulate_tensors")),
        KernelInfo("simple", GEMM, 10, "one thread per output calls mmaemu.arith.schedule.accumulate_one on its rows "
                   "in global memory: the GPU reference, every preset and schedule", selftest=GEMM,
                   declines=Ref("mmaemu.cuda.simple.kernels", "simple_decline"),
                   launch=Ref(_ENGINE, "accumulate_tensors")),
        KernelInfo("epilogue", EPILOGUE, 0, "scaled_mm's epilogue (mmaemu.arith.epilogue.epilogue_one) on the "
                   "device, so CUDA results never leave it", recipes=(TENSORWISE,), selftest=EPILOGUE,
                   launch=Ref(_ENGINE, "epilogue_tensors")),
        KernelInfo("rowwise_epilogue", EPILOGUE, 0, "torch's row-wise epilogue (mmaemu.arith.rowwise."
                   "rowwise_epilogue_one, bf16) on the device; checked under the simulator, no device self-test yet, "
                   "so the CPU loops compute it for device calls", recipes=(ROWWISE,),
                   launch=Ref(_ENGINE, "rowwise_epilogue_tensors")),
        KernelInfo("blockwise", GEMM, 10, "one thread per output calls mmaemu.arith.scaled.accumulate_chunked_one "
                   "(the DeepGEMM-style block-wise kernels of mmaemu.model.chunked) on its decoded rows in global "
                   "memory; no device self-test of its own: it runs where cuda:simple passed, when asked for by name",
                   recipes=(BLOCKWISE,), vouched_by="simple", answers_to="simple",
                   launch=Ref("mmaemu.cuda.blockwise.kernel", "accumulate_chunked_numpy")),
        KernelInfo("block_scaled", GEMM, 10, "one thread per output calls mmaemu.arith.block_scaled's scaled-block "
                   "or scaled-group chain (MXFP8, MXFP4, NVFP4) on its decoded rows in global memory; no device "
                   "self-test of its own: it runs where asked for by name (cuda:simple)", recipes=(BLOCK_SCALED,),
                   vouched_by="simple", answers_to="simple",
                   launch=Ref("mmaemu.cuda.block_scaled.kernel", "accumulate_block_scaled_cuda")),
    )
}

# The kernels with a device self-test of their own: the ones a status, a self-test and ``mmaemu info`` list, and
# the names ``backend="cuda:<kernel>"`` takes.
KERNELS: Dict[str, KernelInfo] = {name: k for name, k in REGISTRY.items() if k.selftest is not None}


def candidates(recipe: str, kind: str = GEMM) -> List[KernelInfo]:
    """The kernels of ``kind`` that serve ``recipe``, in the order the choice tries them (highest priority
    first)."""
    return sorted((k for k in REGISTRY.values() if k.kind == kind and recipe in k.recipes), key=lambda k: -k.priority)


def gemm_kernels() -> List[KernelInfo]:
    """The GEMM kernels in the order "auto"/"cuda" try them (the tensor-wise recipe's candidates)."""
    return candidates(TENSORWISE)


def answering(recipe: str) -> Tuple[str, ...]:
    """The kernel names (``cuda:<name>``) a caller asks for ``recipe``'s candidates by, by priority."""
    return tuple(dict.fromkeys(k.answers_to or k.name for k in candidates(recipe)))


def recipe_decline(name: str, recipe: str) -> Optional[str]:
    """The reason kernel ``name`` gives for not serving ``recipe`` (its ``recipe_declines``); None when it serves
    the recipe, is no entry or gives none."""
    entry = REGISTRY.get(name)
    if entry is None or recipe in entry.recipes:
        return None
    return entry.recipe_declines.get(recipe)


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
