"""Per-tensor FP8 quantisation as Transformer Engine computes it: the bits of TE's cast and of its scaling factors.

TE (delayed and current per-tensor scaling) quantises a tensor ``x`` with an fp32 *scale* ``s`` as

1. ``y = fp32(x) * s`` — one IEEE fp32 multiplication (bf16/fp16/fp32 inputs convert to fp32 exactly);
2. ``q = cvt_satfinite_rn(y)`` — round to nearest, ties to even, into E4M3 or E5M2, *saturating*: a finite or
   infinite ``|y|`` beyond the format's largest value gives ±448 (E4M3) or ±57344 (E5M2); NaN gives the NaN code
   0x7F (sign dropped). Subnormal FP8 results are kept (gradual underflow); a negative value that rounds to zero
   gives the negative-zero code 0x80.

Step 2 equals "clamp ``y`` to [-max, max], then round to nearest even" for every finite and infinite ``y``.
The GEMM then receives the *inverse* scale ``scale_inv = fp32(1 / s)`` (one correctly rounded fp32 division),
which is what TE stores next to the FP8 data and hands to cuBLASLt as the A/B scale.

The scaling factors (:func:`scale_from_amax`) follow TE's two per-tensor recipes:

* ``recipe="delayed"`` (``DelayedScaling``; kernel ``delayed_scaling.cu``): ``s = (fp8_max * 2**-margin) / amax``
  in fp32 when amax is finite and > 0, else the previous scale is kept (1.0 initially); an amax so small that
  the quotient overflows gives the largest fp32 value (as current TE sources guard it; earlier
  releases kept ``inf``).
* ``recipe="current"`` (``Float8CurrentScaling``; ``compute_scale_from_amax`` in ``recipe_common.cuh``): amax
  below ``epsilon`` is raised to it; amax of 0, ±inf or NaN gives ``s = 1``; otherwise ``s = fp8_max / amax``
  in fp32, an overflow to inf gives the largest fp32 value; optionally rounded down to a power of two. TE's
  current scaling has no margin.

The amax itself (:func:`compute_amax`) is TE's ``max |x|`` reduction: NaN elements are ignored (``fmaxf``),
infinities are kept, and an empty tensor has amax 0.

Assumptions about Transformer Engine, beyond the TE sources named above (see docs/limitations.md): TE is built
without ``--use_fast_math`` (its default), so ``x * s`` and ``1 / s`` are IEEE operations; the hardware
conversion ``cvt.rn.satfinite`` (sm_90) returns 0x7F for every NaN as the ``cuda_fp8.hpp`` software path
(used on sm_89) does.

**Which device's kernels.** The per-tensor functions follow Transformer Engine's CUDA kernels (the amax reduction,
``compute_scale_from_amax``, the scale update of ``delayed_scaling.cu``, the cast): their divisions and
multiplications are IEEE fp32 operations in device code, not torch's division of a tensor by a Python number, so a
correctly rounded fp32 division is the GPU's result, on every device. The row-wise functions follow torchao's
eager torch expressions as the reference GPU runs them (:func:`rowwise_scale` says which operations matter;
docs/semantics.md, section 13, has the table of the operations checked).

Everything here is computed with exact IEEE fp32 operations and integer bit manipulation, on the tensor's own
device; torch's own float8 casts are only used for values that are exactly representable (no rounding involved).
Every public function here refuses to compute on a CPU thread in flush-to-zero / denormals-are-zero mode (one
check, the :class:`~mmaemu.errors.MmaemuError` that ``scaled_mm`` raises), since it would flush subnormal scales,
amaxes and products silently; the scalar helpers (``scale_inv``, ``scale_from_amax``) compute on the CPU for tensors
of every device.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from . import formats
from .base.gpu_torch_ops import power_of_two_floor

__all__ = [
    "FP8_MAX",
    "quantize",
    "quantize_current",
    "quantize_e4m3",
    "quantize_e5m2",
    "dequantize",
    "compute_amax",
    "scale_from_amax",
    "amax_scale",
    "scale_inv",
    "rowwise_scale",
    "quantize_rowwise",
]

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLT_MAX = float(np.finfo(np.float32).max)
RECIPES = ("delayed", "current")


# ----------------------------------------------------------------------------------------------------------------
# Scalars: fp32 values held as Python floats or one-element fp32 tensors


def _fmt(fmt) -> str:
    if fmt in FP8_MAX:
        return fmt
    try:
        return formats.fmt_of(fmt)
    except ValueError:
        raise ValueError(f"fmt must be 'e4m3' or 'e5m2' (or the matching torch float8 dtype), got {fmt!r}") from None


def _f32(value) -> np.float32:
    """An fp32 scalar from a Python/numpy number (rounded to nearest even) or a one-element fp32 tensor."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"expected a one-element tensor, got shape {tuple(value.shape)}")
        if value.dtype != torch.float32:
            raise TypeError(f"scales and amax values are fp32 in Transformer Engine; got a {value.dtype} tensor "
                            "(convert it with .float() if that rounding is intended)")
        return np.float32(value.detach().reshape(()).cpu().item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"expected a real number or a one-element fp32 tensor, got {type(value).__name__}")
    return np.float32(value)


