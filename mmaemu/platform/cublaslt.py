"""cuBLASLt on the reference GPU itself: device matching (platform.md 3.6) and the live heuristic query (3.5).

Both talk to the NVIDIA libraries through ctypes only, never at import time, and never when
MMAEMU_DISABLE_CUDA=1. Any probe error means "not the reference GPU" (False / no answer), so a machine without
CUDA simply skips the live query.

The live query rebuilds torch 2.7.1's ``scaled_gemm`` descriptor (the one the recorded tables answer, see the
tables' json ``descriptor``): :func:`build_query` produces it as plain data and :func:`query_heuristic` issues it
through any object exposing the cuBLASLt C functions — the real ``ctypes.CDLL`` or a test double.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import importlib.metadata
import importlib.util
import os
import sys
import threading
from typing import Optional, Tuple

from ..errors import BackendUnavailableError

__all__ = [
    "CublasLtError",
    "MatrixLayout",
    "HeuristicQuery",
    "HeuristicAnswer",
    "build_query",
    "query_heuristic",
    "live_heuristic",
    "profile_matches_device",
    "load_cublaslt",
    "loaded_cublaslt_version",
    "version_matches",
]

# cuBLASLt / CUDA enum values (cublasLt.h, cublas_api.h, library_types.h of CUDA 12.8).
CUBLAS_COMPUTE_32F = 68
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2 = 0, 2, 14, 28, 29
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
DESC_A_SCALE_POINTER, DESC_B_SCALE_POINTER = 17, 18
DESC_FAST_ACCUM = 25
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT_A_BYTES, PREF_MIN_ALIGNMENT_B_BYTES = 5, 6
PREF_MIN_ALIGNMENT_C_BYTES, PREF_MIN_ALIGNMENT_D_BYTES = 7, 8
ALGO_CONFIG_ID, ALGO_CONFIG_TILE_ID, ALGO_CONFIG_SPLITK_NUM, ALGO_CONFIG_CUSTOM_OPTION = 0, 1, 2, 5
LIBRARY_MAJOR_VERSION, LIBRARY_MINOR_VERSION, LIBRARY_PATCH_LEVEL = 0, 1, 2
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16

_FP8_TYPE = {"e4m3": CUDA_R_8F_E4M3, "e5m2": CUDA_R_8F_E5M2}
_OUT_TYPE = {"float32": CUDA_R_32F, "bfloat16": CUDA_R_16BF, "float16": CUDA_R_16F,
             "float8_e4m3fn": CUDA_R_8F_E4M3, "float8_e5m2": CUDA_R_8F_E5M2}
_LIBCUDA_CANDIDATES = ("libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1")
_CUBLAS_WHEEL = "nvidia-cublas-cu12"


class CublasLtError(BackendUnavailableError):
    """libcublasLt (or libcuda) could not be found, loaded or queried."""


# ----------------------------------------------------------------------------------------------------------------
# The query as data


@dataclasses.dataclass(frozen=True)
class MatrixLayout:
    """cublasLtMatrixLayoutCreate(type, rows, cols, ld): column-major, as cuBLASLt sees it."""

    dtype: int
    rows: int
    cols: int
    ld: int


@dataclasses.dataclass(frozen=True)
class HeuristicQuery:
    """Everything cublasLtMatmulAlgoGetHeuristic is given (platform.md 3.5).

    torch computes the row-major M x N result as the column-major N x M problem: m = N, n = M, k = K with
    A = mat2 (K x N, ld K, TRANSA = T), B = mat1 (K x M, ld K, TRANSB = N), C/D of N x M with ld N.
    """

    compute_type: int
    scale_type: int
    transa: int
    transb: int
    a: MatrixLayout
    b: MatrixLayout
    c: MatrixLayout
    d: MatrixLayout
    fast_accum: bool
    workspace_bytes: int
    align: Optional[int]
    requested_algo_count: int = 1


@dataclasses.dataclass(frozen=True)
class HeuristicAnswer:
    """The first algorithm's configuration: id, tile enum, numSplitsK, customOption."""

    algo: int
    tile: int
    splitK: int
    custom: int


