"""Recorded profile bundles: the output of ``mmaemu record``, usable as profiles on any machine.

A bundle is a folder (its name is the bundle's name) holding, next to a manifest ``profile.json``
(format ``mmaemu-profile-bundle/1``):

* ``<table_id>.npz`` + ``<table_id>.json``: the recorded split-K table in the format of ``data/splitk/`` (15 npz
  columns, json with provenance, codes, per-setting summaries and the envelope);
* the verified-combinations json the table names (format ``mmaemu-verified-split-combos/1``);
* ``replays.json`` (format ``mmaemu-replays/1``): what the replays on the recording GPU showed; and, when a replay
  differed, ``findings.npz`` with its inputs and both outputs.

The manifest names the platform (GPU, SM count, capability, driver, cuBLASLt and torch versions), the preset, the
profiles the bundle defines (one per caller/workspace: torch's, Transformer Engine's, workspace 0), the calls the
recorded cuBLASLt rejected, and the sha256 of every file. :func:`read_bundle` refuses (BundleError, naming the
file and the rule) a bundle whose files are missing or differ from their hash, whose npz columns are missing or
of the wrong dtype or shape, whose codes or keys are inconsistent, whose maturity claim does not follow from its
replays ("validated" only when replays ran and all passed), or whose profile names collide with built-in ones.
Loading reads json and npz with ``allow_pickle=False`` only: nothing in a bundle is ever executed.

:func:`load_profile` registers a bundle's profiles (``list_profiles``, ``get_profile``, ``info``, ``explain``,
``scaled_mm(profile=...)``); ``$MMAEMU_PROFILE_PATH`` (``os.pathsep``-separated bundle folders, or folders of
bundle folders) is loaded on the first profile lookup, a damaged bundle there being skipped with a warning.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .. import environment
from ..errors import MmaemuError
from .definitions import (CALLERS, FORMATS, OUT_DTYPES, Profile, RejectRule, builtin_profile_names,
                          register_recorded_profile)
from .table_format import COLUMN_DTYPES, TABLE_FORMAT, TableFormatError, build_index, check_columns

__all__ = ["BundleError", "Bundle", "load_profile", "read_bundle", "write_bundle", "load_profile_path",
           "refused_bundles", "loaded_bundles", "forget_loaded_bundles", "packaged_bundle_folders", "path_entries",
           "json_bytes",
           "replay_maturity", "BUNDLE_FORMAT", "MANIFEST", "COMBOS_FORMAT", "REPLAYS_FORMAT", "PATH_ENV"]

BUNDLE_FORMAT = "mmaemu-profile-bundle/1"
COMBOS_FORMAT = "mmaemu-verified-split-combos/1"
REPLAYS_FORMAT = "mmaemu-replays/1"
MANIFEST = "profile.json"
PATH_ENV = "MMAEMU_PROFILE_PATH"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_SPLITK_MATURITIES = ("validated", "experimental")


class BundleError(MmaemuError, ValueError):
    """A recorded profile bundle that is damaged, tampered with or inconsistent; it is not loaded."""


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A checked bundle: its folder, manifest, profiles and split-K table (a mmaemu.platform.tables.SplitTable)."""

    path: Path
    name: str
    manifest: dict
    manifest_sha256: str
    profiles: tuple
    table: object
    replays: Optional[dict]


# ----------------------------------------------------------------------------------------------------------------
# Reading and checking


