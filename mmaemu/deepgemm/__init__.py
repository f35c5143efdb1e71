"""DeepGEMM's FP8 GEMMs on sm_90, bit for bit: swap ``import deep_gemm`` for ``import mmaemu.deepgemm as deep_gemm``.

Mirrors the Python API of deepseek-ai/DeepGEMM v2.1.1.post3 (commit c9f8b34dcdacc20aa746b786f983492c51072870;
``csrc/apis/gemm.hpp``, ``csrc/utils/layout.hpp``, ``csrc/apis/layout.hpp``, the sm_90 kernels
``sm90_fp8_gemm_1d2d.cuh`` and ``sm90_fp8_gemm_1d1d.cuh``): the functions write into ``d`` and return None, and
DeepGEMM's host assertions are raised in its order as :class:`~mmaemu.errors.ReferenceRejectsError`.

The arithmetic of one output (docs/semantics.md, "Block-wise FP8"): 128-k chunks, each a chain of four wgmma k32
instructions from +0 (the ``hopper`` preset), entered in k order into an fp32 accumulator from +0 by
``final = RN(RN(sa[m, kb] * sb[., kb]) * partial + final)`` (one fused multiply-add); then bf16 by round to
nearest (recipe (1, 128, 128)), or with recipe (1, 1, 128) the fp32 ``d = RN(d + final)`` of the kernel's TMA
reduce-add. No split-K: each CTA loops over all of K, so the bits are those of any sm_90 GPU (H100 and H200
alike) and do not depend on the SM count. Modelled from the pinned source, not recorded on hardware: maturity
``experimental`` (an :class:`~mmaemu.errors.ExperimentalPresetWarning` once per process).

mmaemu's own keyword ``backend``, planned as ``scaled_mm``'s is (:mod:`mmaemu.plan.deepgemm`: the call's
:class:`mmaemu.context.Context`, ``$MMAEMU_BACKEND``, ``MMAEMU_DISABLE_CUDA``, the CUDA kernel choice and its
verdicts): "auto" (the CPU engine; CUDA tensors get their result copied back), "cpu", "reference" (one chunk walk
per output), "cuda" or "cuda:simple" (the GPU reference kernel, on CUDA tensors). Other CUDA kernels decline.

mmaemu's argument checks come first, each naming its argument: ``recipe`` None or three ints (TypeError), the
operands not on the meta device, ``d`` with storage of its own (not on the meta device, no elements that share
memory); then DeepGEMM's host assertions.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import backends
from ..base._untraced import untraced
from ..context import for_call
from ..errors import ExperimentalPresetWarning, MmaemuError, ReferenceRejectsError, UnsupportedFeatureError
from ..model.chunked import DEEPGEMM_SM90_1D1D, DEEPGEMM_SM90_1D2D
from ..plan.deepgemm import plan_blockwise
from ..warn import Notice, edge, report
from .utils import (align, ceil_div, ceil_to_ue8m0, get_mk_alignment_for_contiguous_layout, per_block_cast_to_fp8,
                    per_channel_cast_to_fp8, per_token_cast_to_fp8)

__all__ = ["fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "m_grouped_fp8_gemm_nt_contiguous",
           "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
           "ceil_div", "align", "ceil_to_ue8m0", "per_token_cast_to_fp8", "per_channel_cast_to_fp8",
           "per_block_cast_to_fp8", "get_mk_alignment_for_contiguous_layout", "MATURITY", "SOURCE"]

MATURITY = "experimental"
SOURCE = DEEPGEMM_SM90_1D2D.source
RECIPE_1D2D = (1, 128, 128)
RECIPE_1D1D = (1, 1, 128)
WAVE_ROWS = 64  # WGMMA::M: the rows of one warpgroup's wgmma, the unit of the contiguous layout's validity check


def _require(condition, rule: str):
    """DeepGEMM's ``DG_HOST_ASSERT``: a ReferenceRejectsError naming the rule."""
    if not condition:
        raise ReferenceRejectsError(f"DeepGEMM (sm_90) rejects this call: {rule}")


def _warn_experimental(kernel):
    """The kernel's maturity warning, once per process per kernel (:mod:`mmaemu.warn`), at the caller's line."""
    report([Notice(ExperimentalPresetWarning,
                   f"mmaemu.deepgemm: {kernel.name} is modelled from pinned source ({kernel.source}), not recorded "
                   "on hardware (maturity experimental; docs/limitations.md names the probe that would validate it)",
                   ("deepgemm", kernel.name))])