def _like(value: np.float32, template):
    """Return an fp32 result in the kind of ``template``: a 0-dim fp32 tensor on its device, else a float."""
    if isinstance(template, torch.Tensor):
        return torch.tensor(float(value), dtype=torch.float32, device=template.device)
    return float(value)


def _refuse_flush_to_zero(device=None) -> None:
    """Raise the cast's MmaemuError when this CPU thread flushes fp32 subnormals and the work runs on the CPU
    (``device`` None: numpy scalar arithmetic, always on the CPU), as it would return flushed values silently."""
    if device is None or device.type == "cpu":
        from .plan.flush import check_no_flush_to_zero

        check_no_flush_to_zero()


def _div(a: np.float32, b: np.float32) -> np.float32:
    """One IEEE fp32 division (inf/NaN results allowed, no warnings)."""
    with np.errstate(all="ignore"):
        return np.float32(a) / np.float32(b)


def scale_inv(scale):
    """TE's inverse scale: ``1 / scale`` as one correctly rounded fp32 division.

    ``scale``: a number (taken as fp32) or a one-element fp32 tensor; the result has the same kind (a 0-dim fp32
    tensor on the same device, or a float). This is the value TE stores as ``scale_inv`` and passes to the GEMM,
    i.e. the ``scale_a`` / ``scale_b`` of :func:`mmaemu.scaled_mm`.
    """
    _refuse_flush_to_zero()
    return _like(_div(np.float32(1.0), _f32(scale)), scale)


# ----------------------------------------------------------------------------------------------------------------
# amax and scaling factors


def compute_amax(x):
    """TE's per-tensor amax: ``max |x|`` over all elements, NaN elements ignored, 0 for an empty tensor.

    Returns a 0-dim fp32 tensor on ``x``'s device (exact: the maximum of bf16/fp16/fp32 magnitudes).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"compute_amax: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"compute_amax: expected a floating-point tensor, got {x.dtype}")
    x = x.detach()
    _refuse_flush_to_zero(x.device)
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    if x.device.type == "cpu" and x.dtype in _INPUT_DTYPES:
        return _cpu_amax(x)
    return _amax_torch(x)


def _amax_torch(x: torch.Tensor) -> torch.Tensor:
    """:func:`compute_amax` of a non-empty tensor with torch operations (GPU tensors, float64; the oracle of the
    compiled CPU amax in ``tests/test_quantize.py``)."""
    magnitude = x.abs()
    magnitude = torch.where(torch.isnan(magnitude), torch.zeros((), dtype=x.dtype, device=x.device), magnitude)
    return magnitude.max().to(torch.float32)


def _cpu_amax(x: torch.Tensor) -> torch.Tensor:
    """:func:`compute_amax` of a non-empty CPU fp32 / bf16 / fp16 tensor: its values widened exactly to fp32 by
    numpy (a bf16 pattern is the top half of its fp32 pattern), then one compiled pass on the fp32 bits
    (:func:`mmaemu.cpu.cast.amax_fp32`, on mmaemu's own pool): the same value as torch's ``abs``, NaN-to-zero
    ``where`` and ``max``, without torch's intra-op threads. Those start for tensors of 32768 elements or more and,
    beside mmaemu's pool on a busy machine, measured 16 ms per operation in some calls (a layer's (64, 576) input:
    2.3 ms forwards taking 100-380 ms; docs/performance.md, "Recipe layers")."""
    from .cpu.cast import amax_fp32

    return torch.tensor(float(amax_fp32(_cpu_float32_values(x))), dtype=torch.float32)


def _cpu_float32_values(x: torch.Tensor) -> np.ndarray:
    """The values of a CPU fp32 / bf16 / fp16 tensor as a flat, C-contiguous float32 numpy array, widened exactly
    by numpy (a bf16 pattern is the top half of its fp32 pattern), not by torch's intra-op threads."""
    flat = x.contiguous().reshape(-1)
    if x.dtype == torch.float32:
        return flat.numpy()
    if x.dtype == torch.bfloat16:
        return (flat.view(torch.int16).numpy().astype(np.int32) << np.int32(16)).view(np.float32)
    return flat.view(torch.int16).numpy().view(np.float16).astype(np.float32)


