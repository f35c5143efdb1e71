"""Plans kept per call signature: a repeated ``scaled_mm`` / ``accumulate`` call is validated, split-K-decided and
given its backend once (platform.md 6.1 is unchanged: the plan of a hit is the plan the planner returned).

The rule: a plan is a pure function of its *signature*, and a kept plan is used only for a call of the same
signature. The signature holds everything the planner reads:

* per tensor argument: its Python type, dtype, shape, strides, storage offset and ``requires_grad`` (and for
  ``out=``, the size and resizability of its storage, which torch's resize check reads); a position holding None,
  or something that is not a tensor, is part of it too;
* every other argument, with its type (``1`` and ``True`` differ), and the profile: a built-in profile by name
  (None stands for ``$MMAEMU_PROFILE`` or "hopper"; built-in names never change meaning), any other one by the
  *object* it resolves to now (a recorded name is resolved on every call, as the planner does; the entry holds
  the profile, so its ``id`` cannot be reused while it is kept);
* the process state the decisions read: every variable of :mod:`mmaemu.environment` as text (profile, backend,
  split-K policy and strictness, CUDA switch, profile path, ...), torch's grad mode, and the CUDA device ordinal
  the live cuBLASLt query would ask.

Only calls whose tensors are all dense CPU tensors of type ``torch.Tensor`` or ``torch.nn.Parameter`` are kept
(a CUDA call's backend depends on self-test verdicts that change during the process); anything else is planned
every time. A call that raises is never kept: it is planned, and raises, again every time.

Warnings stay exactly as without the cache: the notices the planner reported while planning (in order) are kept
with the plan and reported again on every hit (:func:`mmaemu.warn.report`), so the registry of
:mod:`mmaemu.warn` decides once-per-process emission as before. The one per-thread check, that the calling CPU
thread does not flush subnormals (:mod:`mmaemu.plan.flush`), is the planner's last step and runs again on every
hit. The cache holds at most :data:`MAX_PLANS` plans (least recently used dropped first) and is thread-safe.

A kept tensor-wise or row-wise plan on the cpu backend also carries, as ``plan.cpu_gemm``, what it decided in the
form the compiled call takes (:class:`mmaemu.cpu.fused.TensorwiseGemm`, made once when the plan is kept): a hit
goes from the key to that one compiled call. A tensor-wise plan's is returned with no plan bound
(:func:`cached_plan_scaled_mm` with ``compiled``, :func:`mmaemu.api.planned_scaled_mm`); a bound plan carries it
too (:func:`mmaemu.api.run_scaled_mm_plan`), and a row-wise plan's runs through its recipe's run.

A call that is planned (a miss, or a call that is never kept) is planned with one :class:`mmaemu.context.Context`
(:func:`mmaemu.context.for_call`): every decision of the plan reads the same environment snapshot. A profile name
that is not a built-in one is resolved for the key in that same context, taken before the lookup (a hit takes
that one reading too: a recorded name is resolved on every call). A hit reuses a plan decided from the same
environment texts (they are part of the signature).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import NamedTuple, Optional, Tuple

import torch

from .. import environment
from ..formats import dtype_name
from ..base._untraced import plain_tensor
from ..context import context_of, for_call
from ..platform.definitions import _BY_NAME as _BUILTIN_PROFILES
from ..platform.definitions import DEFAULT_PROFILE, Profile
from ..platform.profiles import PROFILE_ENV, get_profile
from ..warn import Notice, collecting, report
from .flush import check_no_flush_to_zero
from .planner import Plan, plan_accumulate, plan_scaled_mm

__all__ = ["cached_plan_scaled_mm", "cached_plan_accumulate", "clear", "stats", "MAX_PLANS", "PlanCacheStats"]

MAX_PLANS = 256
_CACHEABLE_TYPES = (torch.Tensor, torch.nn.Parameter)
_SCALED_MM_TENSORS = ("input", "mat2", "scale_a", "scale_b", "scale_result", "out", "bias")


class PlanCacheStats(NamedTuple):
    """Counts since the last :func:`clear`: ``hits``, ``misses`` (planned and kept), ``uncached`` (planned, not
    keepable or raised) and ``size`` (plans kept)."""

    hits: int
    misses: int
    uncached: int
    size: int


@dataclasses.dataclass(frozen=True)
class _Entry:
    template: Plan  # the plan with every tensor of its call replaced by None
    notices: Tuple[Notice, ...]  # what the planner reported, in order
    profile: object  # keeps the profile alive: its id is part of the key
    copies_input: bool  # the planner copied a neither-major input (torch does): the hit copies it again
    checks_flush: bool  # the plan ended with the CPU flush-to-zero check
    # The compiled CPU call a hit may return unbound (cached_plan_scaled_mm's ``compiled``): a tensor-wise plan's
    # only, whose scales are the call's four scalars; a row-wise plan's needs its recipe's run (its scale vectors).
    gemm: object = None


_lock = threading.Lock()
_plans: "collections.OrderedDict[tuple, _Entry]" = collections.OrderedDict()
_counts = {"hits": 0, "misses": 0, "uncached": 0}


def clear() -> None:
    """Forget every kept plan and reset the counts (tests; a plan never goes stale by itself)."""
    with _lock:
        _plans.clear()
        for name in _counts:
            _counts[name] = 0


def stats() -> PlanCacheStats:
    with _lock:
        return PlanCacheStats(_counts["hits"], _counts["misses"], _counts["uncached"], len(_plans))


# ----------------------------------------------------------------------------------------------------------------
# Signatures


def environment_key() -> tuple:
    """The raw texts of the environment variables (:func:`mmaemu.environment.texts`), the part of a kept plan's key
    that the variables decide: for the kept plans of this cache and those that other entry points keep per shape
    (:mod:`mmaemu.deepgemm`'s kept calls), read here at the entry point, as the cache reads them."""
    return environment.texts()


def _process_state() -> tuple:
    """What the decisions read besides the arguments: the environment variables' texts, grad mode, and the CUDA
    ordinal a live cuBLASLt query would ask (0 while torch has not initialised CUDA)."""
    texts = environment.texts()
    ordinal = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return texts, torch.is_grad_enabled(), ordinal


def _tensor_signature(t) -> Optional[tuple]:
    """The facts of a dense CPU tensor the planner reads; None for anything the cache does not keep plans of."""
    if type(t) not in _CACHEABLE_TYPES or not t.is_cpu or t.layout is not torch.strided or t.is_nested:
        return None
    return type(t), t.dtype, t.shape, t.stride(), t.storage_offset(), t.requires_grad


def _out_signature(out) -> Optional[tuple]:
    signature = _tensor_signature(out)
    if signature is None:
        return None
    storage = out.untyped_storage()
    return signature + (storage.nbytes(), storage.resizable())


def _typed(value) -> Optional[tuple]:
    """A hashable key of a plain argument that tells apart values of other types (1, True and 1.0); None when the
    value is not hashable."""
    kind = type(value)
    if kind in _SCALAR_TYPES:  # the common arguments, hashable: what the general path below returns for them
        return kind, value
    if isinstance(value, tuple):
        parts = tuple(_typed(v) for v in value)
        return None if None in parts else (tuple, parts)
    if isinstance(value, torch.Tensor):  # hashed by identity, compared by value: never a key
        return None
    try:
        hash(value)
    except TypeError:
        return None
    return type(value), value


_SCALAR_TYPES = frozenset((type(None), bool, int, float, str, torch.dtype))
_NOT_KEPT = object()


def _signature_part(value, out=False):
    """The key part of an argument position: None stays None; a tensor its signature; else _NOT_KEPT."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        signature = _out_signature(value) if out else _tensor_signature(value)
        return _NOT_KEPT if signature is None else signature
    return _NOT_KEPT


_PROFILE_TEXT = environment.NAMES.index(PROFILE_ENV)


def _resolve_profile(profile, state):
    """(key part, Profile, context) of the profile argument: a built-in profile by name, without reading the
    environment (its text is in the process state), and a Profile as it is (context None: a miss takes its own);
    any other one through get_profile in the call's context (:func:`mmaemu.context.for_call`, taken here: the
    planner of a miss plans in the same one), which raises as the planner's first step does."""
    name = profile
    if profile is None:
        name = state[0][_PROFILE_TEXT] or DEFAULT_PROFILE
    if isinstance(name, str):
        builtin = _BUILTIN_PROFILES.get(name)
        if builtin is not None:
            return ("builtin", name), builtin, None
    if isinstance(profile, Profile):  # as it is: nothing to read
        return ("object", id(profile)), profile, None
    context = for_call()
    resolved = get_profile(profile, context=context)
    return ("object", id(resolved)), resolved, context


