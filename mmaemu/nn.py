"""``EmulatedFP8Linear``: a linear layer whose product is an FP8 tensor-core GEMM, computed by mmaemu.

The layer does what a Transformer-Engine-style FP8 linear layer does in inference, step by step:

1. quantise the input ``x`` [..., in_features] to E4M3 with the input *scale* ``s_x`` (a fixed one, or TE's
   current scaling ``448 / amax(x)`` computed per call, one correctly rounded fp32 division as TE's CUDA kernel
   computes it, on every device) — :func:`mmaemu.quantize.quantize_e4m3`;
2. optionally pad the rows (M = the product of the leading dimensions) with zero rows up to a multiple of
   ``pad_m_to`` (Evo 2's vortex pads M to a multiple of 16 before its FP8 projections; the padded M is what the
   GEMM, and hence cuBLASLt's split-K heuristic, sees);
3. ``y = mmaemu.scaled_mm(x_fp8, W_fp8.t(), scale_a=1/s_x, scale_b=1/s_w, out_dtype=out_dtype,
   use_fast_accum=use_fast_accum, profile=profile, splitk=splitk)`` — the scales handed to the GEMM are the
   *inverse* scales (TE's ``scale_inv``, each ``fp32(1 / s)`` rounded once), as TE passes them to cuBLASLt;
4. crop the padding rows, add the bias (if any) in ``out_dtype`` with an ordinary torch addition, and restore
   the leading dimensions.

``out_dtype`` defaults to None, the dtype of the input activations ``x`` (as Transformer Engine's ``te.Linear``
returns its input's dtype): an fp32 model keeps fp32 activations. A torch dtype fixes the output dtype instead
(e.g. ``out_dtype=torch.bfloat16``, the GEMM output of a bf16 FP8 pipeline whatever the input).

Under ``torch.compile`` the layer's emulation (quantisation, GEMM, bias) runs eagerly, outside the traced graph
(dynamo breaks the graph at the layer's call), as for :func:`mmaemu.scaled_mm`: a compiled model gets exactly the
eager bits, and the quantiser's host-side scale arithmetic is never traced.

The weight is quantised once, per tensor, when the layer is built (:meth:`EmulatedFP8Linear.from_linear`), or
taken as stored FP8 state (:meth:`EmulatedFP8Linear.from_fp8_state`).

Scope: inference only — the layer has no parameters (its FP8 weight, scales and bias are buffers), and calling
it with grad mode on for an input that requires grad raises UnsupportedFeatureError. The bias is never passed
to the GEMM (mmaemu does not model a fused bias epilogue): the result matches models that add the bias after
the FP8 GEMM, not TE's ``te.Linear``, which fuses it into the cuBLASLt epilogue.
"""

from __future__ import annotations

import torch

from . import formats
from .base._untraced import untraced
from .audit import GemmAudit, ModelAudit, run_audit
from .errors import SplitKUnknownError
from .nn_recipes import _inference_rows, weight_slot
from .platform.profiles import get_profile
from .quantize import amax_scale, quantize, quantize_current, scale_inv

__all__ = ["EmulatedFP8Linear", "convert_linears", "audit", "ModelAudit", "GemmAudit"]

_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


