"""The command line: ``python -m mmaemu {info, selftest, explain, demo}`` (platform.md section 7).

The commands collect what the library reports and format it; they decide nothing themselves. Exit codes:
0 = success (a valid call / PASS / report built), 1 = the call would raise / FAIL, 2 = usage error (click),
4 = unavailable (no usable CUDA device, explain could not run).

Heavy imports (torch, numba, the arithmetic) happen inside the commands, so ``mmaemu --help`` is quick.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import warnings
from typing import Any, Dict, List, Optional

import click

from ._version import __version__

__all__ = ["cli", "main"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 4
INFO_FORMAT = "mmaemu-info/1"
EXPLAIN_FORMAT = "mmaemu-explain/1"
SELFTEST_FORMAT = "mmaemu-selftest/1"
KEY_WIDTH = 16
TRUTHY = ("1", "true", "yes", "on")
NO_CUDA_REASON = "no CUDA device visible to torch"
CPU_USED = "the CPU backend is used"


# ================================================================================================================
# Helpers shared by the commands


def _jsonable(value: Any) -> Any:
    """Plain JSON data of dataclasses, named tuples, mappings, sequences, paths and dtypes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return _jsonable(value._asdict())
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def _write_json(report: dict, target: Optional[str]) -> None:
    """Write ``report`` to PATH, or to stdout for "-"."""
    text = json.dumps(_jsonable(report), indent=2, sort_keys=False) + "\n"
    if target == "-":
        click.echo(text, nl=False)
    else:
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)


def _line(key: str, value: Any) -> str:
    return f"{key:<{KEY_WIDTH}}{value}"


def _cuda_disabled_value(exact: bool = False) -> Optional[str]:
    """The value of MMAEMU_DISABLE_CUDA when it disables CUDA, else None: truthy (1/true/yes/on) for running
    kernels (the registry's reading), exactly "1" for diagnostics (``exact``; platform.md section 5)."""
    value = os.environ.get("MMAEMU_DISABLE_CUDA", "")
    if exact:
        return value if value == "1" else None
    return value if value.strip().lower() in TRUTHY else None


def _cuda_unusable(ordinal: Optional[int], exact: bool = False) -> Optional[str]:
    """Why CUDA device ``ordinal`` (None: the current one) cannot be used, or None when it can."""
    disabled = _cuda_disabled_value(exact)
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


def _torch_device(kind: str, index: Optional[int] = None):
    import torch

    return torch.device(kind, index) if index is not None else torch.device(kind)


def _error_text(error: BaseException) -> str:
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return f"{type(error).__name__}: {message}"


# ================================================================================================================
# The group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mmaemu", message="%(prog)s %(version)s")
def cli():
    """mmaemu: NVIDIA FP8 tensor-core GEMMs (torch._scaled_mm of torch 2.7.1), bit for bit, on any CPU."""


def main(argv=None):
    """Console entry point (``mmaemu``, ``python -m mmaemu``)."""
    return cli.main(args=argv, prog_name="mmaemu")


# ================================================================================================================
# info


def _probe(report: dict, component: str, fn, *args, default=None):
    """fn(*args); on failure record the component as unavailable and return ``default``."""
    try:
        return fn(*args)
    except Exception as exc:  # info reports every failure instead of raising it
        report["unavailable"].append({"component": component, "reason": _error_text(exc)})
        return default


def _versions() -> dict:
    import platform

    out = {"python": platform.python_version()}
    for name in ("torch", "numba", "numpy", "click"):
        try:
            module = __import__(name)
            # click deprecates its __version__ attribute: ask the installed distribution first
            out[name] = (_dist_version(name) if name == "click" else None) or getattr(module, "__version__", None)
        except Exception as exc:
            out[name] = None
            out.setdefault("_errors", {})[name] = _error_text(exc)
    return out


def _dist_version(name: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment() -> Dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("MMAEMU_")}


def _device_info(ordinal: Optional[int]) -> dict:
    """The Device section: the CUDA device's facts, or {"available": False, "reason": ...}."""
    reason = _cuda_unusable(ordinal, exact=True)
    if reason is not None:
        return {"available": False, "reason": reason}
    import torch

    index = torch.cuda.current_device() if ordinal is None else ordinal
    props = torch.cuda.get_device_properties(index)
    info = {
        "available": True,
        "index": index,
        "name": props.name,
        "capability": f"sm_{props.major}{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_bytes": int(props.total_memory),
        "torch_cuda": torch.version.cuda,
    }
    for key, probe in (("display_driver", _display_driver), ("cuda_driver_api", _cuda_driver_api),
                       ("cublaslt", _cublaslt_version), ("nvrtc", _nvrtc_version)):
        try:
            info[key] = probe()
        except Exception as exc:
            info[key] = None
            info.setdefault("errors", {})[key] = _error_text(exc)
    return info