def _check_margin(margin) -> int:
    if isinstance(margin, bool) or not isinstance(margin, (numbers.Integral, np.integer)):
        if isinstance(margin, numbers.Real) and float(margin).is_integer():
            return int(margin)
        raise ValueError(f"margin must be an integer (a power-of-two headroom), got {margin!r}")
    return int(margin)


def scale_from_amax(amax, fmt="e4m3", margin=0, *, recipe="delayed", previous_scale=1.0, epsilon=0.0,
                    power_2=False):
    """TE's fp32 scaling factor for a tensor whose amax is ``amax`` (see the module docstring for the rules).

    ``recipe="delayed"``: ``(fp8_max * 2**-margin) / amax`` when amax is finite and > 0, else ``previous_scale``
    (TE keeps the old scale; 1.0 at the start); an infinite result becomes the largest fp32 value.
    ``recipe="current"``: amax < ``epsilon`` → epsilon; amax 0, inf or
    NaN → 1.0; else ``fp8_max / amax`` with an inf result replaced by the largest fp32 value; ``power_2`` keeps
    only the exponent bits (TE's ``force_pow_2_scales``). ``margin`` must be an integer and is only meaningful
    for the delayed recipe (TE's current scaling has none: a nonzero margin there raises ValueError).

    ``amax``: a number or a one-element fp32 tensor; the result is of the same kind.
    """
    fmt = _fmt(fmt)
    margin = _check_margin(margin)
    _refuse_flush_to_zero()
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    a = _f32(amax)
    fp8_max = np.float32(FP8_MAX[fmt])
    if recipe == "delayed":
        if epsilon != 0.0 or power_2:
            raise ValueError("epsilon and power_2 belong to TE's current scaling (recipe='current')")
        scaled_max = np.float32(fp8_max * np.float32(2.0 ** -margin))
        if math.isfinite(a) and a > 0:
            scale = _div(scaled_max, a)
        else:
            scale = _f32(previous_scale)
        if math.isinf(scale):
            scale = np.float32(_FLT_MAX)
        return _like(scale, amax)
    if margin != 0:
        raise ValueError("TE's current scaling (recipe='current') has no margin; use margin=0 or recipe='delayed'")
    eps = _f32(epsilon)
    if a < eps:
        a = eps
    if math.isinf(a) or a == 0 or math.isnan(a):
        return _like(np.float32(1.0), amax)
    scale = _div(fp8_max, a)
    if math.isinf(scale):
        scale = np.float32(_FLT_MAX)
    if power_2:
        bits = np.array([scale], dtype=np.float32).view(np.uint32) & np.uint32(0xFF800000)
        scale = bits.view(np.float32)[0]
    return _like(scale, amax)


