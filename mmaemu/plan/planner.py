"""Planning a call: validation, maturity warnings, ``out=`` handling, the split-K decision and the backend
(semantics.md f.7, platform.md sections 2-4 and 6.1). Nothing is computed here.

Each decision returns its warnings as data (:class:`mmaemu.warn.Notice`); the planner keeps them in the plan
(``CallPlan.warnings`` has the text of every warning that applies) and reports them as it goes
(:func:`mmaemu.warn.report`), so that a call refused later in the plan still gives the warnings found before.
The entry point decides what happens to them: ``scaled_mm``/``accumulate`` emit them (once per process per key,
at the user's line); ``explain`` plans inside :func:`mmaemu.warn.collecting`, so it emits nothing and consumes no
once-per-process slot. The entry point also gives the plan its :class:`mmaemu.context.Context` (``context=``),
which every decision of the plan reads (None: each decision reads the environment as it is then).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, List, Optional, Tuple, Union

from .. import backends
from ..arith.params import require_gemm_level
from ..context import Context, environment_of
from ..errors import BackendUnavailableError, ExperimentalPresetWarning, UnsupportedFeatureError
from ..model.presets import Preset, get_preset
from ..platform import block_scaled, blockwise, get_profile, kernel_families, rowwise
from ..platform.profiles import profile_maturity_notices
from ..platform.splitk import POLICIES, SplitDecision, asks_one_split, check_scheme_for_preset, decide_splitk
from ..warn import Notice, collecting, report
from .block_scaled import split_two_level
from .blockwise import pair_name
from .descriptors import dtype_name
from .flush import check_no_flush_to_zero
from .validate import split_key, validate_accumulate, validate_scaled_mm

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


def _note(plan: Plan, notices: Iterable[Notice]):
    """Keep a decision's warnings in the plan and report them (see the module docstring)."""
    notices = tuple(notices)
    plan.notices.extend(notices)
    report(notices)


def _out_warning(plan: Plan, message: str):
    """A warning about this call alone (out= handling): every call gives it (UserWarning, no once-key)."""
    _note(plan, [Notice(UserWarning, message)])


def _maturity_warnings(plan: Plan):
    """f.7.1: the preset's or the profile's maturity warning (ExperimentalPresetWarning)."""
    _note(plan, profile_maturity_notices(plan.profile))


def _decide(plan: Plan, M, N, K, fmt_a, fmt_b, out_dtype, fast, splitk, layout_std, context):
    """f.7.3: the split-K decision, with the planner's checks of the preset's GEMM level and split scheme."""
    require_gemm_level(plan.preset, fast)
    plan.split, notices = decide_splitk(M, N, K, a_dtype=fmt_a, b_dtype=fmt_b, out_dtype=out_dtype,
                                        use_fast_accum=fast, profile=plan.profile, splitk=splitk,
                                        layout_std=layout_std, context=context)
    _note(plan, notices)
    require_gemm_level(plan.preset, fast, plan.split.S)
    check_scheme_for_preset(plan.split.splitk, plan.preset)


def _check_backend_name(backend, context) -> None:
    """The backend's name is an argument (semantics.md f.7): a name that is not a backend (TypeError, ValueError,
    :func:`mmaemu.backends.requested_backend`; ``$MMAEMU_BACKEND`` of ``context`` for "auto") is refused with the
    arguments, before any decision (the split-K decision could otherwise refuse the call for another reason)."""
    backends.requested_backend(backend, context=context)


def _choose_backend(plan: Plan, device, backend, fmt_a, fmt_b, context):
    """f.7.4: the engine; then f.7.5, the refusal of a CPU thread that flushes subnormals (semantics.md (e)),
    made while planning so that explain reports it and a refused call computes nothing."""
    selection = backends.select(device, backend, fmt_a, fmt_b, plan.preset, context=context)
    plan.backend, plan.fallbacks = selection.name, list(selection.fallbacks)
    if plan.backend == "cpu" and plan.split is not None and fmt_a is not None and fmt_b is not None:
        plan.cpu_engine = _cpu_engine(plan, fmt_a, fmt_b, context)
        _note(plan, plan.cpu_engine.notices)
    if device.type == "cpu":
        check_no_flush_to_zero()


