"""mmaemu's GEMM as a torch custom op, ``torch.ops.mmaemu.scaled_mm``, so that ``torch.compile`` keeps it opaque.

Why an op: under ``torch.compile`` a GEMM is traced on tensors without data (dynamo's fake tensors, AOTAutograd's
functional and fake tensors; torchao's float8 tensors call ``torch._scaled_mm`` from their ``__torch_dispatch__``
while AOTAutograd traces them). The emulation cannot compute on them, and a compiler must not trace into it or
re-round it. A custom op (``torch.library.custom_op``) is one opaque node in every graph (dynamo, AOTAutograd,
inductor); when the compiled graph runs, torch calls it with real tensors and it computes what an eager call
computes, with the same plan (:func:`mmaemu.plan.planner.plan_scaled_mm`) and the same kernels. Its fake
implementation plans the call on the fake tensors (the same validation, split-K decision and backend, so a call
refused eagerly is refused when it is traced, with the same error) and returns an empty tensor of the result's
shape [M, N], dtype and row-major strides; it computes nothing and emits no warning (the run emits them).

The schema (one overload, ``default``)::

    mmaemu::scaled_mm(Tensor input, Tensor mat2, Tensor scale_a, Tensor scale_b, Tensor? bias,
                      Tensor? scale_result, ScalarType? out_dtype, bool use_fast_accum, Tensor? global_scale_a,
                      Tensor? global_scale_b, str profile, str splitk, str backend, str observer) -> Tensor

The arguments are those of ``torch._scaled_mm`` (torch 2.7.1), NVFP4's two global scales (None for every other
call), and the settings as text: ``profile`` a profile name (a :class:`~mmaemu.platform.profiles.Profile` object
is given by its name and must resolve to itself: :func:`profile_argument`), ``splitk`` the Python literal of the
``splitk`` argument (:func:`splitk_argument`), ``backend`` the backend name. ``out=`` has no place in the op (an
op's result never aliases an argument). ``observer``: the name of a :class:`CallObserver` registered by the code
that put the op in the graph ("" for none): ``mmaemu.patch`` registers one that checks, when the compiled graph
runs, that a block of the same settings is open, and records the call in the blocks' logs.
"""

from __future__ import annotations

import ast
from typing import Callable, NamedTuple, Optional

import torch

from .base._untraced import traced_tensor_kind
from .api import run_scaled_mm_plan
from .context import for_call
from .errors import UnsupportedFeatureError
from .plan.planner import plan_scaled_mm
from .warn import collecting, edge

__all__ = ["OP_NAME", "Settings", "CallObserver", "register_observer", "splitk_argument", "profile_argument",
           "settings_of", "traced_call", "scaled_mm_op", "is_tracing"]

OP_NAME = "mmaemu::scaled_mm"


class Settings(NamedTuple):
    """The settings of a call as the op carries them: profile name, splitk literal, backend name (all text)."""

    profile: str
    splitk: str
    backend: str


class CallObserver(NamedTuple):
    """What an op call reports to the code that put it in a graph, when the graph runs (real tensors).

    ``admit(settings)``: raises if the call may not run now (before anything is computed);
    ``record(arguments, plan, error, settings)``: after the call (``plan`` None and ``error`` the exception when
    it failed; ``arguments``: the op's tensor and scalar arguments by torch._scaled_mm's names).
    """

    admit: Callable[[Settings], None]
    record: Callable[[dict, object, Optional[BaseException], Settings], None]


_OBSERVERS = {}


def register_observer(name: str, observer: CallObserver) -> None:
    """Make ``observer`` the one an op call naming ``name`` reports to (the module that owns it registers it once,
    when it is imported; a second registration of the name replaces the first)."""
    _OBSERVERS[name] = observer


def splitk_argument(splitk) -> str:
    """The op's text for a ``splitk`` argument: its Python literal ("'auto'", "1", "(2, 'serial')"), read back by
    :func:`_splitk_value`. An argument without such a literal is refused (TypeError)."""
    value = tuple(splitk) if isinstance(splitk, tuple) else splitk
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise TypeError(f"splitk={splitk!r} has no Python literal, so it cannot be an argument of the custom op "
                        f"{OP_NAME} that torch.compile puts in its graph; pass 'auto', 'assume-unsplit', 1 or "
                        f"(S, scheme)")
    return text


def _splitk_value(text: str):
    return ast.literal_eval(text)


def profile_argument(profile, context=None) -> str:
    """The op's text for a ``profile`` argument: the name it resolves to now (None: ``$MMAEMU_PROFILE`` or the
    default, read from ``context``). A Profile object that its name does not resolve to (one built with
    :func:`mmaemu.profile_from_preset`, say) is refused: an op argument is text, and the graph must name the
    profile the run will use (UnsupportedFeatureError)."""
    from .platform.profiles import get_profile

    resolved = get_profile(profile, context=context)
    try:
        same = get_profile(resolved.name, context=context) == resolved
    except KeyError:
        same = False
    if not same:
        raise UnsupportedFeatureError(
            f"profile {resolved.name!r} is a Profile object that its name does not resolve to, so the custom op "
            f"{OP_NAME} that torch.compile puts in its graph cannot name it; use a built-in or recorded profile "
            f"name under torch.compile, or run the call eagerly [mmaemu scope]")
    return resolved.name


