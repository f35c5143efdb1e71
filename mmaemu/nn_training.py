"""``TrainableFP8Linear``: a linear layer that trains in FP8 as Transformer Engine's ``te.Linear`` does, every GEMM
(forward, grad_input, grad_weight) computed by mmaemu as the profile's reference GPU computes it.

The weight is an ordinary fp32 (or bf16) ``torch.nn.Parameter``, quantised at every forward. Per step:

* fprop  ``y  = x_fp8 @ W_fp8^T``   — E4M3 x E4M3, fast accumulation (TE ``fp8_gemm_fprop``:
  ``use_split_accumulator=False``), output in the input's dtype;
* dgrad  ``dx = dy_fp8 @ W_fp8``    — gradient format x E4M3, slow (split) accumulation, the input's dtype;
* wgrad  ``dW = dy_fp8^T @ x_fp8``  — gradient format x E4M3, slow (split) accumulation, the weight's dtype; its K
  is the number of tokens.

Each is an ``mmaemu.scaled_mm`` call with the inverse scales (TE's ``scale_inv``) as the A/B scales, the operands in
the layouts ``torch._scaled_mm`` takes (A row-major, B column-major; TE keeps the transposed FP8 copies it needs).
The gradient format is E5M2 under ``fp8_format="hybrid"`` (TE's default) and E4M3 under ``"e4m3"``.

Scaling (:class:`TrainingRecipe`): ``"delayed"`` — TE's ``DelayedScaling`` (an amax history per tensor role:
input, weight, grad_output; the scale of a cast comes from earlier steps; :mod:`mmaemu.delayed_scaling`), the
forward roles updated after each forward, the gradient's after each backward (TE updates at the autocast exit
and at the end of the backward: the same for a layer called once per step); ``"current"`` — TE's
``Float8CurrentScaling`` (every cast scaled by ``fp8_max / amax`` of the tensor itself,
:func:`mmaemu.quantize.amax_scale`). The casts are :func:`mmaemu.quantize.quantize` (TE's cast).

Sources pinned (NVIDIA/TransformerEngine commit d0067d0d, 2.20.0.dev0): ``transformer_engine/common/recipe/
__init__.py`` (``DelayedScaling``: margin 0, HYBRID, ``amax_history_len`` 1024, ``amax_compute_algo`` "max";
``Float8CurrentScaling``: HYBRID, no power-of-2 scales, ``amax_epsilon`` 0, split accumulator off in fprop and on
in dgrad/wgrad), ``transformer_engine/pytorch/module/base.py`` (``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD =
True``, ``_2X_ACC_WGRAD = True``: delayed scaling's accumulation modes), ``transformer_engine/common/recipe/
delayed_scaling.cu`` and ``recipe_common.cuh`` (the scale arithmetic, IEEE fp32 division).

Evidence: *experimental* — modelled from those sources, not recorded. The layer warns
(:class:`ExperimentalRecipeWarning`, once per process and recipe) when built. What is modelled: the scale update
and cast arithmetic, and the mapping of TE's cuBLASLt calls onto ``_scaled_mm`` calls (the same A/B formats,
scales, layouts and accumulation mode). The split-K decision is the profile's: the default ``profile="hopper-te"``
(``"ada-te"`` for the RTX 4060) decides with TE's cuBLASLt workspace and alignment, as ``mmaemu.nn`` documents;
docs/limitations.md ("FP8 training") names the GPU probe that would validate the rest. What is not TE's: the bias
is added after the GEMM in the output dtype and its gradient is ``dy.sum(0)`` by torch (TE fuses both into its
kernels). The tokens of a step (M of fprop and dgrad, K of wgrad) must be a multiple of 16, as cuBLASLt's FP8
GEMMs (through ``_scaled_mm``) require.

Refused (:class:`mmaemu.errors.UnsupportedFeatureError`, with the way out): ``fuse_wgrad_accumulation=True``
(TE accumulates ``dW`` into an fp32 ``main_grad`` inside cuBLASLt with beta = 1: how the epilogue adds C is not
recorded).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import torch

from . import delayed_scaling
from .errors import SplitKUnknownError, UnsupportedFeatureError
from .platform.profiles import get_profile
from .quantize import amax_scale, compute_amax, quantize, scale_inv

__all__ = ["TrainableFP8Linear", "TrainingRecipe", "GemmCall", "ExperimentalRecipeWarning", "convert_for_training",
           "ROLES", "FUSED_WGRAD_PROBE"]

ROLES = ("output", "grad_input", "grad_weight")
_FORMATS = {"hybrid": ("e4m3", "e5m2"), "e4m3": ("e4m3", "e4m3")}

#: The GPU measurement that would decide TE's fused wgrad accumulation (docs/limitations.md).
FUSED_WGRAD_PROBE = (
    "record cuBLASLt FP8 GEMMs with beta = 1 and an fp32 C = D (TE's fuse_wgrad_accumulation: dW accumulated into "
    "main_grad) on the reference GPU, for E5M2 x E4M3 slow-accumulation wgrad shapes, and compare D with "
    "fp32(C + GEMM) and with the epilogue's other orders")


class ExperimentalRecipeWarning(UserWarning):
    """A training recipe whose arithmetic is modelled from Transformer Engine's source, not recorded on a GPU."""


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    """Transformer Engine's per-tensor FP8 training recipe (defaults: TE ``DelayedScaling()``).

    ``scaling``: "delayed" (``DelayedScaling``) or "current" (``Float8CurrentScaling``); ``fp8_format``: "hybrid"
    (E4M3 forward, E5M2 gradients) or "e4m3"; ``margin``, ``amax_history_len``, ``amax_compute_algo`` ("max" or
    "most_recent"): delayed scaling's; ``fast_accum``: (fprop, dgrad, wgrad) use_fast_accum, TE's inverted
    ``use_split_accumulator``.
    """

    scaling: str = "delayed"
    fp8_format: str = "hybrid"
    margin: int = 0
    amax_history_len: int = delayed_scaling.DEFAULT_HISTORY_LEN
    amax_compute_algo: str = "max"
    fast_accum: tuple = (True, False, False)

    def __post_init__(self):
        if self.scaling not in ("delayed", "current"):
            raise ValueError(f"scaling must be 'delayed' (TE DelayedScaling) or 'current' (TE Float8CurrentScaling), "
                             f"got {self.scaling!r}")
        if self.fp8_format not in _FORMATS:
            raise ValueError(f"fp8_format must be one of {sorted(_FORMATS)}, got {self.fp8_format!r}")
        if self.amax_compute_algo not in delayed_scaling.AMAX_ALGORITHMS:
            raise ValueError(f"amax_compute_algo must be one of {delayed_scaling.AMAX_ALGORITHMS} (a callable is not "
                             f"modelled), got {self.amax_compute_algo!r}")
        if self.scaling == "current" and self.margin != 0:
            raise ValueError("TE's current scaling has no margin; use margin=0 or scaling='delayed'")
        fast = tuple(self.fast_accum)
        if len(fast) != 3 or not all(isinstance(f, bool) for f in fast):
            raise TypeError("fast_accum must be three bools: (fprop, dgrad, wgrad)")
        object.__setattr__(self, "fast_accum", fast)  # a tuple: the recipe is hashable (its warning's key)
        delayed_scaling.initial_state(self.amax_history_len)  # checks the length

    @classmethod
    def current(cls, fp8_format: str = "hybrid") -> "TrainingRecipe":
        """TE's ``Float8CurrentScaling()`` defaults."""
        return cls(scaling="current", fp8_format=fp8_format)

    @property
    def formats(self):
        """(forward format, gradient format)."""
        return _FORMATS[self.fp8_format]


