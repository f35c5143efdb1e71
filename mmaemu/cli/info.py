"""``mmaemu info``: versions, device, profiles, presets, backends and split-K tables, as text or JSON.

The report is :func:`mmaemu.cli.diagnostics.build_info`; this module only formats it.
"""

from __future__ import annotations

from typing import List, Optional

import click

from .diagnostics import build_info
from .output import emit, json_option

_DRIVER_LABELS = (("display_driver", "display driver"), ("cuda_driver_api", "CUDA driver API"),
                  ("torch_cuda", "torch built with CUDA"), ("cublaslt", "cuBLASLt"), ("nvrtc", "NVRTC"))


def _bytes_text(n: Optional[int]) -> str:
    if n is None:
        return "-"
    if n and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n} B"


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def _gate_text(gate) -> str:
    if not isinstance(gate, dict):
        return str(gate)
    if gate.get("ran") is False:
        state = "not run"
    else:
        state = "passed" if gate.get("passed") else "FAILED"
    return f"{gate.get('name')} {state}" + (" (cached)" if gate.get("cached") else "")


def _header(report: dict) -> List[str]:
    v = report["versions"]
    return [f"mmaemu {report['mmaemu']['version']} ({report['mmaemu']['location']})",
            "python {}, torch {}, numba {}, numpy {}, click {}".format(
                *(v.get(k) or "unavailable" for k in ("python", "torch", "numba", "numpy", "click"))),
            f"numba-cuda {v['numba_cuda']}" if v.get("numba_cuda") else
            "numba-cuda not installed (pip install 'mmaemu[cuda]': the CUDA kernels' preferred compiler; cuda:native "
            "needs it to target sm_90a)"]


def _environment(report: dict) -> List[str]:
    """The variables mmaemu reads that are set, an invalid value flagged; others only counted (never shown)."""
    problems = report.get("environment_problems", {})
    lines = [f"  {k}={val}" + (f"  INVALID: {problems[k]}" if k in problems else "")
             for k, val in report["environment"].items()] or ["  (no variable that mmaemu reads is set)"]
    unread = report.get("environment_unread", 0)
    if unread:
        lines.append(f"  ({unread} other MMAEMU_* variable{' is' if unread == 1 else 's are'} set; mmaemu does not "
                     f"read {'it' if unread == 1 else 'them'})")
    return lines


def _defaults(defaults: dict) -> List[str]:
    return [f"  {key}: {text}" for key, text in defaults.items()] or ["  unavailable"]


def _device(d: dict) -> List[str]:
    if not d.get("available"):
        return [f"  none: {d.get('reason')}"]
    lines = [f"  cuda:{d['index']} {d['name']}, {d['capability']}, {d['sm_count']} SMs, "
             f"{d['memory_bytes'] / 2**30:.1f} GiB"]
    for key, label in _DRIVER_LABELS:
        value = d.get(key)
        if value is None:
            value = "unavailable" + (f" ({d['errors'][key]})" if key in d.get("errors", {}) else "")
        lines.append(f"  {label}: {value}")
    return lines


def _match_text(p: dict) -> str:
    if p["match"] is True:
        match = "MATCHES this device"
    elif p["match"] is False:
        match = "does not match this device"
    else:
        match = "match unknown"
    return match + (f" ({p['match_note']})" if p["match_note"] else "")


def _profiles(profiles: List[dict]) -> List[str]:
    width = max((len(p["name"]) for p in profiles), default=0)
    return [f"  {p['name']:<{width}}  preset {p['preset']}, GPU {p['gpu'] or '-'}, SMs {p['sm_count'] or '-'}, "
            f"cuBLASLt {p['cublaslt'] or '-'}, caller {p['caller']}, workspace {_bytes_text(p['workspace_bytes'])}"
            f", table {p['table'] or '-'}, maturity {p['maturity']}, split-K maturity {p['splitk_maturity']}: "
            f"{_match_text(p)}" for p in profiles]


def _presets(presets: List[dict]) -> List[str]:
    lines = []
    for p in presets:
        alias = f" (alias: {', '.join(p['aliases'])})" if p["aliases"] else ""
        lines.append(f"  {p['name']}{alias}: {p['maturity']}" + (f"; scope: {p['scope']}" if p["scope"] else ""))
    return lines


def _backend(b: dict) -> str:
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
    return f"  {b.get('name')}: {head}" + (f" [{'; '.join(extras)}]" if extras else "")


def _backends(backends: List[dict]) -> List[str]:
    return [_backend(b) for b in backends] or ["  (backend status unavailable: see Unavailable components)"]


def _splitk_tables(tables: List[dict]) -> List[str]:
    lines = []
    for t in tables:
        lines.append(f"  {t['table_id']} (profiles {', '.join(t['profiles'])}): {_count(t['rows'])} rows "
                     f"({_count(t['split_rows'])} split), index {_count(t['index_rows'])} rows, "
                     f"{t['verified_combos']} verified split combinations")
        lines += [f"    {f['name']}  {f['bytes']:,} bytes  sha256 {f['sha256'][:16]}" for f in t["files"]]
    return lines


def _numba_cache(c: Optional[dict]) -> List[str]:
    if not c:
        return ["  unavailable"]
    if c["path"] is None:
        lines = ["  none: no usable folder, compiled code is not cached (it is compiled in every process)"]
    elif c["state"] == "read-only":
        lines = [f"  {c['path']} (read-only: compiled code is loaded from it, nothing is saved; from {c['source']})"]
    else:
        lines = [f"  {c['path']} (read-write, {'exists' if c['exists'] else 'created at the first compilation'}; "
                 f"from {c['source']})"]
    return lines + [f"  passed over: {p['path']} ({p['reason']})" for p in c["passed_over"]]


def _unavailable(components: List[dict]) -> List[str]:
    return [f"  {u['component']}: {u['reason']}" for u in components] or ["  none"]


def format_info(report: dict) -> str:
    """The text form of a :func:`~mmaemu.cli.diagnostics.build_info` report."""
    sections = (("Environment", _environment(report)),
                ("Defaults", _defaults(report.get("defaults", {}))),
                ("Device", _device(report["device"])),
                ("Profiles", _profiles(report["profiles"])),
                ("Presets", _presets(report["presets"])),
                ("Backends", _backends(report["backends"])),
                ("Split-K tables", _splitk_tables(report["splitk_tables"])),
                ("Numba cache", _numba_cache(report["numba_cache"])),
                ("Unavailable components", _unavailable(report["unavailable"])))
    lines = _header(report)
    for title, body in sections:
        lines += ["", f"{title}:"] + body
    return "\n".join(lines)


@click.command(short_help="Versions, device, profiles, presets, backends, split-K tables.")
@click.option("--device", type=click.IntRange(min=0), default=None, help="CUDA device ordinal to describe.")
@json_option("Also write the JSON report to PATH; '-' prints only the JSON report.")
def info(device, json_path):
    """Versions, device, profiles, presets, backends and split-K tables."""
    report = build_info(device)
    emit(report, json_path, format_info)