# ------------------------------------------------------------------------------------------------------------
# DeepGEMM's layout checks (csrc/utils/layout.hpp)


def _major_check(t):
    _require(t.dim() in (2, 3), f"a matrix has 2 or 3 dimensions (got {t.dim()})")
    if t.dim() == 3:
        _require(t.stride(0) == t.size(-2) * t.size(-1), "a 3-D matrix has packed groups (stride(0) = rows * cols)")
    _require(t.stride(-2) == 1 or t.stride(-1) == 1, "a matrix is row- or column-major (one unit stride)")


def _k_major(t, name):
    _major_check(t)
    _require(t.stride(-1) == 1, f"{name} is K-major (stride(-1) == 1): FP8 on sm_90 requires K-major A and B; "
                                "pass the operand as a [..., K] row-major tensor or use the variant whose layout "
                                "matches it")


def _check_cd(t, name):
    _major_check(t)
    _require(t.stride(-1) == 1, f"{name} is N-major (stride(-1) == 1)")


def _check_sf(sf, mn, k, gran_mn, gran_k, num_groups, name, contiguous):
    _require(sf.dtype in (torch.float32, torch.int32), f"{name} is float32 or int32 (got {sf.dtype})")
    _require(sf.dim() == (2 if num_groups is None else 3),
             f"{name} has {2 if num_groups is None else 3} dimensions (got {sf.dim()})")
    if num_groups is not None:
        _require(sf.size(-3) == num_groups, f"{name}.size(-3) == num_groups = {num_groups}")
    _require(sf.size(-2) == ceil_div(mn, gran_mn), f"{name}.size(-2) == ceil({mn} / {gran_mn})")
    per = gran_k * (1 if sf.dtype == torch.float32 else 4)
    _require(sf.size(-1) == ceil_div(k, per), f"{name}.size(-1) == ceil({k} / {per})")
    _require(sf.dtype == torch.float32, f"{name} is float32 on sm_90 (packed UE8M0 int32 scales are the sm_100 "
                                        "path: 'Unknown SF transformation')")
    if contiguous:
        _require(sf.is_contiguous(), f"{name} (128 x 128 block scales of B) is contiguous on sm_90")


def _check_recipe_form(recipe):
    """``recipe`` is None or three Python ints (DeepGEMM's ``std::optional<std::tuple<int, int, int>>``; its
    binding converts neither floats nor strings), checked before anything else: a TypeError naming it."""
    if recipe is None:
        return
    ok = isinstance(recipe, (tuple, list)) and len(recipe) == 3 and \
        all(isinstance(v, int) and not isinstance(v, bool) for v in recipe)
    if not ok:
        raise TypeError(f"recipe must be None or a tuple of three ints (1, 1, 128) or (1, 128, 128), got "
                        f"{recipe!r}; pass recipe=None for the default (1, 128, 128)")


def _recipe_of(recipe, sfa, sfb):
    if recipe is None:
        _require(sfa.dtype == torch.float32 and sfb.dtype == torch.float32,
                 "the default recipe on sm_90 needs float32 scales")
        return RECIPE_1D2D
    return tuple(recipe)


def _check_output(t, name):
    """An output mmaemu can write: not on the meta device (no storage: the result would be lost) and without
    elements that share memory (a stride-0 or overlapping view: which value such an element keeps on the GPU
    depends on the order its CTAs store, not modelled). Checked before computing."""
    if t.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has no storage, so the result would be lost; pass {name} "
                         "on the CPU or a CUDA device")
    if _shares_memory(t):
        raise UnsupportedFeatureError(
            f"{name} (shape {tuple(t.shape)}, strides {tuple(t.stride())}) has elements that share memory: which "
            f"result such an element keeps depends on the order the GPU's CTAs store, not modelled; pass a {name} "
            f"with memory of its own per element (torch.empty, or {name}.contiguous())")


def _shares_memory(t) -> bool:
    """Whether two elements of ``t`` may share memory: its dimensions of more than one element, by increasing
    stride, each step past the span of the ones before (the rule that proves a view free of overlap)."""
    span = 1  # elements one index past the dimensions walked so far
    for stride, size in sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def _check_inputs(tensors):
    """Operands on the meta device hold no values to compute with: a ValueError naming the first."""
    for name, t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            raise ValueError(f"{name} is on the meta device: it holds no values to compute with; pass it on the "
                             "CPU or a CUDA device")


