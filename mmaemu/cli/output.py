"""What the commands share: their exit codes and how they write a report (text lines, JSON to a file or stdout)."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional

import click

from .diagnostics import jsonable

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 4
KEY_WIDTH = 16
CPU_USED = "the CPU backend is used"


def usage_exit(message: str) -> None:
    """End the command as a usage error: one line on stderr, exit 2."""
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(EXIT_USAGE)


def _unwritable(path: str) -> Optional[str]:
    """Why a JSON report cannot be written to ``path``, or None."""
    if os.path.isdir(path):
        return "is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        return "permission denied"
    return None


def _json_target(ctx, param, value: Optional[str]) -> Optional[str]:
    """--json PATH is checked before the command runs: an unwritable PATH is a usage error (exit 2, one line)."""
    if value not in (None, "-"):
        problem = _unwritable(value)
        if problem is not None:
            usage_exit(f"--json {value}: cannot write the report there ({problem})")
    return value


def json_option(help_text: str):
    """The --json PATH|- option of every command (checked by :func:`_json_target`)."""
    return click.option("--json", "json_path", metavar="PATH|-", default=None, callback=_json_target,
                        help=help_text)


def _finite_or_text(value: Any) -> Any:
    """``value`` (plain JSON data) with every NaN / +inf / -inf float replaced by "nan" / "inf" / "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite_or_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_text(v) for v in value]
    return value


def json_text(report: Any) -> str:
    """The report as strict JSON text: JSON (RFC 8259) has no NaN or infinity, so a float that is not finite is
    written as the string "nan", "inf" or "-inf" (docs/api.md), and ``allow_nan=False`` guards the rest."""
    return json.dumps(_finite_or_text(jsonable(report)), indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_json(report: dict, target: Optional[str]) -> None:
    """Write ``report`` to PATH, or to stdout for "-" (a PATH that fails now is still a one-line usage error)."""
    text = json_text(report)
    if target == "-":
        click.echo(text, nl=False)
        return
    try:
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        usage_exit(f"--json {target}: cannot write the report there ({exc.strerror or exc})")


def emit(report: Any, json_path: Optional[str], format_text: Callable[[Any], str]) -> None:
    """Print ``format_text(report)`` unless ``json_path`` is "-" (only the JSON then), and write the report as
    JSON when a path is given."""
    if json_path != "-":
        click.echo(format_text(report))
    if json_path is not None:
        write_json(report, json_path)


def line(key: str, value: Any) -> str:
    """``key`` padded to KEY_WIDTH, then ``value``."""
    return f"{key:<{KEY_WIDTH}}{value}"