def _key(kind: str, tensors: tuple, out, plain: tuple, profile_part, state) -> Optional[tuple]:
    parts = [_signature_part(t) for t in tensors]
    parts.append(_signature_part(out, out=True))
    if _NOT_KEPT in parts:
        return None
    typed = tuple(_typed(v) for v in plain)
    if None in typed:
        return None
    return (kind, tuple(parts), typed, profile_part, state)


# ----------------------------------------------------------------------------------------------------------------
# Lookup and keeping


def _lookup(key) -> Optional[_Entry]:
    with _lock:
        entry = _plans.get(key)
        if entry is None:
            return None
        _plans.move_to_end(key)
        _counts["hits"] += 1
        return entry


def _keep(key, entry: _Entry) -> None:
    with _lock:
        _plans[key] = entry
        _plans.move_to_end(key)
        while len(_plans) > MAX_PLANS:
            _plans.popitem(last=False)
        _counts["misses"] += 1


def _count_uncached() -> None:
    with _lock:
        _counts["uncached"] += 1


def _plan_reporting(planner, *args, **kwargs):
    """Plan, collecting what the planner reports, then report it on (also when planning raises): (plan,
    notices)."""
    found = []
    try:
        with collecting() as found:
            plan = planner(*args, **kwargs)
    finally:
        report(found)
    return plan, tuple(found)