def _call_context(recipe, backend, operands, outputs):
    """The context of one call (:func:`mmaemu.context.for_call`), after mmaemu's argument checks: the form of
    ``recipe``, the backend's name (``$MMAEMU_BACKEND`` of the context for "auto"), the operands (``(name, (codes,
    scales))`` pairs) and the outputs (``(name, tensor)``: what mmaemu writes; ``c`` is never written, nor read);
    before DeepGEMM's assertions and before anything is decided or computed."""
    context = for_call()
    _check_recipe_form(recipe)
    backends.requested_backend(backend, context=context)
    _check_inputs((f"{name}{part}", t) for name, pair in operands for part, t in zip(("", " scales"), pair))
    for name, t in outputs:
        if isinstance(t, torch.Tensor):
            _check_output(t, name)
    return context


def _check_fp8(t, name):
    _require(t.dtype == torch.float8_e4m3fn, f"{name} is torch.float8_e4m3fn (got {t.dtype})")


# ------------------------------------------------------------------------------------------------------------
# The computation


def _codes(t):
    return t.detach().contiguous().view(torch.uint8).cpu().numpy()


def _scales(t):
    return np.ascontiguousarray(t.detach().float().cpu().numpy(), dtype=np.float32)


def _final(a_codes, b_codes, scales_a, scales_b, plan, b_rows=None, weights=None):
    """fp32 accumulators [M, N] of the plan's chunked kernel on the plan's engine. ``b_rows``: the tensor of B's
    rows whose codes ``b_codes`` are, or None: on the CPU engine a repeated B (a weight) then has its decoded
    panels kept between calls (:data:`mmaemu.cpu.prepared.WEIGHTS`, as ``scaled_mm`` keeps them, or ``weights``,
    a layer's slot)."""
    from ..blockwise_cublaslt import accumulate_chunked

    return accumulate_chunked(a_codes, b_codes, "e4m3", "e4m3", scales_a, scales_b, plan.kernel, plan.backend,
                              b_rows=b_rows, weights=weights, context=plan.context)


def _store(d_view, final, kernel):
    """Write the output of ``final`` into d_view (a view of d), as the kernel's output step says."""
    from ..cpu.chunked import chunked_output

    shape = tuple(d_view.shape)
    if kernel is DEEPGEMM_SM90_1D2D:
        bits = chunked_output(final, kernel).view(np.int16).reshape(shape)
        result = torch.from_numpy(bits).view(torch.bfloat16)
    else:
        old = d_view.detach().float().cpu().numpy()
        bits = chunked_output(final, kernel, old).view(np.int32).reshape(shape)
        result = torch.from_numpy(bits).view(torch.float32)
    with torch.no_grad():
        d_view.copy_(result.to(d_view.device))


def _gemm_into(d_view, a_codes, b_codes, scales_a, scales_b, plan, b_rows=None, weights=None):
    _store(d_view, _final(a_codes, b_codes, scales_a, scales_b, plan, b_rows, weights), plan.kernel)


def _rows_of_blocks(sfb, n):
    """Per-row scales [n, kb] of B from its 128 x 128 block scales [ceil(n / 128), kb]."""
    return np.ascontiguousarray(np.repeat(sfb, 128, axis=0)[:n])


# ------------------------------------------------------------------------------------------------------------
# The API


@untraced
def fp8_gemm_nt(a, b, d, c=None, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False, *, backend="auto"):
    """``d = a @ b.T`` of FP8 ``a = (codes [M, K], sfa)`` and ``b = (codes [N, K], sfb)``, written into d.

    Recipe (1, 128, 128) (the default): ``sfa`` [M, ceil(K/128)] per 1 x 128 strip, ``sfb`` [ceil(N/128),
    ceil(K/128)] per 128 x 128 block, d bf16, no ``c``. Recipe (1, 1, 128) (the weight-gradient GEMM): ``sfb``
    [N, ceil(K/128)], d fp32, ``c`` required (DeepGEMM's tests pass ``c=d``): the sm_90 kernel adds its result into
    d (``d = RN(d + a @ b.T)``) and never reads c's values. ``compiled_dims`` and ``disable_ue8m0_cast`` change
    nothing on sm_90 (accepted for compatibility).
    """
    gemm_nt_kept(a, b, d, c, recipe, backend=backend)


