"""What this installation and machine are: the report of ``mmaemu info`` (format "mmaemu-info/1", platform.md
section 7) as plain data, and the reading of "is CUDA usable here" that the commands share.

Versions, ``MMAEMU_*`` environment, the CUDA device (torch's view plus the NVML, libcuda, cuBLASLt and NVRTC
versions), profiles and whether they match the device, presets, backends, split-K tables and the Numba cache.
A missing component never raises: :func:`build_info` lists it under ``unavailable`` instead.

Importing this module imports neither torch nor numba and touches no CUDA: every probe imports what it needs when
it runs. (:func:`mmaemu.cuda.device.probe` answers a different question, whether the numba CUDA kernels can run
on a device, so it is not used here.)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional

from ..base import device_facts
from .. import environment
from .._version import __version__
from ..context import Context

__all__ = ["INFO_FORMAT", "NO_CUDA_REASON", "build_info", "cuda_disabled_value", "cuda_driver_absent",
           "cuda_unusable", "environment_problems", "error_text", "jsonable"]

INFO_FORMAT = "mmaemu-info/1"
NO_CUDA_REASON = "no CUDA device visible to torch"
_LIBRARIES = ("torch", "numba", "numpy", "click")
DISABLE_ENV = "MMAEMU_DISABLE_CUDA"


# ================================================================================================================
# Plain data and error text


def jsonable(value: Any) -> Any:
    """Plain JSON data of dataclasses, named tuples, mappings, sequences, paths and dtypes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return jsonable(value._asdict())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def error_text(error: BaseException) -> str:
    """"Type: message" of an exception (a KeyError's message without the quotes repr adds)."""
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return f"{type(error).__name__}: {message}"


# ================================================================================================================
# Is CUDA usable


def cuda_disabled_value() -> Optional[str]:
    """The value of MMAEMU_DISABLE_CUDA when it disables CUDA (a true boolean, 1/true/yes/on: the one reading of
    every part of mmaemu), else None."""
    env = environment.snapshot()
    return env.raw[DISABLE_ENV] if env[DISABLE_ENV] else None


def cuda_unusable(ordinal: Optional[int]) -> Optional[str]:
    """Why CUDA device ``ordinal`` (None: the current one) cannot be used, or None when it can."""
    disabled = cuda_disabled_value()
    if disabled is not None:
        return f"CUDA disabled by MMAEMU_DISABLE_CUDA={disabled}"
    import torch

    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except Exception as exc:  # a broken driver counts as "no device"
        return f"{NO_CUDA_REASON} ({type(exc).__name__}: {exc})"
    if not available or count == 0:
        return NO_CUDA_REASON
    if ordinal is not None and not 0 <= ordinal < count:
        return f"CUDA device {ordinal} does not exist ({count} device(s) visible to torch)"
    return None


def cuda_driver_absent() -> bool:
    """True when CUDA is disabled (MMAEMU_DISABLE_CUDA) or no CUDA driver library (libcuda) loads: then
    :func:`cuda_unusable` gives a reason for every device, since torch reaches the GPU only through libcuda, and
    asking torch (an import of seconds) can be skipped. False does not mean that a device is usable."""
    if cuda_disabled_value() is not None:
        return True
    try:
        device_facts.load_libcuda()
    except device_facts.CublasLtError:  # no candidate path loads
        return True
    return False


# ================================================================================================================
# Versions and environment


def _versions() -> dict:
    """Python's and the libraries' versions; a library that cannot be imported is None, its error in "_errors"."""
    import platform

    out = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            module = __import__(name)
            # click deprecates its __version__ attribute: ask the installed distribution first
            out[name] = (_dist_version(name) if name == "click" else None) or getattr(module, "__version__", None)
        except Exception as exc:
            out[name] = None
            out.setdefault("_errors", {})[name] = error_text(exc)
    out["numba_cuda"] = _dist_version("numba-cuda")  # the [cuda] extra (cuda:native needs it)
    return out