def read_bundle(path) -> Bundle:
    """Check every file of the bundle at ``path`` (its folder or its profile.json) and build its profiles and
    table without registering them. BundleError names what is wrong."""
    folder = Path(path)
    if folder.name == MANIFEST:
        folder = folder.parent
    manifest_blob = _read_bytes(folder / MANIFEST, folder)
    manifest = _parse_json(manifest_blob, MANIFEST, folder)
    where = f"bundle {folder}"
    _expect(manifest.get("format") == BUNDLE_FORMAT, where, f"{MANIFEST}: format is not {BUNDLE_FORMAT!r}")
    name = _field(manifest, "name", str, where)
    _expect(_NAME.match(name) is not None, where, f"bundle name {name!r} is not a lowercase slug")
    blobs = _checked_files(folder, _field(manifest, "files", dict, where), where)
    table_json = _field(manifest, "table_json", str, where)
    meta = _parse_json(_listed(blobs, table_json, where), table_json, folder)
    table = _table(meta, blobs, manifest, folder)
    replays_name = manifest.get("replays")
    replays = _parse_json(_listed(blobs, replays_name, where), replays_name, folder) if replays_name else None
    if replays is not None:
        _expect(replays.get("format") == REPLAYS_FORMAT, where, f"{replays_name}: format is not {REPLAYS_FORMAT!r}")
    profiles = _profiles(manifest, meta, replays, where)
    return Bundle(folder.resolve(), name, manifest, hashlib.sha256(manifest_blob).hexdigest(), profiles, table,
                  replays)


def _expect(condition: bool, where: str, problem: str) -> None:
    if not condition:
        raise BundleError(f"{where} refused: {problem}")


def _field(mapping: dict, key: str, kind, where: str, label: str = ""):
    value = mapping.get(key) if isinstance(mapping, dict) else None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    _expect(ok, where, f"{label or MANIFEST}: {key!r} missing or not of type {'/'.join(k.__name__ for k in kinds)}")
    return value


