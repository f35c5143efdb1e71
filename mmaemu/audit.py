"""The split-K evidence of a model: every distinct FP8 GEMM of one forward and how its split is decided.

:func:`mmaemu.nn.audit` (implemented here by :func:`run_audit`) runs one forward of a model whose linear layers are
:class:`mmaemu.nn.EmulatedFP8Linear` or a recipe layer of :mod:`mmaemu.nn_recipes` (see
:func:`mmaemu.nn.convert_linears`) and asks, for each GEMM, what the layer's ``explain`` says: the split decision,
the step that decided it (its source) and whether it is verified. The recipe layers' kernels never split K (torch's
row-wise CUTLASS kernel, DeepGEMM's sm_90 kernels, the block-scaled instruction chains): their GEMMs are listed with
S = 1 from the source "kernel".
A GEMM whose split the evidence does not decide is listed ("undecided", with the reason), never raised, so one
audit shows every undecided shape of the forward at once.

What runs: with ``dry_run=False`` (default) each layer whose call is valid computes as in a plain forward (the
decisions, warnings included, are those of the real run); a layer whose call would raise returns the float product
of its dequantised operands instead, so that the forward goes on. With ``dry_run=True`` every layer returns that
float product: nothing is emulated, the forward is fast, and the decisions are exact as long as the model's
shapes do not depend on the values its layers compute (data-dependent routing, as in mixture-of-experts models,
can change M). The recipe layers' weights are kept in formats whose dequantisation the audit does not restate
(block scales, packed FP4): where one stands in, it returns zeros of the layer's output shape and dtype.

A model compiled by ``torch.compile`` (its ``OptimizedModule``) is audited as the module it wraps, run eagerly:
its layers are named as the model names them (``'0'``, not ``'_orig_mod.0'``), and the decisions, which depend on
the shapes only, are those of the compiled forward.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Dict, Optional, Tuple

import torch

from .formats import dtype_name

__all__ = ["GemmAudit", "ModelAudit", "run_audit"]

UNDECIDED = "undecided"
RECORD_HINT = "python -m mmaemu record --shapes FILE"  # docs/recording.md; ModelAudit.shapes_text() writes FILE


@dataclasses.dataclass(frozen=True)
class GemmAudit:
    """One distinct GEMM of the forward: (layer, M, N, K, formats, out dtype, fast, profile) and its decision.

    ``M`` is the GEMM's row count (padded to ``pad_m_to`` as the layer pads it); ``a``/``b`` the formats of the
    activations and the weight; ``calls`` how often the forward ran it. ``S``/``scheme``/``source``/``verified``/
    ``note`` come from the :class:`mmaemu.SplitDecision` (None when there is none); ``error`` is
    "ErrorClass: message" when the call would raise (a SplitKUnknownError makes it "undecided").
    """

    layer: str
    M: int
    N: int
    K: int
    a: str
    b: str
    out: str
    fast: bool
    profile: str
    calls: int
    S: Optional[int]
    scheme: Optional[str]
    source: Optional[str]
    verified: Optional[bool]
    note: str
    error: Optional[str]

    @property
    def status(self) -> str:
        """"verified", "unverified", "undecided" (the split evidence does not decide) or "error" (another
        refusal)."""
        if self.error is not None:
            return UNDECIDED if self.error.startswith("SplitKUnknownError") else "error"
        return "verified" if self.verified else "unverified"

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), status=self.status)


@dataclasses.dataclass(frozen=True)
class ModelAudit:
    """The :class:`GemmAudit` of every distinct GEMM of one forward, in the order they first ran.

    ``str(audit)`` is a table; :meth:`to_dict` the same as data; :meth:`shapes_text` the ``M N K`` lines of the
    undecided shapes, for ``mmaemu record --shapes FILE`` on the reference GPU.
    """

    gemms: Tuple[GemmAudit, ...]
    dry_run: bool

    def __len__(self) -> int:
        return len(self.gemms)

    def __iter__(self):
        return iter(self.gemms)

    def __getitem__(self, index):
        return self.gemms[index]

    @property
    def undecided(self) -> Tuple[GemmAudit, ...]:
        """The GEMMs whose split the evidence does not decide (each would raise SplitKUnknownError)."""
        return tuple(g for g in self.gemms if g.status == UNDECIDED)

    @property
    def unverified(self) -> Tuple[GemmAudit, ...]:
        """The GEMMs computed with a decision that is not verified (assumed, unvalidated, never replayed)."""
        return tuple(g for g in self.gemms if g.status == "unverified")

    def counts(self) -> Dict[str, int]:
        """{source or "undecided" or "error": number of distinct GEMMs}."""
        return dict(Counter(_source_label(g) for g in self.gemms))

    def to_dict(self) -> dict:
        return {"dry_run": self.dry_run, "gemms": [g.to_dict() for g in self.gemms], "counts": self.counts(),
                "undecided": len(self.undecided), "unverified": len(self.unverified)}

    def shapes_text(self, which: str = UNDECIDED) -> str:
        """``M N K`` lines (distinct, in order) of the GEMMs of a status ("undecided", "unverified", or "all")."""
        chosen = self.gemms if which == "all" else [g for g in self.gemms if g.status == which]
        lines = dict.fromkeys(f"{g.M} {g.N} {g.K}" for g in chosen)
        return "".join(line + "\n" for line in lines)

    def summary(self) -> str:
        """One line: the counts by source, and what to do about undecided GEMMs."""
        calls = sum(g.calls for g in self.gemms)
        by_source = ", ".join(f"{label} {n}" for label, n in sorted(self.counts().items()))
        text = (f"{len(self.gemms)} distinct GEMMs ({calls} calls){' (dry run)' if self.dry_run else ''}: "
                f"{by_source or 'none'}; {len(self.unverified)} unverified, {len(self.undecided)} undecided")
        if self.undecided:
            text += (f". Undecided splits: convert with splitk='assume-unsplit' (S = 1, with a warning), or record "
                     f"the shapes on the reference GPU ({RECORD_HINT}, FILE from shapes_text())")
        return text

    def __str__(self) -> str:
        header = ("layer", "M", "N", "K", "formats", "fast", "S", "source", "status")
        rows = [(g.layer, str(g.M), str(g.N), str(g.K), f"{g.a}x{g.b}->{g.out}", "yes" if g.fast else "no",
                 "-" if g.S is None else (str(g.S) if g.S == 1 else f"{g.S} {g.scheme}"), _source_label(g),
                 g.status) for g in self.gemms]
        widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
        numeric = {1, 2, 3, 6}

        def fmt(row):
            return "  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

        lines = [fmt(header), fmt(tuple("-" * w for w in widths))] + [fmt(row) for row in rows]
        for g in self.gemms:
            if g.error is not None:  # the reason only: the ways out follow once, in the summary
                lines.append(f"{g.layer} (M={g.M}, N={g.N}, K={g.K}): {_reason(g.error)}")
        return "\n".join(lines + [self.summary()])


def _reason(error: str) -> str:
    """An error's text without its list of ways out (``to_dict`` keeps the whole text)."""
    head = error.split(". Ways out:", 1)[0]
    return head.split("': ", 1)[1] if head.startswith("SplitKUnknownError") and "': " in head else head


