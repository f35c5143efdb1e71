"""Turning a recording into a profile bundle (:mod:`mmaemu.platform.bundles`): the table npz and json in the
format of ``data/splitk/``, the verified combinations, the replay report and findings, and the manifest."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, List, Optional

import numpy as np

from .._version import __version__
from ..arith.params import CONTIGUOUS_TILE
from ..platform.bundles import BUNDLE_FORMAT, COMBOS_FORMAT, REPLAYS_FORMAT, json_bytes, replay_maturity
from ..platform.definitions import CALLERS, FORMATS, OUT_DTYPES, TE_ALIGN
from ..platform.table_format import COLUMN_DTYPES, KEY_COLUMNS, TABLE_FORMAT, npz_bytes
from .envelope import fit_envelope, settings_summary

__all__ = ["Recording", "bundle_files"]

_TORCH, _TE = CALLERS


@dataclasses.dataclass
class Recording:
    """Everything a bundle is made of (see :func:`mmaemu.record.record`)."""

    name: str
    table_id: str
    preset: str
    preset_schemes: List[str]
    platform: dict
    workspaces: List[int]
    torch_workspace: int
    te_workspace: int
    te_source: str
    descriptor: dict
    torch_rejects: Dict[tuple, str]
    cols: dict
    dropped: dict
    replays: Optional[list]  # ReplayResults, None when replays were not run
    replay_summary: Optional[dict]
    recording: dict


def bundle_files(rec: Recording):
    """(manifest, {file name: bytes}) of the bundle."""
    cols = {k: np.asarray(rec.cols[k]).astype(COLUMN_DTYPES[k]) for k in COLUMN_DTYPES}
    npz = npz_bytes(cols)
    summary = rec.replay_summary or {"custom_to_scheme": {}, "ambiguous": {}, "passed": 0, "failed": 0,
                                     "groups": {}}
    combos_name = f"verified_split_combos_{rec.table_id}.json"
    meta = _table_json(rec, cols, npz, combos_name, summary)
    files = {f"{rec.table_id}.npz": npz, f"{rec.table_id}.json": json_bytes(meta),
             combos_name: json_bytes(_combos_json(rec, cols, summary))}
    replays = None
    if rec.replays is not None:
        report, findings = _replays_json(rec, summary)
        files["replays.json"] = json_bytes(report)
        if findings:
            files["findings.npz"] = npz_bytes(findings)
        replays = report
    ws0 = cols["ws"] == rec.workspaces.index(0) if 0 in rec.workspaces else None
    ws0_unsplit = ws0 is not None and bool(ws0.any()) and not bool((ws0 & (cols["splitK"] > 1)).any())
    return _manifest(rec, replays, ws0_unsplit), files


def _table_json(rec: Recording, cols: dict, npz: bytes, combos_name: str, summary: dict) -> dict:
    split = cols["splitK"] > 1
    ws0 = cols["ws"] == rec.workspaces.index(0) if 0 in rec.workspaces else np.zeros(len(split), bool)
    ragged = [r for r in (rec.replays or []) if r.case.S > 1 and r.case.K % CONTIGUOUS_TILE
              and summary["custom_to_scheme"].get(str(r.case.custom)) == "contiguous"]
    return {
        "format": TABLE_FORMAT, "table_id": rec.table_id,
        "profile_device": {k: rec.platform.get(k) for k in ("gpu", "sm_count", "capability", "cublaslt", "driver",
                                                            "torch")},
        "descriptor": ("torch._scaled_mm as checked by the recorder's probe (m=N, n=M, k=K; A=mat2 transa=T; "
                       "B=mat1; C=out dtype, fp16 for fp8 outputs; D=out dtype; A/B scale pointers; FAST_ACCUM; "
                       "MAX_WORKSPACE_BYTES), requestedAlgoCount 1"),
        "descriptor_check": rec.descriptor,
        "key": list(KEY_COLUMNS),
        "columns": dict(COLUMN_DTYPES),
        "codes": {"custom -> scheme": summary["custom_to_scheme"],
                  "custom -> scheme, unlisted": rec.preset_schemes[0],
                  "fa/fb": {str(i): f for i, f in enumerate(FORMATS)},
                  "out": {str(i): o for i, o in enumerate(OUT_DTYPES)}, "ws": rec.workspaces,
                  "tile/stages/reduction": "cublasLt.h enum values of the recording's cuBLASLt"},
        "rows": int(len(split)), "split_rows": int(split.sum()),
        "npz_bytes": len(npz), "npz_sha256": hashlib.sha256(npz).hexdigest(),
        "settings": settings_summary(cols, rec.workspaces),
        "envelope": fit_envelope(cols, rec.workspaces),
        "verified_combos": combos_name,
        "split_customOptions": sorted(int(c) for c in np.unique(cols["custom"][split])),
        "split_layouts": {"ragged_K": {"verified": bool(ragged) and all(_passed(r, summary) for r in ragged),
                                       "replays": len(ragged),
                                       "what": "K % 128 != 0: the last k-tile is zero padded"}},
        "workspace0_note": (f"cuBLASLt never split without a workspace on {rec.platform.get('gpu')} "
                            f"({int((split & ws0).sum())} split rows among the {int(ws0.sum()):,} workspace-0 "
                            "queries of this recording)"),
        "workspaces": {"torch": rec.torch_workspace, "transformer_engine": rec.te_workspace,
                       "transformer_engine_source": rec.te_source},
        "rejects": [{"fmt_a": fa, "fmt_b": fb, "out": out, "torch_error": error}
                    for (fa, fb, out), error in sorted(rec.torch_rejects.items())],
        "dropped_status_nonzero": sum(v["rows"] for v in rec.dropped.values()),
        "dropped": [{"fmt_a": k[0], "fmt_b": k[1], "out": k[2], "rows": v["rows"], "status": sorted(v["status"])}
                    for k, v in sorted(rec.dropped.items())],
        "recording": rec.recording,
    }


def _passed(result, summary: dict) -> bool:
    want = "none" if result.case.S == 1 else summary["custom_to_scheme"].get(str(result.case.custom))
    return result.gpu_error is None and want in result.matched


def _combos_json(rec: Recording, cols: dict, summary: dict) -> dict:
    """Every (fast, S, scheme, out, pair) a split row of the table can produce, verified or not."""
    custom_map, unlisted = summary["custom_to_scheme"], rec.preset_schemes[0]
    replayed: Dict[tuple, List[bool]] = {}
    for (S, custom, out, fast, fa, fb), ok in summary["groups"].items():
        if S > 1 and str(custom) in custom_map:
            replayed.setdefault((fast, S, custom_map[str(custom)], out, f"{fa}x{fb}"), []).append(ok)
    table = set()
    for r in np.flatnonzero(cols["splitK"] > 1):
        scheme = custom_map.get(str(int(cols["custom"][r])), unlisted)
        table.add((bool(cols["fast"][r]), int(cols["splitK"][r]), scheme, OUT_DTYPES[cols["out"][r]],
                   f"{FORMATS[cols['fa'][r]]}x{FORMATS[cols['fb'][r]]}"))
    combos = []
    for key in sorted(table | set(replayed)):
        outcomes = replayed.get(key, [])
        combos.append({"fast": key[0], "S": key[1], "scheme": key[2], "out": key[3], "fmt_pair": key[4],
                       "in_table": key in table, "verified": bool(outcomes) and all(outcomes),
                       "recordings": ["replays.json"] if outcomes else []})
    in_table = [c for c in combos if c["in_table"]]
    return {"format": COMBOS_FORMAT, "table_id": rec.table_id,
            "definition": ("a (fast, S, scheme, out, fmt_pair) is verified when a torch._scaled_mm call on the "
                           "recording GPU with that split decision returned, on random and adversarial operands, "
                           "the bits of mmaemu's emulation on every output, and no such replay differed"),
            "combos": combos, "n_table_combos": len(in_table),
            "n_verified_table_combos": sum(c["verified"] for c in in_table),
            "unverified_table_combos": [{k: c[k] for k in ("fast", "S", "scheme", "out", "fmt_pair")}
                                        for c in in_table if not c["verified"]]}


def _replays_json(rec: Recording, summary: dict):
    entries, findings = [], {}
    for r in rec.replays:
        entry = {**dataclasses.asdict(r.case), "matched": r.matched, "mismatches": r.mismatches,
                 "errors": r.errors, "gpu_error": r.gpu_error, "seconds": round(r.seconds, 3),
                 "passed": _passed(r, summary)}
        if r.kept is not None:
            index = len({k.split("/")[0] for k in findings})
            entry["finding"] = f"finding{index}"
            findings.update({f"finding{index}/{k}": np.asarray(v) for k, v in r.kept.items()})
        entries.append(entry)
    report = {"format": REPLAYS_FORMAT, "passed": summary["passed"], "failed": summary["failed"],
              "custom_to_scheme": summary["custom_to_scheme"], "ambiguous": summary["ambiguous"],
              "findings_file": "findings.npz" if findings else None, "device": rec.platform.get("gpu"),
              "workspace": rec.torch_workspace, "replays": entries}
    return report, findings


def _manifest(rec: Recording, replays: Optional[dict], ws0_unsplit: bool) -> dict:
    maturity = replay_maturity(replays)
    splitk = "validated" if maturity == "validated" else "experimental"
    profiles = [{"name": rec.name, "caller": _TORCH, "workspace_bytes": rec.torch_workspace, "align": None,
                 "splitk_maturity": splitk}]
    notes = {}
    if rec.te_workspace in rec.workspaces:
        te_name = f"{rec.name}-te"
        profiles.append({"name": te_name, "caller": _TE, "workspace_bytes": rec.te_workspace, "align": TE_ALIGN,
                         "splitk_maturity": "experimental"})
        notes[te_name] = ("no split call ran through Transformer Engine's own GEMM on the recording GPU (replays ran "
                          "torch._scaled_mm at torch's workspace)")
    if ws0_unsplit:  # the workspace-0 rule (platform.md 3.2) holds on this GPU
        profiles.append({"name": f"{rec.name}-ws0", "caller": _TORCH, "workspace_bytes": 0, "align": None,
                         "splitk_maturity": splitk})
    rejects = [{"fmt_a": fa, "fmt_b": fb, "out": out,
                "message": (f"torch {rec.platform.get('torch')} on {rec.platform.get('gpu')} refused "
                            f"{fa} x {fb} -> {out} when the recording was made: {error}")}
               for (fa, fb, out), error in sorted(rec.torch_rejects.items())]
    return {"format": BUNDLE_FORMAT, "name": rec.name, "table_id": rec.table_id,
            "table_json": f"{rec.table_id}.json", "replays": "replays.json" if replays is not None else None,
            "preset": rec.preset, "platform": rec.platform, "maturity": maturity, "profiles": profiles,
            "splitk_notes": notes, "rejects": rejects, "recorded_by": f"mmaemu {__version__}",
            "recording": rec.recording}
