"""Planning a block-wise FP8 call (:mod:`mmaemu.deepgemm`, DeepGEMM's sm_90 kernels): which engine computes it,
decided from the call's :class:`mmaemu.context.Context` by the rules :func:`mmaemu.backends.select` applies to
``scaled_mm`` (platform.md section 4, our own engines). Nothing is computed here.

* ``backend="auto"`` is replaced by ``$MMAEMU_BACKEND`` of the context when set (an unknown name there is a
  ValueError naming the variable); "reference" and "cpu" are the CPU engines.
* "auto" runs the ``cpu`` engine, on CUDA tensors too (the result is copied back): the block-wise CUDA kernel
  (:func:`mmaemu.cuda.blockwise.kernel.gemm_chunked_simple`) has no device self-test of its own, so it runs only
  when asked for.
* "cuda" and "cuda:simple" ask for that kernel: it runs on CUDA tensors, unless the context disables CUDA
  (``MMAEMU_DISABLE_CUDA``: BackendUnavailableError, nothing of CUDA is touched), and only where the kernel
  registry's one choice (:func:`mmaemu.plan.steps.recipe_cuda_kernel`, :func:`mmaemu.cuda.recipe_kernel`) takes
  the block-wise recipe's kernel by the verdict of ``cuda:simple`` it runs under on the device (its self-test, a
  forced failure, the context's verdict source); a failed verdict is a BackendUnavailableError that names it. It warns
  once (:data:`CUDA_SIMPLE_UNCHECKED`).
* Another CUDA kernel declines by design (:func:`mmaemu.cuda.blockwise.kernel.chunked_decline`): named as the
  argument, a BackendUnavailableError with its reason; named by ``$MMAEMU_BACKEND`` (a preference of the process,
  not of this call), the ``cpu`` engine computes and the plan lists why (``fallbacks``).
* On a CPU thread that flushes fp32 subnormals a call of the CPU engines is refused (semantics.md (e)), as
  scaled_mm's are.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

from .. import backends
from ..context import Context
from ..cuda.catalog import BLOCKWISE
from ..errors import BackendUnavailableError, ExperimentalPresetWarning
from ..platform.splitk import SplitDecision
from ..warn import Notice, collecting, report
from .flush import check_no_flush_to_zero
from .steps import CallPlan, recipe_cuda_kernel

__all__ = ["BlockwisePlan", "plan_blockwise", "explain_blockwise", "CUDA_SIMPLE_UNCHECKED",
           "NO_SPLIT_REASON"]

FORMAT = "e4m3"  # DeepGEMM's sm_90 FP8 GEMMs take E4M3 operands only
CUDA_SIMPLE_UNCHECKED = (
    "mmaemu.deepgemm on cuda:simple: the block-wise CUDA kernel (gemm_chunked_simple, the arithmetic of the CPU "
    "reference engine) has no device self-test of its own; it runs on the verdict of cuda:simple's self-test and "
    "is checked against the CPU engines under the CUDA simulator only")


# The chunked kernels' ``splitk == "none"`` (mmaemu.model.chunked, from the DeepGEMM source pinned there): each CTA
# loops over every k block of its outputs; nothing is split across CTAs.
NO_SPLIT_REASON = "DeepGEMM's sm_90 kernels never split K (each CTA loops over all of K)"


class BlockwisePlan(NamedTuple):
    """The engine of a block-wise call: ``backend`` ("reference", "cpu" or "cuda:simple"), why the CUDA kernel was
    passed over (``fallbacks``) and the context it was decided in (what computing it reads)."""

    kernel: object  # the mmaemu.model.chunked kernel of the call
    backend: str
    fallbacks: Tuple[str, ...]
    context: Optional[Context]


def plan_blockwise(kernel, device, backend, *, context: Context) -> BlockwisePlan:
    """The :class:`BlockwisePlan` of a call of ``kernel`` (:mod:`mmaemu.model.chunked`) on tensors of ``device``
    with the ``backend`` argument, by the rules of the module docstring, in ``context`` (the front door's)."""
    name = backends.requested_backend(backend, context=context)
    on_cuda = getattr(device, "type", str(device)) == "cuda"
    if name in backends.CPU_ENGINES:
        plan = BlockwisePlan(kernel, name, (), context)
    elif name == "auto":
        why = ("cuda: block-wise calls run on a CUDA device only with backend='cuda:simple' (its kernel has no "
               "device self-test of its own)",) if on_cuda else ()
        plan = BlockwisePlan(kernel, "cpu", why, context)
    else:
        plan = _plan_cuda(kernel, device, name, from_environment=backend == "auto", context=context)
    if plan.backend in backends.CPU_ENGINES:
        check_no_flush_to_zero()
    return plan


def _plan_cuda(kernel, device, name: str, *, from_environment: bool, context) -> BlockwisePlan:
    """A CUDA backend asked for by ``name`` ("cuda" or "cuda:<kernel>"): ``cuda:simple`` where it may run, the
    cpu engine for a declining kernel that ``$MMAEMU_BACKEND`` prefers, else BackendUnavailableError."""
    if name not in ("cuda", "cuda:simple"):
        from ..cuda.blockwise.kernel import chunked_decline

        why = chunked_decline(name)
        if from_environment:
            return BlockwisePlan(kernel, "cpu", (f"{name}: {why}",), context)
        raise BackendUnavailableError(f"backend {name!r} cannot run {kernel.name}: {why}; use backend='cuda:simple', "
                                      "'cpu' or 'auto'")
    # The CUDA switch, the device and the verdict the block-wise kernel runs under, as the kernel registry's one
    # choice judges them (the words of scaled_mm's selection); an unusable device or a failed verdict raises here
    # (the backend was asked for), before anything is computed.
    chosen = recipe_cuda_kernel(BLOCKWISE, "cuda:simple", device, context)
    if chosen.backend is None:
        raise BackendUnavailableError(chosen.refusal)
    report([Notice(ExperimentalPresetWarning, CUDA_SIMPLE_UNCHECKED, ("deepgemm:cuda:simple",))])
    return BlockwisePlan(kernel, chosen.backend, chosen.passed_over, chosen.context)


def explain_blockwise(kernel, device, backend, *, context: Context) -> CallPlan:
    """What a block-wise call of ``kernel`` on ``device`` would do, as a :class:`mmaemu.CallPlan` (``explain``'s
    answer for the block-wise recipe): its engine, and the split decision of a kernel that never splits (S = 1,
    source "kernel", modelled from the pinned source: not verified). Never raises for a bad call (its
    ``validation`` says what would); planned inside :func:`mmaemu.warn.collecting`, so nothing is emitted."""
    with collecting() as notices:
        try:
            plan = plan_blockwise(kernel, device, backend, context=context)
        except Exception as error:  # explain reports every failure of the call instead of raising it
            return CallPlan((type(error).__name__, str(error)), None, kernel.preset, kernel.maturity, None, "", [],
                            [n.message for n in notices], kernel.name)
    if kernel.splitk != "none":  # no chunked kernel splits today; one that did would need its own decision
        raise ValueError(f"{kernel.name} splits K ({kernel.splitk!r}): explain_blockwise knows unsplit kernels only")
    split = SplitDecision(1, "none", "kernel", False, None, f"{NO_SPLIT_REASON}; {kernel.name}")
    return CallPlan("ok", None, kernel.preset, kernel.maturity, split, plan.backend, list(plan.fallbacks),
                    [n.message for n in notices], kernel.name)
