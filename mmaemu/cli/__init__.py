"""The command line: ``python -m mmaemu {info, selftest, explain, demo, record}`` (platform.md section 7).

The commands collect what the library reports and format it; they decide nothing themselves. One module per
command (:mod:`.info`, :mod:`.selftest`, :mod:`.explain`, :mod:`.demo`, :mod:`.record`); :mod:`.output` holds
what they share.
Exit codes: 0 = success (a valid call / PASS / report built), 1 = the call would raise / FAIL, 2 = usage error
(click), 4 = unavailable (no usable CUDA device, explain could not run).

Heavy imports (torch, numba, the arithmetic) happen inside the commands, so ``mmaemu --help`` is quick.
"""

from __future__ import annotations

import logging

import click

from .._version import __version__
from . import demo, explain, info, record, selftest

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mmaemu", message="%(prog)s %(version)s")
def cli():
    """mmaemu: NVIDIA FP8 tensor-core GEMMs (torch._scaled_mm of torch 2.7.1), bit for bit, on any CPU or
    CUDA GPU."""
    show_library_notes()


class _EchoHandler(logging.Handler):
    """The library's INFO records (e.g. the one-line note before a first compilation) as lines on stderr."""

    def emit(self, record):
        click.echo(record.getMessage(), err=True)


def show_library_notes():
    """Show what the library logs to ``"mmaemu"`` at INFO and above on stderr (once per process)."""
    logger = logging.getLogger("mmaemu")
    if not any(isinstance(h, _EchoHandler) for h in logger.handlers):
        logger.addHandler(_EchoHandler(logging.INFO))
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


for _command in (info.info, selftest.selftest, explain.explain, demo.demo, record.record):
    cli.add_command(_command)


def main(argv=None):
    """Console entry point (``mmaemu``, ``python -m mmaemu``)."""
    return cli.main(args=argv, prog_name="mmaemu")