def _read_bytes(path: Path, folder: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BundleError(f"bundle {folder} refused: cannot read {path.name}: {exc.strerror or exc}") from exc


def _parse_json(blob: bytes, name: str, folder: Path) -> dict:
    try:
        value = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"bundle {folder} refused: {name} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise BundleError(f"bundle {folder} refused: {name} is not a JSON object")
    return value


def _checked_files(folder: Path, files: dict, where: str) -> Dict[str, bytes]:
    """The bytes of every listed file, each checked against its sha256 (names must be plain file names)."""
    blobs = {}
    for name, digest in files.items():
        _expect(isinstance(name, str) and _FILE_NAME.match(name) is not None and name != MANIFEST, where,
                f"{MANIFEST}: file name {name!r} is not a plain file name")
        blob = _read_bytes(folder / name, folder)
        actual = hashlib.sha256(blob).hexdigest()
        _expect(actual == digest, where, f"{name}: sha256 {actual} differs from the manifest's {digest} "
                                         "(damaged or modified after recording)")
        blobs[name] = blob
    return blobs


def _listed(blobs: Dict[str, bytes], name, where: str) -> bytes:
    _expect(isinstance(name, str) and name in blobs, where, f"{name!r} is not among the manifest's files")
    return blobs[name]


def _table(meta: dict, blobs: Dict[str, bytes], manifest: dict, folder: Path):
    """The SplitTable of the recorded npz + json (+ verified combos), after every format check."""
    from .tables import SplitTable, SplitTableError

    where = f"bundle {folder}"
    table_id = _field(manifest, "table_id", str, where)
    label = f"{table_id}.json"
    _expect(meta.get("format") == TABLE_FORMAT and meta.get("table_id") == table_id, where,
            f"{label}: format or table_id differs from {TABLE_FORMAT!r} / {table_id!r}")
    npz_blob = _listed(blobs, f"{table_id}.npz", where)
    _expect(hashlib.sha256(npz_blob).hexdigest() == _field(meta, "npz_sha256", str, where, label), where,
            f"{label}: npz_sha256 is not the sha256 of {table_id}.npz")
    columns = _columns(npz_blob, where, table_id)
    combos_name = _field(meta, "verified_combos", str, where, label)
    combos = _parse_json(_listed(blobs, combos_name, where), combos_name, folder)
    _expect(combos.get("format") == COMBOS_FORMAT and isinstance(combos.get("combos"), list), where,
            f"{combos_name}: format is not {COMBOS_FORMAT!r} with a 'combos' list")
    _check_combos(combos["combos"], where, combos_name)
    try:
        _field(meta, "rows", int, where, label)
        check_columns(meta, columns)
        index = build_index(meta, columns, meta["npz_sha256"])
        return SplitTable(meta, index, combos)
    except (TableFormatError, SplitTableError, KeyError, TypeError, AttributeError) as exc:
        raise BundleError(f"{where} refused: {exc}") from exc


def _columns(blob: bytes, where: str, table_id: str) -> Dict[str, np.ndarray]:
    """The npz's arrays: exactly the 15 table columns, one-dimensional, of the recorded dtypes, no pickles."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise BundleError(f"{where} refused: {table_id}.npz cannot be read without pickles ({exc})") from exc
    missing, extra = set(COLUMN_DTYPES) - set(arrays), set(arrays) - set(COLUMN_DTYPES)
    _expect(not missing and not extra, where,
            f"{table_id}.npz: columns differ from the table format (missing {sorted(missing)}, "
            f"unexpected {sorted(extra)})")
    for key, dtype in COLUMN_DTYPES.items():
        _expect(arrays[key].dtype == np.dtype(dtype) and arrays[key].ndim == 1, where,
                f"{table_id}.npz: column {key} is {arrays[key].dtype} of shape {arrays[key].shape}, "
                f"expected a one-dimensional {dtype} column")
    return arrays


def _check_combos(combos: list, where: str, name: str) -> None:
    for c in combos:
        ok = (isinstance(c, dict) and isinstance(c.get("fast"), bool) and isinstance(c.get("S"), int)
              and c.get("scheme") in ("serial", "pairwise", "contiguous") and c.get("out") in OUT_DTYPES
              and isinstance(c.get("fmt_pair"), str) and isinstance(c.get("verified"), bool))
        _expect(ok, where, f"{name}: malformed combination {c!r}")


def replay_maturity(replays: Optional[dict]) -> str:
    """"validated" when replays ran and every one returned the emulation's bits, else "experimental"."""
    if not replays:
        return "experimental"
    passed, failed = replays.get("passed"), replays.get("failed")
    return "validated" if isinstance(passed, int) and passed > 0 and failed == 0 else "experimental"


def _profiles(manifest: dict, meta: dict, replays: Optional[dict], where: str) -> tuple:
    platform = _field(manifest, "platform", dict, where)
    preset = _field(manifest, "preset", str, where)
    _check_preset(preset, where)
    maturity = replay_maturity(replays)
    _expect(manifest.get("maturity") == maturity, where,
            f"{MANIFEST}: maturity {manifest.get('maturity')!r} does not follow from the replays "
            f"({maturity!r}: 'validated' only when replays ran and all passed)")
    capability = _field(platform, "capability", list, where, "platform")
    _expect(len(capability) == 2 and all(isinstance(x, int) for x in capability), where,
            "platform: capability is not [major, minor]")
    rejects = tuple(_reject_rule(r, where) for r in _field(manifest, "rejects", list, where))
    common = dict(preset=preset, gpu_name=_field(platform, "gpu", str, where, "platform"),
                  capability=tuple(capability), sm_count=_field(platform, "sm_count", int, where, "platform"),
                  cublaslt_version=_field(platform, "cublaslt", str, where, "platform"),
                  torch_version=_field(platform, "torch", str, where, "platform"), rejects=rejects,
                  splitk_table=meta["table_id"], maturity=maturity)
    builtin, out = set(builtin_profile_names()), []
    for entry in _field(manifest, "profiles", list, where):
        out.append(_profile(entry, common, meta, builtin, where))
    _expect(bool(out) and len({p.name for p in out}) == len(out), where, f"{MANIFEST}: no or repeated profiles")
    return tuple(out)


def _profile(entry: dict, common: dict, meta: dict, builtin: set, where: str) -> Profile:
    name = _field(entry, "name", str, where, "profiles")
    _expect(_NAME.match(name) is not None, where, f"profile name {name!r} is not a lowercase slug")
    _expect(name not in builtin, where, f"profile name {name!r} collides with a built-in profile")
    caller = _field(entry, "caller", str, where, "profiles")
    workspace = _field(entry, "workspace_bytes", int, where, "profiles")
    align = entry.get("align")
    splitk_maturity = _field(entry, "splitk_maturity", str, where, "profiles")
    _expect(caller in CALLERS and splitk_maturity in _SPLITK_MATURITIES and (align is None or
            (isinstance(align, int) and align > 0)), where, f"profiles: entry {name!r} has an unknown caller, "
            "split-K maturity or alignment")
    _expect(workspace in meta["codes"]["ws"], where,
            f"profiles: workspace {workspace} of {name!r} was not recorded (table workspaces {meta['codes']['ws']})")
    _expect(common["maturity"] == "validated" or splitk_maturity != "validated", where,
            f"profiles: {name!r} claims validated split-K decisions without passed replays")
    return Profile(name, caller=caller, workspace_bytes=workspace, align=align, splitk_maturity=splitk_maturity,
                   **common)


def _reject_rule(entry, where: str) -> RejectRule:
    ok = (isinstance(entry, dict) and entry.get("fmt_a") in FORMATS + (None,)
          and entry.get("fmt_b") in FORMATS + (None,) and entry.get("out") in OUT_DTYPES + (None,)
          and isinstance(entry.get("message"), str))
    _expect(ok, where, f"{MANIFEST}: malformed reject rule {entry!r}")
    return RejectRule(entry["fmt_a"], entry["fmt_b"], entry["out"], entry["message"])


def _check_preset(name: str, where: str) -> None:
    from ..model.presets import get_preset  # on use: the preset registry imports the arithmetic

    try:
        get_preset(name, warn=False)
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{where} refused: unknown preset {name!r} ({exc})") from exc


# ----------------------------------------------------------------------------------------------------------------
# Registering

_lock = threading.RLock()
_loaded: Dict[str, Bundle] = {}  # bundle name -> Bundle
_refused: Dict[str, str] = {}  # path -> reason (bundles on MMAEMU_PROFILE_PATH that were skipped)
_path_seen: Optional[str] = None


def load_profile(path) -> List[Profile]:
    """Check the bundle at ``path`` and add its profiles; returns them (torch's first). Loading the same bundle
    again is a no-op; another bundle reusing a loaded profile or table name is refused (BundleError)."""
    bundle = read_bundle(path)
    with _lock:
        return list(_register(bundle).profiles)


def _register(bundle: Bundle) -> Bundle:
    from .definitions import _RECORDED
    from .tables import SplitTableError, register_table

    previous = _loaded.get(bundle.name)
    if previous is not None and previous.manifest_sha256 == bundle.manifest_sha256:
        return previous
    owners = {p.name: b for b in _loaded.values() for p in b.profiles}
    tables = {b.table.table_id: b for b in _loaded.values()}
    for clash in [p.name for p in bundle.profiles if p.name in owners or p.name in _RECORDED]:
        owner = owners.get(clash)
        raise BundleError(f"bundle {bundle.path} refused: profile {clash!r} is already provided by "
                          f"{owner.path if owner else 'another recorded profile'}")
    _expect(previous is None and bundle.table.table_id not in tables, f"bundle {bundle.path}",
            f"bundle name {bundle.name!r} or table {bundle.table.table_id!r} is already loaded from another bundle")
    try:
        register_table(bundle.table.table_id, lambda table=bundle.table: table)
    except SplitTableError as exc:
        raise BundleError(f"bundle {bundle.path} refused: {exc}") from exc
    notes = bundle.manifest.get("splitk_notes", {})
    for profile in bundle.profiles:
        register_recorded_profile(profile, str(notes.get(profile.name, "")))
    _loaded[bundle.name] = bundle
    return bundle


def load_profile_path() -> None:
    """Load the recorded bundles shipped in the package (``mmaemu/platform/data/recorded/<name>/``), then those on
    ``$MMAEMU_PROFILE_PATH`` (read at call time; each entry a bundle folder or a folder of bundle folders). A
    bundle that is refused is skipped with a RuntimeWarning, once per path and reason."""
    global _path_seen
    value = environment.snapshot()[PATH_ENV] or ""
    if value == _path_seen:
        return
    with _lock:
        if value == _path_seen:
            return
        _path_seen = value
        for folder in packaged_bundle_folders() + _bundle_folders(value):
            try:
                bundle = read_bundle(folder)
                _register(bundle)
            except BundleError as exc:
                key = str(folder)
                if _refused.get(key) != str(exc):
                    _refused[key] = str(exc)
                    warnings.warn(f"mmaemu: {exc} (found on {PATH_ENV})", RuntimeWarning, stacklevel=4)


def packaged_bundle_folders() -> List[Path]:
    """The bundles recorded by the project and shipped as package data (folders with a profile.json)."""
    root = Path(__file__).resolve().parent / "data" / "recorded"
    return sorted(p for p in root.iterdir() if (p / MANIFEST).is_file()) if root.is_dir() else []


def path_entries(value: str) -> List[Path]:
    """The folders a ``$MMAEMU_PROFILE_PATH`` value names: ``os.pathsep``-separated, empty entries skipped, ``~``
    expanded."""
    return [Path(entry).expanduser() for entry in filter(None, value.split(os.pathsep))]


def _bundle_folders(value: str) -> List[Path]:
    folders = []
    for root in path_entries(value):
        if (root / MANIFEST).is_file():
            folders.append(root)
        elif root.is_dir():
            folders += sorted(p for p in root.iterdir() if (p / MANIFEST).is_file())
    return folders


def refused_bundles() -> Dict[str, str]:
    """path -> reason of the bundles on MMAEMU_PROFILE_PATH that were refused."""
    return dict(_refused)


def loaded_bundles() -> List[Bundle]:
    return list(_loaded.values())


def forget_loaded_bundles() -> None:
    """Unregister every loaded bundle's profiles and tables and forget the path (tests only)."""
    global _path_seen
    from . import definitions, tables

    with _lock:
        for bundle in _loaded.values():
            for profile in bundle.profiles:
                definitions._RECORDED.pop(profile.name, None)
                definitions._SPLITK_MATURITY_NOTES.pop(profile.name, None)
            tables._registered.pop(bundle.table.table_id, None)
            tables._tables.pop(bundle.table.table_id, None)
        _loaded.clear()
        _refused.clear()
        _path_seen = None


# ----------------------------------------------------------------------------------------------------------------
# Writing


def write_bundle(folder, manifest: dict, files: Dict[str, bytes], *, replace: bool = False) -> Path:
    """Write a bundle atomically: the files and a manifest listing their sha256 go to a temporary sibling folder,
    which is then renamed to ``folder`` (an existing bundle there is replaced only with ``replace=True``).
    The written bundle is read back with :func:`read_bundle` before the rename."""
    folder = Path(folder)
    if folder.exists() and not replace:
        raise FileExistsError(f"{folder} exists (pass replace=True / --overwrite to replace it)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    manifest = dict(manifest, files={name: hashlib.sha256(blob).hexdigest() for name, blob in sorted(files.items())})
    manifest.setdefault("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for name, blob in files.items():
            (staging / name).write_bytes(blob)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        read_bundle(staging)
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            os.replace(folder, old / folder.name)
            os.replace(staging, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def json_bytes(value) -> bytes:
    """The canonical JSON bytes of a bundle file (sorted keys, one space indents, trailing newline)."""
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")
