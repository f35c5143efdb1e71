"""The planning steps every recipe's plan is made of (:mod:`mmaemu.recipes`): the plan's types, its warnings kept as
data, the split-K decision and the backend choice (semantics.md f.7, platform.md sections 2-4 and 6.1). Nothing is
computed here.

Each step returns its warnings as data (:class:`mmaemu.warn.Notice`): :func:`note` keeps them in the plan
(``CallPlan.warnings`` has the text of every warning that applies) and reports them as it goes
(:func:`mmaemu.warn.report`), so that a call refused later in the plan still gives the warnings found before
(:mod:`mmaemu.plan.planner` says who emits them).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, List, NamedTuple, Optional, Tuple, Union

from .. import backends
from ..arith.params import require_gemm_level
from ..context import Context
from ..errors import BackendUnavailableError, ExperimentalPresetWarning, UnsupportedFeatureError
from ..model.presets import Preset
from ..platform import block_scaled
from ..platform.profiles import profile_maturity_notices
from ..platform.splitk import SplitDecision, check_scheme_for_preset, decide_splitk
from ..warn import Notice, report
from .flush import check_no_flush_to_zero

__all__ = ["CallPlan", "Plan", "OUT_UNCHANGED_MESSAGE", "OUT_RESIZED_MESSAGE", "note", "out_warning",
           "out_resized_warning", "maturity_warnings", "decide", "check_backend_name", "choose_backend",
           "refuse_block_scaled_preset", "choose_block_scaled_backend", "recipe_cuda_kernel",
           "RecipeKernel", "RecipeEngine", "recipe_engine"]

OUT_UNCHANGED_MESSAGE = (
    "out= is neither row- nor column-major: torch 2.7.1 computes into a private contiguous copy and never "
    "copies it back, so out is returned unchanged (pass a row-major or column-major out to receive the result)"
)
OUT_RESIZED_MESSAGE = "out= has shape {old} but the result is {new}: out is resized (as torch does)"


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """What a call would do (platform.md 6.1); returned by :func:`mmaemu.explain`."""

    validation: Union[str, Tuple[str, str]]
    profile: Optional[str]
    preset: Optional[str]
    preset_maturity: Optional[str]
    split: Optional[SplitDecision]
    backend: str
    fallbacks: List[str]
    warnings: List[str]
    kernel: Optional[str] = None
    cpu_engine: Optional[str] = None  # the cpu backend's engine and why (mmaemu.cpu.features)
    kernel_family: Optional[str] = None  # the kernel family the profile's stack runs (platform.kernel_families)
    kernel_reason: Optional[str] = None  # why that family


@dataclasses.dataclass
class Plan:
    """A validated, decided call, ready to compute (internal)."""

    call: object
    profile: object
    preset: Preset
    split: Optional[SplitDecision] = None
    backend: str = ""
    fallbacks: List[str] = dataclasses.field(default_factory=list)
    notices: List[Notice] = dataclasses.field(default_factory=list)
    action: str = "compute"  # "compute" | "zeros" | "out-unchanged"
    kernel: Optional[str] = None  # the reference kernel when it is not cuBLASLt ("cutlass rowwise")
    cpu_engine: Optional[object] = None  # EngineChoice of the cpu backend (mmaemu.cpu.features)
    route: Optional[object] = None  # the KernelRoute of the profile's stack (mmaemu.platform.kernel_families)
    # The context the plan was decided in: computing it reads the same facts (a CUDA kernel's fallback and the
    # epilogue's verdict). Not part of what the plan is: never compared, never shown.
    context: Optional[Context] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def recipe(self):
        """The recipe that planned the call and computes it (:mod:`mmaemu.recipes`; ``plan.recipe.run(plan)``): the
        one its validation found (``call.recipe``). None for a call that computes nothing by a recipe: a zero-size
        call (torch returns before choosing a kernel) and an ``accumulate`` call (no scaling, no epilogue)."""
        return getattr(self.call, "recipe", None)

    @property
    def warnings(self) -> List[str]:
        """The text of every warning that applies to the call, in the order found."""
        return [notice.message for notice in self.notices]

    def describe(self, validation="ok") -> CallPlan:
        backend = {"zeros": "none (zero-size result)", "out-unchanged": "none (out= is returned unchanged)"}
        return CallPlan(validation, self.profile.name, self.preset.name, self.preset.maturity, self.split,
                        backend.get(self.action, self.backend), list(self.fallbacks), list(self.warnings),
                        self.kernel, None if self.cpu_engine is None or self.action != "compute" else
                        f"{self.cpu_engine.engine}: {self.cpu_engine.reason}",
                        None if self.route is None else self.route.kernel.name,
                        None if self.route is None else self.route.why)


def note(plan: Plan, notices: Iterable[Notice]):
    """Keep a decision's warnings in the plan and report them (see the module docstring)."""
    notices = tuple(notices)
    plan.notices.extend(notices)
    report(notices)


