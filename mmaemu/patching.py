"""``mmaemu.patch``: compute every scaled GEMM of torch with mmaemu for a while.

Usage::

    with mmaemu.patch(profile="ada") as log:
        y = model(x)          # every torch._scaled_mm inside runs as mmaemu.scaled_mm(..., profile="ada")
    print(log.summary())      # one record per call: entry point, recipe, shapes, dtypes, profile, split, backend

    @mmaemu.patch(profile="hopper", splitk=1)
    def run(model, x): ...

What is replaced: the Python attributes of torch's scaled GEMMs, process-wide. Routed to mmaemu, each with torch
2.13.0's signature (an attribute the installed torch lacks is not patched): ``torch._scaled_mm``
(:func:`mmaemu.scaled_mm`), ``torch._scaled_mm_v2`` (so ``torch.nn.functional.scaled_mm``, which looks it up in
the ``torch`` module at each call; :mod:`mmaemu.scaled_v2`), ``torch._scaled_grouped_mm`` and
``torch._scaled_grouped_mm_v2`` (so ``F.scaled_grouped_mm``; :mod:`mmaemu.grouped`). Each computes the recipe pair
of its scales with the model of the kernel the profile's stack runs for it
(:mod:`mmaemu.platform.kernel_families`), or raises mmaemu's error with the way out where mmaemu cannot compute it
(a block-wise call on a stack without block-wise scaling, cuBLASLt's unrecorded row-wise epilogue, MXFP8 grouped
GEMMs). Any other ``torch._scaled...mm...`` attribute (a newer torch's) is replaced by a stand-in that raises
``UnsupportedFeatureError``: inside a block no scaled GEMM is computed natively in silence. Every stand-in calls
one function, :func:`route_call` (entry point, args, kwargs).

While at least one patch block is open in any thread, every thread that calls these attributes gets the
emulation; when the last block closes (normally or through an exception) the original function objects are put
back. The ops of ``torch.ops.aten`` (``_scaled_mm``, ``_scaled_mm_v2``, ``_scaled_grouped_mm``, ...) are *not*
touched (overriding an aten kernel in the dispatcher is global C++ state that cannot be restored safely), so code
that calls the aten ops directly, graphs compiled before the block (``torch.compile``, TorchScript, CUDA graphs)
and references taken before the block (``from torch import _scaled_mm``) still reach torch's kernels, and so do
``torch.compile`` graphs where a tensor subclass calls the function below dynamo (as torchao's do) if they were
captured before the block.

Under ``torch.compile`` inside a block, a call of ``torch._scaled_mm`` or ``torch._scaled_mm_v2`` (F.scaled_mm) is
one opaque node, no graph break: traced (fake or functional tensors) the stand-in puts the custom op
``torch.ops.mmaemu.scaled_mm`` (:mod:`mmaemu.torch_ops`) in the graph with the block's settings; the compiled
graph's run computes it, records it in the logs of the blocks open then, and refuses to run outside a block of the
same settings (docs/guide.md, "Under torch.compile", says what dynamo's caches do around a block). A block-wise
(1x128 / 128x128) v2 call and the grouped GEMMs are not traced into a graph: dynamo breaks its graph at them and
runs them eagerly; traced below dynamo (a tensor subclass's ``__torch_dispatch__``) they are refused.

Settings: ``profile``, ``splitk`` and ``backend`` have the meaning they have in :func:`mmaemu.scaled_mm` and are
checked when the block is built (and, with the inherited ones, when it is entered), so a bad setting fails before
anything is patched. An argument left at None is inherited from the enclosing block of the same context (inner
settings win; the outer ones apply again after the inner block closes), else it takes scaled_mm's default
(``$MMAEMU_PROFILE`` or "hopper", ``splitk="auto"``, ``backend="auto"``).

Contexts: the open blocks are kept in a :mod:`contextvars` variable, so each thread and each asyncio task sees its
own blocks: two tasks on one event loop inside ``patch(profile="ada")`` and ``patch(profile="hopper")`` each get
their own profile and log, and a task created inside a block inherits that block. A thread without a block of its
own uses the settings of the most recently opened block still open anywhere. A block may be left on another thread
than the one that entered it; it is closed for every context then, and torch's function comes back when the last
block closes.

Log: every block keeps a :class:`PatchLog` (a list of :class:`PatchRecord`, with the entry point and the recipe
pair of each call). A call is recorded in the log of every
block open in the calling context (so an outer block also lists the calls of its inner blocks, with the settings
that computed them); a call from a context without a block of its own goes to the log of the block whose settings
it used. Failed calls are recorded too, with the error, and then re-raised. A log keeps the latest ``log_limit``
records (default :data:`DEFAULT_LOG_LIMIT`, 10,000; None keeps all) and counts the older ones it dropped in
``log.dropped``, so a long block does not grow without bound.

Generators: a decorated generator or async generator function (or a plain function that returns a generator, an
async generator or a coroutine) is patched while its body runs, step by step: each ``next`` / ``send`` / ``throw``
/ ``close`` (``asend`` / ``athrow`` / ``aclose``) opens a block until the body yields, and the block is closed
between steps, so the consumer's code between two steps is not patched (unless it is inside a block of its own).
The steps of one call share one log. Without this, the body would run after the decorator's block had closed.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import threading
from typing import List, NamedTuple, Optional, Tuple

import torch

from . import torch_ops
from .base._untraced import untraced
from .formats import dtype_name

__all__ = ["patch", "PatchRecord", "PatchLog", "is_patched", "original_scaled_mm", "original", "route_call",
           "scaled_gemm_attributes", "ROUTED", "REACHED_THROUGH", "DEFAULT_LOG_LIMIT"]

_UNSET = None
#: How many records a block's log keeps by default (the latest ones; a record is about 1 KB with its SplitDecision).
DEFAULT_LOG_LIMIT = 10_000
_DEFAULTS = {"profile": None, "splitk": "auto", "backend": "auto"}

_PACKED_FP4 = "float4_e2m1fn_x2"  # two FP4 elements per byte along K (the record's dtype names)

_lock = threading.RLock()
_open: List["_Block"] = []  # every open block, all contexts, in opening order
_originals = {}  # torch's scaled-GEMM functions as found when the first block opened, by attribute name
_context_blocks: contextvars.ContextVar[Tuple["_Block", ...]] = contextvars.ContextVar("mmaemu_patch_blocks",
                                                                                       default=())


@dataclasses.dataclass(frozen=True)
class PatchRecord:
    """One call of a scaled-GEMM entry point seen inside a patch block.

    ``entry_point`` is the torch attribute called ("torch._scaled_mm", "torch._scaled_mm_v2" for F.scaled_mm,
    "torch._scaled_grouped_mm", "torch._scaled_grouped_mm_v2" for F.scaled_grouped_mm); ``recipe`` torch's name of
    the recipe pair of its scales ("tensorwise_tensorwise", "rowwise_rowwise", "block_1x128_128x128", ...; None when
    the call failed before it was known).

    ``split`` is the :class:`mmaemu.SplitDecision` (None when nothing was computed: a zero-size result, an
    unusable ``out=``, or a call that failed before the decision); ``S``, ``scheme`` and ``source`` are read from
    it. ``error`` is "ExceptionClass: message" for a call that raised, else None.
    """

    input_shape: Tuple[int, ...]
    mat2_shape: Tuple[int, ...]
    input_dtype: str
    mat2_dtype: str
    out_dtype: Optional[str]
    use_fast_accum: object
    profile: Optional[str]
    split: object
    backend: str
    device: str
    thread: str
    error: Optional[str] = None
    entry_point: str = "torch._scaled_mm"
    recipe: Optional[str] = None

    @property
    def K(self):
        """The GEMM's K in elements: input's second dimension, twice it for packed ``float4_e2m1fn_x2`` operands
        (two FP4 elements a byte: NVFP4's K = 64 for a [M, 32] input); "?" when input is not 2-D."""
        if len(self.input_shape) != 2:
            return "?"
        return self.input_shape[1] * (2 if self.input_dtype == _PACKED_FP4 else 1)

    @property
    def S(self) -> Optional[int]:
        return None if self.split is None else self.split.S

    @property
    def scheme(self) -> Optional[str]:
        return None if self.split is None else self.split.scheme

    @property
    def source(self) -> Optional[str]:
        return None if self.split is None else self.split.source

    def line(self) -> str:
        """A one-line description, as in :meth:`PatchLog.summary`."""
        M = self.input_shape[0] if len(self.input_shape) == 2 else "?"
        N = self.mat2_shape[1] if len(self.mat2_shape) == 2 else "?"
        split = "-" if self.split is None else f"S={self.S} {self.scheme} ({self.source})"
        text = (f"M={M} N={N} K={self.K} {self.input_dtype} x {self.mat2_dtype} -> {self.out_dtype} "
                f"fast={self.use_fast_accum} profile={self.profile} split={split} backend={self.backend or '-'} "
                f"via {self.entry_point} ({self.recipe or '?'})")
        return text + (f" ERROR {self.error}" if self.error else "")


class PatchLog(list):
    """The calls recorded by one patch block (a list of :class:`PatchRecord`), the latest ``limit`` of them.

    ``limit``: how many records it keeps (None: all); when a call would exceed it, the oldest record is dropped and
    counted in ``dropped``, so ``len(log) + log.dropped`` is the number of calls the block saw.
    """

    def __init__(self, records=(), *, limit=None):
        super().__init__(records)
        self.limit = limit
        self.dropped = 0

    def _add(self, record) -> None:
        self.append(record)
        if self.limit is not None and len(self) > self.limit:
            excess = len(self) - self.limit
            del self[:excess]
            self.dropped += excess

    def summary(self) -> str:
        """One line per kept call, numbered from the block's first call (after a line counting dropped ones)."""
        lines = [f"{self.dropped + i}: {record.line()}" for i, record in enumerate(self)]
        if self.dropped:
            lines.insert(0, f"({self.dropped} earlier calls dropped: the log keeps the latest {self.limit})")
        return "\n".join(lines)


def _check_log_limit(log_limit):
    if log_limit is None:
        return None
    if isinstance(log_limit, bool) or not isinstance(log_limit, int):
        raise TypeError(f"log_limit must be None or an int >= 0 (records kept per block), got {log_limit!r}")
    if log_limit < 0:
        raise ValueError(f"log_limit must be None or an int >= 0 (records kept per block), got {log_limit!r}")
    return log_limit


_dtype_name = dtype_name  # the records' dtype names (None for None)


@dataclasses.dataclass(eq=False)
class _Block:
    """One entry into a patch block: its effective settings, its log, the ``patch`` object that opened it, and
    whether it is closed (a block left on another thread stays in the entering context's variable, closed)."""

    profile: object
    splitk: object
    backend: object
    log: PatchLog
    owner: "patch"
    closed: bool = False


def _context_stack() -> List[_Block]:
    """The blocks open in the calling context (thread or asyncio task), outermost first."""
    return [block for block in _context_blocks.get() if not block.closed]


def _effective_block() -> Tuple[Optional[_Block], List[_Block]]:
    """(the block whose settings apply to a call from this context, the blocks whose logs record it)."""
    stack = _context_stack()
    if stack:
        return stack[-1], stack
    with _lock:
        block = _open[-1] if _open else None
    return block, ([block] if block is not None else [])


def original_scaled_mm():
    """The ``torch._scaled_mm`` that is (or will be) restored: torch's own function, patched or not."""
    return original("_scaled_mm")


def is_patched() -> bool:
    """True while at least one patch block is open (in any thread)."""
    with _lock:
        return bool(_open)


def _compute(block: _Block, args, kwargs):
    """mmaemu.scaled_mm on torch._scaled_mm's arguments, returning (result, plan or None)."""
    from . import api
    from .context import for_call
    from .plan.planner import plan_scaled_mm

    from .warn import edge

    with edge():  # the warnings of the call are emitted here, at the line that called torch._scaled_mm
        plan = plan_scaled_mm(*args, **kwargs, profile=block.profile, splitk=block.splitk, backend=block.backend,
                              context=for_call())
        return api.run_scaled_mm_plan(plan), plan


def _shape(t) -> Tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def _record(block: _Block, args, kwargs, plan, error, *, entry_point="torch._scaled_mm", recipe=None) -> PatchRecord:
    input_, mat2 = (list(args) + [None, None])[:2]
    out_dtype = kwargs.get("out_dtype")
    if plan is not None:
        out_dtype = plan.call.out_dtype
    elif out_dtype is None and isinstance(kwargs.get("out"), torch.Tensor):
        out_dtype = kwargs["out"].dtype
    elif out_dtype is None and "grouped" in entry_point:  # torch's grouped GEMMs default to bfloat16
        out_dtype = torch.bfloat16
    elif out_dtype is None and isinstance(input_, torch.Tensor):
        out_dtype = input_.dtype
    profile = block.profile
    if plan is not None:
        profile = plan.profile.name
    else:
        try:
            from .platform.profiles import get_profile

            profile = get_profile(profile).name
        except Exception:  # the unknown profile is itself the recorded error
            profile = str(profile)
    return PatchRecord(
        input_shape=_shape(input_), mat2_shape=_shape(mat2),
        input_dtype=_dtype_name(getattr(input_, "dtype", None)), mat2_dtype=_dtype_name(getattr(mat2, "dtype", None)),
        out_dtype=_dtype_name(out_dtype), use_fast_accum=kwargs.get("use_fast_accum", False), profile=profile,
        split=None if plan is None else plan.split, backend="" if plan is None else plan.describe().backend,
        device=str(getattr(input_, "device", "")), thread=threading.current_thread().name,
        error=None if error is None else f"{type(error).__name__}: {error}", entry_point=entry_point, recipe=recipe)


class _Signature(NamedTuple):
    """An entry point's parameters in torch 2.13.0's schema order (the first is "self" in the schema: "input" is
    accepted too), how many of them are required, and the defaults of the others (in order)."""

    params: Tuple[str, ...]
    required: int
    defaults: tuple
    takes_out: bool


_SIGNATURES = {
    "_scaled_mm": _Signature(("input", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype",
                              "use_fast_accum"), 4, (None, None, None, False), True),
    "_scaled_mm_v2": _Signature(("input", "mat2", "scale_a", "recipe_a", "swizzle_a", "scale_b", "recipe_b",
                                 "swizzle_b", "bias", "out_dtype", "contraction_dim", "use_fast_accum"), 10,
                                ((), False), True),
    "_scaled_grouped_mm": _Signature(("input", "mat2", "scale_a", "scale_b", "offs", "bias", "scale_result",
                                      "out_dtype", "use_fast_accum"), 4, (None, None, None, None, False), False),
    "_scaled_grouped_mm_v2": _Signature(("input", "mat2", "scale_a", "recipe_a", "swizzle_a", "scale_b",
                                         "recipe_b", "swizzle_b", "offs", "bias", "out_dtype", "contraction_dim",
                                         "use_fast_accum"), 8, (None, None, None, (), False), False),
}
#: The ``torch`` attributes a block replaces and routes to mmaemu (those the installed torch has).
ROUTED = tuple(_SIGNATURES)
#: Public functions that reach a routed attribute through the ``torch`` module at each call (so replacing the
#: attribute replaces them): ``torch.nn.functional.scaled_mm`` calls ``torch._scaled_mm_v2``, and
#: ``scaled_grouped_mm`` calls ``torch._scaled_grouped_mm_v2`` (torch 2.13.0, ``torch/nn/functional.py``).
REACHED_THROUGH = {"torch.nn.functional.scaled_mm": "_scaled_mm_v2",
                   "torch.nn.functional.scaled_grouped_mm": "_scaled_grouped_mm_v2"}


def scaled_gemm_attributes() -> Tuple[str, ...]:
    """The scaled-GEMM attributes of the installed ``torch`` (names ``_scaled...mm...``): every one is replaced in
    a block, by a routing stand-in (:data:`ROUTED`) or a refusing one (any other: mmaemu does not know its
    arguments, so it raises instead of letting torch compute it natively)."""
    return tuple(name for name in dir(torch) if name.startswith("_scaled") and "mm" in name[len("_scaled"):]
                 and callable(getattr(torch, name)))


def _bind(name: str, args, kwargs) -> dict:
    """The arguments of a call of ``torch.<name>`` by parameter name (defaults filled in; ``out`` only where
    given), with torch's TypeErrors for a bad call."""
    signature = _SIGNATURES[name]
    params = signature.params
    if len(args) > len(params):
        raise TypeError(f"{name}() takes at most {len(params)} positional arguments ({len(args)} given)")
    named = dict(zip(params, args))
    kwargs = dict(kwargs)
    if "self" in kwargs:  # torch's schema names the first argument "self"
        kwargs["input"] = kwargs.pop("self")
    for param in named:
        if param in kwargs:
            raise TypeError(f"{name}() got multiple values for argument '{param}'")
    named.update(kwargs)
    unknown = set(named) - set(params) - ({"out"} if signature.takes_out else set())
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {sorted(unknown)}")
    for param in params[:signature.required]:
        if param not in named:
            raise TypeError(f"{name}() missing required argument '{param}'")
    for param, default in zip(params[signature.required:], signature.defaults):
        named.setdefault(param, default)
    return named


def _in_order(name: str, named: dict) -> list:
    """The bound arguments of ``torch.<name>`` as its positional arguments (``out`` excluded)."""
    return [named[param] for param in _SIGNATURES[name].params]


def _run_scaled_mm(block: _Block, named: dict):
    """``torch._scaled_mm``: mmaemu.scaled_mm's plan and result; (result, plan)."""
    args = _in_order("_scaled_mm", named)
    kwargs = dict(zip(_SIGNATURES["_scaled_mm"].params[4:], args[4:]))
    if "out" in named:
        kwargs["out"] = named["out"]
    return _compute(block, args[:4], kwargs)


def _run_scaled_mm_v2(block: _Block, named: dict):
    """``torch._scaled_mm_v2``: the v2 call resolved (:mod:`mmaemu.scaled_v2`), then computed as that recipe's
    model computes it: mmaemu.scaled_mm's plan, or the block-wise seam; (result, plan or None)."""
    from . import scaled_v2

    call = scaled_v2.resolve_v2(*_in_order("_scaled_mm_v2", named), profile=block.profile)
    out = named.get("out")
    if call.pair in scaled_v2.kernel_families.BLOCKWISE_PAIRS:
        return scaled_v2.run_v2(call, out=out, profile=block.profile, splitk=block.splitk,
                                backend=block.backend), None
    input_, mat2, scale_a, scale_b, bias, scale_result, out_dtype, fast = call.args
    return _compute(block, [input_, mat2, scale_a, scale_b], dict(bias=bias, scale_result=scale_result,
                                                                  out_dtype=out_dtype, use_fast_accum=fast, out=out))


def _run_grouped(block: _Block, named: dict, entry_point: str):
    """``torch._scaled_grouped_mm`` and ``_v2``: :mod:`mmaemu.grouped` with the block's settings; (result, None)."""
    from . import grouped

    compute = grouped.scaled_grouped_mm_v2_op if entry_point.endswith("_v2") else grouped.scaled_grouped_mm_op
    return compute(*_in_order(entry_point, named), profile=block.profile, splitk=block.splitk,
                   backend=block.backend), None


def _recipe_of_arguments(entry_point: str, named: dict) -> Optional[str]:
    """torch's name of the recipe pair a call's arguments state, for the log (None where they name none, and
    for ``torch._scaled_mm``, whose pair its plan tells)."""
    from . import grouped, scaled_v2

    recipe_a = scaled_v2._enum_values(scaled_v2._as_list(named.get("recipe_a")))
    recipe_b = scaled_v2._enum_values(scaled_v2._as_list(named.get("recipe_b")))
    try:
        if entry_point == "_scaled_mm_v2":
            return scaled_v2.recipe_pair(named["input"], named["mat2"], scaled_v2._as_list(named["scale_a"]),
                                         recipe_a, scaled_v2._as_list(named["scale_b"]), recipe_b)
        if entry_point == "_scaled_grouped_mm_v2":
            return grouped._pair_of_v2(recipe_a, recipe_b, named["input"])
        if entry_point == "_scaled_grouped_mm":
            return grouped._pair_of_v1(named["scale_a"], named["scale_b"])
    except Exception:  # the call raises the same error when it is computed: the log records it there
        return None
    return None


def route_call(entry_point: str, args, kwargs):
    """Compute a call of ``torch.<entry_point>`` made inside a patch block: bind its arguments by torch's schema,
    compute it with mmaemu and the block's settings, record it in the logs of the blocks open in this context
    (failed calls too, with their error) and return the result. The one function every stand-in calls."""
    block, logs = _effective_block()
    if block is None:  # called through a reference kept after every block closed
        return original(entry_point)(*args, **kwargs)
    named = _bind(entry_point, args, kwargs)
    if torch_ops.is_tracing(value for value in _flat(named.values())):
        return _traced_call(block, entry_point, named)
    return _computed_call(block, logs, entry_point, named)


@untraced
def _computed_call(block: _Block, logs: List[_Block], entry_point: str, named: dict):
    """A call computed now, on tensors with data, and recorded in ``logs``. Never traced by dynamo: a call that
    dynamo could not put in its graph (a block-wise ``torch._scaled_mm_v2``: the graph breaks at the stand-in)
    runs eagerly, but its frames would still be traced one by one, the emulation's host work (numpy on the
    operands' codes) compiled into graphs of torch ops at each graph break; excluded here, it runs as numpy."""
    from .plan.planner import recipe_pair_of

    plan = error = None
    recipe = _recipe_of_arguments(entry_point, named)
    try:
        if entry_point == "_scaled_mm":
            result, plan = _run_scaled_mm(block, named)
        elif entry_point == "_scaled_mm_v2":
            result, plan = _run_scaled_mm_v2(block, named)
        else:
            result, plan = _run_grouped(block, named, entry_point)
        return result
    except Exception as exc:
        error = exc
        raise
    finally:
        if plan is not None:
            recipe = recipe_pair_of(plan.call)
        _add_to_logs(logs, _record(block, [named.get("input"), named.get("mat2")], named, plan, error,
                                   entry_point=f"torch.{entry_point}", recipe=recipe))


def _flat(values):
    """The values, with the items of list and tuple values (v2's scale lists) in their place."""
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _add_to_logs(logs, record: PatchRecord) -> None:
    with _lock:
        for open_block in logs:
            open_block.log._add(record)


#: The entry points a traced call of which becomes the custom op in the graph (the others break dynamo's graph
#: and run eagerly), with the name of the observer their op calls report to.
_TRACED = {"_scaled_mm": "mmaemu.patch", "_scaled_mm_v2": "mmaemu.patch:_scaled_mm_v2"}


def _traced_call(block: _Block, entry_point: str, named: dict):
    """A call traced by torch.compile (fake or functional tensors): the custom op in the graph with the block's
    settings (:func:`mmaemu.torch_ops.traced_call`); nothing computed or recorded now."""
    from .errors import UnsupportedFeatureError

    if entry_point == "_scaled_mm":
        args = _in_order("_scaled_mm", named)
        rest = dict(zip(_SIGNATURES["_scaled_mm"].params[4:], args[4:]), out=named.get("out"))
        return torch_ops.traced_call(args[:4], rest, _op_settings(block), _TRACED[entry_point])
    if entry_point == "_scaled_mm_v2":
        from . import scaled_v2

        call = scaled_v2.resolve_v2(*_in_order("_scaled_mm_v2", named), profile=block.profile)
        if call.pair not in scaled_v2.kernel_families.BLOCKWISE_PAIRS:
            input_, mat2, scale_a, scale_b, bias, scale_result, out_dtype, fast = call.args
            global_scales = (None, None)
            if isinstance(scale_a, tuple):  # NVFP4's (block scales, global scale) pairs
                (scale_a, global_a), (scale_b, global_b) = scale_a, scale_b
                global_scales = (global_a, global_b)
            rest = dict(bias=bias, scale_result=scale_result, out_dtype=out_dtype, use_fast_accum=fast,
                        out=named.get("out"))
            return torch_ops.traced_call([input_, mat2, scale_a, scale_b], rest, _op_settings(block),
                                         _TRACED[entry_point], global_scales=global_scales)
    raise UnsupportedFeatureError(
        f"torch.{entry_point} is traced here (fake or functional tensors, e.g. a tensor subclass's "
        f"__torch_dispatch__ under torch.compile), and mmaemu puts only torch._scaled_mm and the tensor-wise, "
        f"row-wise and block-scaled torch._scaled_mm_v2 calls into a compiled graph: run this call eagerly (outside "
        f"torch.compile, or behind torch.compiler.disable) [mmaemu scope]")


def _op_settings(block: _Block) -> torch_ops.Settings:
    return torch_ops.settings_of(block.profile, block.splitk, block.backend)


def _admit_compiled_call(settings: torch_ops.Settings) -> None:
    """A compiled graph's op call runs only inside a block of the settings it was traced with (else it raises)."""
    block, _ = _effective_block()
    now = None if block is None else _op_settings(block)
    if now != settings:
        from .errors import UnsupportedFeatureError

        where = "no mmaemu.patch block is open" if block is None else f"the open block's settings are {now}"
        raise UnsupportedFeatureError(
            f"a graph that torch.compile traced inside mmaemu.patch with settings {settings} runs now, but {where}: "
            f"the compiled graph would compute with settings that no longer apply; call torch._dynamo.reset() "
            f"(or torch.compiler.reset()) before running compiled code outside the block it was compiled in, or "
            f"compile it inside each block [mmaemu scope]")


def _compiled_call_recorder(entry_point: str):
    """What records a compiled graph's op call of ``torch.<entry_point>`` in the logs of the blocks open when it
    runs."""
    def record(arguments, plan, error, settings) -> None:
        from .plan.planner import recipe_pair_of

        block, logs = _effective_block()
        if block is None:
            return
        recipe = None if plan is None else recipe_pair_of(plan.call)
        _add_to_logs(logs, _record(block, [arguments["input"], arguments["mat2"]], arguments, plan, error,
                                   entry_point=f"torch.{entry_point}", recipe=recipe))
    return record


for _entry, _observer in _TRACED.items():
    torch_ops.register_observer(_observer, torch_ops.CallObserver(admit=_admit_compiled_call,
                                                                  record=_compiled_call_recorder(_entry)))


def _refuse_unknown(entry_point: str):
    """A scaled-GEMM attribute of torch that mmaemu does not know: refused inside a block, never native."""
    from .errors import UnsupportedFeatureError

    raise UnsupportedFeatureError(
        f"torch.{entry_point} is a scaled GEMM of this torch that mmaemu.patch does not know (it routes "
        f"{', '.join('torch.' + n for n in ROUTED)}): inside a patch block it is refused rather than computed by "
        f"torch natively; call one of those entry points, or call it outside the block")


def _stand_in(entry_point: str):
    """The function a block puts in place of ``torch.<entry_point>``: :func:`route_call` for a routed entry
    point, a refusal for an unknown scaled GEMM. Those of :data:`_TRACED` are put in dynamo's graphs as one opaque
    call (``torch.compiler.allow_in_graph``: run on fake tensors while dynamo traces, they put the custom op in the
    graph); the others are excluded from tracing (``torch.compiler.disable``): dynamo breaks the graph at the call
    and runs the emulation eagerly. Both are applied here, at import, not lazily: dynamo must be imported before a
    block puts this function in place of the torch function, or its first import would record it as torch's
    in-graph op."""
    if entry_point in _SIGNATURES:
        def stand_in(*args, **kwargs):
            return route_call(entry_point, args, kwargs)
    else:
        def stand_in(*args, **kwargs):
            if _effective_block()[0] is None:
                return original(entry_point)(*args, **kwargs)
            _refuse_unknown(entry_point)
    stand_in.__name__ = stand_in.__qualname__ = entry_point
    stand_in.__module__ = "mmaemu.patching"
    stand_in.__doc__ = f"Stand-in for torch.{entry_point} while a patch block is open (mmaemu.patching)."
    stand_in.__wrapped_by_mmaemu__ = True
    if entry_point in _TRACED:
        torch.compiler.allow_in_graph(stand_in)
        return stand_in
    return torch.compiler.disable(stand_in)


_STAND_INS = {}


def _stand_in_for(entry_point: str):
    """The one stand-in of ``entry_point`` (made on first use, kept: the same object in every block)."""
    if entry_point not in _STAND_INS:
        _STAND_INS[entry_point] = _stand_in(entry_point)
    return _STAND_INS[entry_point]


for _routed in ROUTED:  # made at import: dynamo is imported before a block puts any of them in place
    _stand_in_for(_routed)


def original(entry_point: str):
    """``torch.<entry_point>`` as it is restored: torch's own function, patched or not."""
    with _lock:
        found = _originals.get(entry_point)
        return found if found is not None else getattr(torch, entry_point)


def _install() -> None:
    """Replace every scaled-GEMM attribute of torch by its stand-in (the first block opening; under _lock)."""
    for entry_point in scaled_gemm_attributes():
        current = getattr(torch, entry_point)
        stand_in = _stand_in_for(entry_point)
        if current is not stand_in:  # else: a block of ours never closed (see __exit__)
            _originals[entry_point] = current
        setattr(torch, entry_point, stand_in)


def _uninstall() -> None:
    """Put torch's functions back (the last block closing; under _lock), unless someone replaced ours meanwhile
    (then theirs stays, and ours, if they call it, falls through to the original because no block is open)."""
    for entry_point, original_function in _originals.items():
        if getattr(torch, entry_point, None) is _STAND_INS.get(entry_point):
            setattr(torch, entry_point, original_function)


class patch(contextlib.ContextDecorator):
    """Context manager and decorator: torch's scaled GEMMs (``torch._scaled_mm``, ``torch._scaled_mm_v2`` /
    ``F.scaled_mm``, ``torch._scaled_grouped_mm(_v2)`` / ``F.scaled_grouped_mm``) are computed by mmaemu.

    ``profile``, ``splitk``, ``backend``: as in scaled_mm; None inherits from the enclosing block of this context,
    else scaled_mm's default. Bad values raise here (KeyError, TypeError, ValueError, as scaled_mm would).
    ``log_limit``: how many records each block's log keeps, the latest ones (None: all; older ones are counted in
    ``log.dropped``). ``with patch(...) as log`` gives the block's :class:`PatchLog`; the object's ``log``
    attribute is the log of its most recent block (for the decorator form: of the latest call; for a generator,
    of the latest one started). Reentrant, nestable, thread- and asyncio-safe; a decorated ``async def`` keeps the
    block open across its awaits; a decorated generator is patched while its body runs, not between its steps.
    See the module documentation for the process-wide effect.
    """

    def __init__(self, profile=_UNSET, splitk=_UNSET, backend=_UNSET, *, log_limit=DEFAULT_LOG_LIMIT):
        from .context import for_call

        context = for_call()  # the edge: these checks read the environment of this moment
        if profile is not None:
            from .platform.profiles import get_profile

            get_profile(profile, context=context)  # unknown names fail here, not at the first call
        if splitk is not None:
            from .platform.splitk import check_splitk_argument

            check_splitk_argument(splitk, profile, context=context)
        if backend is not None:
            from .backends import requested_backend

            requested_backend(backend, context=context)
        self.profile, self.splitk, self.backend = profile, splitk, backend
        self.log_limit = _check_log_limit(log_limit)
        self.log = PatchLog(limit=self.log_limit)

    def _settings(self) -> dict:
        """The block's settings: its own, else the enclosing block's in this context, else scaled_mm's default;
        the split is checked against the profile it ends up with (inherited or default)."""
        stack = _context_stack()
        outer = stack[-1] if stack else None
        settings = {}
        for name in ("profile", "splitk", "backend"):
            mine = getattr(self, name)
            if mine is not None:
                settings[name] = mine
            elif outer is not None:
                settings[name] = getattr(outer, name)
            else:
                settings[name] = _DEFAULTS[name]
        if self.splitk is not None or self.profile is not None:  # a new combination
            from .context import for_call
            from .platform.profiles import get_profile
            from .platform.splitk import check_splitk_argument

            context = for_call()  # the edge: the block's profile and split read this one reading
            check_splitk_argument(settings["splitk"], get_profile(settings["profile"], context=context),
                                  context=context)
        return settings

    def __enter__(self) -> PatchLog:
        return self._open_block(PatchLog(limit=self.log_limit))

    def _open_block(self, log: PatchLog) -> PatchLog:
        """Enter a block whose calls are recorded in ``log`` (a new one per ``with``; one per decorated call)."""
        block = _Block(**self._settings(), log=log, owner=self)
        with _lock:
            if not _open:
                _install()
            _open.append(block)
        _context_blocks.set(_context_blocks.get() + (block,))
        self.log = block.log
        return block.log

    def _own_block(self) -> Optional[_Block]:
        """The block this object opened most recently in this context, else (left on another thread) anywhere."""
        for block in reversed(_context_stack()):
            if block.owner is self:
                return block
        with _lock:
            return next((block for block in reversed(_open) if block.owner is self), None)

    def __exit__(self, exc_type, exc, tb):
        block = self._own_block()
        if block is None:
            raise RuntimeError(f"{self!r} is not open: __exit__ without a matching __enter__")
        block.closed = True
        _context_blocks.set(tuple(b for b in _context_blocks.get() if b is not block))
        with _lock:
            _open.remove(block)
            if not _open:
                _uninstall()
        return False

    @contextlib.contextmanager
    def _block_logging_to(self, log: PatchLog):
        self._open_block(log)
        try:
            yield
        finally:
            self.__exit__(None, None, None)

    def _steps(self, generator, log: PatchLog):
        """Run ``generator`` one step at a time, each step (``send``, ``throw``, ``close``) inside a block of this
        patch logging to ``log``; between the steps the block is closed, so the consumer's code is not patched."""
        sent = thrown = None
        while True:
            with self._block_logging_to(log):
                try:
                    value = generator.send(sent) if thrown is None else generator.throw(thrown)
                except StopIteration as stop:
                    return stop.value
            sent = thrown = None
            try:
                sent = yield value
            except GeneratorExit:
                with self._block_logging_to(log):
                    generator.close()
                raise
            except BaseException as exc:  # thrown into us by the consumer: hand it to the body, patched
                thrown = exc

    def _async_steps(self, start):
        """:meth:`_steps` for an async generator (``asend``, ``athrow``, ``aclose``); a step's awaits stay inside
        its block, as in a decorated ``async def``. An async generator cannot delegate (no ``yield from``), so
        this is an async generator function, to be decorated or called: each of its calls takes ``(generator,
        log)`` from ``start(*args, **kwargs)`` at its first step and forwards the consumer's steps to them."""

        async def steps(*args, **kwargs):
            generator, log = start(*args, **kwargs)
            sent = thrown = None
            while True:
                with self._block_logging_to(log):
                    try:
                        value = await (generator.asend(sent) if thrown is None else generator.athrow(thrown))
                    except StopAsyncIteration:
                        return
                sent = thrown = None
                try:
                    sent = yield value
                except GeneratorExit:
                    with self._block_logging_to(log):
                        await generator.aclose()
                    raise
                except BaseException as exc:
                    thrown = exc

        return steps

    async def _awaited(self, coroutine, log: PatchLog):
        with self._block_logging_to(log):
            return await coroutine

    def _new_log(self) -> PatchLog:
        self.log = PatchLog(limit=self.log_limit)
        return self.log

    def _deferred(self, result, log: PatchLog):
        """A generator, async generator or coroutine returned by a plain function, made to run its body inside
        this patch too (else it would run after the block closed, unpatched); any other result as it is."""
        if inspect.isgenerator(result):
            return self._steps(result, log)
        if inspect.isasyncgen(result):
            return self._async_steps(lambda: (result, log))()
        if inspect.iscoroutine(result):
            return self._awaited(result, log)
        return result

    def __call__(self, func):
        """Decorate ``func``: each call runs inside a block of this patch, with one log per call.

        Generator and async generator functions (and plain functions returning a generator, an async generator or
        a coroutine) are spanned step by step: the patch is open while the body runs, from ``next`` / ``send`` /
        ``throw`` / ``close`` (or their async forms) until it yields, and closed while the consumer runs between
        steps, so code outside the body never sees it; every step logs to the call's one log. Inherited settings
        are those of the block enclosing each step. An ``async def`` keeps its block across its awaits.
        """
        if inspect.isasyncgenfunction(func):
            def start(*args, **kwargs):
                return func(*args, **kwargs), self._new_log()

            return functools.wraps(func)(self._async_steps(start))

        if inspect.isgeneratorfunction(func):
            @functools.wraps(func)
            def generator_wrapper(*args, **kwargs):
                return (yield from self._steps(func(*args, **kwargs), self._new_log()))

            return generator_wrapper

        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                with self:
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self as log:
                result = func(*args, **kwargs)
            return self._deferred(result, log)

        return wrapper

    def __repr__(self):
        return (f"mmaemu.patch(profile={self.profile!r}, splitk={self.splitk!r}, backend={self.backend!r}, "
                f"log_limit={self.log_limit!r})")
