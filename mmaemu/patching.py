"""``mmaemu.patch``: compute every ``torch._scaled_mm`` call with :func:`mmaemu.scaled_mm` for a while.

Usage::

    with mmaemu.patch(profile="ada") as log:
        y = model(x)          # every torch._scaled_mm inside runs as mmaemu.scaled_mm(..., profile="ada")
    print(log.summary())      # one record per call: shapes, dtypes, profile, split decision, backend

    @mmaemu.patch(profile="hopper", splitk=1)
    def run(model, x): ...

What is replaced: the Python attribute ``torch._scaled_mm`` only, process-wide. While at least one patch block is
open in any thread, every thread that calls ``torch._scaled_mm`` gets the emulation; when the last block closes
(normally or through an exception) the original function object is put back. ``torch.ops.aten._scaled_mm`` is
*not* touched (overriding an aten kernel in the dispatcher is global C++ state that cannot be restored safely),
so code that calls the aten op directly, graphs captured before the block (TorchScript, CUDA graphs, and
``torch.compile`` graphs where a tensor subclass calls the function below dynamo, as torchao's do) and references
taken before the block (``from torch import _scaled_mm``) still reach torch's kernel.

Under ``torch.compile`` inside a block, the call is one opaque node, no graph break: traced (fake or functional
tensors) the stand-in puts the custom op ``torch.ops.mmaemu.scaled_mm`` (:mod:`mmaemu.torch_ops`) in the graph
with the block's settings; the compiled graph's run computes it, records it in the logs of the blocks open then,
and refuses to run outside a block of the same settings (docs/guide.md, "Under torch.compile", says what dynamo's
caches do around a block).

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

Log: every block keeps a :class:`PatchLog` (a list of :class:`PatchRecord`). A call is recorded in the log of every
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
from typing import List, Optional, Tuple

import torch

from . import torch_ops

__all__ = ["patch", "PatchRecord", "PatchLog", "is_patched", "original_scaled_mm", "DEFAULT_LOG_LIMIT"]

_UNSET = None
#: How many records a block's log keeps by default (the latest ones; a record is about 1 KB with its SplitDecision).
DEFAULT_LOG_LIMIT = 10_000
_DEFAULTS = {"profile": None, "splitk": "auto", "backend": "auto"}

_PACKED_FP4 = "float4_e2m1fn_x2"  # two FP4 elements per byte along K (the record's dtype names)

_lock = threading.RLock()
_open: List["_Block"] = []  # every open block, all contexts, in opening order
_original = None  # torch._scaled_mm as found when the first block opened
_context_blocks: contextvars.ContextVar[Tuple["_Block", ...]] = contextvars.ContextVar("mmaemu_patch_blocks",
                                                                                       default=())


@dataclasses.dataclass(frozen=True)
class PatchRecord:
    """One ``torch._scaled_mm`` call seen inside a patch block.

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
                f"fast={self.use_fast_accum} profile={self.profile} split={split} backend={self.backend or '-'}")
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


def _dtype_name(dtype) -> Optional[str]:
    return None if dtype is None else str(dtype).replace("torch.", "")


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
    with _lock:
        return _original if _original is not None else torch._scaled_mm


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


def _record(block: _Block, args, kwargs, plan, error) -> PatchRecord:
    input_, mat2 = (list(args) + [None, None])[:2]
    out_dtype = kwargs.get("out_dtype")
    if plan is not None:
        out_dtype = plan.call.out_dtype
    elif out_dtype is None and isinstance(kwargs.get("out"), torch.Tensor):
        out_dtype = kwargs["out"].dtype
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
        error=None if error is None else f"{type(error).__name__}: {error}")