def out_warning(plan: Plan, message: str):
    """A warning about this call alone (out= handling): every call gives it (UserWarning, no once-key)."""
    note(plan, [Notice(UserWarning, message)])


def out_resized_warning(plan: Plan) -> None:
    """f.7.2: the warning of an ``out=`` of another shape that had elements (resized to [M, N], as torch does)."""
    call = plan.call
    if call.out_resize_warns:
        out_warning(plan, OUT_RESIZED_MESSAGE.format(old=tuple(call.out.shape), new=(call.M, call.N)))


def maturity_warnings(plan: Plan):
    """f.7.1: the preset's or the profile's maturity warning (ExperimentalPresetWarning)."""
    note(plan, profile_maturity_notices(plan.profile))


def decide(plan: Plan, M, N, K, fmt_a, fmt_b, out_dtype, fast, splitk, layout_std, context):
    """f.7.3: the split-K decision, with the planner's checks of the preset's GEMM level and split scheme."""
    require_gemm_level(plan.preset, fast)
    plan.split, notices = decide_splitk(M, N, K, a_dtype=fmt_a, b_dtype=fmt_b, out_dtype=out_dtype,
                                        use_fast_accum=fast, profile=plan.profile, splitk=splitk,
                                        layout_std=layout_std, context=context)
    note(plan, notices)
    require_gemm_level(plan.preset, fast, plan.split.S)
    check_scheme_for_preset(plan.split.splitk, plan.preset)


def check_backend_name(backend, context) -> None:
    """The backend's name is an argument (semantics.md f.7): a name that is not a backend (TypeError, ValueError,
    :func:`mmaemu.backends.requested_backend`; ``$MMAEMU_BACKEND`` of ``context`` for "auto") is refused with the
    arguments, before any decision (the split-K decision could otherwise refuse the call for another reason)."""
    backends.requested_backend(backend, context=context)


def choose_backend(plan: Plan, device, backend, fmt_a, fmt_b, context):
    """f.7.4: the engine; then f.7.5, the refusal of a CPU thread that flushes subnormals (semantics.md (e)),
    made while planning so that explain reports it and a refused call computes nothing."""
    selection = backends.select(device, backend, fmt_a, fmt_b, plan.preset, context=context)
    plan.backend, plan.fallbacks = selection.name, list(selection.fallbacks)
    if plan.backend == "cpu" and plan.split is not None and fmt_a is not None and fmt_b is not None:
        plan.cpu_engine = cpu_engine(plan, fmt_a, fmt_b, context)
        note(plan, plan.cpu_engine.notices)
    if device.type == "cpu":
        check_no_flush_to_zero()


def cpu_engine(plan: Plan, fmt_a, fmt_b, context):
    """The cpu backend's engine for the call (offset or tile, :func:`mmaemu.cpu.engine.cpu_engine_choice`, with
    ``MMAEMU_CPU_ENGINE`` and the AVX2 self-test source of ``context``); ``MMAEMU_CPU_ENGINE=offset`` where it
    cannot run (or failed its self-test) raises here, so that explain reports it and nothing runs."""
    from ..arith.params import schedule_params
    from ..cpu.engine import cpu_engine_choice
    from ..cpu.features import CPU_ENGINE_ENV

    call = plan.call
    schedule = schedule_params(plan.preset, call.K, call.use_fast_accum, plan.split.S, plan.split.scheme)
    return cpu_engine_choice(plan.preset, schedule, fmt_a, fmt_b, context.environment[CPU_ENGINE_ENV],
                             (call.M, call.N), context=context)



def refuse_block_scaled_preset(plan: Plan) -> None:
    """A profile whose preset is a block-scaled instruction computes MXFP8/NVFP4 calls only."""
    if plan.preset.block_scaled:
        raise UnsupportedFeatureError(
            f"profile {plan.profile.name!r} computes block-scaled (MXFP8/NVFP4) calls only: its preset "
            f"{plan.preset.name!r} is a block-scaled instruction; pass float8_e8m0fnu / float8_e4m3fn block scales, "
            f"or use profile 'tcgen05-f8f6f4-experimental' for tensor-wise scales")



class RecipeKernel(NamedTuple):
    """The CUDA kernel of a recipe's call asked for by name (:func:`recipe_cuda_kernel`): ``backend``
    ("cuda:<kernel>", None: none may run), ``refusal`` (the BackendUnavailableError's text when none may run, in
    the words of :func:`mmaemu.backends.select`), ``passed_over`` (why, as the kernel choice lists it) and the
    ``context`` carrying the device's facts (:func:`mmaemu.cuda.device_context`), which the plan keeps."""

    backend: Optional[str]
    refusal: Optional[str]
    passed_over: Tuple[str, ...]
    context: Context


