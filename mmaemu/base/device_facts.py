"""The facts of this machine's CUDA devices and of its cuBLASLt, read in one place (platform.md 3.6, 7).

Every part of mmaemu that needs a device fact reads it here: ``mmaemu info`` (:mod:`mmaemu.cli.diagnostics`), device
matching of the profiles (:mod:`mmaemu.platform.cublaslt`), the identity the kernels' self-test verdicts are keyed
by (:mod:`mmaemu.cuda.device`) and the recorder (:mod:`mmaemu.record.machine`).

* :func:`read` gives a :class:`DeviceFacts` of one device as torch sees it (name, capability, SM count, memory),
  with the display driver and the CUDA driver API version; read once per device and process.
* :func:`driver_device_info` gives (name, SM count) from the CUDA driver API alone (libcuda through ctypes; torch
  is never imported): what a profile's reference GPU is matched by, so that matching never initialises torch's
  CUDA. Probed once per libcuda choice and ordinal.
* :func:`loaded_cublaslt_version` and :func:`load_cublaslt`: the libcublasLt of this process and its version,
  probed once per process (the loaded library cannot change).

The reasons for ctypes: ``mmaemu info`` and device matching must answer on machines without the optional extra
``mmaemu[record]`` (NVIDIA's bindings), and they need a few C functions with stable signatures and no attribute
enums (libcuda's ``cuInit``/``cuDeviceGet``/``cuDeviceGetName``/``cuDeviceGetAttribute`` with
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT and ``cuDriverGetVersion``, NVML's ``nvmlSystemGetDriverVersion``, and
``cublasLtGetProperty`` with libraryPropertyType 0/1/2). Nothing runs at import time; callers check
MMAEMU_DISABLE_CUDA before they ask (this module reads only MMAEMU_LIBCUDA_PATH).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

from .. import environment
from ..errors import BackendUnavailableError

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
# One device as torch sees it


class DeviceFacts(NamedTuple):
    """One CUDA device: torch's view of it (``torch.cuda.get_device_properties``), the driver versions and the
    torch build. A fact that could not be read is None, with its reason in ``errors``.

    The one type of a device's facts: ``mmaemu info`` prints them, :attr:`mmaemu.context.Context.device` carries
    them, and the CUDA kernels decide from them (:func:`mmaemu.cuda.device.probe` fills ``compiler``, the numba
    CUDA implementation that compiles the kernels; None where nobody asked). :meth:`identity` is what a kernel's
    self-test verdict on the device depends on (besides the sources), :attr:`label` how reports name it."""

    index: int
    name: str
    uuid: Optional[str]
    capability: Tuple[int, int]
    sm_count: Optional[int]
    memory_bytes: Optional[int]
    torch_version: str
    torch_cuda: Optional[str]  # the CUDA runtime torch was built with
    display_driver: Optional[str]  # the NVIDIA display driver (NVML, else /proc/driver/nvidia/version)
    cuda_driver_api: Optional[str]  # the CUDA driver API version, "12.8"
    errors: Tuple[Tuple[str, Exception], ...] = ()  # (fact, what reading it raised) of the facts not read
    compiler: Optional[str] = None  # the numba CUDA implementation and versions (mmaemu.cuda.device.probe)

    def error(self, fact: str) -> Optional[Exception]:
        """What reading ``fact`` raised, or None."""
        return dict(self.errors).get(fact)

    @property
    def driver(self) -> str:
        """The CUDA driver API version and, if known, the display driver version, in words."""
        api, display = self.cuda_driver_api or "unknown", self.display_driver
        return f"CUDA driver API {api}" + (f", display driver {display}" if display else "")

    @property
    def label(self) -> str:
        """How reports name the device: "cuda:0 (NVIDIA H100 PCIe, sm_90)"."""
        return f"cuda:{self.index} ({self.name}, sm_{self.capability[0]}{self.capability[1]})"

    def identity(self) -> dict:
        """What a self-test verdict on this device depends on (besides the kernel sources)."""
        return {
            "name": self.name,
            "uuid": self.uuid,
            "capability": list(self.capability),
            "driver": self.driver,
            "compiler": self.compiler,
            "torch": self.torch_version,
        }


_facts_lock = threading.Lock()
_FACTS: Dict[int, DeviceFacts] = {}


def read(index: int) -> DeviceFacts:
    """The :class:`DeviceFacts` of CUDA device ``index`` (torch's numbering), read once per process. Raises what
    torch raises for a device it cannot describe; the driver versions never raise (see ``errors``)."""
    with _facts_lock:
        if index not in _FACTS:
            _FACTS[index] = _read(index)
        return _FACTS[index]


def _read(index: int) -> DeviceFacts:
    import torch

    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    versions, errors = {}, []
    for fact, reader in (("display_driver", display_driver), ("cuda_driver_api", cuda_driver_api)):
        try:
            versions[fact] = reader()
        except Exception as exc:
            versions[fact] = None
            errors.append((fact, exc))
    total = getattr(props, "total_memory", None)
    return DeviceFacts(
        index=index, name=str(props.name), uuid=str(uuid) if uuid is not None else None,
        capability=(int(props.major), int(props.minor)),
        sm_count=int(getattr(props, "multi_processor_count", 0)) or None,
        memory_bytes=int(total) if total is not None else None, torch_version=str(torch.__version__),
        torch_cuda=torch.version.cuda, errors=tuple(errors), **versions)


def forget() -> None:
    """Forget the devices read (tests)."""
    with _facts_lock:
        _FACTS.clear()


def display_driver() -> str:
    """The NVIDIA display driver version (NVML, else /proc/driver/nvidia/version); raises when neither answers."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() == 0:
            buf = ctypes.create_string_buffer(96)
            status = nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf)))
            nvml.nvmlShutdown()
            if status == 0:
                return buf.value.decode()
    except OSError:
        pass
    with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
        words = fh.readline().split()
    return next(w for w in words if w[:1].isdigit() and "." in w)


def cuda_driver_api() -> str:
    """The CUDA driver API version of libcuda (``cuDriverGetVersion``), "major.minor"."""
    cuda = load_libcuda()
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        raise RuntimeError("cuDriverGetVersion failed")
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


# ----------------------------------------------------------------------------------------------------------------
# The CUDA driver API's view of a device (device matching, the recorder)

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
        cuda = load_libcuda()
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


def load_libcuda():
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
# The libcublasLt of this process

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
