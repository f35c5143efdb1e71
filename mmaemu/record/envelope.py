"""Per-setting summaries and the envelope of a recorded table (platform.md 3.9, kind "k_grid"), with its held-out
check.

The envelope lets a profile infer S = 1 for a shape that was not recorded: for a setting (workspace, out,
fast, fmt_a, fmt_b) and a K, S = 1 when M * N > B(setting, K), B taken at the smallest recorded K >= K. Here

    B(setting, K_i) = MARGIN * (the largest M * N of a split row of the setting with K <= K_i)

(0 when rows with K <= K_i exist and none split; null, i.e. no inference, when there are no such rows). Taking the
maximum over every K <= K_i makes B non-decreasing in K, so looking it up at the next recorded K is safe as long
as the largest split M * N does not shrink as K grows (an assumption, stated in the json; the H100 envelope
makes the same). No bound exists outside [smallest, largest] recorded K, nor for workspace 0.

Held-out check: the bounds are first fitted without one shape in five (chosen by a hash of (M, N, K), so the same
shapes are held out in every setting), then every held-out row above its bound is tested; a workspace whose
held-out rows above the bound never split is "validated". The shipped bounds are fitted on every row; they are
never below the held-out fit's, so every held-out row above a shipped bound was also above its fitted bound.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ..platform.profiles import FORMATS, OUT_DTYPES

__all__ = ["MARGIN", "settings_summary", "fit_envelope", "held_out"]

MARGIN = 2
_FAILURES_KEPT = 3


def _setting_masks(cols: dict, workspaces: List[int]):
    """(ws, out, fast, fmt_a, fmt_b) -> boolean row mask, for every setting with rows."""
    code = cols["ws"] * 1000 + cols["out"] * 100 + cols["fast"] * 10 + cols["fa"] * 2 + cols["fb"]
    for value in np.unique(code):
        ws, out, fast, fab = value // 1000, value // 100 % 10, value // 10 % 10, value % 10
        yield (workspaces[ws], OUT_DTYPES[out], bool(fast), FORMATS[fab // 2], FORMATS[fab % 2]), code == value


def _int64(cols: dict) -> dict:
    return {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}


def settings_summary(cols: dict, workspaces: List[int]) -> List[dict]:
    """The json ``settings`` entries: rows, split_rows, S_values, max_split_MN, min_split_K per setting."""
    cols, out = _int64(cols), []
    MN = cols["M"].astype(np.int64) * cols["N"]
    for (ws, o, fast, fa, fb), mask in _setting_masks(cols, workspaces):
        split = mask & (cols["splitK"] > 1)
        out.append({"ws": int(ws), "out": o, "fast": fast, "fmt_a": fa, "fmt_b": fb, "rows": int(mask.sum()),
                    "split_rows": int(split.sum()),
                    "S_values": sorted(int(s) for s in np.unique(cols["splitK"][split])),
                    "max_split_MN": int(MN[split].max()) if split.any() else None,
                    "min_split_K": int(cols["K"][split].min()) if split.any() else None})
    return out


def held_out(cols: dict) -> np.ndarray:
    """One shape in five, by a hash of (M, N, K) (the same shapes in every setting)."""
    M, N, K = (np.asarray(cols[k]).astype(np.uint64) for k in "MNK")
    mixed = (M * np.uint64(0x9E3779B1)) ^ (N * np.uint64(0x85EBCA77)) ^ (K * np.uint64(0xC2B2AE3D))
    return (mixed >> np.uint64(7)) % np.uint64(5) == 0


def _bounds(cols: dict, mask: np.ndarray, grid: np.ndarray) -> List[Optional[int]]:
    K, split = cols["K"][mask], cols["splitK"][mask] > 1
    MN = cols["M"][mask].astype(np.int64) * cols["N"][mask]
    bounds, largest = [], None
    for k in grid:
        upto = K <= k
        if not upto.any():
            bounds.append(None)
            continue
        here = MN[upto & split]
        largest = max(largest or 0, int(here.max()) if len(here) else 0)
        bounds.append(MARGIN * largest)
    return bounds


def _fit(cols: dict, rows: np.ndarray, workspaces: List[int], grid: np.ndarray) -> Dict[tuple, list]:
    fitted = {}
    for setting, mask in _setting_masks(cols, workspaces):
        if setting[0] != 0:
            fitted[setting] = _bounds(cols, mask & rows, grid)
    return fitted


def fit_envelope(cols: dict, workspaces: List[int]) -> dict:
    """The json ``envelope`` (kind "k_grid") of a recorded table, with the held-out validation per workspace."""
    cols = _int64(cols)
    grid = np.unique(cols["K"])
    everything = np.ones(len(cols["K"]), bool)
    hold = held_out(cols)
    fitted = _fit(cols, ~hold, workspaces, grid)
    bounds = _fit(cols, everything, workspaces, grid)
    return {
        "kind": "k_grid",
        "inference": bool(len(grid)),
        "claim": "M * N > B(setting, K) and K_min <= K <= K_max: S = 1",
        "K_min": int(grid[0]) if len(grid) else None, "K_max": int(grid[-1]) if len(grid) else None,
        "K_grid": [int(k) for k in grid],
        "K_lookup": "B at the smallest grid K >= K",
        "margin": MARGIN,
        "bounds": [{"ws": int(s[0]), "out": s[1], "fast": s[2], "fmt_a": s[3], "fmt_b": s[4], "B": b}
                   for s, b in bounds.items()],
        "validation": _validation(cols, hold, fitted, workspaces, grid),
        "assumptions": [
            "the largest split M * N of a setting does not shrink as K grows (B is looked up at the next "
            "recorded K)",
            "shapes between the recorded M, N values behave like their neighbours (held-out check below)",
            "this GPU, this cuBLASLt and this torch descriptor and workspace",
        ],
        "note": (f"B = {MARGIN} x the largest split M*N of the setting at K <= grid K; fitted on every row; "
                 "validated on 1 shape in 5 held out of a separate fit"),
    }


def _validation(cols: dict, hold: np.ndarray, fitted: Dict[tuple, list], workspaces: List[int],
                grid: np.ndarray) -> dict:
    MN = cols["M"].astype(np.int64) * cols["N"]
    index = np.searchsorted(grid, cols["K"])
    out = {}
    for ws in sorted({s[0] for s in fitted}):
        tested, failures, held_rows = 0, [], 0
        for setting, mask in _setting_masks(cols, workspaces):
            if setting[0] != ws:
                continue
            rows = np.flatnonzero(mask & hold)
            held_rows += len(rows)
            bound = np.array([-1 if b is None else b for b in fitted[setting]], dtype=np.int64)[index[rows]]
            above = rows[(bound >= 0) & (MN[rows] > bound)]
            tested += len(above)
            for r in above[cols["splitK"][above] > 1]:
                failures.append({"M": int(cols["M"][r]), "N": int(cols["N"][r]), "K": int(cols["K"][r]),
                                 "fmt_a": setting[3], "fmt_b": setting[4], "out": setting[1], "fast": setting[2],
                                 "splitK": int(cols["splitK"][r]), "custom": int(cols["custom"][r])})
        out[str(ws)] = {"status": "validated" if tested and not failures else "unvalidated", "tested": tested,
                        "split_above_bound": len(failures), "failures": failures[:_FAILURES_KEPT],
                        "rows": held_rows, "holdout": "1 shape in 5 by a hash of (M, N, K)"}
    return out
