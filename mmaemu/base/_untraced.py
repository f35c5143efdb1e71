"""``untraced``: exclude a function from ``torch.compile`` tracing without importing ``torch._dynamo`` eagerly.

``torch.compiler.disable`` imports ``torch._dynamo`` (seconds of start-up) when it decorates. A process that
never compiles has no use for it, so the decorator here defers it: the wrapper calls the function directly
while ``torch._dynamo`` is not imported — no compiled code can be running then, since ``torch.compile`` imports
it — and through ``torch.compiler.disable(fn)``, built on the first such call, once it is. The wrapper carries
dynamo's marker ``_torchdynamo_disable``, so that dynamo breaks the graph at its call instead of tracing into it,
exactly as for a function decorated with ``torch.compiler.disable``.

``traced_tensor_kind`` names the tensors a tracer hands over in place of data (fake and functional tensors), so
that nothing computes on them: :func:`require_untraced` refuses them with the way out.
"""

from __future__ import annotations

import functools
import sys

__all__ = ["untraced", "traced_tensor_kind", "require_untraced", "plain_tensor"]


def untraced(fn=None, *, reason=None):
    """``fn`` run eagerly, never traced by dynamo (a graph break at the call); ``torch._dynamo`` imported only
    when something else imported it first. ``reason``: the text dynamo gives for the break (``fullgraph=True``
    names it; torch < 2.7 takes none). Usable as ``@untraced`` or ``@untraced(reason=...)``."""
    if fn is None:
        return functools.partial(untraced, reason=reason)
    disabled = []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not disabled:
            import torch

            disabled.append(_disable(torch, fn, reason))
        return disabled[0](*args, **kwargs)

    wrapper._torchdynamo_disable = True
    if reason is not None:
        wrapper._torchdynamo_disable_msg = reason
    return wrapper


def _disable(torch, fn, reason):
    if reason is None:
        return torch.compiler.disable(fn)
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:  # torch < 2.7
        return torch.compiler.disable(fn)


def plain_tensor(tensor) -> bool:
    """Whether ``tensor`` is a plain tensor with data: a ``torch.Tensor`` or ``torch.nn.Parameter`` itself (a fake
    or functional tensor is a subclass; a Parameter of one keeps the subclass), neither functional nor
    functorch-wrapped. Such a tensor is never traced (:func:`traced_tensor_kind` returns None for it at once); the
    kept tensor-wise CPU call takes plain tensors only (:func:`mmaemu.recipes.tensorwise.kept_cpu_call`,
    :func:`mmaemu.plan.cache.cached_plan_scaled_mm` with ``compiled``)."""
    probes = _PLAIN_PROBES or _plain_probes()
    return type(tensor) in probes[0] and not probes[1](tensor) and not probes[2](tensor)


_PLAIN_PROBES = None


def _plain_probes():
    """(plain tensor types, is functional, is functorch-wrapped) of torch, looked up once (a tensor exists: torch
    is imported)."""
    global _PLAIN_PROBES
    torch = sys.modules["torch"]
    _PLAIN_PROBES = ((torch.Tensor, torch.nn.Parameter), torch._is_functional_tensor,
                     torch._C._functorch.is_functorch_wrapped_tensor)
    return _PLAIN_PROBES


def traced_tensor_kind(tensor):
    """"fake" or "functional" for a tensor that a tracer (torch.compile's dynamo and AOTAutograd, make_fx,
    FakeTensorMode) hands over in place of one with data, else None (a :func:`plain_tensor` at once). Read without
    importing torch's tracing modules: a process that has not imported them holds no such tensor."""
    if "torch" in sys.modules and plain_tensor(tensor):
        return None
    fake_module = sys.modules.get("torch._subclasses.fake_tensor")
    if fake_module is not None and fake_module.is_fake(tensor):
        return "fake"
    functional_module = sys.modules.get("torch._subclasses.functional_tensor")
    if functional_module is not None and isinstance(tensor, functional_module.FunctionalTensor):
        return "functional"
    if "torch" in sys.modules and sys.modules["torch"]._is_functional_tensor(tensor):
        return "functional"
    return None


def require_untraced(caller, name, tensor) -> None:
    """TypeError naming the rule and the way out for a fake or functional ``tensor`` (:func:`traced_tensor_kind`):
    it holds no data, and the emulation never computes on (or is traced through) such a tensor."""
    kind = traced_tensor_kind(tensor)
    if kind is not None:
        raise TypeError(
            f"{caller}: {name} is a {kind} tensor (a tracer such as torch.compile or FakeTensorMode handed it over "
            f"in place of data); mmaemu computes only on tensors with data: under torch.compile, call "
            f"torch._scaled_mm inside mmaemu.patch or torch.ops.mmaemu.scaled_mm (an opaque custom op that runs on "
            f"the real tensors when the compiled graph runs), or call mmaemu.scaled_mm outside the traced code")