def _replay(entry: _Entry) -> None:
    if entry.notices:
        report(entry.notices)
    if entry.checks_flush:
        check_no_flush_to_zero()


def _strip(plan: Plan, fields) -> Plan:
    call = dataclasses.replace(plan.call, **{name: None for name in fields})
    return dataclasses.replace(plan, call=call, notices=list(plan.notices), fallbacks=list(plan.fallbacks))


def _bind(entry: _Entry, tensors: dict) -> Plan:
    """A copy of the kept plan whose call holds this call's tensors (the fields are copied as they are: the kept
    plan is never changed after it was made)."""
    template = entry.template
    call = object.__new__(type(template.call))
    call.__dict__.update(template.call.__dict__)
    call.__dict__.update(tensors)
    plan = object.__new__(Plan)
    plan.__dict__.update(template.__dict__)
    plan.call = call
    return plan


def _entry(plan: Plan, notices, profile, fields) -> _Entry:
    call = plan.call
    gemm = _cpu_gemm(plan)
    copies_input = bool(getattr(call, "input_copied", False))
    unbound = None if copies_input or not _tensorwise(call) else gemm
    entry = _Entry(_strip(plan, fields), notices, profile, copies_input, plan.action == "compute", unbound)
    if gemm is not None:  # the bound plans of every hit carry it (_bind copies the template's attributes)
        entry.template.cpu_gemm = plan.cpu_gemm = gemm
    return entry


def _tensorwise(call) -> bool:
    """Whether the kept call is a tensor-wise one (its recipe's; an accumulate call has none)."""
    from ..recipes.tensorwise import TENSORWISE

    return getattr(call, "recipe", None) is TENSORWISE


