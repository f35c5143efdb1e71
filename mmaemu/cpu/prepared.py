"""B decoded once: the prepared panels of a repeated ``mat2`` (a weight), kept between calls on the CPU.

An engine prepares B its own way (the tile engine: every panel decoded into its tile layout, 5 bytes per code;
:func:`mmaemu.cpu.engine.prepare_b`); what is kept here is generic: an :class:`Engine` names itself and gives its
``prepare_b(codes, fmt) -> prepared`` and the bytes a prepared B of a shape takes.

The rule that keeps a changed weight from ever being served stale: a prepared B is a pure function of B's codes,
their format and the engine, and it is used only for codes **byte-identical** to the codes it was prepared from
(a copy of them is kept and compared with the call's codes on every use, about 0.2 ms per MB; a planned call,
:mod:`mmaemu.cpu.fused`, compares them the same way before its compiled call, and asks
:meth:`PreparedStore.prepared` again where they differ). The tensor's
identity (data pointer, storage offset, shape, strides, dtype, device) and torch's version counter
(``tensor._version``, which every in-place update through the tensor or a view of it increments) only find the
candidate and drop it early; the comparison also covers what the counter does not see (writes through ``.data``,
a numpy array sharing the memory, a freed and reused address).

Memory:

* :data:`WEIGHTS`, the process-wide store of ``scaled_mm``: a B is prepared and kept only the second time the
  same tensor is seen unchanged (same identity and version; a one-off product keeps nothing), at most
  :data:`MAX_BYTES` of prepared data and code copies in all (least recently used dropped first; a B larger than
  that is never kept); a B whose version moved is dropped at once.
* :class:`WeightSlot`, one per :class:`mmaemu.nn.EmulatedFP8Linear`: its weight's prepared B from the first
  forward on, replaced when the weight changes, freed with the layer (6 bytes per weight element for the tile
  engine: 5 of panels, 1 of the copy).
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, NamedTuple, Optional

import numpy as np

from ..base._jit import arithmetic

__all__ = ["Engine", "WeightSlot", "PreparedStore", "WEIGHTS", "MAX_BYTES", "tensor_identity", "WeightRef", "weight_ref",
           "transposed_weight_ref", "same_bytes"]

MAX_BYTES = 256 << 20
MAX_SEEN = 4096


class Engine(NamedTuple):
    """A CPU engine as the store sees it: ``name`` (part of every key), ``prepare_b(codes [N, K] uint8, fmt) ->
    prepared`` and ``nbytes(N, K)``, the bytes of a prepared B of that shape."""

    name: str
    prepare_b: Callable
    nbytes: Callable


class _Kept(NamedTuple):
    version: Optional[int]
    codes: np.ndarray  # flat copy of the codes prepared from
    prepared: object
    nbytes: int


def tensor_identity(t) -> tuple:
    """What finds a tensor's prepared B again: data pointer, storage offset, shape, strides, dtype, device."""
    return t.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device


def version_of(t) -> Optional[int]:
    """torch's version counter of ``t``; None for an inference tensor, which has none (the comparison of the
    codes still guards it)."""
    return None if t.is_inference() else t._version


class WeightRef(NamedTuple):
    """A B tensor as the stores find it, read once: its :func:`tensor_identity` and :func:`version_of`. The stores
    take it wherever they take the tensor (the same key, the same version)."""

    identity: tuple
    version: Optional[int]


def weight_ref(t) -> WeightRef:
    """The :class:`WeightRef` of ``t`` (itself if it is one)."""
    if type(t) is WeightRef:
        return t
    return WeightRef(tensor_identity(t), version_of(t))


def transposed_weight_ref(t) -> WeightRef:
    """The :class:`WeightRef` of the 2-D ``t.t()`` without making that view (a view shares its tensor's data
    pointer, storage offset and version counter; shape and strides swap): ``scaled_mm``'s ``mat2`` [K, N] finds
    B [N, K]'s prepared panels."""
    (rows, cols), (row_stride, col_stride) = t.shape, t.stride()
    return WeightRef((t.data_ptr(), t.storage_offset(), (cols, rows), (col_stride, row_stride), t.dtype, t.device),
                     None if t.is_inference() else t._version)


def _matches(kept: Optional[_Kept], version: int, codes: np.ndarray) -> bool:
    return (kept is not None and kept.version == version and kept.codes.size == codes.size
            and same_bytes(kept.codes, codes.reshape(-1)))