class GemmCall(NamedTuple):
    """One GEMM a layer ran, as given to ``mmaemu.scaled_mm``: ``role`` (one of :data:`ROLES`), the operands,
    scales, output dtype, accumulation mode, the result and the call's plan (its split decision)."""

    layer: str
    role: str
    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    out_dtype: torch.dtype
    use_fast_accum: bool
    result: torch.Tensor
    plan: object


_ROLE_STATE = ("input", "weight", "grad_output")


class TrainableFP8Linear(torch.nn.Module):
    """``y = x W^T (+ b)`` trained in FP8 with TE's recipe (see the module docstring); ``weight`` and ``bias`` are
    parameters. Build it directly or with :meth:`from_linear` (copies a ``torch.nn.Linear``'s parameters).

    Buffers (delayed scaling): ``amax_history_<role>`` (fp32 [L]), ``scale_<role>``, ``scale_inv_<role>`` for the
    roles input, weight and grad_output. ``gemm_observer``: None, or a callable given a :class:`GemmCall` for every
    GEMM the layer runs (the training audit and the tests use it).
    """

    def __init__(self, in_features, out_features, bias=True, *, recipe=None, profile="hopper-te", splitk="auto",
                 backend="auto", fuse_wgrad_accumulation=False, dtype=torch.float32, device=None):
        super().__init__()
        if fuse_wgrad_accumulation:
            raise UnsupportedFeatureError(
                "fuse_wgrad_accumulation=True (TE accumulates grad_weight into an fp32 main_grad inside cuBLASLt, "
                "beta = 1) is not modelled: how the GEMM epilogue adds C is not recorded. Way out: leave it False "
                "(grad_weight is its own GEMM output; add it to main_grad yourself). The probe that would decide it: "
                f"{FUSED_WGRAD_PROBE} (docs/limitations.md)")
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"the weight must be float32 or bfloat16 (TE's parameter dtypes), got {dtype}")
        self.recipe = TrainingRecipe() if recipe is None else recipe
        if not isinstance(self.recipe, TrainingRecipe):
            raise TypeError("recipe must be a mmaemu.nn_training.TrainingRecipe")
        from .nn import _check_splitk_and_backend, _profile_reference

        self.profile = _profile_reference(get_profile(profile))
        _check_splitk_and_backend(splitk, backend, self.profile)
        self.splitk, self.backend = splitk, backend
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = torch.nn.Parameter(torch.empty(self.out_features, self.in_features, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(self.out_features, dtype=dtype, device=device)) if bias else None
        torch.nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)  # nn.Linear's initialisation
        if self.recipe.scaling == "delayed":
            for role in _ROLE_STATE:
                state = delayed_scaling.initial_state(self.recipe.amax_history_len)
                self._store(role, state)
        self.gemm_observer: Optional[Callable[[GemmCall], None]] = None
        _warn_experimental(self.recipe)

    @classmethod
    def from_linear(cls, linear, *, recipe=None, profile="hopper-te", splitk="auto", backend="auto",
                    fuse_wgrad_accumulation=False):
        """A trainable FP8 layer with a copy of ``linear``'s weight (and bias) as its parameters."""
        weight = linear.weight.detach()
        module = cls(weight.shape[1], weight.shape[0], bias=getattr(linear, "bias", None) is not None,
                     recipe=recipe, profile=profile, splitk=splitk, backend=backend,
                     fuse_wgrad_accumulation=fuse_wgrad_accumulation, dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            module.weight.copy_(weight)
            if module.bias is not None:
                module.bias.copy_(linear.bias.detach())
        return module

    # -- scaling state --------------------------------------------------------------------------------------------

    def _store(self, role, state):
        self.register_buffer(f"amax_history_{role}", state.history)
        self.register_buffer(f"scale_{role}", state.scale)
        self.register_buffer(f"scale_inv_{role}", state.scale_inv)

    def delayed_state(self, role) -> delayed_scaling.DelayedState:
        """The delayed-scaling state of ``role`` ("input", "weight" or "grad_output")."""
        return delayed_scaling.DelayedState(getattr(self, f"amax_history_{role}"), getattr(self, f"scale_{role}"),
                                            getattr(self, f"scale_inv_{role}"))

    def _cast(self, role, x, fmt):
        """(codes, scale_inv) of TE's cast of ``x`` for ``role``; delayed scaling records the amax into slot 0."""
        if self.recipe.scaling == "current":
            scale = amax_scale(x, fmt)
            return quantize(x, scale, fmt), scale_inv(scale)
        state = self.delayed_state(role)
        codes = quantize(x, state.scale, fmt)
        self._store(role, delayed_scaling.record_amax(state, compute_amax(x).cpu()))
        return codes, state.scale_inv.to(x.device)

    def _update(self, roles, fmt):
        if self.recipe.scaling != "delayed":
            return
        for role in roles:
            self._store(role, delayed_scaling.update(self.delayed_state(role), fmt, self.recipe.margin,
                                                     self.recipe.amax_compute_algo))

    # -- the GEMMs ------------------------------------------------------------------------------------------------

    def _gemm(self, role, a, b, scale_a, scale_b, out_dtype, fast):
        """``mmaemu.scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum=fast)`` with the layer's profile,
        split-K and backend; reported to ``gemm_observer``."""
        from .api import run_scaled_mm_plan
        from .plan.cache import cached_plan_scaled_mm
        from .warn import edge

        try:
            with edge():
                plan = cached_plan_scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, use_fast_accum=fast,
                                             profile=self.profile, splitk=self.splitk, backend=self.backend)
                result = run_scaled_mm_plan(plan)
        except SplitKUnknownError as error:
            from .nn import _undecided_layer_error

            raise _undecided_layer_error(self, error) from None
        if self.gemm_observer is not None:
            self.gemm_observer(GemmCall(self.layer_name, role, a, b, scale_a, scale_b, out_dtype, fast, result, plan))
        return result

    @property
    def layer_name(self) -> str:
        """The qualified name :func:`convert_for_training` gave the layer, else a description."""
        return self.__dict__.get("qualified_name") or (f"TrainableFP8Linear(in_features={self.in_features}, "
                                                       f"out_features={self.out_features})")

    def forward(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"expected a tensor [..., {self.in_features}], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"the input must be float32 or bfloat16, got {x.dtype}")
        y = _FP8LinearFunction.apply(x, self.weight, self)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe}, profile={getattr(self.profile, 'name', self.profile)!r}, "
                f"splitk={self.splitk!r}")


