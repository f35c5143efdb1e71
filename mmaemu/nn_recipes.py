"""The FP8 recipes of :class:`mmaemu.nn.EmulatedFP8Linear` besides tensor-wise scaling: one entry each in
:data:`RECIPES` (a layer class with ``from_linear``), chosen by ``recipe=`` in ``from_linear`` and
``convert_linears``. (This module imports nothing of :mod:`mmaemu.nn`, which reads RECIPES.)

* ``"tensorwise"``: the layer itself (one fp32 scale per tensor, cuBLASLt through ``scaled_mm``);
* ``"blockwise"``: :class:`BlockwiseFP8Linear`, DeepSeek-V3's recipe as DeepGEMM computes it on sm_90: the
  weight cast once per 128 x 128 block (``per_block_cast_to_fp8``), every input per 1 x 128 strip of each row
  (``per_token_cast_to_fp8``), the GEMM by :func:`mmaemu.deepgemm.fp8_gemm_nt` with bf16 output, or with
  ``kernel="cublaslt"`` by torch's ``F.scaled_mm`` through cuBLASLt >= 12.9
  (:func:`mmaemu.blockwise_cublaslt.scaled_mm_blockwise`, profile ``hopper-cublaslt-blockwise-experimental``);
* ``"rowwise"``: :class:`RowwiseFP8Linear`, torchao's row-wise float8 recipe: the weight cast once per output
  channel and every input per row (:func:`mmaemu.quantize.quantize_rowwise`, power-of-two scales), the GEMM by
  :func:`mmaemu.scaled_mm` with (M, 1) and (1, N) scales, which torch 2.7.1 runs on its CUTLASS row-wise kernel;
* ``"mxfp8"``, ``"mxfp4"`` and ``"nvfp4"`` (experimental): :class:`MXFP8Linear`, :class:`MXFP4Linear` and
  :class:`NVFP4Linear`, torchao 0.18.0's MX and NVFP4 inference recipes: weight and inputs cast per block of K
  (:mod:`mmaemu.block_quantize`), the GEMM by :func:`mmaemu.scaled_mm` with swizzled block scales on the B200
  profile ``b200-mx-experimental``.
"""

from __future__ import annotations

import torch

from .base._untraced import untraced
from .errors import ExperimentalPresetWarning, UnsupportedFeatureError
from .platform.block_scaled import RECIPES as _BLOCK_SCALED_TABLE
from .platform.splitk import asks_one_split

# torch.compile never traces a recipe layer: its casts must run eagerly to give the bits they give (docs/api.md).
_GRAPH_BREAK_REASON = ("mmaemu recipe layers are a graph break on purpose: their FP8 casts and the emulated GEMM run "
                       "eagerly, bit for bit; compile with fullgraph=False")


def _inference_rows(layer, x, advice: str = "call it under"):
    """The input rows [M, in_features] of an inference-only layer (a recipe layer here, or
    :class:`mmaemu.nn.EmulatedFP8Linear`), or the error that says what is wrong; ``advice`` opens the grad-mode
    error's advice (torch.no_grad() / torch.inference_mode(), or x.detach())."""
    name = type(layer).__name__
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} expects a tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != layer.in_features:
        raise ValueError(f"expected input [..., {layer.in_features}], got shape {tuple(x.shape)}")
    if torch.is_grad_enabled() and x.requires_grad:
        raise UnsupportedFeatureError(
            f"{name} is inference-only: {advice} torch.no_grad() / torch.inference_mode(), or pass x.detach()")
    return x.detach().reshape(-1, layer.in_features)


def _register_weights(layer, weight_fp8, weight_scale, bias):
    """The buffers of a recipe layer: the FP8 weight and its scales as given, the bias (or None) in bf16, the dtype
    the kernels add it in."""
    layer.register_buffer("weight", weight_fp8.detach().contiguous())
    layer.register_buffer("weight_scale", weight_scale.detach().contiguous())
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (layer.out_features,):
            raise ValueError(f"bias must be a tensor of shape ({layer.out_features},)")
        bias = bias.detach().to(device=weight_fp8.device, dtype=torch.bfloat16)
    layer.register_buffer("bias", bias)


def weight_slot(layer):
    """The slot where ``layer`` (:class:`mmaemu.nn.EmulatedFP8Linear` or a recipe layer) keeps its weight's prepared
    operands on the CPU (:class:`mmaemu.cpu.prepared.WeightSlot`, made at the first call), or None where the layer's
    ``keep_prepared_weight`` is False. One slot per layer: a model of more weights than the process-wide store
    keeps (:data:`mmaemu.cpu.prepared.MAX_BYTES`, 256 MB: a 135 M-parameter decoder's take about 850 MB) would
    otherwise prepare some of them again at every step."""
    if not layer.keep_prepared_weight:
        return None
    slot = layer.__dict__.get("_prepared_weight")
    if slot is None:
        from .cpu.prepared import WeightSlot

        slot = layer.__dict__["_prepared_weight"] = WeightSlot()
    return slot


class _RecipeLayer(torch.nn.Module):
    """What every recipe layer shares: its buffers move between devices but keep their dtypes, its weight's
    prepared operands are kept in the layer (:func:`weight_slot`), and its repr gives its shape, its bias and then
    what the layer's ``_recipe_repr`` says of its recipe."""

    #: As :attr:`mmaemu.nn.EmulatedFP8Linear.keep_prepared_weight`: the weight's prepared operands kept in the
    #: layer from the first forward on (used only while its codes and scales are byte-identical to those prepared).
    keep_prepared_weight = True

    def _apply(self, fn, recurse=True):
        """Move buffers between devices but never change their dtypes (FP8 codes and fp32 scales are exact)."""
        for name, buf in list(self._buffers.items()):
            if buf is not None:
                moved = fn(buf)
                self._buffers[name] = moved if moved.dtype == buf.dtype else buf.to(moved.device)
        return self

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{self._recipe_repr()}")