def _display_driver() -> str:
    """The NVIDIA display driver version (NVML, else /proc/driver/nvidia/version)."""
    import ctypes

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


def _cuda_driver_api() -> str:
    import ctypes

    from .platform import cublaslt

    cuda = cublaslt._load_libcuda()
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        raise RuntimeError("cuDriverGetVersion failed")
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def _cublaslt_version() -> str:
    from .platform import cublaslt

    lib, path = cublaslt.load_cublaslt()
    return ".".join(str(x) for x in cublaslt.loaded_cublaslt_version()) + f" ({path})"


def _nvrtc_version() -> str:
    """libnvrtc's version: $MMAEMU_NVRTC_PATH, the nvidia.cuda_nvrtc wheel, $CONDA_PREFIX/lib, $CUDA_HOME/lib64,
    then the system search path."""
    import ctypes
    import ctypes.util
    import glob
    import importlib.util

    candidates = [os.environ.get("MMAEMU_NVRTC_PATH")]
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec("nvidia") else None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(folder, "lib", "libnvrtc.so*")))
    for env, sub in (("CONDA_PREFIX", "lib"), ("CUDA_HOME", "lib64")):
        if os.environ.get(env):
            candidates += sorted(glob.glob(os.path.join(os.environ[env], sub, "libnvrtc.so*")))
    candidates += ["libnvrtc.so.12", ctypes.util.find_library("nvrtc")]
    errors = []
    for path in filter(None, candidates):
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
            continue
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value} ({path})"
    raise RuntimeError("libnvrtc not found" + (": " + "; ".join(errors) if errors else ""))


def _bytes_text(n: Optional[int]) -> str:
    if n is None:
        return "-"
    if n and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n} B"


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def _profiles(report: dict, device_arg) -> List[dict]:
    from .platform import get_profile, list_profiles

    cuda_reason = report["device"].get("reason") if not report["device"].get("available") else None
    disabled = os.environ.get("MMAEMU_DISABLE_CUDA") == "1"
    out = []
    for name in list_profiles():
        p = get_profile(name)
        if not (p.gpu_name and p.sm_count and p.cublaslt_version):
            match, why = None, "no reference GPU"
        elif disabled:
            match, why = None, "MMAEMU_DISABLE_CUDA=1"
        else:
            try:
                match, why = bool(p.matches_device(device_arg)), None
            except Exception as exc:
                match, why = None, _error_text(exc)
            if match is False and cuda_reason:
                why = cuda_reason
            elif match is False:
                d = report["device"]
                why = (f"this device: {d.get('name')}, {d.get('sm_count')} SMs, cuBLASLt "
                       f"{(d.get('cublaslt') or 'unknown').split(' ')[0]}")
        out.append({
            "name": p.name, "preset": p.preset_name, "gpu": p.gpu_name,
            "capability": f"sm_{p.capability[0]}{p.capability[1]}", "sm_count": p.sm_count,
            "cublaslt": p.cublaslt_version, "caller": p.caller, "workspace_bytes": p.workspace_bytes,
            "align": p.align, "table": p.splitk_table, "maturity": p.maturity,
            "splitk_maturity": p.splitk_maturity, "description": p.description, "match": match,
            "match_note": why,
        })
    return out


def _presets() -> List[dict]:
    from .model import presets

    aliases = getattr(presets, "_ALIASES", {})
    out = []
    for name in presets.list_presets():
        p = presets.get_preset(name, warn=False)
        out.append({"name": p.name, "maturity": p.maturity, "scope": p.validated_scope,
                    "aliases": sorted(a for a, target in aliases.items() if target == p.name)})
    return out


def _backends(device_arg) -> List[dict]:
    from . import backends

    status = backends.backends_status(device_arg)
    out = []
    for name, s in status.items():
        entry = _jsonable(s)
        if not isinstance(entry, dict):
            entry = {"status": entry}
        entry.setdefault("name", name)
        out.append(entry)
    return out