def _cpu_engine(plan: Plan, fmt_a, fmt_b, context):
    """The cpu backend's engine for the call (offset or tile, :func:`mmaemu.cpu.engine.cpu_engine_choice`, with
    ``MMAEMU_CPU_ENGINE`` and the AVX2 self-test source of ``context``); ``MMAEMU_CPU_ENGINE=offset`` where it
    cannot run (or failed its self-test) raises here, so that explain reports it and nothing runs."""
    from ..arith.params import schedule_params
    from ..cpu.engine import cpu_engine_choice
    from ..cpu.features import CPU_ENGINE_ENV

    call = plan.call
    schedule = schedule_params(plan.preset, call.K, call.use_fast_accum, plan.split.S, plan.split.scheme)
    return cpu_engine_choice(plan.preset, schedule, fmt_a, fmt_b, environment_of(context)[CPU_ENGINE_ENV],
                             (call.M, call.N), context=context)


def plan_scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                   use_fast_accum=False, *, out=None, profile=None, splitk="auto", backend="auto",
                   global_scales=None, context=None) -> Plan:
    """Validate and plan a ``scaled_mm`` call in the order of semantics.md (f); raises what scaled_mm raises.
    ``global_scales``: NVFP4's (global_scale_a, global_scale_b) or None (:mod:`mmaemu.plan.block_scaled`); they
    may also come as ``(block scales, global scale)`` pairs in scale_a and scale_b.

    The operands may also be :class:`~mmaemu.plan.descriptors.TensorDescriptor` (all of them, on a descriptor
    device, with a TorchName out_dtype): the call is then planned without importing torch, and only explained."""
    profile = get_profile(profile, context=context)
    if global_scales is None:
        scale_a, scale_b, global_scales = split_two_level(scale_a, scale_b)
    call = validate_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, out,
                              profile=profile, global_scales=global_scales)
    plan = Plan(call, profile, get_preset(profile.preset, warn=False), context=context,
                route=kernel_families.route("scaled_mm", recipe_pair_of(call), profile))
    if call.zero_size:
        plan.action = "zeros"
        return plan
    _check_backend_name(backend, context)
    if call.block_scaled is not None:
        return _plan_block_scaled(plan, splitk, backend, context)
    if call.blockwise is not None:
        return _plan_blockwise(plan, splitk, backend, context)
    _refuse_block_scaled_preset(plan)
    _maturity_warnings(plan)
    if call.rowwise:
        return _plan_rowwise(plan, splitk, backend, context)
    if call.out_unusable:
        _out_warning(plan, OUT_UNCHANGED_MESSAGE)
        plan.action = "out-unchanged"
        return plan
    if call.out_resize_warns:
        _out_warning(plan, OUT_RESIZED_MESSAGE.format(old=tuple(out.shape), new=(call.M, call.N)))
    M, N, K, fmt_a, fmt_b = split_key(call)
    # the output dtype by name: the split decision reads only its name, which an operand descriptor's dtype has too
    _decide(plan, M, N, K, fmt_a, fmt_b, dtype_name(call.out_dtype), call.use_fast_accum, splitk, call.layout_std,
            context)
    _choose_backend(plan, call.device, backend, call.fmt_a, call.fmt_b, context)
    return plan


def recipe_pair_of(call) -> str:
    """torch's name of the recipe pair of a validated scaled_mm call (:data:`kernel_families.RECIPE_PAIRS`)."""
    spec = getattr(call, "block_scaled", None)
    if spec is not None:
        single = spec.recipe.name == "nvfp4" and getattr(call, "global_scales", None) is None
        return f"{spec.recipe.name}_{spec.recipe.name}" + ("_single_scale" if single else "")
    return "rowwise_rowwise" if getattr(call, "rowwise", False) else "tensorwise_tensorwise"