def gemm_nt_kept(a, b, d, c=None, recipe=None, *, backend="auto", weights=None):
    """:func:`fp8_gemm_nt` with B's decoded panels kept in ``weights`` (a layer's
    :class:`mmaemu.cpu.prepared.WeightSlot`; None: the process-wide store), as
    :class:`mmaemu.nn_recipes.BlockwiseFP8Linear` calls it."""
    with edge():
        context = _call_context(recipe, backend, (("a", a), ("b", b)), (("d", d),))
        _gemm_nt(a, b, d, c, recipe, backend, context, weights)


# The row tiles' call of a kept decoding step (mmaemu.cpu.chunked.ChunkedRows, or None where it does not run), per
# (M, N, K, backend, the environment's texts, the thread count): everything that decides it. Few entries (a model
# has a few shapes); a dict read and written whole, safe across threads.
_ROWS_CALLS: dict = {}
_MAX_ROWS_CALLS = 256
_MISSING = object()


def _kept_call_values(x):
    """What every kept call does first, whatever was decided for its shape: the flush-to-zero refusal, the
    kernel's warning, and ``x`` as fp32, C-contiguous."""
    from ..plan.flush import check_no_flush_to_zero

    check_no_flush_to_zero()
    _warn_experimental(DEEPGEMM_SM90_1D2D)
    values = x.detach()
    if values.dtype != torch.float32 or not values.is_contiguous():
        values = values.float().contiguous()  # exact: the cast's products are fp32 (torch's type promotion)
    return values


def _kept_per_shape(cache: dict, key, decide):
    """``cache[key]``, decided by ``decide()`` the first time (a cache of more than _MAX_ROWS_CALLS keys, from
    environments that keep changing, starts again)."""
    value = cache.get(key, _MISSING)
    if value is _MISSING:
        if len(cache) >= _MAX_ROWS_CALLS:
            cache.clear()
        value = cache[key] = decide()
    return value


_ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gemm_nt_kept_rows(x, weight, weight_scale, *, backend="auto", weights=None):
    """``fp8_gemm_nt(per_token_cast_to_fp8(x, use_ue8m0=False), (weight, weight_scale), d)`` with recipe (1, 128,
    128) for activations ``x`` [M, K] (fp32, bf16 or fp16 on the CPU) and an E4M3 weight [N, K] with its 128 x 128
    block scales (float32, contiguous) kept in ``weights`` (a layer's :class:`mmaemu.cpu.prepared.WeightSlot`): the
    bf16 [M, N] d, as one compiled call on the offset method's row tiles (:class:`mmaemu.cpu.chunked.ChunkedRows`:
    the cast, the codes' comparison, the chunks and the output's bits), or None where that call does not run (see
    :func:`mmaemu.cpu.chunked.chunked_rows`; another backend, a weight not kept yet): the caller then takes the
    front door with the same bits (``tests/test_blockwise_rows.py``). What the front door checks of a call holds
    for a layer's (its shapes, dtypes and scales were checked when it was built); the plan (``backend``, the
    context) is decided once per :data:`_ROWS_CALLS` key, the flush-to-zero refusal and the kernel's warning at
    every call, as there."""
    from ..cpu import threads
    from ..cpu.fused import ROW_KERNEL_ROWS
    from ..plan.cache import environment_key

    if (weights is None or not isinstance(backend, str) or x.dtype not in _ROW_DTYPES or x.device.type != "cpu"
            or weight.device.type != "cpu" or x.dim() != 2 or not 0 < x.shape[0] <= ROW_KERNEL_ROWS):
        return None
    (M, K), N = x.shape, weight.shape[0]
    key = (M, N, K, backend, environment_key(), threads.num_threads())
    call = _kept_per_shape(_ROWS_CALLS, key, lambda: _rows_call(M, N, K, backend, key[-1]))
    if call is None:
        return None
    values = _kept_call_values(x)
    bits = call.run(weights, weight, values.numpy(), weight.view(torch.uint8).numpy(), weight_scale.numpy())
    return None if bits is None else torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def _rows_call(M, N, K, backend, n_threads):
    """The :class:`mmaemu.cpu.chunked.ChunkedRows` of a decoding step in the context of this moment, or None: a
    backend other than the CPU engine (as :func:`mmaemu.plan.deepgemm.plan_blockwise` names it; an unknown one is
    the front door's error to raise), or :func:`mmaemu.cpu.chunked.chunked_rows` declines."""
    from ..cpu.chunked import chunked_rows

    context = for_call()
    try:
        name = backends.requested_backend(backend, context=context)
    except (TypeError, ValueError):
        return None
    if name not in ("auto", "cpu"):
        return None
    with edge():
        return chunked_rows(DEEPGEMM_SM90_1D2D, M, N, K, n_threads, context)