def _source_label(gemm: GemmAudit) -> str:
    if gemm.source is not None:
        return gemm.source
    return gemm.status


def run_audit(model, layer_type, example_inputs: tuple, example_kwargs: dict, dry_run: bool = False) -> ModelAudit:
    """The audit of ``model(*example_inputs, **example_kwargs)`` over its layers of ``layer_type`` (a class with
    the interface of :class:`mmaemu.nn.EmulatedFP8Linear`); :func:`mmaemu.nn.audit` is the public form.

    ``model``: a ``torch.nn.Module``, or a bound method of one (e.g. a sentence-transformers model's ``encode``), or
    a module compiled by ``torch.compile`` (audited as the module it wraps, run eagerly); layer names are those of
    the module's ``named_modules()``. ``layer_type``: a class or a tuple of classes. The forward runs under
    ``torch.no_grad()``. Never raises for an undecided split (it is listed); any other exception of the forward
    propagates. While the audit runs, the layers' ``forward`` is replaced on the instances (and put back after):
    do not run the model elsewhere then.
    """
    root = model if isinstance(model, torch.nn.Module) else getattr(model, "__self__", None)
    if not isinstance(root, torch.nn.Module):
        raise TypeError(f"audit needs a torch.nn.Module or a bound method of one, got {type(model).__name__}")
    compiled = _compiled_original(root)
    if compiled is not None:  # torch.compile's wrapper: its module, named and run as the model
        model = compiled if model is root else getattr(compiled, model.__name__)
        root = compiled
    layers = [(name or type(module).__name__, module) for name, module in root.named_modules()
              if isinstance(module, layer_type)]
    seen: Dict[tuple, dict] = {}
    saved = [(module, module.__dict__.get("forward")) for _, module in layers]
    try:
        for name, module in layers:
            module.forward = _audited_forward(module, name, seen, dry_run)
        with torch.no_grad():
            model(*example_inputs, **example_kwargs)
    finally:
        for module, previous in saved:
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
    return ModelAudit(tuple(GemmAudit(**fields) for fields in seen.values()), bool(dry_run))