class _FP8LinearFunction(torch.autograd.Function):
    """fprop, dgrad and wgrad of :class:`TrainableFP8Linear` (the layer object is passed through, not
    differentiated)."""

    @staticmethod
    def forward(ctx, x, weight, layer):
        forward_fmt, _ = layer.recipe.formats
        fast_fprop = layer.recipe.fast_accum[0]
        x2 = x.detach().reshape(-1, layer.in_features)
        x_fp8, x_inv = layer._cast("input", x2, forward_fmt)
        w_fp8, w_inv = layer._cast("weight", weight.detach(), forward_fmt)
        y = layer._gemm("output", x_fp8, w_fp8.t(), x_inv, w_inv, x.dtype, fast_fprop)
        layer._update(("input", "weight"), forward_fmt)
        ctx.layer = layer
        ctx.shape, ctx.x_dtype, ctx.w_dtype = tuple(x.shape), x.dtype, weight.dtype
        ctx.save_for_backward(x_fp8, w_fp8, x_inv, w_inv)
        return y.reshape(tuple(x.shape[:-1]) + (layer.out_features,))

    @staticmethod
    def backward(ctx, grad_output):
        layer = ctx.layer
        _, grad_fmt = layer.recipe.formats
        _, fast_dgrad, fast_wgrad = layer.recipe.fast_accum
        x_fp8, w_fp8, x_inv, w_inv = ctx.saved_tensors
        dy = grad_output.reshape(-1, layer.out_features)
        if dy.dtype not in (torch.float32, torch.bfloat16):
            dy = dy.float()
        dy_fp8, dy_inv = layer._cast("grad_output", dy.contiguous(), grad_fmt)
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            column_major_w = w_fp8.t().contiguous().t()  # TE's transposed FP8 copy of the weight
            grad_input = layer._gemm("grad_input", dy_fp8, column_major_w, dy_inv, w_inv, ctx.x_dtype, fast_dgrad)
            grad_input = grad_input.reshape(ctx.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = layer._gemm("grad_weight", dy_fp8.t().contiguous(), x_fp8.t().contiguous().t(), dy_inv,
                                      x_inv, ctx.w_dtype, fast_wgrad)
        layer._update(("grad_output",), grad_fmt)
        return grad_input, grad_weight, None


def _warn_experimental(recipe: TrainingRecipe) -> None:
    """Warn once per process and recipe that the recipe's arithmetic is modelled, not recorded."""
    from .warn import Notice, report

    report([Notice(ExperimentalRecipeWarning,
                   f"mmaemu: TrainableFP8Linear with {recipe} is experimental: Transformer Engine's scale arithmetic "
                   "and its mapping of fprop/dgrad/wgrad onto _scaled_mm calls are modelled from TE's source "
                   "(commit d0067d0d), not recorded on a GPU; docs/limitations.md names the probe that would "
                   "validate them", once_key=("nn_training", recipe))])


def convert_for_training(model, *, include=None, **options):
    """Replace every ``torch.nn.Linear`` inside ``model`` (in place) by :meth:`TrainableFP8Linear.from_linear`
    (``options``: its keyword arguments). ``include(qualified_name, linear) -> bool`` chooses the layers. Returns
    ``model`` (a bare ``nn.Linear`` is returned converted)."""
    from .nn import _replace_linears

    return _replace_linears(model, include, lambda linear: TrainableFP8Linear.from_linear(linear, **options))