def _dist_version(name: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment(env: environment.Snapshot) -> Dict[str, str]:
    """The variables mmaemu reads that are set (:mod:`mmaemu.environment`); other MMAEMU_* ones are never shown."""
    return dict(env.raw)


def _profile_problem(value: str) -> Optional[str]:
    from ..platform.profiles import get_profile

    try:
        get_profile(value)
    except KeyError as exc:
        return exc.args[0] if exc.args else str(exc)
    return None


def _backend_problem(value: str) -> Optional[str]:
    from ..backends import requested_backend

    try:
        requested_backend(value)
    except ValueError as exc:
        return str(exc)
    return None


def _profile_path_problem(value: str) -> Optional[str]:
    from ..platform.bundles import path_entries  # the entries as the loader reads them

    missing = [str(entry) for entry in path_entries(value) if not entry.is_dir()]
    return f"not a folder: {', '.join(missing)}" if missing else None


def _split_policy_problem(value: str) -> Optional[str]:
    from ..platform.splitk import POLICIES

    return None if value in POLICIES else "not a split-K policy: use " + " or ".join(POLICIES)


# The checks of the variables whose valid values other parts of mmaemu know (given the parsed value).
ENVIRONMENT_CHECKS = {"MMAEMU_PROFILE": _profile_problem, "MMAEMU_BACKEND": _backend_problem,
                      "MMAEMU_SPLITK_POLICY": _split_policy_problem, "MMAEMU_PROFILE_PATH": _profile_path_problem}


def environment_problems(env: Optional[environment.Snapshot] = None) -> Dict[str, str]:
    """{name: what is wrong} of the set variables (of the snapshot ``env``; None: now) whose value is invalid
    (flagged by ``mmaemu info``): a value its parser refuses (a boolean that is none, a relative cache folder) or
    that is no profile, backend or folder."""
    return environment.problems(ENVIRONMENT_CHECKS, env)


def _unread_variables() -> int:
    return environment.unread_count()


# ================================================================================================================
# What a call does by default here


def _default_profile(problems: Dict[str, str], context: Context) -> str:
    from ..platform import get_profile

    value = context.environment.raw.get("MMAEMU_PROFILE")
    if "MMAEMU_PROFILE" in problems:
        return f"none: MMAEMU_PROFILE={value!r} is not a profile, so every call with profile=None raises KeyError"
    if value:
        return f"{get_profile(None, context=context).name} (from MMAEMU_PROFILE)"
    return f"{get_profile(None, context=context).name} (MMAEMU_PROFILE is not set)"


def _default_backend(problems: Dict[str, str], device: dict, context: Context) -> str:
    """The engine of a call with backend="auto": MMAEMU_BACKEND, else the CPU engine for CPU tensors and, for CUDA
    tensors, the first CUDA kernel that passed its self-test here (read from cached verdicts; none is run)."""
    from .. import backends

    value = context.environment.raw.get("MMAEMU_BACKEND")
    if "MMAEMU_BACKEND" in problems:
        return f"none: MMAEMU_BACKEND={value!r} is not a backend, so every call with backend='auto' raises ValueError"
    if value and value != "auto":
        return f"{value} for every call with backend='auto' (from MMAEMU_BACKEND)"
    cpu = backends.select(_torch_device("cpu"), "auto", "e4m3", "e4m3", None, context=context).name
    return f"{cpu} for CPU tensors; CUDA tensors: {_default_cuda_engine(device, context)}"


def _default_cuda_engine(device: dict, context: Context) -> str:
    """What "auto" picks for CUDA tensors, in words: the decision of the CUDA dispatcher's own rule
    (:func:`mmaemu.cuda.default_choice`: the kernels by priority, each after its self-test, from the verdicts known
    in ``context``; none is run) on the device of the report's Device section (``device``): the Backends section
    and this line come from the same verdicts."""
    from .. import cuda as cuda_backend

    if context.cuda_disabled:
        return "the CPU engine, the result copied back (CUDA disabled by MMAEMU_DISABLE_CUDA)"
    if not device.get("available"):
        return f"none here ({device.get('reason')})"
    try:
        choice = cuda_backend.default_choice(device.get("index"), context=context)
    except Exception:  # a probe that fails here fails the Backends section too: no kernel can run
        choice = None
    if choice is None or choice.kernel is None:
        return "the CPU engine, the result copied back (no CUDA kernel can run here: see Backends)"
    if choice.validated:
        return f"{choice.kernel.backend} (passed its self-test on this device)"
    return (f"the first of {', '.join(k.backend for k in choice.contenders)} that passes its self-test at the first "
            f"call, else the CPU engine (no verdict cached for {choice.kernel.backend} yet: mmaemu selftest runs the "
            "self-tests)")


def _defaults(report: dict, context: Context) -> dict:
    problems = report["environment_problems"]
    return {"profile": _default_profile(problems, context),
            "backend": _default_backend(problems, report["device"], context)}


# ================================================================================================================
# The CUDA device


def report_context(ordinal: Optional[int], env: Optional[environment.Snapshot] = None) -> Context:
    """The context ``mmaemu info`` prints: the environment (``env``, or as it is now) and the facts of CUDA device
    ``ordinal`` (None: the current one), or why there are none; never raises."""
    env = environment.snapshot() if env is None else env
    try:
        reason = cuda_unusable(ordinal)
        if reason is not None:
            return Context(env, device_problem=reason)
        import torch

        index = torch.cuda.current_device() if ordinal is None else ordinal
        return Context(env, device=device_facts.read(index))
    except Exception as exc:  # info reports every failure instead of raising it
        return Context(env, device_problem="probe failed", device_error=error_text(exc))


def _device_info(context: Context) -> dict:
    """The Device section: the CUDA device's facts, or {"available": False, "reason": ...}."""
    if context.device is None:
        return {"available": False, "reason": context.device_problem}
    return device_section(context.device)


def device_section(facts: device_facts.DeviceFacts) -> dict:
    """The Device section of an available device (:class:`~mmaemu.base.device_facts.DeviceFacts`) with the cuBLASLt
    and NVRTC versions; a version that cannot be read is None, its error in "errors"."""
    info = {
        "available": True,
        "index": facts.index,
        "name": facts.name,
        "capability": f"sm_{facts.capability[0]}{facts.capability[1]}",
        "sm_count": facts.sm_count,
        "memory_bytes": facts.memory_bytes,
        "torch_cuda": facts.torch_cuda,
    }
    for key in ("display_driver", "cuda_driver_api"):
        info[key] = getattr(facts, key)
        if facts.error(key) is not None:
            info.setdefault("errors", {})[key] = error_text(facts.error(key))
    for key, probe in (("cublaslt", _cublaslt_version), ("nvrtc", _nvrtc_version)):
        try:
            info[key] = probe()
        except Exception as exc:
            info[key] = None
            info.setdefault("errors", {})[key] = error_text(exc)
    return info


def _cublaslt_version() -> str:
    lib, path = device_facts.load_cublaslt()
    return ".".join(str(x) for x in device_facts.loaded_cublaslt_version()) + f" ({path})"


def _nvrtc_version() -> str:
    """libnvrtc's version, from the first of :func:`_nvrtc_candidates` that loads and answers."""
    import ctypes

    errors = []
    for path in filter(None, _nvrtc_candidates()):
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
            continue
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value} ({path})"
    raise RuntimeError("libnvrtc not found" + (": " + "; ".join(errors) if errors else ""))


