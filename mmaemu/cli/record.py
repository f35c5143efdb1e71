"""``mmaemu record``: record this machine's GPU into a profile bundle (:func:`mmaemu.record.record`).

Exit 0 when the bundle was written (complete or, with a budget, partial: run the command again to continue),
2 for a usage error (a name, preset, budget, shapes file or sweep spec that cannot describe a recording), found
before anything runs, 4 when no CUDA GPU or NVIDIA's bindings are available, 1 when the recording was refused (the
message, one line, says why).
"""

from __future__ import annotations

from pathlib import Path

import click

from .output import EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, usage_exit


@click.command(short_help="Record this GPU's split-K decisions into a profile bundle.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Folder that receives the bundle <name>/ (and <name>.partial/ meanwhile).")
@click.option("--name", default=None, help="Bundle and profile name (default: <gpu>-lt<cuBLASLt version>).")
@click.option("--shapes", "shapes_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Shapes file: one 'M N K' per line (default: the shipped tables' grid).")
@click.option("--sweep", default=None, metavar="SPEC",
              help="Shapes as a sweep, e.g. 'M=1-4096*2;N=64-8192*2;K=1024-16384:1024'.")
@click.option("--budget", "budget_s", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Stop after this many seconds (the sweep leaves --replay-seconds for the replays).")
@click.option("--replay-seconds", "replay_s", type=click.FloatRange(min=0), default=120.0, show_default=True,
              metavar="SECONDS",
              help="Seconds kept for the replays when a budget is given.")
@click.option("--no-replay", is_flag=True, help="Skip the replays (the profile is then 'experimental').")
@click.option("--preset", default=None, help="Preset of the GPU's tensor cores (default by compute capability).")
@click.option("--torch-workspace", type=click.IntRange(min=0), default=None, metavar="BYTES",
              help="Assert torch's cuBLASLt workspace when the descriptor probe cannot read it.")
@click.option("--device", type=click.IntRange(min=0), default=None, help="CUDA device ordinal.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shape order.")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle of the same name.")
@click.option("--quiet", is_flag=True, help="No progress bar or log lines (errors only).")
def record(out_dir, name, shapes_file, sweep, budget_s, replay_s, no_replay, preset, torch_workspace, device, seed,
           overwrite, quiet):
    """Record the split-K decisions of this machine's GPU and torch into a profile bundle.

    Load the bundle anywhere with mmaemu.load_profile(PATH) or MMAEMU_PROFILE_PATH=PATH.
    """
    from ..errors import BackendUnavailableError, MmaemuError
    from ..record import RecordError, RecordUsageError
    from ..record import record as run
    from ..record.grid import GridError

    try:
        result = run(out_dir, name=name, shapes=shapes_file, sweep=sweep, device=device, budget_s=budget_s,
                     replay=not no_replay, replay_s=replay_s, preset=preset, torch_workspace=torch_workspace,
                     seed=seed, overwrite=overwrite, quiet=quiet)
    except (RecordUsageError, GridError) as exc:
        usage_exit(f"mmaemu record: {_one_line(exc)}")
    except (BackendUnavailableError, RecordError, MmaemuError, OSError) as exc:
        click.echo(f"mmaemu record: {_one_line(exc)}", err=True)
        raise SystemExit(EXIT_UNAVAILABLE if isinstance(exc, BackendUnavailableError) else EXIT_FAIL) from None
    click.echo(f"{result.path}: profiles {', '.join(result.profiles)}; {result.rows:,} rows ({result.split_rows:,} "
               f"split) from {result.shapes_recorded:,} of {result.shapes_planned:,} shapes; replays "
               f"{result.replays_passed} passed, {result.replays_failed} failed, {result.findings} findings")
    raise SystemExit(EXIT_OK)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