def build_query(M: int, N: int, K: int, fmt_a: str, fmt_b: str, out: str, fast: bool, workspace_bytes: int,
                align: Optional[int]) -> HeuristicQuery:
    """torch 2.7.1's scaled_gemm descriptor for mat1 [M, K] (fmt_a) row-major times mat2 [K, N] (fmt_b)
    column-major, output ``out``: C is fp16 when the output is FP8 (torch: C is unused, beta = 0); no D scale
    pointer, no bias epilogue, no SM-count target."""
    out_type = _OUT_TYPE[out]
    c_type = CUDA_R_16F if out.startswith("float8") else out_type
    return HeuristicQuery(
        compute_type=CUBLAS_COMPUTE_32F, scale_type=CUDA_R_32F, transa=CUBLAS_OP_T, transb=CUBLAS_OP_N,
        a=MatrixLayout(_FP8_TYPE[fmt_b], K, N, K), b=MatrixLayout(_FP8_TYPE[fmt_a], K, M, K),
        c=MatrixLayout(c_type, N, M, N), d=MatrixLayout(out_type, N, M, N),
        fast_accum=bool(fast), workspace_bytes=int(workspace_bytes), align=align,
    )


# ----------------------------------------------------------------------------------------------------------------
# Issuing it (ctypes; the library object may be a test double with the same function names)


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _check(status, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} returned cuBLAS status {status}")


def query_heuristic(lib, query: HeuristicQuery, scale_pointer: int) -> Optional[HeuristicAnswer]:
    """Run cublasLtMatmulAlgoGetHeuristic for ``query``; None when the status is nonzero or no algorithm returns.

    ``scale_pointer`` is a device address used for the A and B scale pointers (cuBLASLt only records it).
    Failures to build the descriptors raise CublasLtError.
    """
    handle, desc, pref = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    layouts = [ctypes.c_void_p() for _ in range(4)]
    _check(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    try:
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ctypes.c_int(query.compute_type),
                                            ctypes.c_int(query.scale_type)), "cublasLtMatmulDescCreate")
        _set_desc_attributes(lib, desc, query, scale_pointer)
        for ref, layout in zip(layouts, (query.a, query.b, query.c, query.d)):
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(ref), ctypes.c_int(layout.dtype),
                                                  ctypes.c_uint64(layout.rows), ctypes.c_uint64(layout.cols),
                                                  ctypes.c_int64(layout.ld)), "cublasLtMatrixLayoutCreate")
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        _set_preference_attributes(lib, pref, query)
        results = (_HeuristicResult * query.requested_algo_count)()
        returned = ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, *layouts, pref,
                                                    ctypes.c_int(query.requested_algo_count), results,
                                                    ctypes.byref(returned))
        if status != 0 or returned.value < 1:
            return None
        algo = results[0].algo
        return HeuristicAnswer(
            algo=_algo_attribute(lib, algo, ALGO_CONFIG_ID, ctypes.c_int32),
            tile=_algo_attribute(lib, algo, ALGO_CONFIG_TILE_ID, ctypes.c_uint32),
            splitK=_algo_attribute(lib, algo, ALGO_CONFIG_SPLITK_NUM, ctypes.c_uint32),
            custom=_algo_attribute(lib, algo, ALGO_CONFIG_CUSTOM_OPTION, ctypes.c_uint32),
        )
    finally:
        _destroy(lib, "cublasLtMatmulPreferenceDestroy", pref)
        for ref in layouts:
            _destroy(lib, "cublasLtMatrixLayoutDestroy", ref)
        _destroy(lib, "cublasLtMatmulDescDestroy", desc)
        _destroy(lib, "cublasLtDestroy", handle)


def _set_attribute(lib, function: str, obj, attribute: int, value) -> None:
    _check(getattr(lib, function)(obj, ctypes.c_int(attribute), ctypes.byref(value),
                                  ctypes.c_size_t(ctypes.sizeof(value))), f"{function}({attribute})")


def _set_desc_attributes(lib, desc, query: HeuristicQuery, scale_pointer: int) -> None:
    set_desc = "cublasLtMatmulDescSetAttribute"
    _set_attribute(lib, set_desc, desc, DESC_TRANSA, ctypes.c_int32(query.transa))
    _set_attribute(lib, set_desc, desc, DESC_TRANSB, ctypes.c_int32(query.transb))
    _set_attribute(lib, set_desc, desc, DESC_A_SCALE_POINTER, ctypes.c_void_p(scale_pointer))
    _set_attribute(lib, set_desc, desc, DESC_B_SCALE_POINTER, ctypes.c_void_p(scale_pointer))
    _set_attribute(lib, set_desc, desc, DESC_FAST_ACCUM, ctypes.c_int8(1 if query.fast_accum else 0))