def _fp32_scalar(value, name, device):
    """A 0-dim fp32 tensor from a number or a one-element fp32 tensor (numbers are rounded to fp32 once)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must have one element, got shape {tuple(value.shape)}")
        if value.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (Transformer Engine keeps scales in fp32), got {value.dtype}")
        return value.detach().reshape(()).clone().to(device)
    return torch.tensor(float(value), dtype=torch.float32, device=device)


def _profile_reference(profile):
    """The profile's name when the name finds it again (a listed profile), else the Profile itself (e.g. one made
    by :func:`mmaemu.profile_from_preset`)."""
    try:
        if get_profile(profile.name) is profile:
            return profile.name
    except KeyError:
        pass
    return profile


def _check_pad(pad_m_to):
    if pad_m_to is None:
        return None
    if isinstance(pad_m_to, bool) or not isinstance(pad_m_to, int) or pad_m_to < 1:
        raise ValueError(f"pad_m_to must be None or a positive int, got {pad_m_to!r}")
    return pad_m_to


#: Why ``torch.compile`` breaks its graph at the layer (shown by dynamo, e.g. when ``fullgraph=True`` refuses it).
_GRAPH_BREAK_REASON = (
    "mmaemu: EmulatedFP8Linear is a graph break on purpose: its quantisation and FP8 GEMM run eagerly, because a "
    "compiler must not trace into (or re-round) the emulation whose bits are the point. Compile with "
    "fullgraph=False (the default: the ops around the layer are still compiled), or leave the layer out of the "
    "compiled region (torch's hint to remove the disable does not apply here)"
)


def _check_splitk_and_backend(splitk, backend, profile):
    """Refuse at construction what every forward would refuse: the form of ``splitk`` and the scheme the profile's
    preset computes (the bounds that depend on K stay per call), and the backend's name, each with its own error
    (as ``mmaemu.patch`` checks them). "auto" is resolved per call ($MMAEMU_BACKEND is read then)."""
    from .backends import requested_backend
    from .context import for_call
    from .platform.splitk import check_splitk_argument

    context = for_call()  # the edge: one reading of the environment for these checks
    check_splitk_argument(splitk, profile, context=context)
    if not (isinstance(backend, str) and backend == "auto"):  # a name other than "auto" reads no environment
        requested_backend(backend, context=context)


class EmulatedFP8Linear(torch.nn.Module):
    """``y = x W^T (+ b)`` with W and x in E4M3, computed as the profile's reference GPU computes the FP8 GEMM.

    Build it with :meth:`from_linear` or :meth:`from_fp8_state`. Buffers: ``weight`` (float8_e4m3fn
    [out_features, in_features]), ``weight_scale_inv`` (fp32, the inverse weight scale given to the GEMM),
    ``input_scale`` / ``input_scale_inv`` (fp32, or None for per-call current scaling) and ``bias`` (in
    ``out_dtype``, or None). ``.to(device)`` moves them; dtype conversions (``.half()``, ``.to(torch.bfloat16)``)
    leave them unchanged — set ``out_dtype`` at construction instead. With ``out_dtype=None`` (the default) the
    output has the input's dtype and the bias is kept in its own dtype, converted to the output's at each call.
    """

    recipe = "tensorwise"  # the FP8 recipe (from_linear's recipe=; mmaemu.nn_recipes holds the others)
    #: On the CPU the layer keeps its weight's decoded panels from the first forward on (6 bytes per weight
    #: element with the tile engine; :mod:`mmaemu.cpu.prepared`), used only while the weight's codes are
    #: byte-identical to those decoded. Set it to False (on the class or a layer) to decode at every call.
    keep_prepared_weight = True

    def __init__(self, weight_fp8, weight_scale_inv, *, input_scale=None, input_scale_inv=None, bias=None,
                 profile=None, pad_m_to=None, use_fast_accum=True, out_dtype=None, splitk="auto",
                 backend="auto"):
        super().__init__()
        if not isinstance(weight_fp8, torch.Tensor) or weight_fp8.dtype != torch.float8_e4m3fn:
            raise TypeError("weight_fp8 must be a float8_e4m3fn tensor [out_features, in_features]")
        if weight_fp8.dim() != 2:
            raise ValueError(f"weight_fp8 must be 2-D [out_features, in_features], got shape "
                             f"{tuple(weight_fp8.shape)}")
        if out_dtype is not None and out_dtype not in _OUT_DTYPES:
            raise TypeError(f"out_dtype must be None (the input's dtype) or one of {[str(d) for d in _OUT_DTYPES]}, "
                            f"got {out_dtype}")
        if bias is not None and out_dtype is not None and formats.is_fp8_dtype(out_dtype):
            raise ValueError("a bias cannot be added in an FP8 out_dtype; use a float32/bfloat16/float16 output")
        if not isinstance(use_fast_accum, bool):
            raise TypeError("use_fast_accum must be a bool")
        device = weight_fp8.device
        self.out_features, self.in_features = (int(n) for n in weight_fp8.shape)
        self.profile = _profile_reference(get_profile(profile))
        self.pad_m_to = _check_pad(pad_m_to)
        _check_splitk_and_backend(splitk, backend, self.profile)
        self.use_fast_accum = use_fast_accum
        self.out_dtype = out_dtype
        self.splitk = splitk
        self.backend = backend
        self.register_buffer("weight", weight_fp8.detach().contiguous())
        self.register_buffer("weight_scale_inv", _fp32_scalar(weight_scale_inv, "weight_scale_inv", device))
        if input_scale is None and input_scale_inv is not None:
            raise ValueError("input_scale_inv needs input_scale (the multiplier used to quantise the input)")
        if input_scale is not None:
            s = _fp32_scalar(input_scale, "input_scale", device)
            s_inv = scale_inv(s) if input_scale_inv is None else _fp32_scalar(input_scale_inv, "input_scale_inv",
                                                                               device)
        else:
            s = s_inv = None
        self.register_buffer("input_scale", s)
        self.register_buffer("input_scale_inv", s_inv)
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"bias must be a tensor of shape ({self.out_features},)")
            bias = bias.detach().to(device=device, dtype=out_dtype or bias.dtype)
        self.register_buffer("bias", bias)

    # -- constructors ---------------------------------------------------------------------------------------------

    @classmethod
    def from_linear(cls, linear, *, profile=None, input_scale=None, pad_m_to=None, use_fast_accum=True,
                    out_dtype=None, splitk="auto", backend="auto", weight_scale=None, recipe="tensorwise",
                    **recipe_options):
        """Quantise a ``torch.nn.Linear`` (or any module with ``weight`` [out, in] and ``bias``) once, as TE does.

        The weight scale is TE's current-scaling factor of the weight, ``448 / amax(W)`` in fp32
        (``weight_scale`` overrides it); the stored inverse is ``fp32(1 / weight_scale)``. ``input_scale`` is the
        multiplier used to quantise every input (TE's *scale*, not its inverse); None computes it per call from
        the input's amax (current scaling). The bias, if any, is added after the GEMM in the output dtype
        (``out_dtype``, or the input's dtype when it is None).
        ``recipe``: "tensorwise" (this layer), or another recipe of :data:`mmaemu.nn_recipes.RECIPES` (e.g.
        "blockwise": DeepGEMM's block-wise FP8), whose layer class builds the module from the same options;
        ``recipe_options`` are the options only that recipe's ``from_linear`` takes (``use_ue8m0=`` for
        "blockwise"). The tensor-wise layer takes none: one raises TypeError.
        """
        if recipe != "tensorwise":  # another recipe's layer (mmaemu.nn_recipes.RECIPES), same options
            from .nn_recipes import recipe_layer

            return recipe_layer(recipe).from_linear(linear, profile=profile, input_scale=input_scale,
                                                    pad_m_to=pad_m_to, use_fast_accum=use_fast_accum,
                                                    out_dtype=out_dtype, splitk=splitk, backend=backend,
                                                    weight_scale=weight_scale, **recipe_options)
        if recipe_options:
            raise TypeError(f"from_linear(recipe='tensorwise') takes no option {sorted(recipe_options)[0]!r} (an "
                            "option of another recipe's layer, mmaemu.nn_recipes.RECIPES)")
        weight = linear.weight.detach()
        if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"from_linear: the weight must be float32, bfloat16 or float16, got {weight.dtype}")
        if weight_scale is None:
            weight_scale = amax_scale(weight, "e4m3")
        else:
            weight_scale = _fp32_scalar(weight_scale, "weight_scale", weight.device)
        weight_fp8 = quantize(weight, weight_scale, "e4m3")
        bias = getattr(linear, "bias", None)
        module = cls(weight_fp8, scale_inv(weight_scale), input_scale=input_scale, bias=bias, profile=profile,
                     pad_m_to=pad_m_to, use_fast_accum=use_fast_accum, out_dtype=out_dtype, splitk=splitk,
                     backend=backend)
        module.register_buffer("weight_scale", weight_scale.reshape(()).clone())
        return module

    @classmethod
    def from_fp8_state(cls, weight_fp8, *, weight_scale_inv=None, weight_scale=None, input_scale=None,
                       input_scale_inv=None, bias=None, profile=None, pad_m_to=None, use_fast_accum=True,
                       out_dtype=None, splitk="auto", backend="auto"):
        """Build the layer from TE-style FP8 state.

        ``weight_fp8``: float8_e4m3fn [out_features, in_features]. Give exactly one of ``weight_scale_inv`` (what
        TE stores with the FP8 weight and hands to the GEMM) or ``weight_scale`` (the multiplier that produced
        ``weight_fp8``; its inverse is then ``fp32(1 / weight_scale)``). ``input_scale``: the multiplier used to
        quantise inputs (None: current scaling per call); ``input_scale_inv`` overrides its inverse (default
        ``fp32(1 / input_scale)``).
        """
        if (weight_scale_inv is None) == (weight_scale is None):
            raise ValueError("give exactly one of weight_scale_inv= (TE's stored inverse) or weight_scale=")
        if weight_scale_inv is None:
            device = weight_fp8.device if isinstance(weight_fp8, torch.Tensor) else None
            weight_scale = _fp32_scalar(weight_scale, "weight_scale", device)
            weight_scale_inv = scale_inv(weight_scale)
        module = cls(weight_fp8, weight_scale_inv, input_scale=input_scale, input_scale_inv=input_scale_inv,
                     bias=bias, profile=profile, pad_m_to=pad_m_to, use_fast_accum=use_fast_accum,
                     out_dtype=out_dtype, splitk=splitk, backend=backend)
        if weight_scale is not None:
            module.register_buffer("weight_scale", weight_scale.reshape(()).clone())
        return module

    # -- forward --------------------------------------------------------------------------------------------------

    def _gemm_arguments(self, x):
        """(x_fp8 [M_padded, K], M, leading shape, scale_a) for an input [..., in_features]."""
        x2 = _inference_rows(self, x, "the emulated FP8 GEMM has no backward. Call it under")
        lead = tuple(x.shape[:-1])
        if self.input_scale is None:  # TE's current scaling: amax, scales and cast (one compiled call on the CPU)
            x_fp8, s_inv = quantize_current(x2, "e4m3")
        else:
            s_inv = self.input_scale_inv
            x_fp8 = quantize(x2, self.input_scale, "e4m3")
        M = x_fp8.shape[0]
        if self.pad_m_to is not None and M % self.pad_m_to:
            padded = -(-M // self.pad_m_to) * self.pad_m_to
            zeros = torch.zeros((padded - M, self.in_features), dtype=x_fp8.dtype, device=x_fp8.device)
            x_fp8 = torch.cat([x_fp8, zeros])
        return x_fp8, M, lead, s_inv

    def _output_dtype(self, x):
        return x.dtype if self.out_dtype is None else self.out_dtype

    @untraced(reason=_GRAPH_BREAK_REASON)
    def forward(self, x):
        """The layer's output for ``x`` [..., in_features]. Excluded from ``torch.compile`` tracing: dynamo breaks
        the graph at the layer and runs it eagerly (also under ``torch.inference_mode()``), so a compiled model gets
        the eager bits; ``fullgraph=True`` refuses it, naming this break."""
        x_fp8, M, lead, s_inv = self._gemm_arguments(x)
        out_dtype = self._output_dtype(x)
        try:
            y = self._gemm(x_fp8, s_inv, out_dtype)
        except SplitKUnknownError as error:
            raise _undecided_layer_error(self, error) from None
        y = y[:M]
        if self.bias is not None:
            y = y + self.bias.to(out_dtype)  # torch's addition (numpy's measured no faster: docs/performance.md)
        return y.reshape(lead + (self.out_features,))

    def _gemm(self, x_fp8, s_inv, out_dtype):
        """``mmaemu.scaled_mm`` of the layer, with the weight's prepared panels kept in the layer's slot
        (:class:`mmaemu.cpu.prepared.WeightSlot`; see ``keep_prepared_weight``)."""
        from .api import planned_scaled_mm
        from .warn import edge

        weights = weight_slot(self)
        with edge():  # as in mmaemu.scaled_mm: the call's warnings at the caller's line
            return planned_scaled_mm(x_fp8, self.weight.t(), s_inv, self.weight_scale_inv, None, None, out_dtype,
                                     self.use_fast_accum, None, self.profile, self.splitk, self.backend, weights)

    def explain(self, x):
        """The :class:`mmaemu.CallPlan` of the GEMM this layer would run for input ``x`` (nothing computed)."""
        from .api import explain

        x_fp8, _, _, s_inv = self._gemm_arguments(x)
        return explain(x_fp8, self.weight.t(), s_inv, self.weight_scale_inv, out_dtype=self._output_dtype(x),
                       use_fast_accum=self.use_fast_accum, profile=self.profile, splitk=self.splitk,
                       backend=self.backend)

    @property
    def layer_name(self) -> str:
        """The qualified name :func:`convert_linears` gave the layer in its model, else a description."""
        return self.__dict__.get("qualified_name") or (f"EmulatedFP8Linear(in_features={self.in_features}, "
                                                       f"out_features={self.out_features})")

    # -- module plumbing ------------------------------------------------------------------------------------------

    def _apply(self, fn, recurse=True):
        """Move buffers between devices but never change their dtypes (FP8 codes and fp32 scales are exact)."""
        for name, buf in list(self._buffers.items()):
            if buf is None:
                continue
            moved = fn(buf)
            if moved.dtype != buf.dtype:
                moved = buf.to(moved.device)
            self._buffers[name] = moved
        return self

    def extra_repr(self):
        scaling = "current (per call)" if self.input_scale is None else f"static {float(self.input_scale):g}"
        out_dtype = "input" if self.out_dtype is None else str(self.out_dtype).replace("torch.", "")
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"profile={getattr(self.profile, 'name', self.profile)!r}, use_fast_accum={self.use_fast_accum}, "
                f"out_dtype={out_dtype}, splitk={self.splitk!r}, "
                f"pad_m_to={self.pad_m_to}, input_scaling={scaling}")


def convert_linears(model, *, include=None, **options):
    """Replace every ``torch.nn.Linear`` inside ``model`` (in place) by :meth:`EmulatedFP8Linear.from_linear`.

    ``include``: optional predicate ``include(qualified_name, linear) -> bool`` choosing which layers to
    convert; ``options`` are passed to ``from_linear`` (``profile``, ``pad_m_to``, ``out_dtype``, ...).
    Returns ``model``. A bare ``nn.Linear`` given as ``model`` is returned converted.
    """
    return _replace_linears(model, include, lambda linear: EmulatedFP8Linear.from_linear(linear, **options))


def _replace_linears(model, include, build):
    """Replace every ``torch.nn.Linear`` inside ``model`` chosen by ``include(qualified_name, linear)`` (None: all)
    by ``build(linear)``, in place, naming each new layer (``qualified_name``) for its errors; returns ``model``, or
    ``build(model)`` for a bare ``nn.Linear``. :func:`convert_linears` and
    :func:`mmaemu.nn_training.convert_for_training` are its two uses."""
    if isinstance(model, torch.nn.Linear):
        return build(model)
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            qualified = f"{parent_name}.{child_name}" if parent_name else child_name
            if isinstance(child, torch.nn.Linear) and (include is None or include(qualified, child)):
                layer = build(child)
                layer.qualified_name = qualified  # for the errors that name the layer
                setattr(parent, child_name, layer)
    return model


def audit(model, *example_inputs, dry_run=False, **example_kwargs) -> ModelAudit:
    """The split-K evidence of every distinct GEMM of ``model(*example_inputs, **example_kwargs)``: per layer and
    shape (M, N, K, formats, out dtype, fast) the split decision, its source and whether it is verified, as a
    :class:`ModelAudit` (``print`` it for a table; ``to_dict()`` for data). An undecided split is listed, never
    raised. ``model``: a module whose FP8 layers are :class:`EmulatedFP8Linear`, or a bound method of one (e.g.
    ``st_model.encode``). ``dry_run=True`` emulates nothing (every layer returns the float product of its
    dequantised operands): fast, and exact for models whose shapes do not depend on values. The recipe layers of
    :mod:`mmaemu.nn_recipes` are listed too, with S = 1 from the source "kernel" (their kernels never split K).
    A ``torch.compile``'d model is audited as the module it wraps. See :mod:`mmaemu.audit`."""
    from .nn_recipes import RECIPES

    return run_audit(model, (EmulatedFP8Linear, *RECIPES.values()), example_inputs, example_kwargs, dry_run)


def _undecided_layer_error(layer, error: SplitKUnknownError) -> SplitKUnknownError:
    """The SplitKUnknownError of a layer's GEMM, naming the layer, the audit and the two ways out."""
    return SplitKUnknownError(
        f"layer {layer.layer_name!r}: {error} To list every undecided GEMM of the forward at once, run "
        "mmaemu.nn.audit(model, *inputs). Ways out for a model: build the layers with splitk='assume-unsplit' "
        "(S = 1 where the evidence does not decide, with an AssumedUnsplitWarning; or set "
        "MMAEMU_SPLITK_POLICY=assume-unsplit), or record the undecided shapes on the reference GPU "
        "(`python -m mmaemu record --shapes FILE`, FILE from ModelAudit.shapes_text()) and load the bundle.")
