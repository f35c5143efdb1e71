"""``mmaemu explain``: what scaled_mm would do with an [M, K] x [K, N] call, the plan of :func:`mmaemu.explain` for
operands of that shape (descriptors on the CPU, so that no torch is imported; zero tensors on a CUDA device) (exit 0
valid, 1 the call would raise, 4 the device is unusable or explain cannot run)."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import click

from . import diagnostics
from .diagnostics import error_text, jsonable
from .operands import CPU, FP8_DTYPES, OUT_DTYPES, explain_call
from .output import EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, emit, json_option, line

EXPLAIN_FORMAT = "mmaemu-explain/1"


def _parse_splitk(ctx, param, value: str):
    """auto | assume-unsplit | an integer (1; others are reported by explain) | S,scheme."""
    text = value.strip()
    if text in ("auto", "assume-unsplit"):
        return text
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) == 1:
            return int(parts[0])
        if len(parts) == 2 and parts[1]:
            return (int(parts[0]), parts[1])
    except ValueError:
        pass
    raise click.BadParameter(f"expected 'auto', 'assume-unsplit', 1 or 'S,scheme' (e.g. 2,contiguous), "
                             f"got {value!r}")


def _parse_device(ctx, param, value: str):
    text = value.strip()
    if text in ("auto", "cpu", "cuda"):
        return text
    kind, _, index = text.partition(":")
    if kind == "cuda" and index.isdigit():
        return text
    raise click.BadParameter(f"expected auto, cpu, cuda or cuda:N, got {value!r}")


def _resolve_device(spec: str):
    """(device, None) or (None, why unusable); "auto" is the current CUDA device, else the CPU.

    The CPU is :data:`~.operands.CPU`, a device descriptor: a CPU call is planned on operand descriptors, without
    importing torch (seconds of start-up). torch is imported only to ask for a CUDA device, and for "auto" only
    where a CUDA driver is installed."""
    if spec == "cpu" or (spec == "auto" and diagnostics.cuda_driver_absent()):
        return CPU, None
    ordinal = int(spec.partition(":")[2]) if ":" in spec else None
    why = diagnostics.cuda_unusable(ordinal)
    if why is not None:
        if spec == "auto":
            return CPU, None
        return None, why
    import torch

    return torch.device("cuda", torch.cuda.current_device() if ordinal is None else ordinal), None


def _plan_lines(plan) -> List[str]:
    lines = []
    for field in dataclasses.fields(plan):
        value = getattr(plan, field.name)
        if field.name in ("kernel", "cpu_engine") and value is None:
            continue  # only a call outside cuBLASLt (a row-wise call) names its kernel; only the cpu backend an engine
        if field.name == "validation" and value != "ok":
            value = f"{value[0]}: {value[1]}"
        elif field.name == "split" and value is not None:
            value = dataclasses.asdict(value)
        lines.append(line(field.name, value))
    return lines


def _plan_data(plan) -> Optional[dict]:
    if plan is None:
        return None
    data = jsonable(plan)
    if plan.validation != "ok":
        data["validation"] = {"error": plan.validation[0], "message": plan.validation[1]}
    return data


def _explain(args: tuple, device, device_spec: str, why: Optional[str]):
    """(exit code, plan or None, error or None) of explain_call(*args, device); ``device`` None: the one the user
    asked for (``device_spec``) is unusable for ``why``."""
    if device is None:
        return EXIT_UNAVAILABLE, None, f"device {device_spec} is unusable: {why}"
    try:
        plan = explain_call(*args, device)
    except Exception as exc:  # explain itself never raises for a bad call: this is an unusable setup
        return EXIT_UNAVAILABLE, None, f"explain unavailable: {error_text(exc)}"
    return (EXIT_OK if plan.validation == "ok" else EXIT_FAIL), plan, None


@click.command(short_help="What scaled_mm would do for an M x N x K call.")
@click.argument("M", type=click.IntRange(min=0))
@click.argument("N", type=click.IntRange(min=0))
@click.argument("K", type=click.IntRange(min=0))
@click.option("--a", "fmt_a", type=click.Choice(sorted(FP8_DTYPES)), default="e4m3", show_default=True,
              help="Format of input (mat1).")
@click.option("--b", "fmt_b", type=click.Choice(sorted(FP8_DTYPES)), default="e4m3", show_default=True,
              help="Format of mat2.")
@click.option("--out", type=click.Choice(list(OUT_DTYPES)), default=None, help="out_dtype (default: input's dtype).")
@click.option("--fast", is_flag=True, help="use_fast_accum=True.")
@click.option("--scale-a", type=float, default=1.0, show_default=True)
@click.option("--scale-b", type=float, default=1.0, show_default=True)
@click.option("--scale-result", type=float, default=None)
@click.option("--profile", default=None, help="Profile name (default: $MMAEMU_PROFILE or hopper).")
@click.option("--splitk", default="auto", callback=_parse_splitk, metavar="auto|assume-unsplit|1|S,scheme",
              show_default=True, help="Split-K: 'assume-unsplit' takes S = 1 (with a warning) where the evidence "
              "does not decide.")
@click.option("--backend", default="auto", show_default=True)
@click.option("--device", "device_spec", default="auto", callback=_parse_device, metavar="auto|cpu|cuda|cuda:N",
              show_default=True)
@json_option("Also write the plan as JSON to PATH; '-' prints only the JSON.")
@click.pass_context
def explain(ctx, m, n, k, fmt_a, fmt_b, out, fast, scale_a, scale_b, scale_result, profile, splitk, backend,
            device_spec, json_path):
    """What scaled_mm would do with an [M, K] x [K, N] call (exit 0 valid, 1 would raise, 4 device unusable)."""
    device, why = _resolve_device(device_spec)
    out_dtype = OUT_DTYPES[out] if out else None
    header = (f"explain M={m} N={n} K={k} {fmt_a} x {fmt_b} -> {out_dtype or 'default (input dtype)'}, "
              f"use_fast_accum={fast}, device={device if device is not None else device_spec}")
    call = {"M": m, "N": n, "K": k, "a": fmt_a, "b": fmt_b, "out_dtype": out_dtype, "use_fast_accum": fast,
            "scale_a": scale_a, "scale_b": scale_b, "scale_result": scale_result, "profile": profile,
            "splitk": splitk, "backend": backend, "device": str(device or device_spec)}
    args = (m, n, k, fmt_a, fmt_b, out, fast, scale_a, scale_b, scale_result, profile, splitk, backend)
    code, plan, error = _explain(args, device, device_spec, why)
    report = {"format": EXPLAIN_FORMAT, "call": call, "plan": _plan_data(plan), "error": error, "exit_code": code}
    lines = [header] + (_plan_lines(plan) if plan is not None else [f"error: {error}"])
    emit(report, json_path, lambda _: "\n".join(lines))
    ctx.exit(code)