def _nvrtc_candidates() -> List[Optional[str]]:
    """Where libnvrtc may be: $MMAEMU_NVRTC_PATH, the nvidia.cuda_nvrtc wheel, $CONDA_PREFIX/lib,
    $CUDA_HOME/lib64, then the system search path (None entries are skipped)."""
    import ctypes.util
    import glob
    import importlib.util

    candidates = [environment.snapshot()["MMAEMU_NVRTC_PATH"]]
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec("nvidia") else None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(folder, "lib", "libnvrtc.so*")))
    for folder, sub in ((os.environ.get("CONDA_PREFIX"), "lib"), (os.environ.get("CUDA_HOME"), "lib64")):
        if folder:
            candidates += sorted(glob.glob(os.path.join(folder, sub, "libnvrtc.so*")))
    return candidates + ["libnvrtc.so.12", ctypes.util.find_library("nvrtc")]


# ================================================================================================================
# Profiles, presets, backends


def _profiles(device: dict, device_arg, context: Context) -> List[dict]:
    """Every profile, with whether it matches the device (``device``: the report's Device section)."""
    from ..platform import get_profile, list_profiles

    out = []
    for name in list_profiles(context=context):
        p = get_profile(name, context=context)
        match, why = _profile_match(p, device, device_arg, context)
        out.append(dict(p.describe(), match=match, match_note=why))
    return out


def _profile_match(p, device: dict, device_arg, context: Context) -> tuple:
    """(True | False | None for unknown, why) of profile ``p`` on the device."""
    if not (p.gpu_name and p.sm_count and p.cublaslt_version):
        return None, "no reference GPU"
    disabled = cuda_disabled_value()
    if disabled is not None:
        return None, f"{DISABLE_ENV}={disabled}"
    try:
        match = bool(p.matches_device(device_arg, context=context))
    except Exception as exc:
        return None, error_text(exc)
    if match:
        return True, None
    cuda_reason = None if device.get("available") else device.get("reason")
    if cuda_reason:
        return False, cuda_reason
    return False, (f"this device: {device.get('name')}, {device.get('sm_count')} SMs, cuBLASLt "
                   f"{(device.get('cublaslt') or 'unknown').split(' ')[0]}")