def _splitk_tables() -> List[dict]:
    """Per table id of the profiles: its files (bytes, sha256), row counts from the json and the index's own
    ``rows`` member (the big arrays are not loaded)."""
    import hashlib
    from importlib import resources

    import numpy as np

    from .platform import get_profile, list_profiles

    data = resources.files("mmaemu.platform").joinpath("data")
    users: Dict[str, List[str]] = {}
    for name in list_profiles():
        table_id = get_profile(name).splitk_table
        if table_id:
            users.setdefault(table_id, []).append(name)

    def describe(file_name: str) -> dict:
        blob = data.joinpath(file_name).read_bytes()
        return {"name": file_name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}

    out = []
    for table_id, profiles in users.items():
        meta = json.loads(data.joinpath(f"{table_id}.json").read_text(encoding="utf-8"))
        combos_name = meta.get("verified_combos", "verified_split_combos.json")
        combos = json.loads(data.joinpath(combos_name).read_text(encoding="utf-8"))
        index_name = f"{table_id}.index.npz"
        with data.joinpath(index_name).open("rb") as fh, np.load(fh, allow_pickle=False) as npz:
            index_rows = int(npz["rows"])
            index_format = str(npz["format"])
        out.append({
            "table_id": table_id,
            "profiles": profiles,
            "rows": meta.get("rows"),
            "split_rows": meta.get("split_rows"),
            "index_rows": index_rows,
            "index_format": index_format,
            "verified_combos": sum(1 for c in combos.get("combos", []) if c.get("verified")),
            "files": [describe(f"{table_id}.json"), describe(index_name), describe(combos_name)],
        })
    return out


def _numba_cache() -> dict:
    from . import _cache

    path = _cache.numba_cache_dir()
    root = _cache.default_cache_root()
    probe = path if path.exists() else root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return {"path": str(path), "exists": path.exists(), "writable": os.access(probe, os.W_OK)}


def build_info(device: Optional[int] = None) -> dict:
    """The ``mmaemu info`` report as plain data (format "mmaemu-info/1"); never raises for a missing component."""
    report: Dict[str, Any] = {
        "format": INFO_FORMAT,
        "mmaemu": {"version": __version__, "location": os.path.dirname(os.path.abspath(__file__))},
        "unavailable": [],
    }
    versions = _versions()
    for name, error in versions.pop("_errors", {}).items():
        report["unavailable"].append({"component": name, "reason": error})
    report["versions"] = versions
    report["environment"] = _environment()
    report["device"] = _probe(report, "device", _device_info, device,
                              default={"available": False, "reason": "probe failed"})
    if not report["device"].get("available"):
        report["unavailable"].append({"component": "cuda", "reason": report["device"]["reason"]})
    device_arg = None if device is None else _torch_device("cuda", device)
    report["profiles"] = _probe(report, "profiles", _profiles, report, device_arg, default=[])
    report["presets"] = _probe(report, "presets", _presets, default=[])
    report["backends"] = _probe(report, "backends", _backends, device_arg, default=[])
    report["splitk_tables"] = _probe(report, "split-K tables", _splitk_tables, default=[])
    report["numba_cache"] = _probe(report, "numba cache", _numba_cache, default=None)
    report["unavailable"] = report.pop("unavailable")  # listed last
    return report


def _gate_text(gate) -> str:
    if not isinstance(gate, dict):
        return str(gate)
    if gate.get("ran") is False:
        state = "not run"
    else:
        state = "passed" if gate.get("passed") else "FAILED"
    return f"{gate.get('name')} {state}" + (" (cached)" if gate.get("cached") else "")


