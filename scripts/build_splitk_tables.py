#!/usr/bin/env python
"""Build the packaged split-K tables (mmaemu/platform/data/) from the recorded originals (data/splitk/).

For every ``heur_*.json`` in the source folder:

1. the npz named next to it must match the json's ``npz_sha256`` and ``npz_bytes`` (refused otherwise: the json's
   metadata, settings and envelope describe exactly that recording);
2. its rows must be unique in the key (M, N, K, fa, fb, out, fast, ws), with codes inside the json's ``codes`` and
   sizes below 2**21 (platform.md 3.4);
3. the rows are sorted by (setting code, shape key) and written as ``<table_id>.index.npz`` in the format described
   in :mod:`mmaemu.platform.tables` (zip entries with a fixed timestamp, so a rebuild is byte-identical);
4. the json, its verified-combos file (whose ``table_id`` must match) and the licence files are copied unchanged.

Paths are relative to the repository root (the parent of this script's folder) unless absolute::

    python scripts/build_splitk_tables.py [--src data/splitk] [--dst mmaemu/platform/data] [--check]

``--check`` builds into a temporary folder and exits 1 if the committed package data differs.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mmaemu.platform.table_format import (  # noqa: E402  (needs the repository on sys.path)
    TableFormatError, build_index, check_columns, npz_bytes)
from mmaemu.platform.tables import DEFAULT_VERIFIED_COMBOS  # noqa: E402

COPIED_FILES = ("LICENSE", "NOTICE", "BSD-2-Clause-MATLAB-tensor-core.txt")
DATA_README = """\
# Packaged split-K tables (generated; do not edit)

Built by `scripts/build_splitk_tables.py` from the recordings in `data/splitk/` at the repository root (see the
README there for provenance, licence and schema). `<table_id>.json` and the verified-combos files are copied
unchanged; `<table_id>.index.npz` is the same table re-indexed for binary search (format `mmaemu-splitk-index/1`,
described in `mmaemu/platform/tables.py`). `LICENSE` and `NOTICE` are those of the recordings (Apache-2.0,
mmaemu 0.1.0 by Xun Ding); `BSD-2-Clause-MATLAB-tensor-core.txt` is kept because the NOTICE refers to it.
"""
BuildError = TableFormatError  # every refusal of this script


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_verified_npz(json_path: Path):
    """(meta, columns as int64 arrays) after checking the npz against the json's npz_sha256 / npz_bytes."""
    meta = json.loads(json_path.read_text(encoding="utf-8"))
    npz_path = json_path.with_suffix(".npz")
    digest = sha256_of(npz_path)
    if digest != meta["npz_sha256"]:
        raise BuildError(f"{npz_path.name}: sha256 {digest} differs from the json's npz_sha256 {meta['npz_sha256']}")
    if npz_path.stat().st_size != meta["npz_bytes"]:
        raise BuildError(f"{npz_path.name}: {npz_path.stat().st_size} bytes, the json says {meta['npz_bytes']}")
    with np.load(npz_path, allow_pickle=False) as npz:
        columns = {name: npz[name].astype(np.int64) for name in npz.files}
    return meta, columns, digest


def build_table(json_path: Path, dst: Path) -> str:
    meta, cols, digest = load_verified_npz(json_path)
    check_columns(meta, cols)  # the columns of the table format, each within its codes and sizes
    table_id = meta["table_id"]
    (dst / f"{table_id}.index.npz").write_bytes(npz_bytes(build_index(meta, cols, digest)))  # reproducible bytes
    shutil.copyfile(json_path, dst / f"{table_id}.json")
    combos_name = meta.get("verified_combos", DEFAULT_VERIFIED_COMBOS)
    combos_path = json_path.parent / combos_name
    combos = json.loads(combos_path.read_text(encoding="utf-8"))
    if combos.get("table_id") != table_id:
        raise BuildError(f"{combos_name} belongs to {combos.get('table_id')!r}, not {table_id!r}")
    shutil.copyfile(combos_path, dst / combos_name)
    return f"{table_id}: {meta['rows']} rows ({meta['split_rows']} split), from {json_path.with_suffix('.npz').name}"


def build(src: Path, dst: Path) -> list:
    tables = sorted(src.glob("heur_*.json"))
    if not tables:
        raise BuildError(f"no heur_*.json in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    report = [build_table(path, dst) for path in tables]
    for name in COPIED_FILES:
        shutil.copyfile(src / name, dst / name)
    (dst / "README.md").write_text(DATA_README, encoding="utf-8")
    return report


def differences(built: Path, committed: Path) -> list:
    names = sorted({p.name for p in built.iterdir()} | {p.name for p in committed.iterdir() if p.is_file()})
    return [n for n in names if not (built / n).is_file() or not (committed / n).is_file()
            or not filecmp.cmp(built / n, committed / n, shallow=False)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="data/splitk", help="recorded originals (relative to the repository root)")
    parser.add_argument("--dst", default="mmaemu/platform/data", help="package data folder (same)")
    parser.add_argument("--check", action="store_true", help="verify that --dst is up to date; write nothing")
    args = parser.parse_args(argv)
    src, dst = REPO_ROOT / args.src, REPO_ROOT / args.dst
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                build(src, Path(tmp))
                stale = differences(Path(tmp), dst)
            print("up to date" if not stale else f"stale or missing: {', '.join(stale)}")
            return 1 if stale else 0
        for line in build(src, dst):
            print(line)
    except BuildError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