def _presets() -> List[dict]:
    from ..model import presets

    return presets.describe()


def _backends(device_arg, context: Context) -> List[dict]:
    from .. import backends

    out = []
    for name, s in backends.backends_status(device_arg, context=context).items():
        entry = jsonable(s)
        if not isinstance(entry, dict):
            entry = {"status": entry}
        entry.setdefault("name", name)
        out.append(entry)
    return out


# ================================================================================================================
# Split-K tables and the Numba cache


def _splitk_tables(context: Context) -> List[dict]:
    """Per table id of the profiles, the table's own description (a recorded bundle's, else the packaged one's:
    files with bytes and sha256, row counts) and the profiles that use it."""
    from ..platform.bundles import loaded_bundles
    from ..platform.tables import describe_packaged

    recorded = {b.table.table_id: b for b in loaded_bundles()}
    out = []
    for table_id, profiles in _table_users(context).items():
        described = recorded[table_id].describe() if table_id in recorded else describe_packaged(table_id)
        out.append({"table_id": described.pop("table_id"), "profiles": profiles, **described})
    return out


def _refused_bundles() -> List[dict]:
    from ..platform.bundles import refused_bundles

    return [{"component": f"profile bundle {path}", "reason": reason} for path, reason in refused_bundles().items()]


def _table_users(context: Context) -> Dict[str, List[str]]:
    """table id -> the profiles that use it, in profile order."""
    from ..platform import get_profile, list_profiles

    users: Dict[str, List[str]] = {}
    for name in list_profiles(context=context):
        table_id = get_profile(name, context=context).splitk_table
        if table_id:
            users.setdefault(table_id, []).append(name)
    return users


def _numba_cache() -> dict:
    """The cache folder this process uses (mmaemu.base._cache.cache_location): its numba folder, state and why, and
    the folders passed over with the reason."""
    from ..base import _cache

    location = _cache.cache_location()
    path = location.numba_dir
    return {"path": None if path is None else str(path), "exists": bool(path and path.is_dir()),
            "writable": location.writable, "state": location.state, "source": location.source,
            "passed_over": [{"path": folder, "reason": why} for folder, why in location.passed_over]}


# ================================================================================================================
# The report


def _probe(report: dict, component: str, fn, *args, default=None):
    """fn(*args); on failure record the component as unavailable and return ``default``."""
    try:
        return fn(*args)
    except Exception as exc:  # info reports every failure instead of raising it
        report["unavailable"].append({"component": component, "reason": error_text(exc)})
        return default


def _torch_device(kind: str, index: Optional[int] = None):
    import torch

    return torch.device(kind, index) if index is not None else torch.device(kind)


def build_info(device: Optional[int] = None) -> dict:
    """The ``mmaemu info`` report as plain data (format "mmaemu-info/1"); never raises for a missing component."""
    report: Dict[str, Any] = {
        "format": INFO_FORMAT,
        "mmaemu": {"version": __version__, "location": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))},
        "unavailable": [],
    }
    versions = _versions()
    for name, error in versions.pop("_errors", {}).items():
        report["unavailable"].append({"component": name, "reason": error})
    report["versions"] = versions
    env = environment.snapshot()
    report["environment"] = _environment(env)
    report["environment_problems"] = _probe(report, "environment", environment_problems, env, default={})
    report["environment_unread"] = _unread_variables()
    context = report_context(device, env)
    if context.device_error is not None:
        report["unavailable"].append({"component": "device", "reason": context.device_error})
    report["device"] = _probe(report, "device", _device_info, context,
                              default={"available": False, "reason": "probe failed"})
    if not report["device"].get("available"):
        report["unavailable"].append({"component": "cuda", "reason": report["device"]["reason"]})
    device_arg = None if device is None else _torch_device("cuda", device)
    report["profiles"] = _probe(report, "profiles", _profiles, report["device"], device_arg, context, default=[])
    report["presets"] = _probe(report, "presets", _presets, default=[])
    report["backends"] = _probe(report, "backends", _backends, device_arg, context, default=[])
    report["defaults"] = _probe(report, "defaults", _defaults, report, context, default={})
    report["splitk_tables"] = _probe(report, "split-K tables", _splitk_tables, context, default=[])
    report["unavailable"] += _refused_bundles()
    report["numba_cache"] = _probe(report, "numba cache", _numba_cache, default=None)
    report["unavailable"] = report.pop("unavailable")  # listed last
    return report