def same_bytes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two flat uint8 arrays of one size hold the same bytes: compared 8 at a time where the size allows,
    by :func:`same_words` (about 0.6 of the time of numpy's ``array_equal`` of the words: 7 against 11 us for
    330 KB, docs/performance.md), else byte-wise."""
    if x.size % 8 == 0 and x.flags.c_contiguous and y.flags.c_contiguous:
        return bool(same_words(x.view(np.uint64), y.view(np.uint64)))
    return bool(np.array_equal(x, y))


# Words compared per step of same_words: ORs of differences in four independent lanes (they vectorise), then one
# test per step, so that a difference stops the comparison early.
_COMPARE_WORDS = 1024


@arithmetic
def same_words(x, y):
    """Whether the flat uint64 arrays x and y (of one size) hold the same words. Indices run unsigned, so that the
    loop has no negative-index code and vectorises."""
    u = np.uint64
    n = u(x.shape[0])
    start = u(0)
    while start < n:
        end = min(start + u(_COMPARE_WORDS), n)
        d0 = d1 = d2 = d3 = u(0)
        i = start
        while i + u(4) <= end:
            d0 |= x[i] ^ y[i]
            d1 |= x[i + u(1)] ^ y[i + u(1)]
            d2 |= x[i + u(2)] ^ y[i + u(2)]
            d3 |= x[i + u(3)] ^ y[i + u(3)]
            i += u(4)
        while i < end:
            d0 |= x[i] ^ y[i]
            i += u(1)
        if (d0 | d1 | d2 | d3) != u(0):
            return False
        start = end
    return True


def _prepare(engine: Engine, codes: np.ndarray, fmt: str, version: int) -> _Kept:
    prepared = engine.prepare_b(codes, fmt)
    copy = np.array(codes.reshape(-1), copy=True)
    return _Kept(version, copy, prepared, engine.nbytes(*codes.shape) + copy.nbytes)


class PreparedStore:
    """The process-wide store (see the module docstring); thread-safe."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_seen: int = MAX_SEEN):
        self.max_bytes, self.max_seen = max_bytes, max_seen
        self._lock = threading.Lock()
        self._kept: "collections.OrderedDict[tuple, _Kept]" = collections.OrderedDict()
        self._seen: "collections.OrderedDict[tuple, int]" = collections.OrderedDict()
        self._bytes = 0
        self.prepares = 0  # how many B were prepared (tests count them)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._seen.clear()
            self._bytes = 0
            self.prepares = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)

    def candidate(self, engine: Engine, fmt: str, tensor) -> Optional[_Kept]:
        """The kept B of ``tensor`` while its identity and version are those it was prepared at, else None; the
        caller uses ``.prepared`` only after finding the call's codes byte-identical to ``.codes`` (else it asks
        :meth:`prepared`, which compares again and drops or replaces it). Marks it recently used, as
        :meth:`prepared` does."""
        ref = weight_ref(tensor)
        key = (engine.name, fmt) + ref.identity
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            self._kept.move_to_end(key)
        return kept if kept.version == ref.version else None

    def prepared(self, engine: Engine, fmt: str, tensor, codes: np.ndarray):
        """The prepared B of ``codes`` (the uint8 codes [N, K] of ``tensor``, B's rows), or None: not kept (yet),
        the caller decodes as it goes. ``tensor``: the tensor or its :class:`WeightRef`."""
        ref = weight_ref(tensor)
        key, version = (engine.name, fmt) + ref.identity, ref.version
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
        if _matches(kept, version, codes):
            return kept.prepared
        with self._lock:
            if kept is not None and self._kept.get(key) is kept:  # changed: dropped at once
                self._drop(key)
            if key not in self._seen or self._seen[key] != version:
                self._seen[key] = version
                self._seen.move_to_end(key)
                while len(self._seen) > self.max_seen:
                    self._seen.popitem(last=False)
                return None
            del self._seen[key]
        if engine.nbytes(*codes.shape) + codes.size > self.max_bytes:
            return None
        fresh = _prepare(engine, codes, fmt, version)
        with self._lock:
            self.prepares += 1
            if key in self._kept:
                self._drop(key)
            self._kept[key] = fresh
            self._bytes += fresh.nbytes
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._kept)))
        return fresh.prepared

    def _drop(self, key) -> None:
        self._bytes -= self._kept.pop(key).nbytes


class WeightSlot:
    """One layer's prepared weight (see the module docstring): kept from the first use, replaced when the weight
    changes. Copies and pickles of a layer start with an empty slot."""

    def __init__(self):
        self._lock = threading.Lock()
        self._key = None
        self._kept: Optional[_Kept] = None
        self.prepares = 0

    def __reduce__(self):
        return (WeightSlot, ())

    def clear(self) -> None:
        with self._lock:
            self._key, self._kept = None, None

    def candidate(self, engine: Engine, fmt: str, tensor) -> Optional[_Kept]:
        """As :meth:`PreparedStore.candidate`: the kept B while the tensor's identity and version are unchanged."""
        ref = weight_ref(tensor)
        key = (engine.name, fmt) + ref.identity
        with self._lock:
            kept = self._kept if self._key == key else None
        return kept if kept is not None and kept.version == ref.version else None

    def prepared(self, engine: Engine, fmt: str, tensor, codes: np.ndarray):
        ref = weight_ref(tensor)
        key, version = (engine.name, fmt) + ref.identity, ref.version
        with self._lock:
            kept = self._kept if self._key == key else None
        if _matches(kept, version, codes):
            return kept.prepared
        fresh = _prepare(engine, codes, fmt, version)
        with self._lock:
            self._key, self._kept = key, fresh
            self.prepares += 1
        return fresh.prepared


WEIGHTS = PreparedStore()
