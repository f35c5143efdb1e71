"""The cuBLASLt heuristic query torch._scaled_mm makes, asked through NVIDIA's own bindings (platform.md 3.5).

One code path serves the live query on the reference GPU (:func:`query_heuristic`) and the recorder of new
platforms (:mod:`mmaemu.record`, which keeps a :class:`HeuristicSession` open for millions of queries).

* :func:`build_query` states the problem as plain data, in the vendor's enum *names* ("CUDA_R_8F_E4M3",
  "COMPUTE_32F", "T"): torch 2.7.1's ``scaled_gemm`` descriptor, the one the recorded tables answer (their json
  ``descriptor``). Which workspace a torch build really uses is measured by the recorder, not assumed here.
* :class:`LtApi` holds the bindings: ``nvmath.bindings.cublasLt`` (``nvmath-python``, Apache-2.0, the optional extra
  ``mmaemu[record]``), whose enum values and attribute buffer types come from NVIDIA's headers, never from
  constants written here. Beware: ``nvmath.ComputeType`` is cuTensorNet's enum (COMPUTE_32F = 4); cuBLASLt's
  ``cublasComputeType_t`` (COMPUTE_32F = 68) is ``nvmath.bindings.cublas.ComputeType``.
* :class:`HeuristicSession` issues queries, reusing the handle, the matmul descriptors (one per fast/slow), the
  preferences (one per workspace and alignment) and the matrix layouts of a shape.

The bindings bind to the libcublasLt already mapped into the process when there is one (cuda-pathfinder looks for a
loaded library first), so torch is imported before them: the answers are those of torch's own cuBLASLt. A session
refuses to run when two different libcublasLt files are mapped.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from .cublaslt import CublasLtError, mapped_cublaslt_paths

__all__ = [
    "MatrixLayout",
    "HeuristicQuery",
    "HeuristicAnswer",
    "LtApi",
    "HeuristicSession",
    "build_query",
    "query_heuristic",
    "nvmath_api",
    "INSTALL_HINT",
    "live_heuristic",
    "device_scale_pointer",
]

INSTALL_HINT = "install NVIDIA's bindings: pip install 'mmaemu[record]' (nvmath-python)"

_FP8_TYPE = {"e4m3": "CUDA_R_8F_E4M3", "e5m2": "CUDA_R_8F_E5M2"}
_OUT_TYPE = {"float32": "CUDA_R_32F", "bfloat16": "CUDA_R_16BF", "float16": "CUDA_R_16F",
             "float8_e4m3fn": "CUDA_R_8F_E4M3", "float8_e5m2": "CUDA_R_8F_E5M2"}
# The algorithm's configuration read back, in this order (cublasLtMatmulAlgoConfigAttributes_t names).
_CONFIG_FIELDS = (("algo", "ID"), ("tile", "TILE_ID"), ("splitK", "SPLITK_NUM"), ("custom", "CUSTOM_OPTION"),
                  ("stages", "STAGES_ID"), ("reduction", "REDUCTION_SCHEME"), ("swizzle", "CTA_SWIZZLING"))
_ALIGNMENT_PREFERENCES = ("MIN_ALIGNMENT_A_BYTES", "MIN_ALIGNMENT_B_BYTES", "MIN_ALIGNMENT_C_BYTES",
                          "MIN_ALIGNMENT_D_BYTES")


# ----------------------------------------------------------------------------------------------------------------
# The query as data


@dataclasses.dataclass(frozen=True)
class MatrixLayout:
    """cublasLtMatrixLayoutCreate(type, rows, cols, ld): column-major, as cuBLASLt sees it; ``dtype`` is a
    cudaDataType name."""

    dtype: str
    rows: int
    cols: int
    ld: int


@dataclasses.dataclass(frozen=True)
class HeuristicQuery:
    """Everything cublasLtMatmulAlgoGetHeuristic is given (platform.md 3.5), in vendor enum names.

    torch computes the row-major M x N result as the column-major N x M problem: m = N, n = M, k = K with
    A = mat2 (K x N, ld K, TRANSA = T), B = mat1 (K x M, ld K, TRANSB = N), C/D of N x M with ld N.
    """

    compute_type: str
    scale_type: str
    transa: str
    transb: str
    a: MatrixLayout
    b: MatrixLayout
    c: MatrixLayout
    d: MatrixLayout
    fast_accum: bool
    workspace_bytes: int
    align: Optional[int]
    requested_algo_count: int = 1

    @property
    def descriptor_key(self) -> tuple:
        return (self.compute_type, self.scale_type, self.transa, self.transb, self.fast_accum)

    @property
    def preference_key(self) -> tuple:
        return (self.workspace_bytes, self.align)


@dataclasses.dataclass(frozen=True)
class HeuristicAnswer:
    """The first algorithm's configuration: id, tile enum, numSplitsK, customOption, stages enum, reduction scheme
    and CTA swizzling (the value columns of the split-K tables)."""

    algo: int
    tile: int
    splitK: int
    custom: int
    stages: int = 0
    reduction: int = 0
    swizzle: int = 0


def build_query(M: int, N: int, K: int, fmt_a: str, fmt_b: str, out: str, fast: bool, workspace_bytes: int,
                align: Optional[int]) -> HeuristicQuery:
    """torch 2.7.1's scaled_gemm descriptor for mat1 [M, K] (fmt_a) row-major times mat2 [K, N] (fmt_b)
    column-major, output ``out``: C is fp16 when the output is FP8 (torch: C is unused, beta = 0); A and B scale
    pointers; no D scale pointer, no bias epilogue, no SM-count target."""
    out_type = _OUT_TYPE[out]
    c_type = "CUDA_R_16F" if out.startswith("float8") else out_type
    return HeuristicQuery(
        compute_type="COMPUTE_32F", scale_type="CUDA_R_32F", transa="T", transb="N",
        a=MatrixLayout(_FP8_TYPE[fmt_b], K, N, K), b=MatrixLayout(_FP8_TYPE[fmt_a], K, M, K),
        c=MatrixLayout(c_type, N, M, N), d=MatrixLayout(out_type, N, M, N),
        fast_accum=bool(fast), workspace_bytes=int(workspace_bytes), align=align,
    )


# ----------------------------------------------------------------------------------------------------------------
# The bindings


@dataclasses.dataclass(frozen=True)
class LtApi:
    """The cuBLASLt bindings and the enums they take (``nvmath_api()`` for the real ones; tests pass a double).

    ``lt``: ``nvmath.bindings.cublasLt``; ``data_type``: cudaDataType_t (``nvmath.CudaDataType``);
    ``compute_type``: cublasComputeType_t (``nvmath.bindings.cublas.ComputeType``); ``operation``:
    cublasOperation_t (``nvmath.bindings.cublas.Operation``); ``error``: the exception the bindings raise for a
    status other than success (its ``status`` attribute holds the status).
    """

    lt: object
    data_type: object
    compute_type: object
    operation: object
    error: type
    source: str = "test double"


def nvmath_api() -> LtApi:
    """NVIDIA's cuBLASLt bindings, bound to torch's libcublasLt (torch is imported first). CublasLtError if the
    optional extra is missing."""
    import importlib

    importlib.import_module("torch")  # loads torch's libcublasLt before the bindings look for one

    try:
        import nvmath
        from nvmath.bindings import cublas, cublasLt
    except ImportError as exc:
        raise CublasLtError(f"nvmath-python is not importable ({exc}): {INSTALL_HINT}") from exc
    return LtApi(cublasLt, nvmath.CudaDataType, cublas.ComputeType, cublas.Operation, cublasLt.cuBLASLtError,
                 f"nvmath-python {getattr(nvmath, '__version__', '?')}")


def _status_of(exc: BaseException) -> int:
    status = getattr(exc, "status", None)
    if status is None and exc.args and isinstance(exc.args[0], int):
        status = exc.args[0]
    return int(status) if status is not None else -1


# ----------------------------------------------------------------------------------------------------------------
# Issuing queries


class HeuristicSession:
    """Queries through one cuBLASLt handle, caching descriptors, preferences and (until :meth:`forget_layouts`)
    matrix layouts. ``scale_pointer`` is a device address given as the A and B scale pointers (cuBLASLt only
    records it). Use as a context manager, or call :meth:`close`."""

    def __init__(self, api: LtApi, scale_pointer: int):
        self.api, self.scale_pointer = api, int(scale_pointer)
        lt = api.lt
        self._handle = lt.create()
        self._descs: Dict[tuple, int] = {}
        self._prefs: Dict[tuple, int] = {}
        self._layouts: Dict[MatrixLayout, int] = {}
        self._results = lt.MatmulHeuristicResult(1)
        self._algo_pointer = self._results.ptr + lt.matmul_heuristic_result_dtype.fields["algo"][1]
        self._returned = np.zeros(1, np.int32)
        self._written = np.zeros(1, np.uint64)
        self._written_address = self._written.ctypes.data
        self._config = []  # (answer field, attribute, its buffer of the vendor's type, the buffer's address)
        for field, name in _CONFIG_FIELDS:
            attr = getattr(lt.MatmulAlgoConfigAttribute, name)
            buf = np.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
            self._config.append((field, attr, buf, buf.ctypes.data))
        check_single_cublaslt()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ask(self, query: HeuristicQuery) -> Tuple[int, Optional[HeuristicAnswer]]:
        """(status, first answer): status 0 with None when cuBLASLt returns no algorithm; a nonzero status (e.g.
        15, CUBLAS_STATUS_NOT_SUPPORTED) with None when the heuristic refuses the problem."""
        desc = self._descriptor(query)
        pref = self._preference(query)
        layouts = [self._layout(x) for x in (query.a, query.b, query.c, query.d)]
        self._returned[0] = 0
        try:
            self.api.lt.matmul_algo_get_heuristic(self._handle, desc, *layouts, pref, query.requested_algo_count,
                                                  self._results.ptr, self._returned.ctypes.data)
        except self.api.error as exc:
            return _status_of(exc), None
        if self._returned[0] < 1:
            return 0, None
        return 0, HeuristicAnswer(**{field: self._config_value(attr, buf, address)
                                     for field, attr, buf, address in self._config})

    def forget_layouts(self) -> None:
        """Destroy the cached matrix layouts (the recorder calls this after each shape)."""
        for layout in self._layouts.values():
            self.api.lt.matrix_layout_destroy(layout)
        self._layouts.clear()

    def close(self) -> None:
        lt = self.api.lt
        self.forget_layouts()
        for pref in self._prefs.values():
            lt.matmul_preference_destroy(pref)
        for desc in self._descs.values():
            lt.matmul_desc_destroy(desc)
        self._prefs.clear()
        self._descs.clear()
        if self._handle:
            lt.destroy(self._handle)
            self._handle = 0

    # -- cached objects --------------------------------------------------------------------------------------

    def _descriptor(self, query: HeuristicQuery) -> int:
        key = query.descriptor_key
        if key not in self._descs:
            api, lt = self.api, self.api.lt
            desc = lt.matmul_desc_create(getattr(api.compute_type, query.compute_type),
                                         getattr(api.data_type, query.scale_type))
            attrs = lt.MatmulDescAttribute
            for attr, value in ((attrs.TRANSA, getattr(api.operation, query.transa)),
                                (attrs.TRANSB, getattr(api.operation, query.transb)),
                                (attrs.A_SCALE_POINTER, self.scale_pointer),
                                (attrs.B_SCALE_POINTER, self.scale_pointer),
                                (attrs.FAST_ACCUM, 1 if query.fast_accum else 0)):
                _set_attribute(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, attr, value)
            self._descs[key] = desc
        return self._descs[key]

    def _preference(self, query: HeuristicQuery) -> int:
        key = query.preference_key
        if key not in self._prefs:
            lt = self.api.lt
            attrs = lt.MatmulPreferenceAttribute
            pref = lt.matmul_preference_create()
            settings = [(attrs.MAX_WORKSPACE_BYTES, query.workspace_bytes)]
            if query.align is not None:
                settings += [(getattr(attrs, name), query.align) for name in _ALIGNMENT_PREFERENCES]
            for attr, value in settings:
                _set_attribute(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                               attr, value)
            self._prefs[key] = pref
        return self._prefs[key]

    def _layout(self, layout: MatrixLayout) -> int:
        if layout not in self._layouts:
            self._layouts[layout] = self.api.lt.matrix_layout_create(
                getattr(self.api.data_type, layout.dtype), layout.rows, layout.cols, layout.ld)
        return self._layouts[layout]

    def _config_value(self, attr, buf: np.ndarray, address: int) -> int:
        self.api.lt.matmul_algo_config_get_attribute(self._algo_pointer, attr, address, buf.itemsize,
                                                     self._written_address)
        return int(buf[0])


def _set_attribute(setter, dtype_of, obj: int, attr, value) -> None:
    """Set an attribute from a buffer of the vendor's own type for it (get_*_attribute_dtype)."""
    buf = np.array([value], dtype=dtype_of(attr))
    setter(obj, attr, buf.ctypes.data, buf.itemsize)