def _cpu_gemm(plan: Plan):
    """The compiled call of a kept tensor-wise or row-wise scaled_mm plan on the cpu backend
    (:class:`mmaemu.cpu.fused.TensorwiseGemm`: what the plan decided, made once; a row-wise call's output is its
    epilogue's bfloat16), or None for every other plan."""
    from ..arith.tile import TILE_FORMATS
    from ..cpu.fused import TensorwiseGemm
    from ..recipes.rowwise import ROWWISE
    from ..recipes.tensorwise import TENSORWISE

    call = plan.call
    if (plan.action != "compute" or plan.backend != "cpu" or plan.cpu_engine is None or plan.split is None
            or getattr(call, "recipe", None) not in (TENSORWISE, ROWWISE)  # the call's recipe says
            or call.device.type != "cpu" or 0 in (call.M, call.N, call.K)
            or call.fmt_a not in TILE_FORMATS or call.fmt_b not in TILE_FORMATS):
        return None
    return TensorwiseGemm(plan.cpu_engine.engine, plan.preset, call.fmt_a, call.fmt_b, call.M, call.N, call.K,
                          call.use_fast_accum, plan.split.S, plan.split.scheme,
                          "bfloat16" if call.recipe is ROWWISE else dtype_name(call.out_dtype), _row_tiles(plan))


def _row_tiles(plan: Plan) -> bool:
    """Whether the kept plan's calls with a kept B run on the offset method's row tiles
    (:func:`mmaemu.cpu.fused.row_tiles_fit`): the engine choice of the plan's context for the call without the
    shape rule (``MMAEMU_CPU_ENGINE`` and the AVX2 self-test as the plan read them)."""
    from ..arith.params import schedule_params
    from ..cpu.engine import cpu_engine_choice
    from ..cpu.features import CPU_ENGINE_ENV, numba_target, offset_rounding
    from ..cpu.fused import ROW_KERNEL_ROWS, row_tiles_fit

    call = plan.call
    rounding = offset_rounding(numba_target())
    if (plan.context is None or plan.cpu_engine.engine != "tile" or call.M > ROW_KERNEL_ROWS
            or not row_tiles_fit("tile", call.M, "offset", rounding)):  # the choice below only where it decides
        return False
    schedule = schedule_params(plan.preset, call.K, call.use_fast_accum, plan.split.S, plan.split.scheme)
    choice = cpu_engine_choice(plan.preset, schedule, call.fmt_a, call.fmt_b,
                               plan.context.environment[CPU_ENGINE_ENV], None, context=plan.context)
    return row_tiles_fit(plan.cpu_engine.engine, call.M, choice.engine, rounding)


# ----------------------------------------------------------------------------------------------------------------
# Entry points


def _takes_bias(call) -> bool:
    """Whether the kept call's recipe keeps a bias in its call spec (:attr:`mmaemu.recipes.base.Recipe.takes_bias`;
    a zero-size call has no recipe and no bias)."""
    return call.recipe is not None and call.recipe.takes_bias


