"""The audit of a training step: every FP8 GEMM of one forward *and* its backward, with its layer, role, shape,
formats, accumulation and split-K evidence.

:func:`audit_step` runs ``loss_fn(model(*inputs))`` and its ``backward()`` once, inside ``mmaemu.patch`` (so that
torchao's float8 training layers, which call ``torch._scaled_mm``, are emulated), and lists each distinct GEMM of
the step (the sibling of :func:`mmaemu.nn.audit`, which lists one forward of inference layers). It knows two kinds
of training layers:

* :class:`mmaemu.nn_training.TrainableFP8Linear`: the layer reports each GEMM with its role;
* torchao's ``Float8Linear`` (``torchao.float8.convert_to_float8_training``): its calls are read from the patch
  block's log; the layer is the one whose forward or backward was entered last (a forward pre-hook; a hook on
  the gradient of its output), and the role follows torchao 0.18.0's order (``torchao/float8/float8_linear.py``,
  ``matmul_with_hp_or_float8_args``): one GEMM in the forward (output), then in the backward grad_input before
  grad_weight (the recipe "rowwise_with_gw_hp" computes grad_weight in high precision: no FP8 GEMM). The audit
  checks each GEMM's shapes against its role ([T, in] x [in, out], [T, out] x [out, in], [out, T] x [T, in]) and
  labels it "?" where they do not fit.

Split-K: with ``splitk="auto"`` (a layer's own setting, or the patch's) a GEMM the evidence does not decide would
raise; the audit computes it with S = 1 instead (``"assume-unsplit"``) so that the step goes on, and lists it as
"undecided". The step's parameters receive gradients (the optimiser is not stepped): zero them afterwards if the
audit ran inside a training loop. While it runs, the audit sets hooks, the layers' ``gemm_observer`` and (for
"auto") their ``splitk``, and puts them back.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import torch

from .audit import GemmAudit, ModelAudit, _format_name, _reason, _source_label
from .nn_training import TrainableFP8Linear

__all__ = ["TrainingGemmAudit", "TrainingAudit", "audit_step"]

_ASSUME_SETTING = "assume-unsplit"  # the splitk= setting
_ASSUMED = "assumed-unsplit"  # the source of a decision it made


@dataclasses.dataclass(frozen=True)
class TrainingGemmAudit(GemmAudit):
    """A :class:`mmaemu.audit.GemmAudit` with its ``role``: "output", "grad_input", "grad_weight" or "?"."""

    role: str = "output"


@dataclasses.dataclass(frozen=True)
class TrainingAudit(ModelAudit):
    """The distinct GEMMs of a training step in the order they first ran (forward, then backward; in a model with
    both kinds of layers, the :class:`~mmaemu.nn_training.TrainableFP8Linear` GEMMs come before torchao's)."""

    def by_role(self) -> Dict[str, int]:
        """{role: number of GEMM calls}."""
        counts: Dict[str, int] = {}
        for gemm in self.gemms:
            counts[gemm.role] = counts.get(gemm.role, 0) + gemm.calls
        return counts

    def __str__(self) -> str:
        header = ("layer", "role", "M", "N", "K", "formats", "fast", "S", "source", "status")
        rows = [header] + [
            (g.layer, g.role, str(g.M), str(g.N), str(g.K), f"{g.a}x{g.b}->{g.out}", "yes" if g.fast else "no",
             "-" if g.S is None else str(g.S), _source_label(g), g.status) for g in self.gemms]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines += [f"{g.layer} {g.role} (M={g.M}, N={g.N}, K={g.K}): {_reason(g.error)}" for g in self.gemms
                  if g.error is not None]
        return "\n".join(lines + [self.summary()])


def _decision_fields(split, assumed_undecided: bool, error=None) -> dict:
    """The S/scheme/source/verified/note/error fields of a split decision; an S = 1 assumed for "auto" is listed
    as undecided (the error "auto" would raise)."""
    if split is None:
        return dict(S=None, scheme=None, source=None, verified=None, note="", error=error)
    if assumed_undecided and split.source == _ASSUMED:
        error = ("SplitKUnknownError: splitk='auto' cannot decide this GEMM (the audit computed it with S = 1): "
                 f"{split.note}")
    return dict(S=split.S, scheme=split.scheme, source=split.source, verified=split.verified, note=split.note,
                error=error)


class _Collector:
    """The distinct GEMMs seen, keyed by (layer, role, M, N, K, formats, out, fast, profile)."""

    def __init__(self):
        self.seen: Dict[tuple, dict] = {}

    def add(self, layer, role, M, N, K, a, b, out, fast, profile, decision: dict):
        key = (layer, role, M, N, K, a, b, out, bool(fast), str(profile))
        entry = self.seen.get(key)
        if entry is not None:
            entry["calls"] += 1
            return
        self.seen[key] = dict(layer=layer, role=role, M=M, N=N, K=K, a=a, b=b, out=out, fast=bool(fast),
                              profile=str(profile), calls=1, **decision)

    def audit(self) -> TrainingAudit:
        return TrainingAudit(tuple(TrainingGemmAudit(**fields) for fields in self.seen.values()), False)


def _observer(collector: _Collector, assumed_undecided: bool):
    def observe(call):
        M, K = call.a.shape
        N = call.b.shape[1]
        collector.add(call.layer, call.role, M, N, K, _format_name(call.a.dtype), _format_name(call.b.dtype),
                      _format_name(call.out_dtype), call.use_fast_accum, call.plan.profile.name,
                      _decision_fields(call.plan.split, assumed_undecided))

    return observe


def _torchao_layers(root) -> List[Tuple[str, torch.nn.Module]]:
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:  # torchao not installed: no such layers
        return []
    return [(name, module) for name, module in root.named_modules() if isinstance(module, Float8Linear)]


def _role_of(record, module, phase_index: int, forward: bool) -> str:
    """The role of a torchao GEMM record: by its place in the layer's pass, checked against its shapes."""
    if len(record.input_shape) != 2 or len(record.mat2_shape) != 2:
        return "?"
    (M, K), (_, N) = record.input_shape, record.mat2_shape
    fits = {"output": (K, N) == (module.in_features, module.out_features),
            "grad_input": (K, N) == (module.out_features, module.in_features),
            "grad_weight": (M, N) == (module.out_features, module.in_features)}
    role = "output" if forward else ("grad_input", "grad_weight")[min(phase_index, 1)]
    return role if fits[role] and (forward or phase_index < 2) else "?"


def audit_step(model, *inputs, loss_fn=None, profile=None, splitk="auto", **kwargs) -> TrainingAudit:
    """The :class:`TrainingAudit` of one training step: ``loss_fn(model(*inputs, **kwargs)).backward()``.

    ``loss_fn``: the output -> scalar loss (default: the float sum of the output). ``profile``, ``splitk``: the
    settings of the ``mmaemu.patch`` block the step runs in (torchao's layers; None inherits an enclosing block's
    profile); :class:`~mmaemu.nn_training.TrainableFP8Linear` layers keep their own. See the module docstring for
    what is recorded and how an undecided split is listed.
    """
    from .patching import patch

    root = model if isinstance(model, torch.nn.Module) else getattr(model, "__self__", None)
    if not isinstance(root, torch.nn.Module):
        raise TypeError(f"audit_step needs a torch.nn.Module or a bound method of one, got {type(model).__name__}")
    collector = _Collector()
    own = [(name, m) for name, m in root.named_modules() if isinstance(m, TrainableFP8Linear)]
    saved = [(m, m.gemm_observer, m.splitk) for _, m in own]
    ao = _torchao_layers(root)
    marks: List[Tuple[int, str, torch.nn.Module, bool]] = []  # (log index, layer, module, forward?)
    handles = []
    patch_auto = splitk == "auto"
    block = patch(profile=profile, splitk=_ASSUME_SETTING if patch_auto else splitk, log_limit=None)
    try:
        for _, module in own:
            module.gemm_observer = _observer(collector, module.splitk == "auto")
            if module.splitk == "auto":
                module.splitk = _ASSUME_SETTING
        with block as log:
            for name, module in ao:
                handles.append(module.register_forward_pre_hook(
                    lambda m, args, name=name: marks.append((len(log), name, m, True))))
                handles.append(module.register_forward_hook(
                    lambda m, args, out, name=name: _mark_backward(out, marks, log, name, m)))
            output = model(*inputs, **kwargs)
            loss = output.float().sum() if loss_fn is None else loss_fn(output)
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        for module, observer, own_splitk in saved:
            module.gemm_observer, module.splitk = observer, own_splitk
    _add_patch_records(collector, list(log), marks, patch_auto)
    return collector.audit()


def _mark_backward(output, marks, log, name, module):
    """Mark the log when the gradient of the layer's output arrives: its backward GEMMs come next."""
    if isinstance(output, torch.Tensor) and output.requires_grad:
        output.register_hook(lambda grad: marks.append((len(log), name, module, False)))


def _add_patch_records(collector: _Collector, records, marks, assumed_undecided: bool) -> None:
    """The GEMMs the patch log recorded for torchao's layers, each attributed to the mark before it."""
    bounds = [index for index, *_ in marks] + [len(records)]
    for (start, name, module, forward), end in zip(marks, bounds[1:]):
        for position, record in enumerate(records[start:end]):
            role = _role_of(record, module, position, forward)
            M, K = record.input_shape if len(record.input_shape) == 2 else (0, 0)
            N = record.mat2_shape[1] if len(record.mat2_shape) == 2 else 0
            collector.add(name, role, M, N, K, _short(record.input_dtype), _short(record.mat2_dtype),
                          str(record.out_dtype), record.use_fast_accum, record.profile,
                          _decision_fields(record.split, assumed_undecided, record.error))


def _short(dtype_name: str) -> str:
    return {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(dtype_name, dtype_name)
