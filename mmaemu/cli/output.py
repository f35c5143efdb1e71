"""What the commands share: their exit codes and how they write a report (text lines, JSON to a file or stdout)."""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

import click

from ..diagnostics import jsonable

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 4
KEY_WIDTH = 16
CPU_USED = "the CPU backend is used"


def write_json(report: dict, target: Optional[str]) -> None:
    """Write ``report`` to PATH, or to stdout for "-"."""
    text = json.dumps(jsonable(report), indent=2, sort_keys=False) + "\n"
    if target == "-":
        click.echo(text, nl=False)
    else:
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)


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
