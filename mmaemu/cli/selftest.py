"""``mmaemu selftest``: run the CUDA kernels' gates on a device (``mmaemu.backends.selftest``) and print each
kernel's status and a verdict: exit 0 PASS, 1 FAIL (a required kernel failed), 4 UNAVAILABLE."""

from __future__ import annotations

from typing import List

import click

from ..base import device_facts
from . import diagnostics
from .diagnostics import error_text, jsonable
from .kernel_requirements import kernel_requirement
from .output import CPU_USED, EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, json_option, write_json

SELFTEST_FORMAT = "mmaemu-selftest/1"
_GATE_FIELDS = ("name", "passed", "reason", "details", "seconds", "cached", "ran")


class _Verdict(Exception):
    """The self-test ended: (verdict, reason, exit code)."""

    def __init__(self, verdict: str, reason: str, code: int):
        super().__init__(verdict, reason, code)
        self.verdict, self.reason, self.code = verdict, reason, code


def _unavailable(why: str) -> _Verdict:
    return _Verdict("UNAVAILABLE", f"{why}: {CPU_USED}", EXIT_UNAVAILABLE)


def _strip_not_run(reason: str) -> str:
    return reason[len("not run: "):] if reason.startswith("not run: ") else reason


def _gate_fields(gate) -> dict:
    """A GateResult(name, passed, reason, details, seconds, cached) as a dict (dataclass, named tuple, dict or
    any object with those attributes)."""
    data = jsonable(gate)
    if isinstance(data, dict):
        return data
    return {f: jsonable(getattr(gate, f, None)) for f in _GATE_FIELDS}


def _parse_kernels(kernels: str):
    """"all" or the list of names, each one a known kernel (checked before any device is looked at, so an unknown
    name is a usage error on every machine)."""
    from ..backends import kernel_names

    names = [k.strip() for k in kernels.split(",")]
    if not names or any(not k for k in names):
        raise click.BadParameter(f"expected 'all' or a comma list of kernel names, got {kernels!r}",
                                 param_hint="--kernels")
    if names == ["all"]:
        return "all"
    try:
        kernel_names(names)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--kernels") from None
    return names


def _run_gates(device, selected, force) -> dict:
    """mmaemu.backends.selftest(device, ...): kernel name -> its gate results."""
    from .. import backends
    from ..errors import BackendUnavailableError

    run = getattr(backends, "selftest", None)
    if run is None:
        raise _unavailable("this mmaemu has no CUDA self-test (mmaemu.backends.selftest is missing)")
    try:
        return run(device, kernels=selected, force=force)
    except BackendUnavailableError as exc:
        raise _unavailable(str(exc)) from None
    except (ValueError, KeyError) as exc:
        raise click.BadParameter(error_text(exc), param_hint="--kernels")
    except Exception as exc:
        raise _Verdict("FAIL", f"the self-test raised {error_text(exc)}", EXIT_FAIL) from None


def _kernel_entry(name: str, gates, device_index: int) -> dict:
    """A kernel's status (PASS, FAIL, REJECTED for an optional kernel, NOT RUN), requirement and gates."""
    gates = list(gates) if isinstance(gates, (list, tuple)) else [gates]
    fields = [_gate_fields(g) for g in gates]
    ran = [g for g in fields if g.get("ran", True) is not False]
    required, why = kernel_requirement(name, device_index)
    if not ran:
        status = "NOT RUN"
    elif all(g.get("passed") for g in ran):
        status = "PASS"
    else:
        status = "FAIL" if required else "REJECTED"
    return {"name": name, "status": status, "required": required, "why": why, "gates": fields}


def _gate_line(g: dict) -> str:
    seconds = g.get("seconds")
    state = "not run" if g.get("ran", True) is False else ("passed" if g.get("passed") else "FAILED")
    reason = _strip_not_run(g.get("reason") or "")
    extra = [f"{seconds:.2f} s" if isinstance(seconds, (int, float)) and state != "not run" else None,
             "cached" if g.get("cached") else None, reason or None]
    return f"  {g.get('name')}: {state}" + "".join(f"; {e}" for e in extra if e)


def _kernel_lines(entry: dict) -> List[str]:
    return [f"{entry['name']}: {entry['status']} ({entry['why']})"] + [_gate_line(g) for g in entry["gates"]]


def _not_run_reason(entry: dict) -> str:
    return next((g.get("reason") for g in entry["gates"] if g.get("reason")), "not run")


def _verdict(kernels: List[dict], device_name: str) -> _Verdict:
    """UNAVAILABLE if no kernel ran, FAIL if a required kernel failed, else PASS."""
    not_run = [k for k in kernels if k["status"] == "NOT RUN"]
    failed_required = [k["name"] for k in kernels if k["status"] == "FAIL"]
    if len(not_run) == len(kernels):
        why = _strip_not_run(_not_run_reason(not_run[0])) if not_run else f"no CUDA kernel to test on {device_name}"
        return _unavailable(why)
    if failed_required:
        return _Verdict("FAIL", f"required kernel(s) failed on {device_name}: {', '.join(failed_required)}",
                       EXIT_FAIL)
    skipped = f" (not run: {', '.join(k['name'] for k in not_run)})" if not_run else ""
    return _Verdict("PASS", f"every required kernel passed on {device_name}{skipped}", EXIT_OK)


def _selftest(report: dict, device, force: bool, echo) -> _Verdict:
    """Run the gates, fill ``report`` and echo each kernel; the verdict is returned or, if the gates could not
    run, raised."""
    unusable = diagnostics.cuda_unusable(device)
    if unusable is not None:
        return _unavailable(unusable)
    import torch

    index = torch.cuda.current_device() if device is None else device
    report["device"] = {"index": index, "name": device_facts.read(index).name}
    results = _run_gates(torch.device("cuda", index), report["kernels_requested"], force)
    for name, gates in results.items():
        entry = _kernel_entry(str(name), gates, index)
        report["kernels"].append(entry)
        echo("\n".join(_kernel_lines(entry)))
    return _verdict(report["kernels"], report["device"]["name"])


@click.command(short_help="Run the CUDA kernels' gates; verdict PASS/FAIL/UNAVAILABLE.")
@click.option("--device", type=click.IntRange(min=0), default=None, help="CUDA device ordinal (default: current).")
@click.option("--kernels", default="all", metavar="all|a,b", help="Kernels to test (default all).")
@click.option("--force", is_flag=True, help="Ignore cached verdicts and rerun every gate.")
@json_option("Also write the results as JSON to PATH; '-' prints only the JSON.")
@click.pass_context
def selftest(ctx, device, kernels, force, json_path):
    """Run the CUDA kernels' gates on a device and print a verdict (exit 0 PASS, 1 FAIL, 4 UNAVAILABLE)."""
    report = {"format": SELFTEST_FORMAT, "device": None, "kernels_requested": _parse_kernels(kernels),
              "force": force, "kernels": [], "verdict": None, "reason": None}
    echo = (lambda text: None) if json_path == "-" else click.echo  # "-": only the JSON report
    try:
        end = _selftest(report, device, force, echo)
    except _Verdict as raised:
        end = raised
    report["verdict"], report["reason"] = end.verdict, end.reason
    echo(f"verdict: {end.verdict} - {end.reason}")
    if json_path is not None:
        write_json(report, json_path)
    ctx.exit(end.code)