# The plan of a kept prefill call (a BlockwisePlan on the CPU engine, or None where the front door takes the call),
# per the same key as _ROWS_CALLS; read and written whole, safe across threads.
_PREFILL_PLANS: dict = {}


def gemm_nt_kept_prefill(x, weight, weight_scale, *, backend="auto", weights=None):
    """:func:`gemm_nt_kept_rows` for more than ``ROW_KERNEL_ROWS`` rows (a block-wise layer's prefill): the bf16
    [M, N] d of the front door's chunked kernel (:func:`mmaemu.cpu.chunked.accumulate_chunked_codes` on the
    weight's panels kept in ``weights``, the engine they were prepared for), with DeepGEMM's per-token cast
    compiled (:func:`mmaemu.cpu.cast.token_strips_fp8`, the one the decoding step runs) and the plan decided once
    per :data:`_PREFILL_PLANS` key; None where the front door takes the call (another backend than the CPU engine,
    an input the layer's checks did not cover). What it leaves out of the front door are its checks of a layer's
    operands (made when the layer was built), its torch cast and its copy of the output; the bits are the front
    door's (``tests/test_blockwise_prefill.py``). The flush-to-zero refusal and the kernel's warning at every call,
    as there."""
    from ..base.gpu_torch_ops import reciprocal_of_number
    from ..cpu import threads
    from ..cpu.cast import token_strips_fp8
    from ..cpu.chunked import E4M3_MAX, TOKEN_AMAX_FLOOR, accumulate_chunked_codes, chunked_output, kept_panels
    from ..cpu.fused import ROW_KERNEL_ROWS
    from ..plan.cache import environment_key

    if (weights is None or not isinstance(backend, str) or x.dtype not in _ROW_DTYPES or x.device.type != "cpu"
            or weight.device.type != "cpu" or weight.dtype != torch.float8_e4m3fn or not weight.is_contiguous()
            or x.dim() != 2 or x.shape[0] <= ROW_KERNEL_ROWS
            or weight_scale.dtype != torch.float32 or not weight_scale.is_contiguous()
            or weight_scale.device.type != "cpu"):
        return None
    (M, K), N = x.shape, weight.shape[0]
    key = (M, N, K, backend, environment_key(), threads.num_threads())
    plan = _kept_per_shape(_PREFILL_PLANS, key, lambda: _prefill_plan(backend))
    if plan is None:
        return None
    values = _kept_call_values(x)
    chunk = DEEPGEMM_SM90_1D2D.chunk
    a_codes = np.empty((M, K), np.uint8)
    scales_a = np.empty((M, -(-K // chunk)), np.float32)
    token_strips_fp8(values.numpy(), chunk, TOKEN_AMAX_FLOOR, reciprocal_of_number(E4M3_MAX), a_codes, scales_a)
    b_codes = weight.view(torch.uint8).numpy()
    scales_b = _rows_of_blocks(weight_scale.numpy(), N)
    prepared = kept_panels(weights, weight, b_codes, "e4m3", "e4m3", DEEPGEMM_SM90_1D2D, M, plan.context)
    final = accumulate_chunked_codes(a_codes, b_codes, "e4m3", "e4m3", scales_a, scales_b, DEEPGEMM_SM90_1D2D,
                                     prepared_b=prepared, context=plan.context)
    bits = chunked_output(final, DEEPGEMM_SM90_1D2D).view(np.int16).reshape(M, N)
    return torch.from_numpy(bits).view(torch.bfloat16)


def _prefill_plan(backend):
    """The :class:`mmaemu.plan.deepgemm.BlockwisePlan` of a kept prefill call in the context of this moment where
    it runs on the CPU engine, else None (the reference, a CUDA backend; an unknown one is the front door's error
    to raise)."""
    context = for_call()
    try:
        with edge():
            plan = plan_blockwise(DEEPGEMM_SM90_1D2D, torch.device("cpu"), backend, context=context)
    except (TypeError, ValueError, MmaemuError):  # the front door raises it again, with its words
        return None
    return plan if plan.backend == "cpu" else None


def _gemm_nt(a, b, d, c, recipe, backend, context, weights=None):
    (a_t, sfa), (b_t, sfb) = a, b
    _k_major(a_t, "a")
    _k_major(b_t, "b")
    _check_cd(d, "d")
    _require(a_t.dim() == 2 and b_t.dim() == 2 and d.dim() == 2, "a, b and d are 2-D")
    m, k = a_t.shape
    n, k_ = b_t.shape
    m_, n_ = d.shape
    _require(m == m_ and n == n_ and k == k_, f"shapes [M, K] @ [N, K].T -> [M, N] agree (got a {tuple(a_t.shape)}, "
                                              f"b {tuple(b_t.shape)}, d {tuple(d.shape)})")
    _require(n > 0 and k > 0, "n > 0 and k > 0")
    _check_fp8(a_t, "a")
    _check_fp8(b_t, "b")
    _require(d.dtype in (torch.bfloat16, torch.float32), f"d is bfloat16 or float32 (got {d.dtype})")
    if c is not None:
        _check_cd(c, "c")
        _require(d.dtype == torch.float32, "with c, d is float32")
        _require(c.dtype == torch.float32, f"c is float32 (got {c.dtype})")
    if m == 0:
        return None
    recipe = _recipe_of(recipe, sfa, sfb)
    _require(recipe in (RECIPE_1D1D, RECIPE_1D2D), f"recipe is (1, 1, 128) or (1, 128, 128) (got {recipe})")
    _check_sf(sfa, m, k, recipe[0], recipe[2], None, "sfa", False)
    _check_sf(sfb, n, k, recipe[1], recipe[2], None, "sfb", recipe[1] == 128)
    if recipe[1] == 1:
        kernel = DEEPGEMM_SM90_1D1D
        _require(c is not None and d.dtype == torch.float32,
                 "recipe (1, 1, 128) (sm90_fp8_gemm_1d1d) needs c and a float32 d; pass c=d")
        if c.data_ptr() != d.data_ptr() or c.stride() != d.stride():
            report([Notice(UserWarning, "mmaemu.deepgemm: DeepGEMM's sm_90 1d1d kernel adds its result into d and "
                           "never reads c; c is not d here, so c's values are ignored (as on the GPU)")])
        scales_b = _scales(sfb)
    else:
        kernel = DEEPGEMM_SM90_1D2D
        _require(c is None and d.dtype == torch.bfloat16,
                 "recipe (1, 128, 128) (sm90_fp8_gemm_1d2d) takes no c and writes a bfloat16 d")
        scales_b = _rows_of_blocks(_scales(sfb), n)
    plan = plan_blockwise(kernel, a_t.device, backend, context=context)
    _warn_experimental(kernel)
    _gemm_into(d, _codes(a_t), _codes(b_t), _scales(sfa), scales_b, plan, b_t, weights)


@untraced
def fp8_gemm_nn(a, b, d, c=None, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False, *, backend="auto"):
    """``fp8_gemm_nt`` with ``b = (codes [K, N], sfb)`` given transposed: ``nt(a, (b.T, sfb.T))``."""
    return fp8_gemm_nt(a, (b[0].transpose(0, 1), b[1].transpose(0, 1)), d, c, recipe, compiled_dims,
                       disable_ue8m0_cast, backend=backend)


@untraced
def fp8_gemm_tn(a, b, d, c=None, recipe=None, compiled_dims="mn", disable_ue8m0_cast=False, *, backend="auto"):
    """``fp8_gemm_nt`` with both operands given transposed: ``nt((a.T, sfa.T), (b.T, sfb.T))``."""
    return fp8_gemm_nt((a[0].transpose(0, 1), a[1].transpose(0, 1)), (b[0].transpose(0, 1), b[1].transpose(0, 1)),
                       d, c, recipe, compiled_dims, disable_ue8m0_cast, backend=backend)


@untraced
def fp8_gemm_tt(a, b, d, c=None, recipe=None, compiled_dims="mn", disable_ue8m0_cast=False, *, backend="auto"):
    """``fp8_gemm_nt`` with ``a = (codes [K, M], sfa)`` given transposed: ``nt((a.T, sfa.T), b)``."""
    return fp8_gemm_nt((a[0].transpose(0, 1), a[1].transpose(0, 1)), b, d, c, recipe, compiled_dims,
                       disable_ue8m0_cast, backend=backend)


def _grouped_recipe(recipe, sfa, sfb):
    recipe = _recipe_of(recipe, sfa, sfb)
    if recipe != RECIPE_1D2D:
        raise UnsupportedFeatureError(
            f"M-grouped FP8 GEMMs on sm_90 run DeepGEMM's 1d2d kernel, which reads 128 x 128 block scales of B; "
            f"recipe {recipe} is not modelled for them; use recipe=None or (1, 128, 128)")
    return recipe


def _contiguous_rows(m_indices, num_groups):
    """``(row group, computed)`` per row of an M-grouped contiguous GEMM (the sm_90 1d2d kernel's scheduler).

    The kernel takes a block's group from its first row and computes a warpgroup's 64 rows only if their first
    row's index is >= 0; with DeepGEMM's layout (each group's rows start at a multiple of 128, padding rows marked
    -1 after them) that is: every row of a 128-row segment uses the segment's group, and a 64-row wave whose first
    row is padding is +0. Other layouts would depend on the kernel's tile configuration: refused.
    """
    idx = m_indices.detach().cpu().numpy().astype(np.int64)
    m = idx.size
    _require(not np.any(idx >= num_groups), f"m_indices are < num_groups = {num_groups} (or -1 for padding)")
    _require(not np.any(idx < -1), "m_indices are group indices or -1 for padding")
    seg = get_mk_alignment_for_contiguous_layout()
    group = np.empty(m, np.int64)
    for s0 in range(0, m, seg):
        rows = idx[s0:s0 + seg]
        valid = rows >= 0
        count = int(valid.sum())
        if count and (not valid[:count].all() or np.any(rows[:count] != rows[0])):
            raise UnsupportedFeatureError(
                f"m_indices rows {s0}..{s0 + rows.size - 1}: DeepGEMM's contiguous layout gives each group rows "
                "that start at a multiple of get_mk_alignment_for_contiguous_layout() = 128, padding (-1) after "
                "them; other layouts give bits that depend on the kernel's tile configuration, not modelled")
        group[s0:s0 + seg] = rows[0]
    wave_first = idx[(np.arange(m) // WAVE_ROWS) * WAVE_ROWS]
    return group, wave_first >= 0


@untraced
def m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False,
                                     *, backend="auto"):
    """M-grouped GEMM (MoE): rows of ``a = (codes [M, K], sfa [M, ceil(K/128)])`` times the group's
    ``b = (codes [G, N, K], sfb [G, ceil(N/128), ceil(K/128)])``, group of each row in ``m_indices`` [M] (int32,
    -1 for padding rows), into the bf16 ``d`` [M, N]."""
    with edge():
        context = _call_context(recipe, backend, (("a", a), ("b", b)), (("d", d),))
        _grouped_contiguous(a, b, d, m_indices, recipe, backend, context)


def _grouped_contiguous(a, b, d, m_indices, recipe, backend, context):
    (a_t, sfa), (b_t, sfb) = a, b
    _major_check(a_t)
    _require(a_t.stride(-1) == 1, "a is K-major (stride(-1) == 1)")
    _k_major(b_t, "b")
    _require(m_indices.is_contiguous(), "m_indices is contiguous")
    _require(a_t.dim() == 2 and b_t.dim() == 3 and d.dim() == 2, "a [M, K], b [G, N, K] and d [M, N]")
    m, k = a_t.shape
    num_groups, n, k_ = b_t.shape
    m_, n_ = d.shape
    _require(m == m_ and m == m_indices.numel() and n == n_ and k == k_,
             "shapes [M, K] @ [G, N, K].mT -> [M, N] agree, m_indices has M entries")
    _require(n > 0 and k > 0 and num_groups > 0, "n > 0, k > 0 and num_groups > 0")
    _check_fp8(a_t, "a")
    _check_fp8(b_t, "b")
    _require(d.dtype == torch.bfloat16, f"d is bfloat16 (got {d.dtype})")
    _require(m_indices.dtype == torch.int32, f"m_indices is int32 (got {m_indices.dtype})")
    _check_cd(d, "d")
    if m == 0:
        return None
    recipe = _grouped_recipe(recipe, sfa, sfb)
    _check_sf(sfa, m, k, recipe[0], recipe[2], None, "sfa", False)
    _check_sf(sfb, n, k, recipe[1], recipe[2], num_groups, "sfb", True)
    kernel = DEEPGEMM_SM90_1D2D
    _warn_experimental(kernel)
    group, computed = _contiguous_rows(m_indices, num_groups)
    plan = plan_blockwise(kernel, a_t.device, backend, context=context)
    a_codes, scales_a, scales_b = _codes(a_t), _scales(sfa), _scales(sfb)
    with torch.no_grad():
        d[torch.from_numpy(~computed).to(d.device)] = 0
    for g in range(num_groups):
        rows = np.flatnonzero((group == g) & computed)
        if rows.size:
            final = _final(a_codes[rows], _codes(b_t[g]), scales_a[rows], _rows_of_blocks(scales_b[g], n), plan)
            part = torch.empty((rows.size, n), dtype=d.dtype, device=d.device)
            _store(part, final, kernel)
            with torch.no_grad():
                d[torch.from_numpy(rows).to(d.device)] = part
    return None


@untraced
def m_grouped_fp8_gemm_nn_contiguous(a, b, d, m_indices, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False,
                                     *, backend="auto"):
    """``m_grouped_fp8_gemm_nt_contiguous`` with ``b = (codes [G, K, N], sfb [G, ceil(K/128), ceil(N/128)])``."""
    return m_grouped_fp8_gemm_nt_contiguous(a, (b[0].transpose(1, 2), b[1].transpose(1, 2)), d, m_indices, recipe,
                                            compiled_dims, disable_ue8m0_cast, backend=backend)


@untraced
def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk",
                                 disable_ue8m0_cast=False, *, backend="auto"):
    """Masked M-grouped GEMM (MoE decoding): for each group g, the first ``masked_m[g]`` rows of
    ``a = (codes [G, M, K], sfa [G, M, ceil(K/128)])`` times ``b = (codes [G, N, K], sfb [G, ceil(N/128),
    ceil(K/128)])`` into the bf16 ``d`` [G, M, N]. Rows from masked_m[g] on are left as they are (on the GPU, those
    of the last scheduled block depend on its tile configuration; DeepGEMM's tests do not read them).
    ``expected_m`` is a scheduling hint."""
    with edge():
        context = _call_context(recipe, backend, (("a", a), ("b", b)), (("d", d),))
        _grouped_masked(a, b, d, masked_m, expected_m, recipe, backend, context)


def _grouped_masked(a, b, d, masked_m, expected_m, recipe, backend, context):
    (a_t, sfa), (b_t, sfb) = a, b
    _major_check(a_t)
    _major_check(b_t)
    _require(a_t.stride(-1) == 1 and b_t.stride(-1) == 1, "a and b are K-major (stride(-1) == 1)")
    _require(masked_m.is_contiguous(), "masked_m is contiguous")
    _require(a_t.dim() == 3 and b_t.dim() == 3 and d.dim() == 3, "a [G, M, K], b [G, N, K] and d [G, M, N]")
    num_groups, m, k = a_t.shape
    num_groups_, n, k_ = b_t.shape
    num_groups__, m_, n_ = d.shape
    _require(num_groups == num_groups_ == num_groups__ == masked_m.numel(),
             "a, b, d and masked_m have the same number of groups")
    _require(m == m_ and n == n_ and k == k_, "shapes [G, M, K] @ [G, N, K].mT -> [G, M, N] agree")
    _require(expected_m > 0 and m > 0 and n > 0 and k > 0 and num_groups > 0,
             "expected_m, m, n, k and num_groups are > 0")
    _check_fp8(a_t, "a")
    _check_fp8(b_t, "b")
    _require(d.dtype == torch.bfloat16, f"d is bfloat16 (got {d.dtype})")
    _require(masked_m.dtype == torch.int32, f"masked_m is int32 (got {masked_m.dtype})")
    _check_cd(d, "d")
    recipe = _grouped_recipe(recipe, sfa, sfb)
    _check_sf(sfa, m, k, recipe[0], recipe[2], num_groups, "sfa", False)
    _check_sf(sfb, n, k, recipe[1], recipe[2], num_groups, "sfb", True)
    counts = masked_m.detach().cpu().numpy().astype(np.int64)
    if np.any(counts < 0) or np.any(counts > m):
        raise ValueError(f"masked_m must lie in [0, {m}] (the kernel would read past the group's rows), got "
                         f"{counts.tolist()}")
    kernel = DEEPGEMM_SM90_1D2D
    plan = plan_blockwise(kernel, a_t.device, backend, context=context)
    _warn_experimental(kernel)
    scales_a, scales_b = _scales(sfa), _scales(sfb)
    for g in range(num_groups):
        rows = int(counts[g])
        if rows:
            final = _final(_codes(a_t[g, :rows]), _codes(b_t[g]), scales_a[g, :rows],
                           _rows_of_blocks(scales_b[g], n), plan)
            _store(d[g, :rows], final, kernel)
    return None


fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked  # DeepGEMM's legacy alias