def _plan_rowwise(plan: Plan, splitk, backend, context) -> Plan:
    """A row-wise call (torch's CUTLASS kernel, :mod:`mmaemu.platform.rowwise`): experimental; one CTA per output
    over all of K, so S = 1 whatever the shape; the scale order of the epilogue is in the split note."""
    call = plan.call
    _note(plan, [rowwise.rowwise_maturity_notice()])
    if call.out_resize_warns:
        _out_warning(plan, OUT_RESIZED_MESSAGE.format(old=tuple(call.out.shape), new=(call.M, call.N)))
    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(
            f"splitk={splitk!r}: torch 2.7.1's row-wise kernel never splits K ({rowwise.NO_SPLIT_REASON}); use "
            f"splitk='auto' or 1"
        )
    require_gemm_level(plan.preset, call.use_fast_accum)
    order = rowwise.scale_order(call.M, call.N)
    plan.kernel = rowwise.KERNEL
    plan.split = SplitDecision(1, "none", "kernel", False, None, f"{rowwise.NO_SPLIT_REASON}; {order.note}")
    _choose_backend(plan, call.device, backend, call.fmt_a, call.fmt_b, context)
    return plan


def _refuse_block_scaled_preset(plan: Plan) -> None:
    """A profile whose preset is a block-scaled instruction computes MXFP8/NVFP4 calls only."""
    if plan.preset.block_scaled:
        raise UnsupportedFeatureError(
            f"profile {plan.profile.name!r} computes block-scaled (MXFP8/NVFP4) calls only: its preset "
            f"{plan.preset.name!r} is a block-scaled instruction; pass float8_e8m0fnu / float8_e4m3fn block scales, "
            f"or use profile 'tcgen05-f8f6f4-experimental' for tensor-wise scales")


def _plan_block_scaled(plan: Plan, splitk, backend, context) -> Plan:
    """An MXFP8 / MXFP4 / NVFP4 call (:mod:`mmaemu.platform.block_scaled`): experimental; one chain of the
    instruction per output over all of K (zero-padded to whole instructions), so S = 1 only; CPU engines, or
    ``cuda:simple`` when asked for by name."""
    call = plan.call
    spec = call.block_scaled
    plan.preset = spec.preset
    padded = spec.padded_K != spec.K
    _note(plan, [Notice(ExperimentalPresetWarning,
                        block_scaled.maturity_message(spec.recipe, spec.preset.name, padded),
                        (f"block-scaled:{plan.profile.name}:{spec.recipe.name}:{'padded' if padded else 'whole'}",))])
    if call.out_resize_warns:
        _out_warning(plan, OUT_RESIZED_MESSAGE.format(old=tuple(call.out.shape), new=(call.M, call.N)))
    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(
            f"splitk={splitk!r}: {spec.recipe.name.upper()} calls are modelled with one chain per output "
            f"({block_scaled.NO_SPLIT_REASON}); use splitk='auto' or 1")
    plan.kernel = block_scaled.KERNEL
    plan.split = SplitDecision(1, "none", "kernel", False, None,
                               f"{block_scaled.NO_SPLIT_REASON}; instruction {spec.preset.name}, "
                               f"{spec.recipe.name.upper()} block {spec.block}, K = {spec.K} elements"
                               f"{f', K zero-padded to {spec.padded_K}' if padded else ''}; unknown: "
                               f"{'; '.join(block_scaled.unknowns(spec.recipe, padded))}")
    _choose_block_scaled_backend(plan, call.device, backend, context)
    return plan