def amax_scale(x, fmt="e4m3", margin=0, *, recipe="current", previous_scale=1.0, epsilon=0.0, power_2=False):
    """The scaling factor TE derives from this tensor's own amax: ``scale_from_amax(compute_amax(x), ...)``.

    Default ``recipe="current"`` (TE's current scaling, what a per-call input scale is); ``recipe="delayed"``
    with ``margin`` gives the delayed-scaling factor for an amax history whose maximum is this tensor's amax.
    Returns a 0-dim fp32 tensor on ``x``'s device.
    """
    return scale_from_amax(compute_amax(x), fmt, margin, recipe=recipe, previous_scale=previous_scale,
                           epsilon=epsilon, power_2=power_2)


# ----------------------------------------------------------------------------------------------------------------
# The cast


def _scale_tensor(scale, device) -> torch.Tensor:
    return torch.tensor(float(_f32(scale)), dtype=torch.float32, device=device)


def quantize(x, scale, fmt="e4m3"):
    """TE's per-tensor cast of ``x`` (fp32, bf16 or fp16) with the fp32 multiplier ``scale`` into ``fmt``.

    Computes ``fp32(x) * scale`` (one fp32 multiplication), clamps to ±448 (E4M3) / ±57344 (E5M2) and rounds to
    nearest even into the FP8 format; NaN → 0x7F. ``scale`` is TE's *scale* (the multiplier, e.g. from
    :func:`amax_scale`), not its inverse; a Python number is first rounded to fp32. Returns a float8 tensor of
    ``x``'s shape on ``x``'s device.
    """
    fmt = _fmt(fmt)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"quantize: Transformer Engine casts float32, bfloat16 or float16 tensors; got {x.dtype}")
    x = x.detach()
    _refuse_flush_to_zero(x.device)
    if x.device.type == "cpu":  # one compiled loop (mmaemu.cpu.cast), the same bits as the torch operations
        from .cpu.cast import quantize_fp8

        values = x.to(torch.float32).contiguous().reshape(-1).numpy()
        codes = torch.from_numpy(quantize_fp8(values, _f32(scale), fmt)).reshape(x.shape)
        return codes.view(formats.DTYPE_OF[fmt])
    y = x.to(torch.float32) * _scale_tensor(scale, x.device)
    return _round_to_fp8(y, fmt)


def quantize_current(x, fmt="e4m3"):
    """``(q, scale_inv)``: TE's current scaling of ``x`` (fp32, bf16 or fp16), ``q = quantize(x, s, fmt)`` with
    ``s = amax_scale(x, fmt)`` (recipe "current", no epsilon, no power of two) and ``scale_inv(s)``, the inverse
    scale the GEMM takes (a 0-dim fp32 tensor on x's device): what a layer with per-call input scaling computes.
    A non-empty CPU ``x`` whose cast is one task (:func:`mmaemu.cpu.cast.fits_one_pass`) takes one compiled call
    for the amax, both scales and the cast (:func:`mmaemu.cpu.cast.current_scaling_fp8`: the same bits, the same
    IEEE fp32 divisions; ``tests/test_quantize.py``); any other takes those three functions."""
    fmt = _fmt(fmt)
    if (isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype in _INPUT_DTYPES
            and 0 < x.numel()):
        from .cpu.cast import current_scaling_fp8, fits_one_pass

        if fits_one_pass(x.numel()):
            _refuse_flush_to_zero(x.device)
            codes, scales = current_scaling_fp8(_cpu_float32_values(x.detach()), fmt)
            q = torch.from_numpy(codes.reshape(x.shape)).view(formats.DTYPE_OF[fmt])
            return q, torch.from_numpy(scales[1:].reshape(()))
    s = amax_scale(x, fmt)
    return quantize(x, s, fmt), scale_inv(s)