def format_info(report: dict) -> str:
    lines = [f"mmaemu {report['mmaemu']['version']} ({report['mmaemu']['location']})"]
    v = report["versions"]
    lines.append("python {}, torch {}, numba {}, numpy {}, click {}".format(
        *(v.get(k) or "unavailable" for k in ("python", "torch", "numba", "numpy", "click"))))
    lines.append("")
    lines.append("Environment:")
    env = report["environment"]
    lines += [f"  {k}={val}" for k, val in env.items()] or ["  (no MMAEMU_* variable is set)"]

    lines += ["", "Device:"]
    d = report["device"]
    if not d.get("available"):
        lines.append(f"  none: {d.get('reason')}")
    else:
        lines.append(f"  cuda:{d['index']} {d['name']}, {d['capability']}, {d['sm_count']} SMs, "
                     f"{d['memory_bytes'] / 2**30:.1f} GiB")
        for key, label in (("display_driver", "display driver"), ("cuda_driver_api", "CUDA driver API"),
                           ("torch_cuda", "torch built with CUDA"), ("cublaslt", "cuBLASLt"), ("nvrtc", "NVRTC")):
            value = d.get(key)
            if value is None:
                value = "unavailable" + (f" ({d['errors'][key]})" if key in d.get("errors", {}) else "")
            lines.append(f"  {label}: {value}")

    lines += ["", "Profiles:"]
    width = max((len(p["name"]) for p in report["profiles"]), default=0)
    for p in report["profiles"]:
        if p["match"] is True:
            match = "MATCHES this device"
        elif p["match"] is False:
            match = "does not match this device"
        else:
            match = "match unknown"
        if p["match_note"]:
            match += f" ({p['match_note']})"
        lines.append(
            f"  {p['name']:<{width}}  preset {p['preset']}, GPU {p['gpu'] or '-'}, SMs {p['sm_count'] or '-'}, "
            f"cuBLASLt {p['cublaslt'] or '-'}, caller {p['caller']}, workspace {_bytes_text(p['workspace_bytes'])}"
            f", table {p['table'] or '-'}, maturity {p['maturity']}, split-K maturity {p['splitk_maturity']}: "
            f"{match}")

    lines += ["", "Presets:"]
    for p in report["presets"]:
        alias = f" (alias: {', '.join(p['aliases'])})" if p["aliases"] else ""
        lines.append(f"  {p['name']}{alias}: {p['maturity']}" + (f"; scope: {p['scope']}" if p["scope"] else ""))

    lines += ["", "Backends:"]
    for b in report["backends"]:
        state = "available" if b.get("available") else "unavailable"
        reason = str(b.get("reason") or "")
        head = reason if reason.split(":")[0].strip() == state else state + (f": {reason}" if reason else "")
        extras = []
        if b.get("source"):
            extras.append(f"source {b['source']}")
        if "validated_here" in b:
            extras.append("validated here" if b["validated_here"] else "not validated here")
        if b.get("gates"):
            extras.append("gates " + ", ".join(_gate_text(g) for g in b["gates"]))
        lines.append(f"  {b.get('name')}: {head}" + (f" [{'; '.join(extras)}]" if extras else ""))
    if not report["backends"]:
        lines.append("  (backend status unavailable: see Unavailable components)")

    lines += ["", "Split-K tables:"]
    for t in report["splitk_tables"]:
        lines.append(f"  {t['table_id']} (profiles {', '.join(t['profiles'])}): {_count(t['rows'])} rows "
                     f"({_count(t['split_rows'])} split), index {_count(t['index_rows'])} rows, "
                     f"{t['verified_combos']} verified split combinations")
        for f in t["files"]:
            lines.append(f"    {f['name']}  {f['bytes']:,} bytes  sha256 {f['sha256'][:16]}")

    lines += ["", "Numba cache:"]
    c = report["numba_cache"]
    if c:
        lines.append(f"  {c['path']} ({'exists' if c['exists'] else 'not created yet'}"
                     f"{'' if c['writable'] else ', NOT writable: compiled code is not cached'})")
    else:
        lines.append("  unavailable")

    lines += ["", "Unavailable components:"]
    lines += [f"  {u['component']}: {u['reason']}" for u in report["unavailable"]] or ["  none"]
    return "\n".join(lines)


@cli.command(short_help="Versions, device, profiles, presets, backends, split-K tables.")
@click.option("--device", type=click.IntRange(min=0), default=None, help="CUDA device ordinal to describe.")
@click.option("--json", "json_path", metavar="PATH|-", default=None,
              help="Also write the JSON report to PATH; '-' prints only the JSON report.")
def info(device, json_path):
    """Versions, device, profiles, presets, backends and split-K tables."""
    report = build_info(device)
    if json_path != "-":
        click.echo(format_info(report))
    if json_path is not None:
        _write_json(report, json_path)


# ================================================================================================================
# selftest


