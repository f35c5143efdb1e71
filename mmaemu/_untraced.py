"""``untraced``: exclude a function from ``torch.compile`` tracing without importing ``torch._dynamo`` eagerly.

``torch.compiler.disable`` imports ``torch._dynamo`` (seconds of start-up) when it decorates. A process that
never compiles has no use for it, so the decorator here defers it: the wrapper calls the function directly
while ``torch._dynamo`` is not imported — no compiled code can be running then, since ``torch.compile`` imports
it — and through ``torch.compiler.disable(fn)``, built on the first such call, once it is. The wrapper carries
dynamo's marker ``_torchdynamo_disable``, so that dynamo breaks the graph at its call instead of tracing into it,
exactly as for a function decorated with ``torch.compiler.disable``.
"""

from __future__ import annotations

import functools
import sys

__all__ = ["untraced"]


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