def _round_to_fp8(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Saturating round-to-nearest-even of fp32 values into an FP8 format (exact integer/power-of-two steps)."""
    fp8_max = FP8_MAX[fmt]
    mbits = formats.MANT_BITS[fmt]
    emin = formats.EMIN[fmt]
    y = torch.clamp(y, -fp8_max, fp8_max)  # NaN passes through; +-inf becomes +-max
    # Alignment exponent of each value, read from the fp32 exponent field (fp32 subnormals and zeros clamp to emin).
    exponent = ((y.view(torch.int32) >> 23) & 0xFF) - 127
    exponent = torch.clamp(exponent, min=emin, max=15)  # 15: above every finite clamped value; NaN lands here
    # 2**(mbits - exponent) and its inverse, built from their fp32 bit patterns (exact powers of two).
    up = ((mbits - exponent + 127) << 23).to(torch.int32).view(torch.float32)
    down = ((exponent - mbits + 127) << 23).to(torch.int32).view(torch.float32)
    rounded = torch.round(y * up) * down  # torch.round is round-half-to-even; every step here is exact
    codes = rounded.to(formats.DTYPE_OF[fmt]).view(torch.uint8)  # exactly representable: no rounding in the cast
    codes = torch.where(torch.isnan(y), torch.full_like(codes, formats.CANONICAL_NAN_BITS["float8_e4m3fn"]), codes)
    return codes.view(formats.DTYPE_OF[fmt])


def quantize_e4m3(x, scale):
    """``quantize(x, scale, "e4m3")``: TE's E4M3 cast (saturating at ±448, round to nearest even, NaN → 0x7F)."""
    return quantize(x, scale, "e4m3")


def quantize_e5m2(x, scale):
    """``quantize(x, scale, "e5m2")``: TE's E5M2 cast (saturating at ±57344, round to nearest even, NaN → 0x7F)."""
    return quantize(x, scale, "e5m2")


def dequantize(q, scale_inv, dtype=torch.float32):
    """TE's dequantisation: ``fp32(q) * scale_inv`` (one fp32 multiplication), then converted to ``dtype``.

    ``scale_inv`` is the inverse scale (as stored by TE), a number or a one-element fp32 tensor.
    """
    if not isinstance(q, torch.Tensor) or not formats.is_fp8_dtype(q.dtype):
        raise TypeError("dequantize: expected a float8_e4m3fn or float8_e5m2 tensor")
    _refuse_flush_to_zero(q.device)
    y = q.detach().to(torch.float32) * _scale_tensor(scale_inv, q.device)
    return y.to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# Row-wise (axis-wise) quantisation as torchao's float8 row-wise recipe computes it


#: torchao's ``EPS`` (``torchao/float8/float8_utils.py``): the smallest amax a scale is computed from.
TORCHAO_EPS = 1e-12


def rowwise_scale(x, fmt="e4m3", *, round_scales_to_power_of_2=True) -> torch.Tensor:
    """fp32 scales [rows, 1] of a 2-D tensor ``x`` [rows, cols], one per row, as torchao computes them on the GPU.

    torchao (``torchao/float8/float8_utils.py`` of pytorch/ao at commit 00141f40b97ef7adeb95e756bcb33d2b1c8a660f,
    and of torchao 0.18.0: ``tensor_to_amax`` with ``AXISWISE`` granularity and ``amax_to_scale``):
    ``amax = max |x|`` along the row (bf16 widened to fp32 first), exact on every device; ``fp8_max / amax64``
    with amax64 = max(fp64(amax), 1e-12) is a Python number divided by a tensor, which torch computes on every
    device as ``amax64.reciprocal() * fp8_max`` (``Tensor.__rtruediv__``): two correctly rounded float64
    operations, then rounded to fp32 (equal to ``fp32(fp8_max / amax)`` for every fp32 amax: the quotient never
    lies within 2**-49 of an fp32 rounding boundary). Those are computed with the same torch operations on x's
    device. With ``round_scales_to_power_of_2`` (its row-wise recipe sets it), torchao's
    ``exp2(floor(log2(s)))``: computed as the exact power of two at most s
    (:func:`mmaemu.base.gpu_torch_ops.power_of_two_floor`), as the GPU's log2 gives it except within 2 fp32 ulps below
    an integer log2, where CUDA's 1-ulp ``log2f`` may round up to the next power: such a scale raises
    :class:`~mmaemu.errors.UnsupportedFeatureError` (no bf16 or fp16 row gives one). For the weight [N, K] of a
    linear layer this is its per-output-channel scale.
    """
    return _rowwise_parts(x, _fmt(fmt), round_scales_to_power_of_2)[0]


def _rowwise_parts(x, fmt: str, round_scales_to_power_of_2: bool):
    """(:func:`rowwise_scale` of ``x``, x's values as a C-contiguous float32 numpy array [rows, cols] or None).

    The values and the rows' amax come from one compiled pass (:mod:`mmaemu.cpu.cast`, on mmaemu's own pool, not
    torch's intra-op threads: docs/performance.md, "Recipe layers") for a non-empty CPU fp32 / bf16 / fp16 ``x``
    whose elements are all finite: there ``max |x|`` of a row is the largest magnitude bit pattern, the value
    torch's ``abs`` and ``amax`` give. A tensor holding an Inf or a NaN (whose NaN payloads and signs torch's
    operations carry into the scales and the codes), or any other, takes torch's operations (None). The scale is
    then computed from the finite amax by the same IEEE operations in numpy: ``max(fp64(amax), 1e-12)``, its
    float64 reciprocal times fp8_max (torch's ``__rtruediv__``), the conversion to fp32 (each correctly rounded in
    numpy as in torch), then :func:`_power_of_two_scales`."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"rowwise_scale: x must be a 2-D tensor [rows, cols], got {getattr(x, 'shape', x)!r}")
    _refuse_flush_to_zero(x.device)
    values, amax = _finite_cpu_rows(x.detach())
    if amax is not None:  # the same operations compiled, on the rows' finite amax
        from .cpu.cast import rowwise_scales

        scale = np.empty(amax.shape[0], np.float32)
        rowwise_scales(amax.view(np.int32), float(FP8_MAX[fmt]), TORCHAO_EPS, scale)
        scale = scale.reshape(-1, 1)
        if round_scales_to_power_of_2:
            scale = _power_of_two_scales(scale)
        return torch.from_numpy(scale), values
    with torch.no_grad():
        magnitude = torch.abs(x).to(torch.float32) if x.dtype == torch.bfloat16 else torch.abs(x)
        amax = torch.amax(magnitude, dim=-1, keepdim=True).to(torch.float64)
        scale = (FP8_MAX[fmt] / torch.clamp(amax, min=TORCHAO_EPS)).to(torch.float32)
        if round_scales_to_power_of_2:
            scale = torch.from_numpy(_power_of_two_scales(scale.cpu().numpy())).to(scale.device)
    return scale, None


def _power_of_two_scales(scale: np.ndarray) -> np.ndarray:
    """torchao's ``exp2(floor(log2(s)))`` of the fp32 scales ``scale`` (:func:`rowwise_scale`):
    :func:`mmaemu.base.gpu_torch_ops.power_of_two_floor` (about 60 us of numpy operations for a single scale),
    except where every scale is a normal positive fp32 value whose fraction field is below 0x7FF000 (significand
    below 1.99956: :data:`mmaemu.cpu.cast.BELOW_REFUSED_FRACTION`, :func:`mmaemu.cpu.cast.cleared_fractions`):
    there the result is each scale with its fraction cleared (its binade's power of two 2**k), and none is refused:
    the refused window is log2 of the significand within ``LOG2_WINDOW_ULPS`` = 2 fp32 ulps of |k + 1| below 1, at
    most 2 * 2**(7 - 23) = 2**-15 for a normal scale (|k + 1| <= 128), so only a significand of at least
    2**(1 - 2**-15) = 1.99995 (fraction field 0x7FFE9D) can be refused. The same values power_of_two_floor gives
    (``tests/test_quantize.py``)."""
    from .cpu.cast import cleared_fractions

    cleared = np.array(scale, np.float32, order="C")  # a copy: the caller's scales stay as they are
    if scale.size and cleared_fractions(cleared.reshape(-1)):
        return cleared
    return power_of_two_floor(scale, rule="rowwise_scale (torchao's power-of-two scale)",
                              way_out="quantise bf16 or fp16 rows, whose scales never fall there (for a layer: "
                                      "model.to(torch.bfloat16)), or pass round_scales_to_power_of_2=False")



def _finite_cpu_rows(x: torch.Tensor):
    """(float32 values [rows, cols], the rows' amax: float32 [rows]) of a non-empty CPU fp32 / bf16 / fp16 2-D ``x``
    whose elements are all finite (:func:`mmaemu.cpu.cast.row_magnitudes`); (None, None) for any other."""
    if x.device.type != "cpu" or x.dtype not in _INPUT_DTYPES or x.numel() == 0:
        return None, None
    from .cpu.cast import row_magnitudes

    values = _cpu_float32_values(x).reshape(x.shape)
    largest = row_magnitudes(values)
    if int(largest.max()) >= _FP32_INF_BITS:  # an Inf or a NaN: torch's operations
        return None, None
    return values, largest.view(np.float32)


# fp32 bits of +Inf: a magnitude pattern at or above it is an Inf or a NaN.
_FP32_INF_BITS = 0x7F800000


def rowwise_cast_codes(x, fmt="e4m3"):
    """``(codes, inverses)`` of :func:`quantize_rowwise` (power-of-two scales) of a 2-D ``x`` [rows, cols] by one
    compiled call on the calling thread (:func:`mmaemu.cpu.cast.rowwise_cast_rows`): uint8 codes [rows, cols] of
    ``q`` and float32 [rows] ``scale.reciprocal()`` (the ``scale_a`` of the row-wise GEMM), for a non-empty CPU
    fp32 / bf16 / fp16 ``x`` of at most one cast task (:func:`mmaemu.cpu.cast.fits_one_pass`) whose rows are finite
    and whose scales are cleared by :func:`mmaemu.cpu.cast.cleared_fractions`; else None (the caller takes
    :func:`quantize_rowwise`). The same bits (``tests/test_nn_rowwise.py``)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.device.type != "cpu" or x.dtype not in _INPUT_DTYPES \
            or x.numel() == 0:
        return None
    from .cpu.cast import fits_one_pass, rowwise_cast_rows

    if not fits_one_pass(x.numel()):
        return None
    _refuse_flush_to_zero(x.device)
    fmt = _fmt(fmt)
    values = _cpu_float32_values(x.detach()).reshape(x.shape)
    rows = x.shape[0]
    codes, scales, inverses = np.empty(x.shape, np.uint8), np.empty(rows, np.float32), np.empty(rows, np.float32)
    if not rowwise_cast_rows(values, float(FP8_MAX[fmt]), TORCHAO_EPS, fmt == "e5m2", codes, scales, inverses):
        return None
    return codes, inverses


def quantize_rowwise(x, fmt="e4m3", *, round_scales_to_power_of_2=True):
    """``(q, scale)``: torchao's row-wise float8 cast of a 2-D ``x`` [rows, cols].

    ``scale`` = :func:`rowwise_scale`; ``q = fp8(clamp(fp32(x) * scale, -fp8_max, fp8_max))`` (torchao's
    ``hp_tensor_and_scale_to_float8`` and ``to_fp8_saturated``: one fp32 multiplication of two tensors, a clamp,
    torch's round to nearest cast; each the same on torch's CPU and CUDA kernels). ``_scaled_mm`` takes the
    reciprocals (torchao passes ``scale.reciprocal()``): for ``x @ w.t()`` call
    ``scaled_mm(qx, qw.t(), sx.reciprocal(), sw.reciprocal().t(), out_dtype=torch.bfloat16)``. A finite CPU tensor
    is cast by one compiled loop (:func:`mmaemu.cpu.cast.quantize_rows_fp8`: the same fp32 product, clamp and
    round to nearest even; ``tests/test_quantize.py`` checks it against these torch operations).
    """
    fmt = _fmt(fmt)
    scale, values = _rowwise_parts(x, fmt, round_scales_to_power_of_2)
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    if values is not None:  # finite CPU values: the compiled cast, the same bits (its docstring)
        from .cpu.cast import quantize_rows_fp8

        codes = quantize_rows_fp8(values, np.ascontiguousarray(scale.reshape(-1).numpy()), fmt)
        return torch.from_numpy(codes).view(dtype), scale
    with torch.no_grad():
        scaled = x.to(torch.float32) * scale
        q = scaled.clamp(min=-FP8_MAX[fmt], max=FP8_MAX[fmt]).to(dtype)
    return q, scale
