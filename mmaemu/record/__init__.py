"""Record a GPU's split-K decisions into a profile any CPU can replay (``python -m mmaemu record``).

:func:`record` runs on a machine with a CUDA GPU, with the torch installed there:

0. **Arguments** (name, preset, budget, grid) are checked before anything runs (RecordUsageError, GridError);
   the recording then holds the lock of its bundle name (:mod:`.lock`): one recorder per bundle and folder.
1. **Descriptor probe** (:mod:`.probe`, :mod:`.trace`): a few ``torch._scaled_mm`` calls under cuBLASLt's trace
   log tell which (mat1, mat2, out) combinations torch accepts, the workspace its cuBLASLt calls really get, and
   whether the recorder's heuristic query (:mod:`mmaemu.platform.heuristic`, NVIDIA's bindings) is the one torch
   makes: same layouts, same descriptor attributes, same algorithm. Anything else refuses the recording.
2. **Sweep** (:mod:`.sweep`): every accepted combination, slow and fast, at torch's workspace, Transformer
   Engine's and 0, for every shape of the grid (:mod:`.grid`), in a seeded random order; answers are appended to
   ``<name>.partial/`` as they come, so an interrupted recording resumes where it stopped. A time budget ends the
   sweep early with a uniform sample of the grid.
3. **Replays** (:mod:`.replay`): the real GEMM against mmaemu's emulation of the recorded decision, bit for bit.
4. **Bundle** (:mod:`.assemble`, :mod:`mmaemu.platform.bundles`): table, envelope with its held-out check
   (:mod:`.envelope`), verified combinations, replay report and findings, manifest; written atomically.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Optional

import numpy as np

from .. import environment
from ..platform.bundles import write_bundle
from ..platform.heuristic import HeuristicSession, build_query
from .assemble import Recording, bundle_files
from .grid import default_grid, ordered, parse_sweep, read_shapes_file
from .lock import recording_lock
from .machine import Machine, RecordError, RecordUsageError, cuda_machine, default_preset, profile_name
from .progress import Progress, duration_text
from .sweep import Plan, open_partial, read_answers, run_sweep, settings_for, table_columns
from .trace import check_descriptor

__all__ = ["record", "RecordResult", "RecordError", "RecordUsageError", "Machine", "check_name", "table_id_of"]

DEFAULT_REPLAY_SECONDS = 120.0
DEFAULT_MAX_REPLAY_MACS = 2_000_000_000


@dataclasses.dataclass(frozen=True)
class RecordResult:
    """Where the bundle went and what it holds."""

    path: Path
    profiles: tuple
    rows: int
    split_rows: int
    shapes_recorded: int
    shapes_planned: int
    replays_passed: int
    replays_failed: int
    findings: int

    @property
    def complete(self) -> bool:
        return self.shapes_recorded == self.shapes_planned


def record(out_dir, *, name: Optional[str] = None, shapes=None, sweep: Optional[str] = None, device=None,
           budget_s: Optional[float] = None, replay: bool = True, replay_s: float = DEFAULT_REPLAY_SECONDS,
           max_replay_macs: int = DEFAULT_MAX_REPLAY_MACS, preset: Optional[str] = None,
           torch_workspace: Optional[int] = None, seed: int = 0, overwrite: bool = False, quiet: bool = False,
           machine: Optional[Machine] = None) -> RecordResult:
    """Record this machine's GPU into the bundle ``out_dir/<name>`` (see the module docstring).

    ``shapes``: a shapes file (``M N K`` lines) or an int array [n, 3]; ``sweep``: a sweep spec (see
    :func:`mmaemu.record.grid.parse_sweep`); default: the shipped tables' grid. ``budget_s``: seconds for the
    whole recording (the sweep stops ``replay_s`` before the end to leave time for the replays); ``preset``:
    default from the compute capability (sm_90 hopper, sm_89 ada); ``torch_workspace``: bytes, only to override a
    probe that could not tell (recorded as asserted). ``machine``: the GPU (default :func:`cuda_machine`).
    """
    started = time.monotonic()
    out_dir = Path(out_dir)
    grid = _checked_arguments(out_dir, name, shapes, sweep, budget_s, replay_s, max_replay_macs, preset)
    deadline = None if budget_s is None else started + budget_s
    machine = machine or cuda_machine(device)
    platform = machine.platform
    preset = preset or default_preset(platform["capability"])
    sm = "sm_" + "".join(map(str, platform["capability"]))
    if preset is None:
        raise RecordError(f"no preset is known to compute the tensor cores of {sm} ({platform['gpu']}): pass "
                          "--preset NAME")
    schemes = _preset_schemes(preset)
    if name is None:
        name = profile_name(platform["gpu"], platform["cublaslt"])
        check_name(name, out_dir, RecordError)
    with recording_lock(out_dir, name):
        return _record_locked(out_dir, name, machine, grid=grid, grid_source=_grid_source(shapes, sweep),
                              started=started, deadline=deadline, replay=replay, replay_s=replay_s,
                              max_replay_macs=max_replay_macs, preset=preset, schemes=schemes,
                              torch_workspace=torch_workspace, seed=seed, overwrite=overwrite, quiet=quiet)


def _record_locked(out_dir: Path, name: str, machine: Machine, *, grid, grid_source: str, started: float, deadline,
                   replay: bool, replay_s: float, max_replay_macs: int, preset: str, schemes: list, torch_workspace,
                   seed: int, overwrite: bool, quiet: bool) -> RecordResult:
    """The recording, under the lock of its bundle name (see :func:`record`)."""
    platform = machine.platform
    sm = "sm_" + "".join(map(str, platform["capability"]))
    table_id = table_id_of(name)
    bundle_path, partial = out_dir / name, out_dir / f"{name}.partial"
    if bundle_path.exists() and not overwrite and not partial.exists():
        raise RecordError(f"{bundle_path} exists: pass --overwrite to record it again")
    log = Progress(1, "", "", quiet=quiet)
    log.log(f"mmaemu record: {platform['gpu']} ({platform['sm_count']} SMs, {sm}), "
            f"cuBLASLt {platform['cublaslt']}, torch {platform['torch']}, preset {preset}")

    with HeuristicSession(machine.api, machine.scale_pointer) as session:
        descriptor, combos, torch_rejects, ws_torch = _probe(machine, session, torch_workspace, log,
                                                             out_dir / f"{name}.probe.log")
        te_ws, te_source = machine.te_workspace
        workspaces = sorted({0, ws_torch, te_ws})
        plan = Plan(platform=_plan_platform(platform), descriptor={"workspace": ws_torch, "preset": preset},
                    settings=settings_for(combos, workspaces), workspaces=workspaces,
                    shapes=ordered(grid, seed), seed=seed)
        done = open_partial(partial, plan)
        log.log(f"plan: {len(plan.shapes):,} shapes x {plan.per_shape} settings = "
                f"{len(plan.shapes) * plan.per_shape:,} queries (workspaces {workspaces}); {done:,} shapes on disk")
        sweep_deadline = None if deadline is None else deadline - (replay_s if replay else 0.0)
        bar = Progress(len(plan.shapes), "recording", "queries", quiet=quiet, start_done=done)
        done = run_sweep(session, partial, plan, done, sweep_deadline, bar)
        bar.close()

    cols, dropped = table_columns(plan, read_answers(partial, plan))
    log.log(f"sweep: {done:,} of {len(plan.shapes):,} shapes, {len(cols['M']):,} rows, "
            f"{int((cols['splitK'] > 1).sum()):,} split")
    results, summary, planned_replays = _replays(machine, preset, schemes, cols, workspaces, ws_torch, replay,
                                                 max_replay_macs, deadline, quiet, log)
    recording = {"shapes_planned": len(plan.shapes), "shapes_recorded": done,
                 "complete": done == len(plan.shapes), "grid": grid_source, "seed": seed,
                 "seconds_this_run": round(time.monotonic() - started, 1), "device": machine.device,
                 "torch_workspace_source": "asserted by the user" if torch_workspace is not None else "probe"}
    rec = Recording(name, table_id, preset, schemes, platform, workspaces, ws_torch, te_ws, te_source, descriptor,
                    torch_rejects, cols, dropped, results, summary, recording)
    manifest, files = bundle_files(rec)
    write_bundle(bundle_path, manifest, files, replace=True)
    finished = recording["complete"] and (results is None or len(results) == planned_replays)
    if finished:
        shutil.rmtree(partial, ignore_errors=True)
    log.log(f"bundle: {bundle_path} (profiles {', '.join(p['name'] for p in manifest['profiles'])}; maturity "
            f"{manifest['maturity']}) in {duration_text(time.monotonic() - started)}"
            + ("" if finished else f"; run the same command again to continue ({partial} is kept)"))
    return RecordResult(bundle_path, tuple(p["name"] for p in manifest["profiles"]), len(cols["M"]),
                        int((cols["splitK"] > 1).sum()), done, len(plan.shapes),
                        summary["passed"] if summary else 0, summary["failed"] if summary else 0,
                        sum(r.kept is not None for r in results or []))


def table_id_of(name: str) -> str:
    """The table id of bundle ``name``: "rec_<name>". The packaged tables are "heur_*" (the build script takes only
    those), so a recording of a reference GPU itself (an H100 PCIe with cuBLASLt 12.8.3.14) cannot take the id of
    a shipped table, and distinct bundle names give distinct ids."""
    return f"rec_{name}"


def check_name(name, out_dir: Path, error=None) -> None:
    """Refuse (``error``, default RecordUsageError) a bundle name that is not a lowercase slug leaving room for the
    "-te" and "-ws0" profiles, or whose profiles' names belong to a built-in profile or to a loaded bundle other
    than the one at ``out_dir/name``."""
    from ..platform import bundles
    from ..platform.bundle_schema import NAME_PATTERN
    from ..platform.definitions import builtin_profile_names

    error = error or RecordUsageError
    longest = f"{name}-ws0" if isinstance(name, str) else ""
    if not isinstance(name, str) or NAME_PATTERN.match(name) is None or NAME_PATTERN.match(longest) is None:
        raise error(f"bundle name {name!r} is not a lowercase slug (a-z, 0-9, '.', '_', '-', starting with a letter or "
                    f"digit, at most {80 - len('-ws0')} characters)")
    names = {name, f"{name}-te", f"{name}-ws0"}
    builtin = sorted(names & set(builtin_profile_names()))
    if builtin:
        raise error(f"bundle name {name!r} gives the profile {builtin[0]!r} of a built-in profile: choose another "
                    "--name")
    bundles.load_profile_path(environment.snapshot()[bundles.PATH_ENV] or "")  # the recorder is an entry point
    here = (Path(out_dir) / name).resolve()
    for bundle in bundles.loaded_bundles():
        clash = sorted(names & {p.name for p in bundle.profiles})
        if clash and bundle.path != here:
            raise error(f"bundle name {name!r} gives the profile {clash[0]!r} of the loaded bundle {bundle.path}: "
                        "choose another --name")


def _checked_arguments(out_dir: Path, name, shapes, sweep, budget_s, replay_s, max_replay_macs, preset):
    """The grid of the recording, after every argument was checked: RecordUsageError (or GridError) before anything
    runs."""
    for label, value, least in (("--budget", budget_s, 1e-9), ("--replay-seconds", replay_s, 0.0)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= least):
            raise RecordUsageError(f"{label} {value!r} is not a finite number of seconds"
                                   + (" above 0" if least else " (0 or more)"))
    if not isinstance(max_replay_macs, int) or max_replay_macs < 1:
        raise RecordUsageError(f"max_replay_macs {max_replay_macs!r} is not a positive integer")
    if preset is not None:
        from ..model.presets import get_preset

        try:
            get_preset(preset, warn=False)
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordUsageError(f"--preset {preset!r}: {exc.args[0] if exc.args else exc}") from None
    if name is not None:
        check_name(name, out_dir)
    return _grid(shapes, sweep)


def _preset_schemes(preset: str) -> list:
    from ..model.presets import get_preset, split_schemes

    return list(split_schemes(get_preset(preset, warn=False)))


def _plan_platform(platform: dict) -> dict:
    return {k: platform.get(k) for k in ("gpu", "sm_count", "capability", "cublaslt", "torch")}


def _grid(shapes, sweep):
    if shapes is not None and sweep is not None:
        raise RecordUsageError("give shapes or a sweep spec, not both")
    if sweep is not None:
        return parse_sweep(sweep)
    if shapes is None:
        return default_grid()
    if isinstance(shapes, (str, Path)):
        return read_shapes_file(shapes)
    from .grid import check_shapes

    return check_shapes([tuple(int(x) for x in s) for s in np.asarray(shapes).reshape(-1, 3)], "shapes")


def _grid_source(shapes, sweep) -> str:
    if sweep is not None:
        return f"sweep {sweep}"
    if isinstance(shapes, (str, Path)):
        return f"shapes file {Path(shapes).name}"
    return "shapes array" if shapes is not None else "the shipped tables' shapes (H100 PCIe and RTX 4060)"


def _probe(machine: Machine, session: HeuristicSession, asserted_workspace, log, log_path: Path):
    """(descriptor report, accepted (fa, fb, out), torch's refusals, torch's workspace). The probe's calls and
    cuBLASLt log are kept in ``log_path`` (evidence, and material to mend the parser if cuBLASLt's format moves)."""
    calls, traced, text = machine.probe()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("".join(f"# {c}\n" for c in calls) + text, encoding="utf-8")
    api = machine.api

    def enum_names(field, value):
        enum = {"tile": "MatmulTile", "stages": "MatmulStages", "reduction": "ReductionScheme"}[field]
        try:
            return getattr(api.lt, enum)(value).name
        except (AttributeError, ValueError):
            return None

    check = check_descriptor(calls, traced, lambda c, ws: build_query(c.M, c.N, c.K, c.fa, c.fb, c.out, c.fast, ws,
                                                                      None),
                             lambda q: session.ask(q)[1], enum_names)
    accepted = sorted({(c.fa, c.fb, c.out) for c in calls if c.error is None})
    rejects = {}
    for c in calls:
        if (c.fa, c.fb, c.out) not in accepted:
            rejects.setdefault((c.fa, c.fb, c.out), c.error)
    report = check.as_json()
    if check.problems:
        if asserted_workspace is None:
            raise RecordError("the descriptor probe does not confirm that the recorder asks cuBLASLt what torch "
                              "asks: " + "; ".join(check.problems[:12])
                              + f". The probe's calls and cuBLASLt log are in {log_path}. If the log format is the "
                                "only problem, pass --torch-workspace BYTES to assert torch's workspace (recorded as "
                                "asserted; the replays then test the recorded decisions).")
        log.log(f"descriptor probe: {len(check.problems)} problems; torch workspace asserted: {asserted_workspace}")
        report["asserted_workspace"] = asserted_workspace
    if not accepted:
        raise RecordError("torch refused every FP8 combination on this GPU: " + "; ".join(set(rejects.values())))
    workspace = asserted_workspace if asserted_workspace is not None else check.workspace_bytes
    log.log(f"descriptor probe: {check.calls} calls ({check.split_calls} split), torch workspace {workspace:,} "
            f"bytes, fast-accumulation attribute {check.fast_attribute!r}, algorithm fields compared "
            f"{check.compared_algo_fields}; torch refuses {len(rejects)} combinations")
    return report, accepted, rejects, workspace


def _replays(machine, preset, schemes, cols, workspaces, ws, replay, max_macs, deadline, quiet, log):
    """(results, summary, cases planned); (None, None, 0) when replays are off or the machine has no GEMM."""
    from .replay import mmaemu_emulation, replay_cases, run_replays, summarise

    if not replay or machine.gpu_gemm is None:
        return None, None, 0
    cases = replay_cases(cols, workspaces, ws, max_macs)
    bar = Progress(len(cases), "replaying", "replays", quiet=quiet)
    results = run_replays(cases, preset, lambda S: ["none"] if S == 1 else schemes, machine.gpu_gemm,
                          mmaemu_emulation(preset, machine.platform["capability"]), deadline, bar)
    bar.close()
    summary = summarise(results, schemes)
    log.log(f"replays: {len(results)} of {len(cases)} run, {summary['passed']} passed, {summary['failed']} failed; "
            f"customOption -> scheme {summary['custom_to_scheme']}")
    return results, summary, len(cases)