_PARAMS = ("input", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")


def _patched_scaled_mm(*args, **kwargs):
    """Stand-in for ``torch._scaled_mm`` while a patch block is open: mmaemu.scaled_mm with the block's settings.

    Run eagerly (real tensors), it computes and records the call. Traced (fake or functional tensors: dynamo,
    AOTAutograd, a tensor subclass's ``__torch_dispatch__`` under them), it puts the custom op
    ``torch.ops.mmaemu.scaled_mm`` in the graph with the block's settings (:func:`mmaemu.torch_ops.traced_call`),
    which computes and records when the compiled graph runs (:data:`_COMPILED_CALLS`); nothing is computed or
    recorded while tracing. Dynamo puts this function itself in its graph as one opaque call
    (``torch.compiler.allow_in_graph`` below): no graph break.
    """
    block, logs = _effective_block()
    if block is None:  # called through a reference kept after every block closed
        return original_scaled_mm()(*args, **kwargs)
    if len(args) > len(_PARAMS):
        raise TypeError(f"_scaled_mm() takes at most {len(_PARAMS)} positional arguments ({len(args)} given)")
    named = dict(zip(_PARAMS, args))
    if "self" in kwargs:  # torch's schema names the first argument "self"
        kwargs["input"] = kwargs.pop("self")
    for name in named:
        if name in kwargs:
            raise TypeError(f"_scaled_mm() got multiple values for argument '{name}'")
    named.update(kwargs)
    unknown = set(named) - set(_PARAMS) - {"out"}
    if unknown:
        raise TypeError(f"_scaled_mm() got unexpected keyword arguments {sorted(unknown)}")
    for required in _PARAMS[:4]:
        if required not in named:
            raise TypeError(f"_scaled_mm() missing required argument '{required}'")
    positional = [named.pop(name) for name in _PARAMS[:4]]
    if torch_ops.is_tracing(positional + list(named.values())):
        return torch_ops.traced_call(positional, named, _op_settings(block), _OBSERVER_NAME)
    plan = error = None
    try:
        result, plan = _compute(block, positional, named)
        return result
    except Exception as exc:
        error = exc
        raise
    finally:
        _add_to_logs(logs, _record(block, positional, named, plan, error))


def _add_to_logs(logs, record: PatchRecord) -> None:
    with _lock:
        for open_block in logs:
            open_block.log._add(record)


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


def _record_compiled_call(arguments, plan, error, settings) -> None:
    """Record a compiled graph's op call in the logs of the blocks open when it runs."""
    block, logs = _effective_block()
    if block is None:
        return
    _add_to_logs(logs, _record(block, [arguments["input"], arguments["mat2"]], arguments, plan, error))


_OBSERVER_NAME = "mmaemu.patch"
#: What the op reports to, in a compiled graph traced inside a block.
_COMPILED_CALLS = torch_ops.CallObserver(admit=_admit_compiled_call, record=_record_compiled_call)
torch_ops.register_observer(_OBSERVER_NAME, _COMPILED_CALLS)
# Dynamo puts the stand-in in its graph as one call (run on fake tensors while it traces); dynamo is imported here,
# before any block puts the function in place of torch._scaled_mm.
torch.compiler.allow_in_graph(_patched_scaled_mm)


# `torch._scaled_mm.__name__` etc. for introspection; the signature is torch 2.7.1's.
_patched_scaled_mm.__name__ = "_scaled_mm"
_patched_scaled_mm.__qualname__ = "_scaled_mm"
_patched_scaled_mm.__module__ = "mmaemu.patching"
_patched_scaled_mm.__wrapped_by_mmaemu__ = True


class patch(contextlib.ContextDecorator):
    """Context manager and decorator: ``torch._scaled_mm`` calls are computed by :func:`mmaemu.scaled_mm`.

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
        if profile is not None:
            from .platform.profiles import get_profile

            get_profile(profile)  # unknown names fail here, not at the first call
        if splitk is not None:
            from .platform.splitk import check_splitk_argument

            check_splitk_argument(splitk, profile)
        if backend is not None:
            from .backends import requested_backend

            requested_backend(backend)
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
            from .platform.profiles import get_profile
            from .platform.splitk import check_splitk_argument

            check_splitk_argument(settings["splitk"], get_profile(settings["profile"]))
        return settings

    def __enter__(self) -> PatchLog:
        return self._open_block(PatchLog(limit=self.log_limit))

    def _open_block(self, log: PatchLog) -> PatchLog:
        """Enter a block whose calls are recorded in ``log`` (a new one per ``with``; one per decorated call)."""
        global _original
        block = _Block(**self._settings(), log=log, owner=self)
        with _lock:
            if not _open:
                if torch._scaled_mm is not _patched_scaled_mm:  # else: a block of ours never closed (see __exit__)
                    _original = torch._scaled_mm
                torch._scaled_mm = _patched_scaled_mm
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
            if not _open and torch._scaled_mm is _patched_scaled_mm:
                # Restore torch's function, unless someone replaced ours meanwhile (then theirs stays, and ours,
                # if they call it, falls through to the original because no block is open).
                torch._scaled_mm = _original
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

    async def _async_steps(self, generator, log: PatchLog):
        """:meth:`_steps` for an async generator (``asend``, ``athrow``, ``aclose``); a step's awaits stay inside
        its block, as in a decorated ``async def``."""
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
            return self._async_steps(result, log)
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
            @functools.wraps(func)
            async def async_generator_wrapper(*args, **kwargs):
                steps = self._async_steps(func(*args, **kwargs), self._new_log())
                sent = thrown = None
                while True:  # an async generator cannot delegate with `yield from`: forward by hand
                    try:
                        value = await (steps.asend(sent) if thrown is None else steps.athrow(thrown))
                    except StopAsyncIteration:
                        return
                    sent = thrown = None
                    try:
                        sent = yield value
                    except GeneratorExit:
                        await steps.aclose()
                        raise
                    except BaseException as exc:
                        thrown = exc

            return async_generator_wrapper

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