def _set_preference_attributes(lib, pref, query: HeuristicQuery) -> None:
    set_pref = "cublasLtMatmulPreferenceSetAttribute"
    _set_attribute(lib, set_pref, pref, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(query.workspace_bytes))
    if query.align is not None:
        for attribute in (PREF_MIN_ALIGNMENT_A_BYTES, PREF_MIN_ALIGNMENT_B_BYTES, PREF_MIN_ALIGNMENT_C_BYTES,
                          PREF_MIN_ALIGNMENT_D_BYTES):
            _set_attribute(lib, set_pref, pref, attribute, ctypes.c_uint32(query.align))


def _algo_attribute(lib, algo: _Algo, attribute: int, ctype) -> int:
    value, written = ctype(0), ctypes.c_size_t(0)
    _check(lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), ctypes.c_int(attribute),
                                                    ctypes.byref(value), ctypes.c_size_t(ctypes.sizeof(value)),
                                                    ctypes.byref(written)),
           f"cublasLtMatmulAlgoConfigGetAttribute({attribute})")
    return int(value.value)


def _destroy(lib, function: str, ref) -> None:
    if ref.value:
        getattr(lib, function)(ref)


def live_heuristic(profile, M: int, N: int, K: int, fmt_a: str, fmt_b: str, out: str,
                   fast: bool) -> Optional[HeuristicAnswer]:
    """The reference GPU's own answer for this key with the profile's workspace and alignment, or None.

    Only meaningful after ``profile.matches_device()``; every failure (library, scale buffer, status) gives None
    so that the caller falls through to the envelope.
    """
    try:
        lib, _ = load_cublaslt()
        query = build_query(M, N, K, fmt_a, fmt_b, out, fast, profile.workspace_bytes, profile.align)
        return query_heuristic(lib, query, device_scale_pointer())
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


# ----------------------------------------------------------------------------------------------------------------
# Device matching (platform.md 3.6)


def profile_matches_device(profile, device=None) -> bool:
    """True only if ``device`` is the profile's reference GPU: same driver device name, same SM count and the
    same loaded cuBLASLt version (major.minor.patch, and build when both sides know it). Never the compute
    capability alone; any probe error → False; nothing is touched when MMAEMU_DISABLE_CUDA=1."""
    if not (profile.gpu_name and profile.sm_count and profile.cublaslt_version):
        return False
    if os.environ.get("MMAEMU_DISABLE_CUDA") == "1":
        return False
    try:
        ordinal = cuda_ordinal(device)
        if ordinal is None:
            return False
        name, sm_count = driver_device_info(ordinal)
        if name != profile.gpu_name or sm_count != profile.sm_count:
            return False
        return version_matches(profile.cublaslt_version, loaded_cublaslt_version())
    except Exception:  # a probe: any error means "not this GPU"
        return False


def cuda_ordinal(device=None) -> Optional[int]:
    """CUDA ordinal of ``device``; None for a non-CUDA device. Default: torch's current CUDA device if torch has
    already initialised CUDA (torch is never imported here), else ordinal 0."""
    if device is None or (isinstance(device, str) and device == "cuda"):
        return _current_ordinal()
    if isinstance(device, int) and not isinstance(device, bool):
        return device if device >= 0 else None
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda":
            return None
        return int(index) if index else _current_ordinal()
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind != "cuda":
        return None
    return int(index) if index is not None else _current_ordinal()


def _current_ordinal() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return 0


_probe_lock = threading.Lock()
_device_info = {}


def driver_device_info(ordinal: int) -> Tuple[str, int]:
    """(device name, SM count) from the CUDA driver API (cached per libcuda choice and ordinal)."""
    cache_key = (os.environ.get("MMAEMU_LIBCUDA_PATH"), ordinal)
    with _probe_lock:
        if cache_key not in _device_info:
            _device_info[cache_key] = _probe_driver(ordinal)
        result = _device_info[cache_key]
    if isinstance(result, Exception):
        raise result
    return result