def _cc_tuple(value) -> Optional[tuple]:
    """(major, minor) of a capability written as (8, 9), "8.9", 8.9, 89, "89" or "sm_89"; None if unreadable."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return int(value[0]), int(value[1])
    text = str(value).strip().lower().replace("sm_", "").replace("sm", "")
    if "." in text:
        major, _, minor = text.partition(".")
        return int(major), int(minor)
    if text.isdigit():
        return divmod(int(text), 10)
    return None


def _kernel_requirement(name: str, device_index: int) -> tuple:
    """(required, why) of a kernel on the device (platform.md 7): required if it is not gated and the device
    meets min_cc, or gated and the device's capability is in validated_on; otherwise optional (a rejection only
    stops auto-selection). Read from the kernel's metadata in ``mmaemu.backends.KERNELS`` (or
    ``mmaemu.cuda.KERNELS``; name -> object or dict
    with ``gated``, ``validated_on``, ``min_cc``) when it exists; without metadata every kernel is required."""
    import torch

    cc = tuple(torch.cuda.get_device_capability(device_index))
    cc_text = f"sm_{cc[0]}{cc[1]}"
    spec = None
    for module in ("backends", "cuda"):
        try:
            kernels = getattr(importlib.import_module(f".{module}", __package__), "KERNELS", None)
        except Exception:  # no such module: no metadata there
            continue
        if isinstance(kernels, dict):
            spec = kernels.get(name) or kernels.get(name.split(":", 1)[-1])
            if spec is not None:
                break
    if spec is None:
        return True, "required: no kernel metadata, every kernel counts"

    def attr(key, default=None):
        return spec.get(key, default) if isinstance(spec, dict) else getattr(spec, key, default)

    if attr("gated", False):
        validated = [_cc_tuple(v) for v in (attr("validated_on", ()) or ())]
        listed = ", ".join(f"sm_{v[0]}{v[1]}" for v in validated if v) or "none"
        if cc in validated:
            return True, f"required: gated, validated on {cc_text}"
        return False, f"optional: gated, {cc_text} is not among validated_on ({listed})"
    min_cc = _cc_tuple(attr("min_cc"))
    if min_cc is None or cc >= min_cc:
        return True, "required: not gated" + (f", {cc_text} meets min_cc {min_cc[0]}.{min_cc[1]}" if min_cc else "")
    return False, f"optional: {cc_text} is below min_cc {min_cc[0]}.{min_cc[1]}"


def _strip_not_run(reason: str) -> str:
    return reason[len("not run: "):] if reason.startswith("not run: ") else reason


_GATE_FIELDS = ("name", "passed", "reason", "details", "seconds", "cached", "ran")


def _gate_fields(gate) -> dict:
    """A GateResult(name, passed, reason, details, seconds, cached) as a dict (dataclass, named tuple, dict or
    any object with those attributes)."""
    data = _jsonable(gate)
    if isinstance(data, dict):
        return data
    return {f: _jsonable(getattr(gate, f, None)) for f in _GATE_FIELDS}


@cli.command(short_help="Run the CUDA kernels' gates; verdict PASS/FAIL/UNAVAILABLE.")
@click.option("--device", type=click.IntRange(min=0), default=None, help="CUDA device ordinal (default: current).")
@click.option("--kernels", default="all", metavar="all|a,b", help="Kernels to test (default all).")
@click.option("--force", is_flag=True, help="Ignore cached verdicts and rerun every gate.")
@click.option("--json", "json_path", metavar="PATH|-", default=None,
              help="Also write the results as JSON to PATH; '-' prints only the JSON.")
@click.pass_context
def selftest(ctx, device, kernels, force, json_path):
    """Run the CUDA kernels' gates on a device and print a verdict (exit 0 PASS, 1 FAIL, 4 UNAVAILABLE)."""
    names = [k.strip() for k in kernels.split(",")]
    if not names or any(not k for k in names):
        raise click.BadParameter(f"expected 'all' or a comma list of kernel names, got {kernels!r}",
                                 param_hint="--kernels")
    selected = "all" if names == ["all"] else names
    report = {"format": SELFTEST_FORMAT, "device": None, "kernels_requested": selected, "force": force,
              "kernels": [], "verdict": None, "reason": None}

    echo = (lambda text: None) if json_path == "-" else click.echo  # "-": only the JSON report

    def finish(verdict: str, reason: str, code: int):
        report["verdict"], report["reason"] = verdict, reason
        echo(f"verdict: {verdict} - {reason}")
        if json_path is not None:
            _write_json(report, json_path)
        ctx.exit(code)

    unusable = _cuda_unusable(device)
    if unusable is not None:
        finish("UNAVAILABLE", f"{unusable}: {CPU_USED}", EXIT_UNAVAILABLE)
    import torch

    index = torch.cuda.current_device() if device is None else device
    report["device"] = {"index": index, "name": torch.cuda.get_device_name(index)}
    from . import backends

    run = getattr(backends, "selftest", None)
    if run is None:
        finish("UNAVAILABLE", "this mmaemu has no CUDA self-test (mmaemu.backends.selftest is missing): "
               + CPU_USED, EXIT_UNAVAILABLE)
    from .errors import BackendUnavailableError

    try:
        results = run(torch.device("cuda", index), kernels=selected, force=force)
    except BackendUnavailableError as exc:
        finish("UNAVAILABLE", f"{exc}: {CPU_USED}", EXIT_UNAVAILABLE)
    except (ValueError, KeyError) as exc:
        raise click.BadParameter(_error_text(exc), param_hint="--kernels")
    except Exception as exc:
        finish("FAIL", f"the self-test raised {_error_text(exc)}", EXIT_FAIL)

    failed_required, not_run = [], []
    for name, gates in results.items():
        gates = list(gates) if isinstance(gates, (list, tuple)) else [gates]
        fields = [_gate_fields(g) for g in gates]
        ran = [g for g in fields if g.get("ran", True) is not False]
        required, why = _kernel_requirement(str(name), index)
        if not ran:
            status = "NOT RUN"
            not_run.append((str(name), next((g.get("reason") for g in fields if g.get("reason")), "not run")))
        elif all(g.get("passed") for g in ran):
            status = "PASS"
        else:
            status = "FAIL" if required else "REJECTED"
            if required:
                failed_required.append(str(name))
        report["kernels"].append({"name": str(name), "status": status, "required": required, "why": why,
                                  "gates": fields})
        echo(f"{name}: {status} ({why})")
        for g in fields:
            seconds = g.get("seconds")
            state = "not run" if g.get("ran", True) is False else ("passed" if g.get("passed") else "FAILED")
            reason = _strip_not_run(g.get("reason") or "")
            extra = [f"{seconds:.2f} s" if isinstance(seconds, (int, float)) and state != "not run" else None,
                     "cached" if g.get("cached") else None, reason or None]
            echo(f"  {g.get('name')}: {state}" + "".join(f"; {e}" for e in extra if e))
    device_name = report["device"]["name"]
    if len(not_run) == len(report["kernels"]):
        why = _strip_not_run(not_run[0][1]) if not_run else f"no CUDA kernel to test on {device_name}"
        finish("UNAVAILABLE", f"{why}: {CPU_USED}", EXIT_UNAVAILABLE)
    if failed_required:
        finish("FAIL", f"required kernel(s) failed on {device_name}: {', '.join(failed_required)}", EXIT_FAIL)
    skipped = f" (not run: {', '.join(n for n, _ in not_run)})" if not_run else ""
    finish("PASS", f"every required kernel passed on {device_name}{skipped}", EXIT_OK)


