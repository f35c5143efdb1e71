"""The heuristic sweep: every setting of every shape of the plan, asked in the plan's order, kept on disk as it goes.

A recording in progress lives in ``<name>.partial/`` next to the bundle it will become:

* ``plan.json`` (format ``mmaemu-record-plan/1``) and ``shapes.npy``: the platform, the settings, the workspaces
  and the ordered shapes; written once, atomically (temporary file + rename). A resumed recording must find the
  same plan (same GPU, cuBLASLt, torch, descriptor, settings and shapes), else it is refused;
* ``answers.bin``: the answers, appended shape by shape (every setting of a shape in one write, flushed and
  synced at least every few seconds). Row r answers setting ``r % per_shape`` of shape ``r // per_shape``, so
  the file holds only the answer fields (:data:`ANSWER`, 13 bytes a row). On resume a trailing incomplete shape
  is cut off and asked again: no complete shape is lost or asked twice.

Rows are answers of :class:`mmaemu.platform.heuristic.HeuristicSession`, with the recorder's descriptor (torch's,
checked by the probe) at each workspace.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import time
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from ..platform.heuristic import HeuristicSession, build_query
from ..platform.profiles import FORMATS, OUT_DTYPES
from .machine import RecordError

__all__ = ["ANSWER", "PLAN_FORMAT", "Setting", "Plan", "PlanMismatchError", "settings_for", "open_partial", "run_sweep",
           "read_answers", "table_columns"]

PLAN_FORMAT = "mmaemu-record-plan/1"
ANSWER = np.dtype([("status", "<i2"), ("returned", "u1"), ("splitK", "u1"), ("custom", "u1"), ("algo", "<i2"),
                   ("tile", "<i2"), ("stages", "<i2"), ("reduction", "u1"), ("swizzle", "u1")])
_ANSWER_FIELDS = ANSWER.names[2:]  # the HeuristicAnswer fields a row keeps, after status and returned
_SYNC_SECONDS = 5.0


class PlanMismatchError(RecordError):
    """A partial recording made with another plan, or with a plan that cannot be read, is in the way."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One query per shape: formats of mat1/mat2, output dtype, use_fast_accum, workspace (bytes)."""

    fa: str
    fb: str
    out: str
    fast: bool
    ws: int


@dataclasses.dataclass
class Plan:
    """What a recording asks: platform and descriptor (for refusing a mismatched resume), settings, shapes."""

    platform: dict
    descriptor: dict
    settings: List[Setting]
    workspaces: List[int]
    shapes: np.ndarray  # int64 [n, 3], in query order
    seed: int

    @property
    def per_shape(self) -> int:
        return len(self.settings)

    def identity(self) -> dict:
        from .grid import grid_sha256

        return {"format": PLAN_FORMAT, "platform": self.platform, "descriptor": self.descriptor,
                "settings": [dataclasses.asdict(s) for s in self.settings], "workspaces": self.workspaces,
                "shapes": len(self.shapes), "shapes_sha256": grid_sha256(self.shapes), "seed": self.seed}


def settings_for(combos: List[Tuple[str, str, str]], workspaces: List[int]) -> List[Setting]:
    """Every accepted (fa, fb, out), slow and fast, at every workspace: the queries of one shape."""
    return [Setting(fa, fb, out, fast, ws) for fa, fb, out in combos for fast in (False, True) for ws in workspaces]