def _plan_blockwise(plan: Plan, splitk, backend, context) -> Plan:
    """A block-wise call through cuBLASLt >= 12.9 (:mod:`mmaemu.platform.blockwise`): experimental; no split-K
    table is recorded, so S = 1 is assumed; the engines of the block-scaled calls."""
    call = plan.call
    spec = call.blockwise
    pair = pair_name(spec.block_a, spec.block_b)
    _note(plan, [Notice(ExperimentalPresetWarning, blockwise.maturity_message(pair), (f"blockwise:{pair}",))])
    if call.out_resize_warns:
        _out_warning(plan, OUT_RESIZED_MESSAGE.format(old=tuple(call.out.shape), new=(call.M, call.N)))
    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(f"splitk={splitk!r}: {blockwise.NO_SPLIT_REASON}; use splitk='auto' or 1")
    plan.kernel = blockwise.KERNEL
    plan.split = SplitDecision(1, "none", "kernel", False, None, blockwise.NO_SPLIT_REASON)
    _choose_block_scaled_backend(plan, call.device, backend, context)
    return plan


def _choose_block_scaled_backend(plan: Plan, device, backend, context) -> None:
    """The engines of block-scaled calls: "reference" and "cpu"; on CUDA tensors "cuda:simple" when named (it
    warns: its kernel has no device self-test), else the CPU engine (the result is copied back)."""
    name = backends.requested_backend(backend, context=context)
    on_cuda = getattr(device, "type", str(device)) == "cuda"
    if name in backends.CPU_ENGINES:
        plan.backend = name
    elif name == "cuda:simple" and on_cuda and not backends.cuda_disabled(context=context):
        plan.backend = name
        _note(plan, [Notice(ExperimentalPresetWarning, block_scaled.CUDA_SIMPLE_UNCHECKED,
                            ("block-scaled:cuda:simple",))])
    elif name == "auto" or backend == "auto":  # $MMAEMU_BACKEND naming another CUDA kernel is a preference
        plan.backend = "cpu"
        if on_cuda or name != "auto":
            plan.fallbacks = [f"{name if name != 'auto' else 'cuda'}: block-scaled calls run on a CUDA device only "
                              f"with backend='cuda:simple'"]
    else:
        raise BackendUnavailableError(
            f"backend {name!r} cannot run a block-scaled call: it runs on 'cpu', 'reference' and, for CUDA "
            f"tensors, 'cuda:simple'")
    check_no_flush_to_zero()


def plan_accumulate(a, b, *, use_fast_accum, profile=None, splitk="auto", backend="auto",
                    out_dtype_for_split=None, context=None) -> Plan:
    """Validate and plan an ``accumulate`` call (semantics.md f.8)."""
    import torch

    profile = get_profile(profile, context=context)
    call = validate_accumulate(a, b, use_fast_accum=use_fast_accum)
    plan = Plan(call, profile, get_preset(profile.preset, warn=False), context=context)
    if call.zero_size:
        plan.action = "zeros"
        return plan
    _check_backend_name(backend, context)
    _refuse_block_scaled_preset(plan)
    _maturity_warnings(plan)
    out_dtype = torch.float32 if out_dtype_for_split is None else out_dtype_for_split
    _decide(plan, call.M, call.N, call.K, call.fmt_a, call.fmt_b, out_dtype, call.use_fast_accum, splitk, True,
            context)
    _choose_backend(plan, call.device, backend, call.fmt_a, call.fmt_b, context)
    return plan


def explain_scaled_mm(*args, **kwargs) -> CallPlan:
    """The CallPlan of a scaled_mm call; never raises for a bad call (its ``validation`` says what would). The
    call is planned inside :func:`mmaemu.warn.collecting`: nothing is emitted, no once-per-process slot is used."""
    with collecting():
        try:
            return plan_scaled_mm(*args, **kwargs).describe()
        except Exception as error:  # explain reports every failure of the call instead of raising it
            return _failed_plan(error, kwargs.get("profile"), kwargs.get("context"))


def _failed_plan(error: Exception, profile, context=None) -> CallPlan:
    name = preset = maturity = None
    try:
        resolved = get_profile(profile, context=context)
        name, preset_obj = resolved.name, get_preset(resolved.preset, warn=False)
        preset, maturity = preset_obj.name, preset_obj.maturity
    except Exception:  # an unknown profile is itself the error being reported
        pass
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return CallPlan((type(error).__name__, message), name, preset, maturity, None, "", [], [])