# ================================================================================================================
# explain

_FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_OUT = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
        "float16": "float16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
#: Operands up to this many bytes are ordinary zero tensors; larger CPU operands are zero pages mapped read-only
#: (no memory is committed), larger CUDA operands views of a small allocation (explain never reads them).
SMALL_OPERAND_BYTES = 64 << 20


def _parse_splitk(ctx, param, value: str):
    """auto | an integer (1; others are reported by explain) | S,scheme."""
    text = value.strip()
    if text == "auto":
        return "auto"
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) == 1:
            return int(parts[0])
        if len(parts) == 2 and parts[1]:
            return (int(parts[0]), parts[1])
    except ValueError:
        pass
    raise click.BadParameter(f"expected 'auto', 1 or 'S,scheme' (e.g. 2,contiguous), got {value!r}")


def _parse_device(ctx, param, value: str):
    text = value.strip()
    if text in ("auto", "cpu", "cuda"):
        return text
    kind, _, index = text.partition(":")
    if kind == "cuda" and index.isdigit():
        return text
    raise click.BadParameter(f"expected auto, cpu, cuda or cuda:N, got {value!r}")


def _resolve_device(spec: str):
    """(torch device, None) or (None, why unusable)."""
    import torch

    if spec == "cpu":
        return torch.device("cpu"), None
    ordinal = int(spec.partition(":")[2]) if ":" in spec else None
    why = _cuda_unusable(ordinal)
    if why is not None:
        if spec == "auto":
            return torch.device("cpu"), None
        return None, why
    return torch.device("cuda", torch.cuda.current_device() if ordinal is None else ordinal), None


def _zero_rows(rows: int, cols: int, dtype, device):
    """A zero-filled row-major [rows, cols] tensor, 16-byte aligned, that does not need rows*cols bytes of
    memory when it is large."""
    import torch

    nbytes = rows * cols
    if nbytes <= SMALL_OPERAND_BYTES:
        return torch.zeros((rows, cols), dtype=torch.uint8, device=device).view(dtype)
    if device.type == "cpu":
        import mmap

        import numpy as np

        # Private read-only anonymous pages read as zeros and commit no memory (the zero page backs them).
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
        array = np.frombuffer(buf, dtype=np.uint8).reshape(rows, cols)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the array is not writable: explain never writes
            return torch.from_numpy(array).view(dtype)
    return _cuda_view(rows, cols, dtype, device)


