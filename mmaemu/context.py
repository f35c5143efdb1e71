"""The context of the decisions: what mmaemu knows about its surroundings at one moment, as one immutable value.

The policy layers decide from a :class:`Context` instead of reading the surroundings themselves: the profile
choice (:func:`mmaemu.platform.profiles.get_profile`), the split-K decision
(:func:`mmaemu.platform.splitk.decide_splitk`) and the backend selection (:func:`mmaemu.backends.select`) take
``context=`` and return data (the profile, the decision with its warnings, the selection with its fallbacks).
Only the edge builds a context: the entry points of :mod:`mmaemu.api` (:func:`for_call`, once per call) and
``mmaemu info`` (:func:`mmaemu.diagnostics.report_context`, which also reads the device), so a call sees one
reading of the environment from its first decision to its last.

What a context does not hold yet: for a call, the device facts and the kernels' verdicts are read by the CUDA
dispatcher when CUDA tensors are seen (:mod:`mmaemu.cuda.device`, :mod:`mmaemu.device_facts`, once per device
and process), and the split-K tables and recorded bundles are loaded on first use
(:func:`mmaemu.platform.tables.get_table`, :mod:`mmaemu.platform.bundles`), so that a CPU call never touches CUDA
and never loads a table it does not consult.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from . import environment
from .device_facts import DeviceFacts

__all__ = ["Context", "for_call", "environment_of"]


@dataclasses.dataclass(frozen=True)
class Context:
    """The surroundings of the decisions, read at the edge.

    ``environment``: the parsed ``MMAEMU_*`` variables (:func:`mmaemu.environment.snapshot`). ``device``: the facts
    of the CUDA device described (``mmaemu info``; :class:`mmaemu.device_facts.DeviceFacts`), None when none was
    read; then ``device_problem`` says why (CUDA disabled, no device, "probe failed") and ``device_error`` what
    reading it raised, if it raised.
    """

    environment: environment.Snapshot
    device: Optional[DeviceFacts] = None
    device_problem: Optional[str] = None
    device_error: Optional[str] = None

    @property
    def cuda_disabled(self) -> bool:
        """``MMAEMU_DISABLE_CUDA`` is true: no decision may touch CUDA."""
        return bool(self.environment["MMAEMU_DISABLE_CUDA"])


def for_call() -> Context:
    """The context of one API call: the environment as it is now (the device is read later, for CUDA tensors)."""
    return Context(environment.snapshot())


def environment_of(context: Optional[Context]) -> environment.Snapshot:
    """The environment snapshot of a decision: its context's, or (a decision called without one, by a test or
    by code outside the entry points) the environment as it is now."""
    return environment.snapshot() if context is None else context.environment
