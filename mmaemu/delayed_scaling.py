"""Transformer Engine's delayed scaling of one tensor: the amax history and the scale update, as TE's kernel does.

TE's recipe (``DelayedScaling``) quantises a tensor with a scale derived from the amaxes of *earlier* steps: each
quantisation writes the tensor's amax into slot 0 of the history (``history[0]``), and after the pass TE's
scale-update kernel rolls the history and derives the next scale. Source: NVIDIA/TransformerEngine, commit
d0067d0d (2.20.0.dev0), ``transformer_engine/common/recipe/delayed_scaling.cu``, ``kernel_bulk`` (the kernel that
``amax_and_scale_update_after_reduction`` launches, which TE's PyTorch modules use); the rules, per tensor, with
``last = history[0]`` and history length ``L``:

1. when ``last != 0`` the history is rolled: ``new[i] = history[i + 1]`` for ``0 < i < L - 1``,
   ``new[L - 1] = last``, ``new[0] = 0``; the amax of the update is ``fmaxf`` over every rolled value, i.e. the
   largest of the whole old history (``amax_compute_algo="max"``) or ``last`` (``"most_recent"``). When
   ``last == 0`` (the tensor was not quantised since the last update) nothing is rolled and the amax is 0
   ("max"; "most_recent" gives ``last``, also 0);
2. ``scale = scaled_max / amax`` (IEEE fp32 division: ``delayed_scaling.cu`` is not among the sources TE's
   ``CMakeLists.txt`` compiles with ``--use_fast_math``) when the amax is finite and > 0, else the previous scale;
   an infinite quotient becomes the largest fp32 value; ``scaled_max = fp8_max * 2**-margin`` computed once in
   fp32 on the host (exact for an integer margin). This is :func:`mmaemu.quantize.scale_from_amax`
   (``recipe="delayed"``);
3. ``scale_inv = 1 / scale`` (IEEE fp32 division): :func:`mmaemu.quantize.scale_inv`.

TE's defaults (``transformer_engine/common/recipe/__init__.py``, same commit): ``margin=0``,
``fp8_format=Format.HYBRID`` (E4M3 forward, E5M2 gradients), ``amax_history_len=1024``,
``amax_compute_algo="max"``; the first scale is 1.0 and the history starts at zeros. Not modelled: a callable
``amax_compute_algo`` or ``scaling_factor_compute_algo`` and the amax reduction across ranks (``reduce_amax``
with more than one process): refused by the layer that uses this module.

Evidence: modelled from the pinned source, not recorded on a GPU (experimental; docs/limitations.md names the
probe). Everything is computed on the CPU with exact fp32 operations; the functions are pure (new tensors out).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .quantize import FP8_MAX, scale_from_amax, scale_inv

__all__ = ["DelayedState", "initial_state", "record_amax", "update", "AMAX_ALGORITHMS", "DEFAULT_HISTORY_LEN"]

AMAX_ALGORITHMS = ("max", "most_recent")
DEFAULT_HISTORY_LEN = 1024  # TE DelayedScaling.amax_history_len


class DelayedState(NamedTuple):
    """One tensor's delayed-scaling state: ``history`` (fp32 [L], slot 0 the amax recorded since the last
    update), ``scale`` and ``scale_inv`` (0-dim fp32: the multiplier of the next cast and its inverse)."""

    history: torch.Tensor
    scale: torch.Tensor
    scale_inv: torch.Tensor


def initial_state(history_len: int = DEFAULT_HISTORY_LEN) -> DelayedState:
    """TE's starting state: a history of zeros, scale 1 and scale_inv 1."""
    if isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 1:
        raise ValueError(f"amax_history_len must be a positive int, got {history_len!r}")
    one = torch.ones((), dtype=torch.float32)
    return DelayedState(torch.zeros(history_len, dtype=torch.float32), one, one.clone())


def record_amax(state: DelayedState, amax) -> DelayedState:
    """The state with ``amax`` (the amax of the tensor just cast) written into slot 0, as TE's cast kernel does."""
    history = state.history.clone()
    history[0] = torch.as_tensor(amax, dtype=torch.float32).reshape(())
    return DelayedState(history, state.scale, state.scale_inv)


def update(state: DelayedState, fmt: str, margin: int = 0, amax_compute_algo: str = "max") -> DelayedState:
    """The state after TE's scale update (rules 1-3 of the module docstring) for a tensor cast into ``fmt``."""
    if amax_compute_algo not in AMAX_ALGORITHMS:
        raise ValueError(f"amax_compute_algo must be one of {AMAX_ALGORITHMS} (TE's named algorithms), got "
                         f"{amax_compute_algo!r}")
    if fmt not in FP8_MAX:
        raise ValueError(f"fmt must be one of {sorted(FP8_MAX)}, got {fmt!r}")
    old = state.history.detach().to("cpu", torch.float32).numpy()
    last = np.float32(old[0])
    history = old.copy()
    amax = np.float32(0.0)
    if last != 0:
        rolled = np.concatenate([old[1:], old[:1]])  # new[i] = old[i + 1], new[L - 1] = last
        amax = np.fmax.reduce(rolled)  # fmaxf over the rolled values (TE's reduction ignores NaN)
        history = rolled.copy()
        history[0] = 0
    if amax_compute_algo == "most_recent":
        amax = last
    scale = scale_from_amax(torch.tensor(float(amax), dtype=torch.float32), fmt, margin, recipe="delayed",
                            previous_scale=float(state.scale))
    return DelayedState(torch.from_numpy(history), scale, scale_inv(scale))