def recipe_cuda_kernel(recipe: str, name: str, device, context: Context) -> RecipeKernel:
    """The kernel of ``recipe`` (a :mod:`mmaemu.cuda.catalog` recipe name) that answers to backend ``name`` for
    tensors on ``device``, as the kernel registry's one choice takes it (:func:`mmaemu.cuda.recipe_kernel`: its
    decline rules and the verdict it runs under, from ``context``); nothing of CUDA is touched when the tensors are
    not on a CUDA device or the context disables CUDA."""
    on_cuda = getattr(device, "type", str(device)) == "cuda"
    if not on_cuda or context.cuda_disabled:
        reason = "cuda: tensors on cpu" if not on_cuda else "cuda: disabled by MMAEMU_DISABLE_CUDA"
        return RecipeKernel(None, f"backend {name!r} cannot run: {reason}; use backend='cpu' or 'auto'", (reason,),
                            context)
    from .. import cuda

    context = cuda.device_context(device, context)
    choice = cuda.recipe_kernel(recipe, name, device, context=context)
    if choice.kernel is not None:
        return RecipeKernel(name, None, (), context)
    if context.device is None:
        refusal = f"backend {name!r} cannot run: cuda: {context.device_problem}; use backend='cpu' or 'auto'"
    else:
        refusal = f"backend {name!r} cannot run on {context.device.label}: " + "; ".join(choice.passed_over)
    return RecipeKernel(None, refusal, choice.passed_over, context)


class RecipeEngine(NamedTuple):
    """The engine of a block-scaled or block-wise call (:func:`recipe_engine`): ``backend`` ("reference", "cpu" or
    "cuda:simple"), why a CUDA kernel was passed over (``fallbacks``), the ``context`` computing it reads (with the
    device's facts when a CUDA kernel was judged) and the warnings of the choice (``notices``, data)."""

    backend: str
    fallbacks: Tuple[str, ...]
    context: Context
    notices: Tuple[Notice, ...]


RECIPE_WORDS = {"block_scaled": "block-scaled", "blockwise": "block-wise"}  # the kernel registry's recipe names


def recipe_engine(device, backend, context: Context, *, recipe: str) -> RecipeEngine:
    """The engine of a call of ``recipe`` ("block_scaled" or "blockwise", the kernel registry's names) on tensors
    of ``device``: "reference" and "cpu"; "cuda:simple" when named and the registry's choice takes the recipe's
    kernel there (:func:`recipe_cuda_kernel`: ``MMAEMU_DISABLE_CUDA``, the device and the verdict it runs under;
    it warns, the kernel has no device self-test of its own), else the CPU engine (a CUDA tensor gets its result
    copied back). Named as the argument, a ``cuda:simple`` that may not run is a BackendUnavailableError; named by
    ``$MMAEMU_BACKEND`` (a preference of the process), the CPU engine computes and ``fallbacks`` says why. On a CPU
    thread that flushes fp32 subnormals the call is refused (semantics.md (e)). Every front door of the two
    recipes (``scaled_mm``, ``F.scaled_mm``'s block-wise form) chooses by this one rule."""
    name = backends.requested_backend(backend, context=context)
    on_cuda = getattr(device, "type", str(device)) == "cuda"
    words = RECIPE_WORDS[recipe]
    choice = None
    if name in backends.CPU_ENGINES:
        choice = RecipeEngine(name, (), context, ())
    elif name == "cuda:simple" and (on_cuda or backend != "auto"):
        kernel = recipe_cuda_kernel(recipe, name, device, context)
        if kernel.backend is not None:
            notice = Notice(ExperimentalPresetWarning, block_scaled.CUDA_SIMPLE_UNCHECKED, ("block-scaled:cuda:simple",))
            choice = RecipeEngine(kernel.backend, (), kernel.context, (notice,))
        elif backend == "auto":  # $MMAEMU_BACKEND's preference: the cpu engine computes
            choice = RecipeEngine("cpu", kernel.passed_over, kernel.context, ())
        else:
            raise BackendUnavailableError(kernel.refusal)
    elif name == "auto" or backend == "auto":  # $MMAEMU_BACKEND naming another CUDA kernel is a preference
        why = ()
        if on_cuda or name != "auto":
            why = (f"{name if name != 'auto' else 'cuda'}: {words} calls run on a CUDA device only with "
                   f"backend='cuda:simple'",)
        choice = RecipeEngine("cpu", why, context, ())
    else:
        raise BackendUnavailableError(
            f"backend {name!r} cannot run a {words} call: it runs on 'cpu', 'reference' and, for CUDA "
            f"tensors, 'cuda:simple'")
    check_no_flush_to_zero()
    return choice


def choose_block_scaled_backend(plan: Plan, device, backend, context, *, recipe: str) -> None:
    """The plan's engine by :func:`recipe_engine` (its warnings noted in the plan)."""
    choice = recipe_engine(device, backend, context, recipe=recipe)
    plan.backend, plan.fallbacks, plan.context = choice.backend, list(choice.fallbacks), choice.context
    note(plan, choice.notices)

