"""cuBLASLt on the reference GPU itself: device matching (platform.md 3.6) for the live heuristic query (3.5).

The query itself goes through NVIDIA's bindings (:mod:`.heuristic`, the optional extra ``mmaemu[record]``). What
stays here on ctypes is identification only, for a concrete reason: ``mmaemu info`` and device matching must
answer on machines without the optional extra, and they need four C functions with stable signatures and no
attribute enums (libcuda's ``cuInit``/``cuDeviceGet``/``cuDeviceGetName``/``cuDeviceGetAttribute`` with
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, and ``cublasLtGetProperty`` with libraryPropertyType 0/1/2). None of it
runs at import time or when MMAEMU_DISABLE_CUDA=1, and any probe error means "not the reference GPU" (False / no
answer), so a machine without CUDA simply skips the live query.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import sys
import threading
from typing import List, Optional, Tuple

from .. import environment
from ..errors import BackendUnavailableError

__all__ = [
    "CublasLtError",
    "profile_matches_device",
    "load_cublaslt",
    "loaded_cublaslt_version",
    "mapped_cublaslt_paths",
    "version_matches",
]

# library_types.h (libraryPropertyType) and cuda.h (CUdevice_attribute): identification only, see above.
LIBRARY_MAJOR_VERSION, LIBRARY_MINOR_VERSION, LIBRARY_PATCH_LEVEL = 0, 1, 2
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16

LIBCUDA_ENV = "MMAEMU_LIBCUDA_PATH"
_LIBCUDA_CANDIDATES = ("libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1")
_CUBLAS_WHEELS = ("nvidia-cublas-cu12", "nvidia-cublas", "nvidia-cublas-cu13")


class CublasLtError(BackendUnavailableError):
    """libcublasLt (or libcuda, or NVIDIA's bindings) could not be found, loaded or queried."""


def _check(status, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} returned cuBLAS status {status}")


# ----------------------------------------------------------------------------------------------------------------
# Device matching (platform.md 3.6)


def profile_matches_device(profile, device=None) -> bool:
    """True only if ``device`` is the profile's reference GPU: same driver device name, same SM count and the
    same loaded cuBLASLt version (major.minor.patch, and build when both sides know it). Never the compute
    capability alone; any probe error → False; nothing is touched when MMAEMU_DISABLE_CUDA is true."""
    if not (profile.gpu_name and profile.sm_count and profile.cublaslt_version):
        return False
    if environment.snapshot()["MMAEMU_DISABLE_CUDA"]:
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
    cache_key = (environment.snapshot()[LIBCUDA_ENV], ordinal)
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
    explicit = environment.snapshot()[LIBCUDA_ENV]
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


def mapped_cublaslt_paths() -> List[str]:
    """The distinct real paths of the libcublasLt files mapped into this process (from /proc/self/maps)."""
    paths = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if "libcublasLt.so" in os.path.basename(path):
                    real = os.path.realpath(path)
                    if real not in paths:
                        paths.append(real)
    except OSError:
        pass
    return paths


def _mapped_cublaslt_path() -> Optional[str]:
    paths = mapped_cublaslt_paths()
    return paths[0] if paths else None


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
    """(major, minor, patch[, build]) of the loaded libcublasLt; the build comes from the NVIDIA cuBLAS wheel's
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
    """The 4th version field of the NVIDIA cuBLAS wheel (CUDA 12: nvidia-cublas-cu12, CUDA 13: nvidia-cublas) that
    installed the loaded file, or None when the library does not come from such a wheel."""
    if not loaded_path:
        return None
    loaded = os.path.realpath(loaded_path)
    for name in _CUBLAS_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        owns = any("libcublasLt.so" in str(f) and os.path.realpath(dist.locate_file(f)) == loaded
                   for f in dist.files or ())
        fields = dist.version.split(".")
        if owns and len(fields) > 3 and fields[3].isdigit():
            return int(fields[3])
    return None


def version_matches(expected: str, loaded: Tuple[int, ...]) -> bool:
    """major.minor.patch equal, and the 4th (build) component equal when both sides have one."""
    want = tuple(int(x) for x in expected.split("."))
    if tuple(loaded[:3]) != want[:3]:
        return False
    return len(want) < 4 or len(loaded) < 4 or want[3] == loaded[3]