def settings_of(profile, splitk, backend) -> Settings:
    """The op's settings for ``scaled_mm``'s ``profile``, ``splitk`` and ``backend`` arguments (the profile resolved
    now, with the environment of this moment: :func:`mmaemu.context.for_call`)."""
    return Settings(profile_argument(profile, context=for_call()), splitk_argument(splitk), backend)


def traced_call(positional, named: dict, settings: Settings, observer: str = "", global_scales=(None, None)):
    """The op on a traced ``torch._scaled_mm`` call: ``positional`` its input, mat2, scale_a and scale_b,
    ``named`` its other arguments by name (bias, scale_result, out_dtype, use_fast_accum; an ``out`` is refused:
    UnsupportedFeatureError), ``global_scales`` NVFP4's two one-element global scales (or Nones). Puts the op in
    the graph being traced; computes nothing."""
    if named.get("out") is not None:
        raise UnsupportedFeatureError(
            "torch._scaled_mm(..., out=...) cannot be traced by torch.compile inside mmaemu.patch: the custom op "
            f"{OP_NAME} returns a new tensor and never writes into an argument; drop out= in compiled code "
            "(y = torch._scaled_mm(...)) or run the call eagerly [mmaemu scope]")
    return scaled_mm_op(*positional, named.get("bias"), named.get("scale_result"), named.get("out_dtype"),
                        named.get("use_fast_accum", False), *global_scales, *settings, observer)


def is_tracing(tensors) -> bool:
    """True when a call on ``tensors`` is being traced, not run: a fake or functional tensor among them, or an
    active fake, functional or proxy dispatch mode (make_fx, AOTAutograd, dynamo's fake propagation)."""
    if any(traced_tensor_kind(t) is not None for t in tensors if isinstance(t, torch.Tensor)):
        return True
    keys = torch._C._TorchDispatchModeKey
    return any(torch._C._get_dispatch_mode(key) is not None for key in (keys.FAKE, keys.PROXY, keys.FUNCTIONAL))


def _plan(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, global_scale_a,
          global_scale_b, settings: Settings):
    globals_ = None if global_scale_a is None and global_scale_b is None else (global_scale_a, global_scale_b)
    return plan_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                          profile=settings.profile, splitk=_splitk_value(settings.splitk), backend=settings.backend,
                          global_scales=globals_, context=for_call())


@torch.library.custom_op(OP_NAME, mutates_args=())
def scaled_mm_op(input: torch.Tensor, mat2: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 bias: Optional[torch.Tensor], scale_result: Optional[torch.Tensor], out_dtype: Optional[torch.dtype],
                 use_fast_accum: bool, global_scale_a: Optional[torch.Tensor],
                 global_scale_b: Optional[torch.Tensor], profile: str, splitk: str, backend: str,
                 observer: str) -> torch.Tensor:
    """``mmaemu.scaled_mm`` of the arguments with the settings (see the module documentation): the result, a new
    row-major [M, N] tensor of the effective output dtype. The warnings of the call are emitted here, at the line
    of the caller's code that ran (or compiled) the call."""
    settings = Settings(profile, splitk, backend)
    watcher = _OBSERVERS.get(observer) if observer else None
    if observer and watcher is None:
        raise RuntimeError(f"{OP_NAME}: no observer {observer!r} is registered in this process (import the module "
                           f"that registers it, e.g. mmaemu.patching for 'mmaemu.patch')")
    if watcher is not None:
        watcher.admit(settings)
    plan = error = None
    try:
        with edge():
            planned = _plan(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                            global_scale_a, global_scale_b, settings)
            result = run_scaled_mm_plan(planned)
        plan = planned
        return result
    except Exception as exc:
        error = exc
        raise
    finally:
        if watcher is not None:
            arguments = dict(input=input, mat2=mat2, scale_a=scale_a, scale_b=scale_b, bias=bias,
                             scale_result=scale_result, out_dtype=out_dtype, use_fast_accum=use_fast_accum)
            watcher.record(arguments, plan, error, settings)


@scaled_mm_op.register_fake
def _scaled_mm_fake(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, global_scale_a,
                    global_scale_b, profile, splitk, backend, observer):
    """The result's metadata from the plan of the call on the traced tensors: the same refusals as the run, no
    warning emitted (collected and dropped: the run emits them), nothing computed."""
    tensors = [_static(t) for t in (input, mat2, scale_a, scale_b, bias, scale_result, global_scale_a,
                                    global_scale_b)]
    input, mat2, scale_a, scale_b, bias, scale_result, global_scale_a, global_scale_b = tensors
    with collecting():
        plan = _plan(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, global_scale_a,
                     global_scale_b, Settings(profile, splitk, backend))
    call = plan.call
    return input.new_empty((call.M, call.N), dtype=call.out_dtype)


def _static(t):
    """``t``, or where one of its sizes, strides or its offset is symbolic (``torch.compile``'s dynamic shapes) a
    fake tensor of the same metadata in Python ints: the symbols are specialised (dynamo guards on their values,
    and another shape is traced again), because every decision of the plan (the split-K table, the envelope, the
    kernel) depends on M, N and K."""
    if t is None:
        return None
    shape, strides, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    if all(type(v) is int for v in shape + strides + (offset,)):
        return t
    shape, strides, offset = tuple(int(v) for v in shape), tuple(int(v) for v in strides), int(offset)
    extent = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
    storage = t.new_empty((offset + extent,))
    static = storage.as_strided(shape, strides, offset)
    return static.requires_grad_() if t.requires_grad and t.dtype.is_floating_point else static