def cached_plan_scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                          use_fast_accum=False, *, out=None, profile=None, splitk="auto", backend="auto",
                          compiled=False):
    """:func:`mmaemu.plan.planner.plan_scaled_mm`, planned once per signature (see the module docstring).

    ``compiled``: a hit whose kept plan carries a compiled CPU call (``cpu_gemm``), whose input is not copied and
    whose tensors are all plain data (:func:`mmaemu.base._untraced.plain_tensor`) returns that
    :class:`mmaemu.cpu.fused.TensorwiseGemm` instead of a plan bound to the call's tensors (its warnings replayed
    and the flush check done, as for any hit): the caller runs it on the tensors it holds
    (:func:`mmaemu.api.planned_scaled_mm`). A hit reads the signature and nothing else of the call (the planner's
    arguments are put together only for a miss)."""
    state = _process_state()
    profile_part, resolved, context = _resolve_profile(profile, state)  # the planner's first step; raises as it does
    key = _scaled_mm_key(input, mat2, scale_a, scale_b, bias, scale_result, out, out_dtype, use_fast_accum, splitk,
                         backend, profile_part, state)
    if key is not None:
        entry = _lookup(key)
        if entry is not None:
            _replay(entry)
            if compiled and entry.gemm is not None and _plain(input, mat2, scale_a, scale_b, scale_result, out):
                return entry.gemm
            given = dict(input=input.contiguous() if entry.copies_input else input, mat2=mat2, scale_a=scale_a,
                         scale_b=scale_b, scale_result=scale_result, out=out,
                         bias=bias if _takes_bias(entry.template.call) else None)
            return _bind(entry, given)
    arguments = (input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    options = dict(out=out, profile=resolved, splitk=splitk, backend=backend)
    if key is None:
        _count_uncached()
        return plan_scaled_mm(*arguments, **options, context=context_of(context))
    try:
        plan, notices = _plan_reporting(plan_scaled_mm, *arguments, **options, context=context_of(context))
    except BaseException:
        _count_uncached()
        raise
    if getattr(plan.call, "global_scales", None) is None:  # NVFP4's global scales come in tuples: never kept
        _keep(key, _entry(plan, notices, resolved, _SCALED_MM_TENSORS))
    return plan


def _plain(input, mat2, scale_a, scale_b, scale_result, out) -> bool:
    """Whether every tensor of a kept call is plain data (:func:`mmaemu.base._untraced.plain_tensor`; None is:
    the optional ones)."""
    return (plain_tensor(input) and plain_tensor(mat2) and plain_tensor(scale_a) and plain_tensor(scale_b)
            and (scale_result is None or plain_tensor(scale_result)) and (out is None or plain_tensor(out)))


def _scaled_mm_key(input, mat2, scale_a, scale_b, bias, scale_result, out, out_dtype, use_fast_accum, splitk,
                   backend, profile_part, state) -> Optional[tuple]:
    """:func:`_key` of a scaled_mm call, the same tuple, built without the generic loops (it is built at every
    call: a hit costs little else): the tensors' parts by :func:`_dense_part`, the usual scalar arguments' typed
    parts at once."""
    parts = (_dense_part(input), _dense_part(mat2), _dense_part(scale_a), _dense_part(scale_b),
             None if bias is None else _dense_part(bias),
             None if scale_result is None else _dense_part(scale_result),
             None if out is None else _signature_part(out, out=True))
    if _NOT_KEPT in parts:
        return None
    kinds = (type(out_dtype), type(use_fast_accum), type(splitk), type(backend))
    if kinds[0] in _SCALAR_TYPES and kinds[1] in _SCALAR_TYPES and kinds[2] in _SCALAR_TYPES \
            and kinds[3] in _SCALAR_TYPES:
        typed = ((kinds[0], out_dtype), (kinds[1], use_fast_accum), (kinds[2], splitk), (kinds[3], backend))
    else:
        typed = (_typed(out_dtype), _typed(use_fast_accum), _typed(splitk), _typed(backend))
        if None in typed:
            return None
    return ("scaled_mm", parts, typed, profile_part, state)


def _dense_part(t):
    """:func:`_signature_part` of a position that is not ``out`` (the same value), in one call: None, the tensor's
    signature (:func:`_tensor_signature`), or _NOT_KEPT."""
    if t is None:
        return None
    if type(t) not in _CACHEABLE_TYPES:
        return _NOT_KEPT  # a tensor of another type (a subclass), or not a tensor: never kept
    if not t.is_cpu or t.layout is not _STRIDED or t.is_nested:
        return _NOT_KEPT
    return type(t), t.dtype, t.shape, t.stride(), t.storage_offset(), t.requires_grad


_STRIDED = torch.strided


def cached_plan_accumulate(a, b, *, use_fast_accum, profile=None, splitk="auto", backend="auto",
                           out_dtype_for_split=None) -> Plan:
    """:func:`mmaemu.plan.planner.plan_accumulate`, planned once per signature (see the module docstring)."""
    state = _process_state()
    profile_part, resolved, context = _resolve_profile(profile, state)
    key = _key("accumulate", (a, b), None, (use_fast_accum, splitk, backend, out_dtype_for_split), profile_part,
               state)
    options = dict(use_fast_accum=use_fast_accum, profile=resolved, splitk=splitk, backend=backend,
                   out_dtype_for_split=out_dtype_for_split)
    if key is None:
        _count_uncached()
        return plan_accumulate(a, b, **options, context=context_of(context))
    entry = _lookup(key)
    if entry is not None:
        _replay(entry)
        return _bind(entry, dict(a=a, b=b))
    try:
        plan, notices = _plan_reporting(plan_accumulate, a, b, **options, context=context_of(context))
    except BaseException:
        _count_uncached()
        raise
    _keep(key, _entry(plan, notices, resolved, ("a", "b")))
    return plan