def check_single_cublaslt() -> None:
    """Refuse to query when two different libcublasLt files are mapped: the answers might not be torch's."""
    paths = mapped_cublaslt_paths()
    if len(paths) > 1:
        raise CublasLtError("two different libcublasLt are loaded in this process (" + ", ".join(paths)
                            + "): the heuristic answers might not be those of torch's cuBLASLt; import torch before "
                              "anything else that loads CUDA libraries")


def query_heuristic(api: LtApi, query: HeuristicQuery, scale_pointer: int) -> Optional[HeuristicAnswer]:
    """One query: the first algorithm's configuration, or None when the status is nonzero or none returns."""
    with HeuristicSession(api, scale_pointer) as session:
        return session.ask(query)[1]


# ----------------------------------------------------------------------------------------------------------------
# The live query of platform.md 3.5 on the reference GPU


def live_heuristic(profile, M: int, N: int, K: int, fmt_a: str, fmt_b: str, out: str, fast: bool):
    """The reference GPU's own answer (a HeuristicAnswer) for this key with the profile's workspace and alignment,
    or None.

    Only meaningful after ``profile.matches_device()``; every failure (bindings missing, scale buffer, status)
    gives None so that the caller falls through to the envelope.
    """
    try:
        query = build_query(M, N, K, fmt_a, fmt_b, out, fast, profile.workspace_bytes, profile.align)
        return query_heuristic(nvmath_api(), query, device_scale_pointer())
    except Exception:  # a probe: any error means "no live answer"
        return None


_scale_lock = threading.Lock()
_scale_buffers = {}


def device_scale_pointer() -> int:
    """Address of a 1-element fp32 buffer on torch's current CUDA device (kept for the process)."""
    import torch  # only reached on the reference GPU

    index = torch.cuda.current_device()
    with _scale_lock:
        if index not in _scale_buffers:
            _scale_buffers[index] = torch.ones(1, dtype=torch.float32, device=f"cuda:{index}")
        return _scale_buffers[index].data_ptr()