def _compiled_original(module):
    """The module ``torch.compile`` wrapped (its ``OptimizedModule`` keeps it as ``_orig_mod``), or None."""
    original = getattr(module, "_orig_mod", None)
    wrapper = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    wrapper = getattr(wrapper, "OptimizedModule", None)
    if wrapper is not None and isinstance(module, wrapper) and isinstance(original, torch.nn.Module):
        return original
    return None


def _audited_forward(module, name: str, seen: Dict[tuple, dict], dry_run: bool):
    """The stand-in forward of one layer during an audit: record the decision, then compute or stand in."""
    def forward(x):
        plan = module.explain(x)
        key = _gemm_key(module, name, x, plan)
        entry = seen.get(key)
        if entry is None:
            seen[key] = _entry(key, plan)
        else:
            entry["calls"] += 1
        if dry_run or plan.validation != "ok":
            return _float_stand_in(module, x)
        return type(module).forward(module, x)

    return forward


def _gemm_key(module, name: str, x, plan) -> tuple:
    """(layer, M, N, K, a, b, out, fast, profile) of the layer's GEMM for input x (its :class:`mmaemu.CallPlan`
    ``plan``); M padded as the layer pads. The tensor-wise layer casts its inputs to E4M3; a recipe layer casts
    them to its weight's format (row-wise, block-wise, MXFP8: E4M3; NVFP4: E2M1). ``out`` is the layer's output
    dtype; the profile is the layer's, or for a recipe layer the one its plan names ("none": DeepGEMM has none)."""
    K = module.in_features
    M = x.numel() // K if K else 0
    pad = getattr(module, "pad_m_to", None)
    if pad is not None and M % pad:
        M = -(-M // pad) * pad
    weight = _format_name(module.weight.dtype)
    if _is_tensorwise(module):
        activations, profile = "e4m3", getattr(module.profile, "name", module.profile)
    else:
        activations, profile = weight, plan.profile or "none"
    return (name, M, module.out_features, K, activations, weight, _dtype_name(_output_dtype(module, x)),
            bool(getattr(module, "use_fast_accum", False)), str(profile))


def _is_tensorwise(module) -> bool:
    """The tensor-wise layer (:class:`mmaemu.nn.EmulatedFP8Linear`), whose stand-in dequantises its weight."""
    return getattr(module, "recipe", None) == "tensorwise"


def _entry(key: tuple, plan) -> dict:
    layer, M, N, K, a, b, out, fast, profile = key
    split = plan.split
    error = None if plan.validation == "ok" else f"{plan.validation[0]}: {plan.validation[1]}"
    return dict(layer=layer, M=M, N=N, K=K, a=a, b=b, out=out, fast=fast, profile=profile, calls=1,
                S=None if split is None else split.S, scheme=None if split is None else split.scheme,
                source=None if split is None else split.source, verified=None if split is None else split.verified,
                note="" if split is None else split.note, error=error)


def _output_dtype(module, x) -> torch.dtype:
    return getattr(module, "out_dtype", None) or x.dtype


def _float_stand_in(module, x):
    """x W^T (+ b) with the dequantised FP8 weight, in float32, then in the layer's output dtype: a value of the
    right shape and dtype for the rest of the forward, not the emulated GEMM. A recipe layer's stand-in is zeros
    of that shape and dtype (see the module docstring)."""
    if not _is_tensorwise(module):
        return torch.zeros(tuple(x.shape[:-1]) + (module.out_features,), dtype=_output_dtype(module, x),
                           device=x.device)
    weight = module.weight.float() * module.weight_scale_inv.float()
    y = torch.nn.functional.linear(x.detach().float(), weight.to(x.device))
    if module.bias is not None:
        y = y + module.bias.float()
    return y.to(_output_dtype(module, x))


def _format_name(dtype) -> str:
    return {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2",
            getattr(torch, "float4_e2m1fn_x2", None): "e2m1"}.get(dtype, _dtype_name(dtype))


_dtype_name = dtype_name