class _CudaArray:
    """A ``__cuda_array_interface__`` describing a [rows, cols] uint8 array at ``ptr`` (no bounds of its own)."""

    def __init__(self, ptr: int, rows: int, cols: int, keep):
        self._keep = keep
        self.__cuda_array_interface__ = {"shape": (rows, cols), "strides": (cols, 1), "typestr": "|u1",
                                         "data": (ptr, True), "version": 2}


def _cuda_view(rows: int, cols: int, dtype, device):
    """A [rows, cols] CUDA tensor over a 4 KiB zero allocation: it has the shape, strides, device and alignment
    explain looks at, but not the memory (explain reads no element; nothing else may use it)."""
    import torch

    backing = torch.zeros(4096, dtype=torch.uint8, device=device)
    view = torch.as_tensor(_CudaArray(backing.data_ptr(), rows, cols, backing), device=device)
    return view.view(dtype)


def _explain_call(M, N, K, a, b, out, fast, scale_a, scale_b, scale_result, profile, splitk, backend, device):
    """The CallPlan of a scaled_mm call on zero-filled operands of the given shape on ``device``."""
    import torch

    import mmaemu

    input = _zero_rows(M, K, getattr(torch, _FP8[a]), device)
    mat2 = _zero_rows(N, K, getattr(torch, _FP8[b]), device).t()
    scalar = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # explain records every warning in the plan; do not print them twice
        return mmaemu.explain(
            input, mat2, scalar(scale_a), scalar(scale_b), scale_result=None if scale_result is None else
            scalar(scale_result), out_dtype=None if out is None else getattr(torch, _OUT[out]),
            use_fast_accum=fast, profile=profile, splitk=splitk, backend=backend)


def _plan_lines(plan) -> List[str]:
    lines = []
    for field in dataclasses.fields(plan):
        value = getattr(plan, field.name)
        if field.name == "validation" and value != "ok":
            value = f"{value[0]}: {value[1]}"
        elif field.name == "split" and value is not None:
            value = dataclasses.asdict(value)
        lines.append(_line(field.name, value))
    return lines


@cli.command(short_help="What scaled_mm would do for an M x N x K call.")
@click.argument("M", type=click.IntRange(min=0))
@click.argument("N", type=click.IntRange(min=0))
@click.argument("K", type=click.IntRange(min=0))
@click.option("--a", "fmt_a", type=click.Choice(sorted(_FP8)), default="e4m3", show_default=True,
              help="Format of input (mat1).")
@click.option("--b", "fmt_b", type=click.Choice(sorted(_FP8)), default="e4m3", show_default=True,
              help="Format of mat2.")
@click.option("--out", type=click.Choice(list(_OUT)), default=None, help="out_dtype (default: input's dtype).")
@click.option("--fast", is_flag=True, help="use_fast_accum=True.")
@click.option("--scale-a", type=float, default=1.0, show_default=True)
@click.option("--scale-b", type=float, default=1.0, show_default=True)
@click.option("--scale-result", type=float, default=None)
@click.option("--profile", default=None, help="Profile name (default: $MMAEMU_PROFILE or hopper).")
@click.option("--splitk", default="auto", callback=_parse_splitk, metavar="auto|1|S,scheme", show_default=True)
@click.option("--backend", default="auto", show_default=True)
@click.option("--device", "device_spec", default="auto", callback=_parse_device, metavar="auto|cpu|cuda|cuda:N",
              show_default=True)
@click.option("--json", "json_path", metavar="PATH|-", default=None,
              help="Also write the plan as JSON to PATH; '-' prints only the JSON.")