def _probe_driver(ordinal: int):
    try:
        cuda = _load_libcuda()
        _check_cu(cuda.cuInit(ctypes.c_uint(0)), "cuInit")
        dev = ctypes.c_int(0)
        _check_cu(cuda.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        _check_cu(cuda.cuDeviceGetName(name, ctypes.c_int(len(name)), dev), "cuDeviceGetName")
        sms = ctypes.c_int(0)
        _check_cu(cuda.cuDeviceGetAttribute(ctypes.byref(sms), ctypes.c_int(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                                            dev), "cuDeviceGetAttribute")
        return name.value.decode("utf-8", "replace"), int(sms.value)
    except Exception as exc:  # remembered: a machine without a driver stays without one
        return exc


def _check_cu(status, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} returned CUDA driver error {status}")


def _load_libcuda():
    """libcuda: $MMAEMU_LIBCUDA_PATH, libcuda.so.1, /usr/lib/wsl/lib/libcuda.so.1 (platform.md 3.6)."""
    explicit = os.environ.get("MMAEMU_LIBCUDA_PATH")
    candidates = ((explicit,) if explicit else ()) + _LIBCUDA_CANDIDATES
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise CublasLtError("libcuda not found: " + "; ".join(errors))


# ----------------------------------------------------------------------------------------------------------------
# Finding libcublasLt and its version

_cublaslt_lock = threading.Lock()
_cublaslt = None


def load_cublaslt():
    """(CDLL, real path) of libcublasLt: the one already mapped into the process, else the nvidia-cublas-cu12
    wheel's lib/libcublasLt.so.12, else ctypes.util.find_library("cublasLt"). Raises CublasLtError."""
    global _cublaslt
    with _cublaslt_lock:
        if _cublaslt is None:
            _cublaslt = _find_and_load_cublaslt()
        return _cublaslt


def _find_and_load_cublaslt():
    candidates = [p for p in (_mapped_cublaslt_path(), _wheel_cublaslt_path()) if p]
    found = ctypes.util.find_library("cublasLt")
    if found:
        candidates.append(found)
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            continue
        return lib, _mapped_cublaslt_path() or path
    raise CublasLtError("libcublasLt not found" + (": " + "; ".join(errors) if errors else ""))


def _mapped_cublaslt_path() -> Optional[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if "libcublasLt.so" in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


def _wheel_cublaslt_path() -> Optional[str]:
    try:
        spec = importlib.util.find_spec("nvidia.cublas")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", "libcublasLt.so.12")
        if os.path.exists(path):
            return path
    return None


_version_lock = threading.Lock()
_version = None


def loaded_cublaslt_version() -> Tuple[int, ...]:
    """(major, minor, patch[, build]) of the loaded libcublasLt; the build comes from the nvidia-cublas-cu12 wheel
    metadata when the loaded file is that wheel's. Probed once per process (the loaded library cannot change)."""
    global _version
    with _version_lock:
        if _version is None:
            _version = _probe_version(*load_cublaslt())
        return _version


def _probe_version(lib, path) -> Tuple[int, ...]:
    parts = []
    for prop in (LIBRARY_MAJOR_VERSION, LIBRARY_MINOR_VERSION, LIBRARY_PATCH_LEVEL):
        value = ctypes.c_int(0)
        _check(lib.cublasLtGetProperty(ctypes.c_int(prop), ctypes.byref(value)), "cublasLtGetProperty")
        parts.append(int(value.value))
    build = _wheel_build_number(path)
    return tuple(parts) + ((build,) if build is not None else ())


def _wheel_build_number(loaded_path: str) -> Optional[int]:
    wheel_path = _wheel_cublaslt_path()
    if not wheel_path or not loaded_path or os.path.realpath(wheel_path) != os.path.realpath(loaded_path):
        return None
    try:
        fields = importlib.metadata.version(_CUBLAS_WHEEL).split(".")
        return int(fields[3]) if len(fields) > 3 else None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def version_matches(expected: str, loaded: Tuple[int, ...]) -> bool:
    """major.minor.patch equal, and the 4th (build) component equal when both sides have one."""
    want = tuple(int(x) for x in expected.split("."))
    if tuple(loaded[:3]) != want[:3]:
        return False
    return len(want) < 4 or len(loaded) < 4 or want[3] == loaded[3]