def _atomic_write(path: Path, blob: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_plan(plan_path: Path, folder: Path) -> dict:
    """The plan a partial recording was made with; a plan.json that is not a JSON object (torn by a crash or a
    full disk, edited by hand) is a :class:`PlanMismatchError` with the ways out: which plan the answers beside it
    follow cannot be told, so they are neither reused nor silently thrown away."""
    try:
        found = json.loads(plan_path.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        found = exc
    if isinstance(found, dict):
        return found
    why = f"not JSON ({type(found).__name__}: {found})" if isinstance(found, Exception) else \
        f"a JSON {type(found).__name__}, not the {PLAN_FORMAT} object"
    raise PlanMismatchError(f"{plan_path} is unreadable ({why}), so the partial recording in {folder} cannot be "
                            "resumed: remove that folder to start again (its answers are lost), or record into "
                            "another folder (--out or --name)")


def open_partial(folder: Path, plan: Plan) -> int:
    """Create or resume ``folder``; return how many shapes are already answered (the file is cut to them)."""
    folder.mkdir(parents=True, exist_ok=True)
    plan_path, shapes_path, answers = folder / "plan.json", folder / "shapes.npy", folder / "answers.bin"
    identity = json.loads(json.dumps(plan.identity()))
    if plan_path.exists():
        found = _read_plan(plan_path, folder)
        differs = sorted(k for k in set(found) | set(identity) if found.get(k) != identity.get(k))
        if differs:
            raise PlanMismatchError(f"{folder} holds a partial recording of another plan (differs in "
                                    f"{', '.join(differs)}): remove it, or record into another folder")
    else:
        answers.unlink(missing_ok=True)
        shapes = io.BytesIO()
        np.save(shapes, plan.shapes.astype(np.int64), allow_pickle=False)
        _atomic_write(shapes_path, shapes.getvalue())
        _atomic_write(plan_path, (json.dumps(identity, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    shape_bytes = ANSWER.itemsize * plan.per_shape
    size = answers.stat().st_size if answers.exists() else 0
    done = min(size // shape_bytes, len(plan.shapes))
    if size != done * shape_bytes:
        with open(answers, "r+b") as fh:
            fh.truncate(done * shape_bytes)
    return done


def read_answers(folder: Path, plan: Plan) -> np.ndarray:
    """The complete shapes' answers (ANSWER rows, shape-major)."""
    path = folder / "answers.bin"
    if not path.exists():
        return np.zeros(0, ANSWER)
    raw = np.fromfile(path, dtype=np.uint8)
    whole = (len(raw) // (ANSWER.itemsize * plan.per_shape)) * ANSWER.itemsize * plan.per_shape
    return raw[:whole].view(ANSWER)


def run_sweep(session: HeuristicSession, folder: Path, plan: Plan, start: int, deadline: Optional[float],
              progress=None) -> int:
    """Ask every setting of shapes[start:] until done or ``deadline`` (time.monotonic()); returns the number of
    complete shapes now on disk."""
    block = np.zeros(plan.per_shape, ANSWER)
    queries, done, last_sync = 0, start, time.monotonic()
    with open(folder / "answers.bin", "ab") as fh:
        try:
            for M, N, K in plan.shapes[start:]:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                _ask_shape(session, int(M), int(N), int(K), plan.settings, block)
                fh.write(block.tobytes())
                queries += plan.per_shape
                done += 1
                if time.monotonic() - last_sync >= _SYNC_SECONDS:
                    fh.flush()
                    os.fsync(fh.fileno())
                    last_sync = time.monotonic()
                if progress is not None:
                    progress.update(done, queries)
        finally:
            fh.flush()
            os.fsync(fh.fileno())
    if progress is not None:
        progress.update(done, queries, force=True)
    return done


def _ask_shape(session: HeuristicSession, M: int, N: int, K: int, settings: List[Setting], block) -> None:
    block[:] = 0
    for i, s in enumerate(settings):
        status, answer = session.ask(build_query(M, N, K, s.fa, s.fb, s.out, s.fast, s.ws, None))
        row = block[i]
        row["status"] = status
        if answer is not None:
            row["returned"] = 1
            for field in _ANSWER_FIELDS:
                row[field] = getattr(answer, field)
    session.forget_layouts()


def table_columns(plan: Plan, answers: np.ndarray) -> Tuple[dict, dict]:
    """(columns of the table format for the answered rows, counts of dropped rows).

    Rows whose status is nonzero (the heuristic refused the problem) or that returned no algorithm are not
    table rows; they are counted per (fa, fb, out) with their statuses."""
    shapes = plan.shapes[: len(answers) // max(plan.per_shape, 1)]
    n = len(shapes)
    code = {"fa": {f: i for i, f in enumerate(FORMATS)}, "out": {o: i for i, o in enumerate(OUT_DTYPES)}}
    ws_index = {w: i for i, w in enumerate(plan.workspaces)}
    per = {"fa": [code["fa"][s.fa] for s in plan.settings], "fb": [code["fa"][s.fb] for s in plan.settings],
           "out": [code["out"][s.out] for s in plan.settings], "fast": [int(s.fast) for s in plan.settings],
           "ws": [ws_index[s.ws] for s in plan.settings]}
    cols = {"M": np.repeat(shapes[:, 0], plan.per_shape), "N": np.repeat(shapes[:, 1], plan.per_shape),
            "K": np.repeat(shapes[:, 2], plan.per_shape)}
    cols.update({k: np.tile(np.asarray(v), n) for k, v in per.items()})
    for field in _ANSWER_FIELDS:
        cols[field] = answers[field]
    keep = (answers["status"] == 0) & (answers["returned"] == 1)
    dropped = {}
    for i, s in enumerate(plan.settings):
        rows = answers[i::plan.per_shape]
        bad = (rows["status"] != 0) | (rows["returned"] == 0)
        if bad.any():
            key = (s.fa, s.fb, s.out)
            entry = dropped.setdefault(key, {"rows": 0, "status": set()})
            entry["rows"] += int(bad.sum())
            entry["status"].update(int(x) for x in rows["status"][bad])
    return {k: v[keep] for k, v in cols.items()}, dropped