@click.pass_context
def explain(ctx, m, n, k, fmt_a, fmt_b, out, fast, scale_a, scale_b, scale_result, profile, splitk, backend,
            device_spec, json_path):
    """What scaled_mm would do with an [M, K] x [K, N] call (exit 0 valid, 1 would raise, 4 device unusable)."""
    device, why = _resolve_device(device_spec)
    out_text = _OUT[out] if out else "default (input dtype)"
    header = (f"explain M={m} N={n} K={k} {fmt_a} x {fmt_b} -> {out_text}, use_fast_accum={fast}, "
              f"device={device if device is not None else device_spec}")
    call = {"M": m, "N": n, "K": k, "a": fmt_a, "b": fmt_b, "out_dtype": _OUT[out] if out else None,
            "use_fast_accum": fast, "scale_a": scale_a, "scale_b": scale_b, "scale_result": scale_result,
            "profile": profile, "splitk": splitk, "backend": backend, "device": str(device or device_spec)}
    report = {"format": EXPLAIN_FORMAT, "call": call, "plan": None, "error": None}
    lines = [header]
    if device is None:
        code = EXIT_UNAVAILABLE
        report["error"] = f"device {device_spec} is unusable: {why}"
        lines.append(f"error: {report['error']}")
    else:
        try:
            plan = _explain_call(m, n, k, fmt_a, fmt_b, out, fast, scale_a, scale_b, scale_result, profile, splitk,
                                 backend, device)
        except Exception as exc:  # explain itself never raises for a bad call: this is an unusable setup
            code = EXIT_UNAVAILABLE
            report["error"] = f"explain unavailable: {_error_text(exc)}"
            lines.append(f"error: {report['error']}")
        else:
            code = EXIT_OK if plan.validation == "ok" else EXIT_FAIL
            report["plan"] = _jsonable(plan)
            if plan.validation != "ok":
                report["plan"]["validation"] = {"error": plan.validation[0], "message": plan.validation[1]}
            lines += _plan_lines(plan)
    report["exit_code"] = code
    if json_path != "-":
        click.echo("\n".join(lines))
    if json_path is not None:
        _write_json(report, json_path)
    ctx.exit(code)


# ================================================================================================================
# demo


def format_demo(result: dict) -> str:
    s, inp = result["shape"], result["inputs"]
    n_out = result["outputs"]
    lines = [
        f"mmaemu demo: an FP8 GEMM of the Evo 2 1B projection shape M={s['M']}, N={s['N']}, K={s['K']}"
        + (" (--quick: smaller N)" if result["quick"] else ""),
        f"inputs: activations {inp['activations']}, weights {inp['weights']} (seed {result['seed']}), quantised to "
        f"E4M3 with per-tensor amax scaling to 448 as Transformer Engine does (scale_inv {inp['scale_inv_a']:.6g} "
        f"and {inp['scale_inv_b']:.6g})",
        "call: mmaemu.scaled_mm(x, w.t(), scale_inv_x, scale_inv_w, out_dtype=torch.bfloat16, use_fast_accum=True,"
        " splitk='auto')",
        result["reference"] + ".",
        "",
    ]
    width = max(len(name) for name in result["profiles"])
    for name, r in result["profiles"].items():
        split = r["split"]
        split_text = f"S={split['S']} ({split['source']})" if split else "no split decision"
        d = r["vs_ieee"]
        lines.append(
            f"{name:<{width}}  {r['gpu']}: split-K {split_text}; {d['differ']:,} of {n_out:,} outputs "
            f"({100 * d['differ'] / n_out:.2f}%) differ from the IEEE reference; max abs diff {d['max_abs_diff']:.6g}"
            f", max rel diff {d['max_rel_diff']:.3g}; {r['seconds']:.2f} s"
            + (" (first call: includes Numba compilation or cache loading)" if r["first_call"] else ""))
    b = result["between"]
    if b:
        lines.append(
            f"{b['profiles'][0]} vs {b['profiles'][1]}: {b['differ']:,} of {n_out:,} outputs "
            f"({100 * b['differ'] / n_out:.2f}%) differ; max abs diff {b['max_abs_diff']:.6g}, "
            f"max rel diff {b['max_rel_diff']:.3g}")
    lines.append("(relative differences are relative to the IEEE reference, over its nonzero outputs)")
    return "\n".join(lines)


@cli.command(short_help="FP8 GEMM of the Evo 2 1B shape: hopper vs ada vs IEEE.")
@click.option("--quick", is_flag=True, help="Smaller N (for tests).")
@click.option("--json", "json_path", metavar="PATH|-", default=None,
              help="Also write the results as JSON to PATH; '-' prints only the JSON.")
def demo(quick, json_path):
    """An FP8 GEMM of the Evo 2 1B projection shape under hopper and ada, compared with IEEE accumulation."""
    from .demo import run_demo

    result = run_demo(quick=quick)
    if json_path != "-":
        click.echo(format_demo(result))
    if json_path is not None:
        _write_json(result, json_path)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