class _ScaledMMRecipeLayer(_RecipeLayer):
    """A recipe layer whose GEMM is one :func:`mmaemu.scaled_mm` call (:class:`RowwiseFP8Linear`, the block-scaled
    layers): ``self._gemm(x)`` gives the call's arguments and options for input ``x`` (the input's casts run) and
    ``finish``, which makes the layer's output rows of the call's result."""

    @untraced(reason=_GRAPH_BREAK_REASON)
    def forward(self, x):
        from .api import run_scaled_mm_plan
        from .plan.cache import cached_plan_scaled_mm
        from .warn import edge

        args, options, finish = self._gemm(x)
        with edge():  # as in mmaemu.scaled_mm, with the weight kept in the layer's slot
            y = run_scaled_mm_plan(cached_plan_scaled_mm(*args, **options), weights=weight_slot(self))
        return finish(y).reshape(tuple(x.shape[:-1]) + (self.out_features,))

    def explain(self, x):
        """The :class:`mmaemu.CallPlan` of the layer's GEMM for input ``x`` (its casts run; the GEMM does not)."""
        from .api import explain

        args, options, _ = self._gemm(x)
        return explain(*args, **options)


_BLOCKWISE_KERNELS = ("deepgemm", "cublaslt")


class BlockwiseFP8Linear(_RecipeLayer):
    """``y = x W^T (+ b)`` in block-wise FP8 as DeepGEMM's sm_90 ``fp8_gemm_nt`` (recipe (1, 128, 128)) computes it,
    or with ``kernel="cublaslt"`` as torch's ``F.scaled_mm`` with ``BlockWise1x128`` x ``BlockWise128x128`` scales
    computes it through cuBLASLt >= 12.9 on an H100 (:mod:`mmaemu.blockwise_cublaslt`, experimental).

    Buffers: ``weight`` (float8_e4m3fn [out_features, in_features]), ``weight_scale`` (fp32 [ceil(out/128),
    ceil(in/128)], DeepGEMM's ``sfb``: the multiplier that dequantises each block) and ``bias`` (bf16, or None).
    Inputs are cast per call with ``per_token_cast_to_fp8``. The output is bf16 (DeepGEMM's 1d2d kernel writes
    nothing else); DeepGEMM's bias is added to it in bf16 afterwards, cuBLASLt's in fp32 before the cast (its
    epilogue). With ``kernel="cublaslt"`` the rows of a call are padded with zero rows to a multiple of 4 (cuBLASLt's
    rule for 1x128 input scales; every row's result depends on its own row only). Inference only.
    """

    recipe = "blockwise"

    def __init__(self, weight_fp8, weight_scale, *, bias=None, use_ue8m0=False, backend="auto", out_dtype=None,
                 kernel="deepgemm"):
        super().__init__()
        if kernel not in _BLOCKWISE_KERNELS:
            raise ValueError(f"kernel must be one of {_BLOCKWISE_KERNELS} (the block-wise kernel family), got "
                             f"{kernel!r}")
        self.kernel = kernel
        if not isinstance(weight_fp8, torch.Tensor) or weight_fp8.dtype != torch.float8_e4m3fn or \
                weight_fp8.dim() != 2:
            raise TypeError("weight_fp8 must be a 2-D float8_e4m3fn tensor [out_features, in_features]")
        self.out_features, self.in_features = (int(n) for n in weight_fp8.shape)
        blocks = (-(-self.out_features // 128), -(-self.in_features // 128))
        if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != torch.float32 or \
                tuple(weight_scale.shape) != blocks:
            raise ValueError(f"weight_scale must be a float32 tensor of shape {blocks} (one per 128 x 128 block)")
        self.use_ue8m0 = bool(use_ue8m0)
        self.backend = backend
        if out_dtype not in (None, torch.bfloat16):
            raise UnsupportedFeatureError(f"recipe='blockwise' writes bfloat16 (DeepGEMM's 1d2d kernel), not "
                                          f"{out_dtype}")
        self.out_dtype = out_dtype  # None: DeepGEMM's bf16 result, widened to the input's dtype
        _register_weights(self, weight_fp8, weight_scale, bias)

    @classmethod
    def from_linear(cls, linear, *, profile=None, input_scale=None, pad_m_to=None, use_fast_accum=True,
                    out_dtype=None, splitk="auto", backend="auto", weight_scale=None, use_ue8m0=False,
                    kernel="deepgemm"):
        """Cast a ``torch.nn.Linear``'s weight once with ``per_block_cast_to_fp8`` (in the weight's dtype).

        Takes the options of :meth:`mmaemu.nn.EmulatedFP8Linear.from_linear`; those without a meaning for DeepGEMM
        raise: a ``profile``, an ``input_scale`` or ``weight_scale`` (its scales are per strip and per block, computed
        here), a ``splitk`` of more than one split (DeepGEMM has no split-K), an ``out_dtype`` other than bf16. With
        ``out_dtype=None`` (the default, as for the tensor-wise layer) the layer returns DeepGEMM's bf16 result
        converted to the input's dtype (exact for fp32 and bf16 inputs).
        ``use_fast_accum`` and ``pad_m_to`` change nothing (DeepGEMM always promotes every 128 k; rows are
        independent). ``kernel``: "deepgemm" (DeepGEMM's sm_90 kernel) or "cublaslt" (torch's F.scaled_mm through
        cuBLASLt >= 12.9; its profile is implied, so ``profile=`` still raises).
        """
        for name, value in (("profile", profile), ("input_scale", input_scale), ("weight_scale", weight_scale)):
            if value is not None:
                raise UnsupportedFeatureError(
                    f"recipe='blockwise' takes no {name}=: DeepGEMM's bits are those of any sm_90 GPU (no profile) "
                    "and its scales are one per 1 x 128 input strip and 128 x 128 weight block, computed by its casts")
        if not asks_one_split(splitk):
            raise UnsupportedFeatureError("recipe='blockwise' has no split-K (DeepGEMM's CTAs loop over all of K); "
                                          "use splitk='auto' or 1")
        from .deepgemm import per_block_cast_to_fp8

        weight = linear.weight.detach()
        weight_fp8, sf = per_block_cast_to_fp8(weight, use_ue8m0=use_ue8m0)
        bias = getattr(linear, "bias", None)
        return cls(weight_fp8, sf.float(), bias=None if bias is None else bias.detach(), use_ue8m0=use_ue8m0,
                   backend=backend, out_dtype=out_dtype, kernel=kernel)

    @classmethod
    def from_fp8_state(cls, weight_fp8, *, weight_scale, bias=None, use_ue8m0=False, backend="auto",
                       kernel="deepgemm"):
        """From a block-wise FP8 checkpoint: codes [out, in] and their ``weight_scale_inv``-style block scales
        [ceil(out/128), ceil(in/128)] (the multipliers DeepSeek-V3 checkpoints store as ``weight_scale_inv``)."""
        return cls(weight_fp8, weight_scale, bias=bias, use_ue8m0=use_ue8m0, backend=backend, kernel=kernel)

    def _quantise_input(self, x):
        from .deepgemm import per_token_cast_to_fp8

        x2 = _inference_rows(self, x)
        return per_token_cast_to_fp8(x2, use_ue8m0=self.use_ue8m0), tuple(x.shape[:-1])

    @untraced(reason=_GRAPH_BREAK_REASON)
    def forward(self, x):
        from .deepgemm import gemm_nt_kept, gemm_nt_kept_prefill, gemm_nt_kept_rows

        if self.kernel == "deepgemm" and not self.use_ue8m0:
            # the weight kept: a decoding step's cast and GEMM in one compiled call where it runs, a prefill's
            # compiled cast and kept plan around the front door's kernel
            rows = _inference_rows(self, x)
            y = gemm_nt_kept_rows(rows, self.weight, self.weight_scale, backend=self.backend, weights=weight_slot(self))
            if y is None:
                y = gemm_nt_kept_prefill(rows, self.weight, self.weight_scale, backend=self.backend,
                                         weights=weight_slot(self))
            if y is not None:
                return self._output(y, x, tuple(x.shape[:-1]))
        (x_fp8, sfa), lead = self._quantise_input(x)
        if self.kernel == "cublaslt":
            y = self._cublaslt_gemm(x_fp8, sfa)
        else:
            y = torch.empty((x_fp8.shape[0], self.out_features), dtype=torch.bfloat16, device=x_fp8.device)
            if x_fp8.shape[0]:
                gemm_nt_kept((x_fp8, sfa), (self.weight, self.weight_scale), y, backend=self.backend,
                             weights=weight_slot(self))
        return self._output(y, x, lead)

    def _output(self, y, x, lead):
        """The layer's output of the GEMM's bf16 rows ``y`` (DeepGEMM's bias added to them in bf16) for input
        ``x``."""
        if self.kernel != "cublaslt" and self.bias is not None:
            y = y + self.bias
        if self.out_dtype is None:
            y = y.to(x.dtype)
        return y.reshape(lead + (self.out_features,))

    def _cublaslt_gemm(self, x_fp8, sfa):
        """The bf16 [rows, out_features] of F.scaled_mm (1x128 x 128x128) through cuBLASLt, bias in its epilogue:
        rows padded to a multiple of 4 (zero codes, scale 1), the scales laid out as F.scaled_mm takes them."""
        from .blockwise_cublaslt import scaled_mm_blockwise
        from .platform.blockwise import PROFILE

        rows, chunks = x_fp8.shape[0], sfa.shape[1]
        padded = -(-rows // 4) * 4
        if not rows:
            return torch.empty((0, self.out_features), dtype=torch.bfloat16, device=x_fp8.device)
        a = torch.zeros((padded, self.in_features), dtype=x_fp8.dtype, device=x_fp8.device)
        a[:rows] = x_fp8
        scale_a = torch.ones((padded, chunks), dtype=torch.float32, device=x_fp8.device)
        scale_a[:rows] = sfa
        lead = -(-chunks // 4) * 4  # cuBLASLt's BLK128x128 layout: each row of blocks padded to 4 scales
        scale_b = torch.zeros((self.weight_scale.shape[0], lead), dtype=torch.float32, device=x_fp8.device)
        scale_b[:, :chunks] = self.weight_scale
        y = scaled_mm_blockwise(a, self.weight.t(), scale_a.t().contiguous().t(), scale_b.t(), block_a=(1, 128),
                                block_b=(128, 128), out_dtype=torch.bfloat16, bias=self.bias, profile=PROFILE,
                                backend=self.backend)
        return y[:rows]

    def explain(self, x):
        """The :class:`mmaemu.CallPlan` of the layer's GEMM for input ``x`` (its cast runs; the GEMM does not):
        DeepGEMM's 1d2d kernel on the engine of ``backend`` (:func:`mmaemu.plan.deepgemm.explain_blockwise`)."""
        if self.kernel == "cublaslt":
            raise UnsupportedFeatureError("explain() of a block-wise layer covers DeepGEMM's kernel; this layer runs "
                                          "mmaemu.blockwise_cublaslt.scaled_mm_blockwise: explain that call with "
                                          "mmaemu.explain (see docs/guide.md, 'Block-wise FP8')")
        from .context import for_call
        from .model.chunked import DEEPGEMM_SM90_1D2D
        from .plan.deepgemm import explain_blockwise

        (x_fp8, _), _ = self._quantise_input(x)
        return explain_blockwise(DEEPGEMM_SM90_1D2D, x_fp8.device, self.backend, context=for_call())

    def _recipe_repr(self):
        if self.kernel == "cublaslt":
            return ("recipe='blockwise' kernel='cublaslt' (torch F.scaled_mm through cuBLASLt >= 12.9, 1 x 128 "
                    f"inputs, 128 x 128 weights), use_ue8m0={self.use_ue8m0}")
        return (f"recipe='blockwise' (DeepGEMM sm_90 fp8_gemm_nt, 1 x 128 inputs, 128 x 128 weights), "
                f"use_ue8m0={self.use_ue8m0}")


class RowwiseFP8Linear(_ScaledMMRecipeLayer):
    """``y = x W^T (+ b)`` in row-wise FP8 (torchao's row-wise recipe) as torch 2.7.1's CUTLASS row-wise
    ``_scaled_mm`` computes it on the profile's GPU (the H100 profiles whose caller is torch: ``hopper``,
    ``hopper-ws0``; the others refuse it, see docs/guide.md "Row-wise scaling").

    Buffers: ``weight`` (float8_e4m3fn [out_features, in_features]), ``weight_scale`` (fp32 [out_features, 1]:
    torchao's per-channel multiplier, a power of two; the GEMM takes its reciprocal) and ``bias`` (bf16, or None;
    the kernel adds it in its epilogue). Inputs are cast per call with :func:`mmaemu.quantize.quantize_rowwise`,
    one scale per row (torchao's scales as the H100 computes them: see :func:`mmaemu.quantize.rowwise_scale`), so a
    row's result does not depend on the other rows of its batch. The GEMM writes bf16;
    with ``out_dtype=None`` (the default) the layer returns it in the input's dtype (exact for fp32 and bf16
    inputs). Inference only.
    """

    recipe = "rowwise"

    def __init__(self, weight_fp8, weight_scale, *, bias=None, profile=None, use_fast_accum=True, out_dtype=None,
                 splitk="auto", backend="auto"):
        super().__init__()
        if not isinstance(weight_fp8, torch.Tensor) or weight_fp8.dtype != torch.float8_e4m3fn or \
                weight_fp8.dim() != 2:
            raise TypeError("weight_fp8 must be a 2-D float8_e4m3fn tensor [out_features, in_features]")
        self.out_features, self.in_features = (int(n) for n in weight_fp8.shape)
        if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != torch.float32 or \
                tuple(weight_scale.shape) != (self.out_features, 1):
            raise ValueError(f"weight_scale must be a float32 tensor of shape ({self.out_features}, 1)")
        if out_dtype not in (None, torch.bfloat16):
            raise UnsupportedFeatureError(f"recipe='rowwise' writes bfloat16 (torch 2.7.1's row-wise kernel), not "
                                          f"{out_dtype}")
        if not asks_one_split(splitk):
            raise UnsupportedFeatureError("recipe='rowwise' has no split-K (torch 2.7.1's row-wise kernel never "
                                          "splits K); use splitk='auto' or 1")
        self.profile, self.use_fast_accum, self.out_dtype = profile, bool(use_fast_accum), out_dtype
        self.splitk, self.backend = splitk, backend
        _register_weights(self, weight_fp8, weight_scale, bias)

    @classmethod
    def from_linear(cls, linear, *, profile=None, input_scale=None, pad_m_to=None, use_fast_accum=True,
                    out_dtype=None, splitk="auto", backend="auto", weight_scale=None):
        """Cast a ``torch.nn.Linear``'s weight once per output channel (:func:`mmaemu.quantize.quantize_rowwise`).

        Takes the options of :meth:`mmaemu.nn.EmulatedFP8Linear.from_linear`; ``input_scale`` and
        ``weight_scale`` raise (the recipe computes one scale per row and per channel), ``pad_m_to`` changes
        nothing (rows are independent).
        """
        from .quantize import quantize_rowwise

        for name, value in (("input_scale", input_scale), ("weight_scale", weight_scale)):
            if value is not None:
                raise UnsupportedFeatureError(f"recipe='rowwise' takes no {name}=: its scales are one per input row "
                                              "and one per output channel, computed by torchao's row-wise cast")
        weight_fp8, scale = quantize_rowwise(linear.weight.detach())
        bias = getattr(linear, "bias", None)
        return cls(weight_fp8, scale, bias=None if bias is None else bias.detach(), profile=profile,
                   use_fast_accum=use_fast_accum, out_dtype=out_dtype, splitk=splitk, backend=backend)

    @untraced(reason=_GRAPH_BREAK_REASON)
    def forward(self, x):
        """As :meth:`_ScaledMMRecipeLayer.forward`; a CPU input of one cast task (a decoding step) is cast by one
        compiled call (:func:`mmaemu.quantize.rowwise_cast_codes`) and a kept plan's compiled call then takes its
        codes and the layer's kept scale and bias values directly (:func:`mmaemu.recipes.rowwise.
        kept_rowwise_call`): the same bits, less Python (docs/performance.md, "The row-wise decoding step")."""
        steps = _rowwise_steps()
        rows = _inference_rows(self, x)
        cast = steps.cast(rows) if self.weight.device.type == "cpu" else None
        if cast is None:
            return super().forward(x)
        codes, inverses = cast
        w_inverse, w_values, bias_values = self._epilogue_operands(steps)
        x_fp8 = torch.from_numpy(codes).view(torch.float8_e4m3fn)
        args = (x_fp8, self.weight.t(), torch.from_numpy(inverses).reshape(-1, 1), w_inverse)
        slot = weight_slot(self)
        with steps.edge():  # as in mmaemu.scaled_mm, with the weight kept in the layer's slot
            plan = steps.plan(*args, **self._options())
            y = self._kept_call(steps, plan, codes, inverses, w_values, bias_values, slot)
            if y is None:
                y = steps.run_plan(plan, weights=slot)
        y = y.to(x.dtype) if self.out_dtype is None else y
        return y.reshape(tuple(x.shape[:-1]) + (self.out_features,))

    def _kept_call(self, steps, plan, codes, inverses, w_values, bias_values, slot):
        """The bf16 output of a kept plan's compiled call (``plan.cpu_gemm``) on the cast's codes and the kept
        values, or None (no compiled call, or a buffer that is not plain data: the plan runs)."""
        gemm = getattr(plan, "cpu_gemm", None)
        if gemm is None or not steps.plain(self.weight) or (self.bias is not None and not steps.plain(self.bias)):
            return None
        return steps.kept_call(gemm, codes, inverses, w_values, bias_values,
                               steps.scale_order(codes.shape[0], self.out_features).x_first, self.weight, slot)

    def _epilogue_operands(self, steps):
        """(``weight_scale.reciprocal()`` [1, N], its values as float32 [N], the bias's fp32 values [N]), read at every
        call as the plan's path reads them (a buffer written through numpy changes no version counter)."""
        w_inverse = self.weight_scale.reciprocal().reshape(1, -1)
        return w_inverse, w_inverse.reshape(-1).numpy(), steps.bias_values(self.bias, self.out_features)

    def _options(self):
        return dict(bias=self.bias, out_dtype=torch.bfloat16, use_fast_accum=self.use_fast_accum,
                    profile=self.profile, splitk=self.splitk, backend=self.backend)

    def _gemm(self, x):
        from .quantize import quantize_rowwise

        x_fp8, x_scale = quantize_rowwise(_inference_rows(self, x))
        args = (x_fp8, self.weight.t(), x_scale.reciprocal(), self.weight_scale.reciprocal().reshape(1, -1))
        options = self._options()

        def finish(y):
            return y.to(x.dtype) if self.out_dtype is None else y

        return args, options, finish

    def _recipe_repr(self):
        return (f"recipe='rowwise' (torch 2.7.1 CUTLASS row-wise scaled_mm), profile={self.profile!r}, "
                f"use_fast_accum={self.use_fast_accum}")


def _rowwise_steps():
    """The functions of the row-wise layer's decoding step (:meth:`RowwiseFP8Linear.forward`), imported at its first
    call (they import the plan and the CPU engine, which importing this module does not) and kept: an import
    statement run at every call costs about a microsecond each."""
    global _ROWWISE_STEPS
    if _ROWWISE_STEPS is None:
        from types import SimpleNamespace

        from .api import run_scaled_mm_plan
        from .base._untraced import plain_tensor
        from .plan.cache import cached_plan_scaled_mm
        from .platform.rowwise import scale_order
        from .quantize import rowwise_cast_codes
        from .recipes.rowwise import _bias_values, kept_rowwise_call
        from .warn import edge

        _ROWWISE_STEPS = SimpleNamespace(cast=rowwise_cast_codes, plan=cached_plan_scaled_mm,
                                         run_plan=run_scaled_mm_plan, kept_call=kept_rowwise_call,
                                         plain=plain_tensor, scale_order=scale_order, bias_values=_bias_values,
                                         edge=edge)
    return _ROWWISE_STEPS


_ROWWISE_STEPS = None


class _BlockScaledLinear(_ScaledMMRecipeLayer):
    """The block-scaled recipes (:class:`MXFP8Linear`, :class:`MXFP4Linear`, :class:`NVFP4Linear`): torchao
    0.18.0's inference casts and ``_scaled_mm`` / ``F.scaled_mm`` call, computed by :func:`mmaemu.scaled_mm` on a
    block-scaled profile (default ``b200-mx-experimental``). Experimental: the casts are modelled from torchao's
    source, the GEMM from MMA-Sim's instructions; nothing was recorded on a B200 (docs/limitations.md). Inference
    only; inputs float32 or bfloat16 (the dtypes torchao casts).

    Buffers: ``weight`` (the weight's element codes), ``weight_scale`` (its block scales in plain layout [out_features,
    in_features / block]; swizzled per call), ``weight_global_scale`` (NVFP4 only) and ``bias``.
    """

    recipe = None
    block = None
    weight_dtype = scale_dtype = None

    def __init__(self, weight, weight_scale, *, weight_global_scale=None, bias=None, profile=None, backend="auto",
                 out_dtype=None):
        super().__init__()
        weight_dtype, scale_dtype = getattr(torch, self.weight_dtype), getattr(torch, self.scale_dtype)
        packing = 2 if self.weight_dtype == "float4_e2m1fn_x2" else 1
        if not isinstance(weight, torch.Tensor) or weight.dtype != weight_dtype or weight.dim() != 2:
            raise TypeError(f"weight must be a 2-D {self.weight_dtype} tensor [out_features, in_features"
                            f"{' / 2' if packing == 2 else ''}]")
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1]) * packing
        blocks = (self.out_features, self.in_features // self.block)
        if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != scale_dtype or \
                tuple(weight_scale.shape) != blocks:
            raise ValueError(f"weight_scale must be a {self.scale_dtype} tensor of shape {blocks} (one per "
                             f"{self.block} elements of in_features, plain layout)")
        allowed = (None, torch.bfloat16) if self.recipe in ("mxfp8", "mxfp4") else (None,)
        if out_dtype not in allowed:
            raise UnsupportedFeatureError(f"recipe={self.recipe!r} returns {self._output_text}, not {out_dtype}")
        self.profile = profile if profile is not None else _BLOCK_SCALED_PROFILE
        from .platform.block_scaled import refusal
        from .platform.profiles import get_profile

        refused = refusal(get_profile(self.profile))  # an unknown name raises KeyError here, as scaled_mm would
        if refused:
            raise UnsupportedFeatureError(f"recipe={self.recipe!r}: {refused}")
        self.backend, self.out_dtype = backend, out_dtype
        self.register_buffer("weight", weight.detach().contiguous())
        self.register_buffer("weight_scale", weight_scale.detach().contiguous())
        if self.recipe == "nvfp4":
            if not isinstance(weight_global_scale, torch.Tensor) or weight_global_scale.dtype != torch.float32 or \
                    weight_global_scale.numel() != 1:
                raise ValueError("weight_global_scale must be a one-element float32 tensor (NVFP4's per-tensor scale)")
            self.register_buffer("weight_global_scale", weight_global_scale.detach().reshape(()))
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (self.out_features,)):
            raise ValueError(f"bias must be a tensor of shape ({self.out_features},)")
        self.register_buffer("bias", None if bias is None else bias.detach().to(weight.device))
        from .warn import Notice, report

        report([Notice(ExperimentalPresetWarning, self._maturity, ("nn recipe", self.recipe))])

    @classmethod
    def from_linear(cls, linear, *, profile=None, input_scale=None, pad_m_to=None, use_fast_accum=True,
                    out_dtype=None, splitk="auto", backend="auto", weight_scale=None):
        """Cast a ``torch.nn.Linear``'s weight once along in_features, as torchao 0.18.0 casts it.

        Takes the options of :meth:`mmaemu.nn.EmulatedFP8Linear.from_linear`; ``input_scale`` and ``weight_scale``
        raise (the recipe's scales are per block, computed by its casts), ``splitk`` must be "auto" or 1 (the
        profile never splits K), ``profile`` must be a block-scaled one (default ``b200-mx-experimental``).
        ``use_fast_accum`` and ``pad_m_to`` change nothing: torchao's ``_scaled_mm`` calls leave
        ``use_fast_accum=False``, and rows are independent.
        """
        for name, value in (("input_scale", input_scale), ("weight_scale", weight_scale)):
            if value is not None:
                raise UnsupportedFeatureError(f"recipe={cls.recipe!r} takes no {name}=: its scales are one per block "
                                              f"of {cls.block} elements, computed by torchao's casts")
        if not asks_one_split(splitk):
            raise UnsupportedFeatureError(f"recipe={cls.recipe!r} has no split-K (the profile "
                                          f"{_BLOCK_SCALED_PROFILE!r} computes one chain per output, splitk=1)")
        weight = linear.weight.detach()
        if weight.dim() != 2 or weight.shape[1] % cls.k_multiple:
            raise UnsupportedFeatureError(f"recipe={cls.recipe!r} needs in_features to be a multiple of "
                                          f"{cls.k_multiple}, got weight shape {tuple(weight.shape)}")
        bias = getattr(linear, "bias", None)
        return cls(*cls._cast_weight(weight), bias=None if bias is None else bias.detach(), profile=profile,
                   backend=backend, out_dtype=out_dtype)

    def _input_rows(self, x):
        rows = _inference_rows(self, x)
        if rows.dtype not in (torch.float32, torch.bfloat16):
            raise UnsupportedFeatureError(f"recipe={self.recipe!r} casts float32 or bfloat16 inputs (torchao's), "
                                          f"got {rows.dtype}")
        return rows

    def _scaled_mm_options(self, out_dtype):
        return dict(out_dtype=out_dtype, use_fast_accum=False, profile=self.profile, splitk=1,
                    backend=self.backend)

    def _swizzled_weight_scale(self):
        """``to_blocked(self.weight_scale)``, made once and kept while the buffer holds the same codes (compared on
        every use: a few bytes per row), so that a call does not swizzle the weight's scales again; the same
        tensor every time, so that the GEMM finds the weight's kept preparation."""
        from .scale_layout import to_blocked

        codes = self.weight_scale.view(torch.uint8)
        kept = self.__dict__.get("_kept_swizzled_scale")
        if kept is None or kept[0].shape != codes.shape or kept[0].device != codes.device or \
                not _same_codes(kept[0], codes):
            kept = self.__dict__["_kept_swizzled_scale"] = (codes.clone(), to_blocked(self.weight_scale))
        return kept[1]

    @untraced(reason=_GRAPH_BREAK_REASON)
    def forward(self, x):
        from .api import run_scaled_mm_plan
        from .plan.cache import cached_plan_scaled_mm
        from .warn import edge

        args, options, finish, cast = self._block_gemm(x)
        slot = weight_slot(self)
        with edge():  # as in mmaemu.scaled_mm, with the weight kept in the layer's slot
            plan = cached_plan_scaled_mm(*args, **options)
            y = self._kept_gemm(plan, cast, slot)
            if y is None:
                y = run_scaled_mm_plan(plan, weights=slot)
        return finish(y).reshape(tuple(x.shape[:-1]) + (self.out_features,))

    def _gemm(self, x):
        return self._block_gemm(x)[:3]

    def _kept_gemm(self, plan, cast, slot):
        """The GEMM's result as ``run_scaled_mm_plan`` computes it (the same bits), for a plan computed by the CPU's
        fast path whose K needs no padding, with the weight kept in the layer's slot: the kernel reads the input's
        plain codes and scales of its cast (:class:`mmaemu.block_quantize.CastRows`) and the weight's from its own
        buffers (plain layout: no swizzled scales mapped back per call), the preset's tables and parameters kept
        (:func:`mmaemu.cpu.block_scaled.accumulate_kept`). None where that does not apply."""
        call = plan.call
        if (slot is None or plan.action != "compute" or plan.backend != "cpu" or call.device.type != "cpu"
                or call.out is not None or call.spec.padded_K != call.spec.K):
            return None
        from .cpu.block_scaled import accumulate_kept
        from .recipes.block_scaled import _block_scaled_epilogue

        spec = call.spec
        acc = accumulate_kept(cast.codes, cast.scales, spec.fmt_a, self._kept_weight(slot, spec), spec.preset,
                              spec.recipe.scale_fmt)
        return _block_scaled_epilogue(torch.from_numpy(acc), call)

    def _kept_weight(self, slot, spec):
        """The weight's :class:`mmaemu.cpu.block_scaled.KeptBlockScaledB` from the layer's slot: prepared from its
        codes and plain scale codes, used again while both hold the bytes it was prepared from."""
        import numpy

        from .cpu.block_scaled import plain_b_engine
        from .recipes.block_scaled import _kept_unchanged

        raw = self.weight.detach().view(torch.uint8).numpy().reshape(-1)
        scales = self.weight_scale.detach().view(torch.uint8).numpy().reshape(-1)
        engine = plain_b_engine(spec.fmt_b, spec.recipe.scale_fmt, spec.block, self.out_features, spec.K)
        kept = _kept_unchanged(slot.candidate(engine, spec.fmt_b, self.weight), raw, scales)
        if kept is None:
            kept = slot.prepared(engine, spec.fmt_b, self.weight, numpy.concatenate((raw, scales)).reshape(1, -1))
        return kept

    def _recipe_repr(self):
        return (f"recipe={self.recipe!r} (torchao 0.18.0 casts, block-scaled scaled_mm, experimental), "
                f"profile={getattr(self.profile, 'name', self.profile)!r}")


def _same_codes(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two uint8 tensors of one shape and device hold the same bytes: on the CPU compared by numpy on the
    calling thread (:func:`mmaemu.cpu.prepared.same_bytes`), as ``torch.equal`` of 32768 bytes or more starts torch's
    intra-op threads, whose parallel region measured 18 ms a call on a busy machine (a (1536, 36) NVFP4 weight's
    scales: docs/performance.md, "Recipe layers")."""
    if x.device.type != "cpu":
        return torch.equal(x, y)
    from .cpu.prepared import same_bytes

    return same_bytes(x.contiguous().numpy().reshape(-1), y.contiguous().numpy().reshape(-1))


_BLOCK_SCALED_PROFILE = "b200-mx-experimental"


def _table_row(name: str) -> tuple:
    """``(recipe, block, k_multiple, weight_dtype, scale_dtype)`` of the layer of a block-scaled variant, from the
    one table of them (:data:`mmaemu.platform.block_scaled.RECIPES`)."""
    row = _BLOCK_SCALED_TABLE[name]
    return row.name, row.block, row.k_multiple, row.operand_dtypes[0], row.scale_dtype


class MXFP8Linear(_BlockScaledLinear):
    """``y = x W^T (+ b)`` as torchao 0.18.0's MXFP8 inference recipe runs on a B200 (experimental, modelled).

    Weight and inputs: :func:`mmaemu.block_quantize.quantize_mx` (E4M3 elements, one UE8M0 scale per 32 elements
    of in_features, torchao's default ``"floor"`` scale rule). GEMM: ``scaled_mm(x_codes, weight.t(),
    scale_a=swizzled input scales, scale_b=swizzled weight scales, out_dtype=torch.bfloat16)``, torchao's
    ``_scaled_mm`` call. The bias is added to the bf16 result in bf16 afterwards: torchao passes it to
    ``_scaled_mm``, whose fused bias epilogue on a B200 is not modelled, so with a bias the result is that of a
    model adding it after the GEMM. With ``out_dtype=None`` the layer returns the bf16 result in the input's dtype.
    """

    recipe, block, k_multiple, weight_dtype, scale_dtype = _table_row("mxfp8")
    element_fmt = "e4m3"
    _output_text = "bfloat16 (torchao's _scaled_mm call), or with out_dtype=None the input's dtype"
    _maturity = ("mmaemu: recipe='mxfp8' is experimental: torchao 0.18.0's MX cast (modelled from its source) and "
                 "the B200 block-scaled GEMM of profile 'b200-mx-experimental' (modelled, not recorded); a bias is "
                 "added after the GEMM (docs/limitations.md)")

    @classmethod
    def _cast_weight(cls, weight):
        from .block_quantize import quantize_mx

        q = quantize_mx(weight, cls.element_fmt)
        return q.codes, q.scales

    def _block_gemm(self, x):
        from .block_quantize import cast_rows

        cast = cast_rows(self._input_rows(x), "mx", self.element_fmt)
        q = cast.quantized
        args = (q.codes, self.weight.t(), q.scales, self._swizzled_weight_scale())
        out_dtype = x.dtype if self.out_dtype is None else self.out_dtype

        def finish(y):
            if self.bias is not None:
                y = y + self.bias.to(torch.bfloat16)
            return y.to(out_dtype)

        return args, self._scaled_mm_options(torch.bfloat16), finish, cast


class MXFP4Linear(MXFP8Linear):
    """``y = x W^T (+ b)`` as torchao 0.18.0's MXFP4 inference recipe runs on a B200 (experimental, modelled).

    As :class:`MXFP8Linear` with E2M1 elements (:func:`mmaemu.block_quantize.quantize_mx` with ``"e2m1"``, one UE8M0
    scale per 32 elements of in_features; in_features a multiple of 32, torch's rule for packed FP4). torchao calls
    ``F.scaled_mm(x_codes, weight.t(), BlockWise1x32 scales, swizzle 32_4_4, bias=bias, output_dtype=bfloat16)``,
    which the same GEMM computes here (``kind::mxf4``, :mod:`mmaemu.platform.block_scaled`). The bias is added to the
    bf16 result in bf16 afterwards: on sm_100 torch's ``_scaled_mm_v2`` hands MXFP4 to FBGEMM's ``f4f4bf16``, which
    receives no bias in the pinned torch source (so torchao's layer may return the GEMM without it there; the
    warning says so).
    """

    recipe, block, k_multiple, weight_dtype, scale_dtype = _table_row("mxfp4")
    element_fmt = "e2m1"
    _maturity = ("mmaemu: recipe='mxfp4' is experimental: torchao 0.18.0's MX cast (modelled from its source) and "
                 "the B200 block-scaled GEMM of profile 'b200-mx-experimental' (modelled, not recorded); a bias is "
                 "added after the GEMM, while torch's F.scaled_mm MXFP4 kernel on sm_100 (FBGEMM f4f4bf16) is handed "
                 "no bias in the pinned torch source (docs/limitations.md)")


class NVFP4Linear(_BlockScaledLinear):
    """``y = x W^T (+ b)`` as torchao 0.18.0's NVFP4 inference recipe (dynamic per-tensor scales) runs on a B200
    (experimental, modelled).

    Weight and inputs: :func:`mmaemu.block_quantize.quantize_nvfp4` with the dynamic global scale (E2M1 elements,
    one UE4M3 scale per 16 elements of in_features, torchao's ``max|t| / 2688`` per tensor as the B200 computes it:
    ``max|t| * fp32(1 / 2688)``). GEMM, as torchao's
    ``_addmm_nvfp4_dispatch``: ``scaled_mm(x_codes, weight.t(), scale_a=swizzled input scales,
    scale_b=swizzled weight scales, out_dtype=the input's dtype)`` (no global scale inside the GEMM), then the result
    times ``fp32(g_x * g_w)`` converted to the input's dtype, then plus the bias in the input's dtype: each one
    torch operation of two tensors, the same on the B200's kernels as on the CPU's.
    """

    recipe, block, k_multiple, weight_dtype, scale_dtype = _table_row("nvfp4")
    _output_text = "the input's dtype (torchao's out_dtype); use out_dtype=None"
    _maturity = ("mmaemu: recipe='nvfp4' is experimental: torchao 0.18.0's NVFP4 cast (modelled from its source) "
                 "and the B200 block-scaled GEMM of profile 'b200-mx-experimental' (modelled, not recorded) "
                 "(docs/limitations.md)")

    @staticmethod
    def _cast_weight(weight):
        from .block_quantize import quantize_nvfp4

        q = quantize_nvfp4(weight, global_scale="dynamic")
        return q.codes, q.scales, torch.tensor(q.global_scale, dtype=torch.float32, device=weight.device)

    def __init__(self, weight, weight_scale, weight_global_scale=None, **options):
        super().__init__(weight, weight_scale, weight_global_scale=weight_global_scale, **options)

    def _block_gemm(self, x):
        from .block_quantize import cast_rows

        rows = self._input_rows(x)
        cast = cast_rows(rows, "nvfp4")
        q = cast.quantized
        args = (q.codes, self.weight.t(), q.scales, self._swizzled_weight_scale())
        dtype = rows.dtype
        scale_result = torch.tensor(q.global_scale, dtype=torch.float32, device=rows.device) * \
            self.weight_global_scale.to(rows.device)

        def finish(y):
            y = y * scale_result.to(dtype)
            if self.bias is not None:
                y = y + self.bias.to(dtype)
            return y

        return args, self._scaled_mm_options(dtype), finish, cast


RECIPES = {"blockwise": BlockwiseFP8Linear, "rowwise": RowwiseFP8Linear, "mxfp8": MXFP8Linear,
           "mxfp4": MXFP4Linear, "nvfp4": NVFP4Linear}


def recipe_layer(recipe):
    """The layer class of a recipe other than "tensorwise" (:data:`RECIPES`)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; expected 'tensorwise' or one of {sorted(RECIPES)}")
    return RECIPES[recipe]
