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
Loading reads json and npz with ``allow_pickle=False`` only: nothing in a bundle is ever executed. Files are
opened without following links or blocking, must be regular files of bounded size (:data:`MAX_FILE_BYTES`), json
strict and at most :data:`MAX_JSON_DEPTH` deep, and every field read is checked once against
:mod:`mmaemu.platform.bundle_schema`. A folder or file another user can write or owns is warned about
(:class:`mmaemu.errors.UnsafeBundleWarning`) before the bundle is used.

:func:`load_profile` registers a bundle's profiles (``list_profiles``, ``get_profile``, ``info``, ``explain``,
``scaled_mm(profile=...)``); ``$MMAEMU_PROFILE_PATH`` (``os.pathsep``-separated bundle folders, or folders of
bundle folders) is loaded on the first profile lookup, a damaged bundle or an unreadable folder there being
skipped with a warning. The lookup asks the recorded-profile source of its :class:`mmaemu.context.Context`
(:func:`recorded_of`), giving it the context's value of the variable: the process's source,
:func:`recorded_profiles`, unless the context names another. This module reads no environment variable itself.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import types
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np

from ..errors import MmaemuError, UnsafeBundleWarning
from ..warn import user_stacklevel
from .bundle_schema import (SchemaError, check_table_rules, combos_schema, manifest_schema, replays_schema,
                            table_schema)
from .bundle_schema import check as check_schema
from .definitions import Profile, RejectRule, builtin_profile_names, register_recorded_profile
from .table_format import COLUMN_DTYPES, TABLE_FORMAT, TableFormatError, build_index, check_columns

__all__ = ["BundleError", "Bundle", "load_profile", "read_bundle", "write_bundle", "load_profile_path",
           "recorded_of", "recorded_profiles", "refused_bundles", "loaded_bundles", "forget_loaded_bundles",
           "packaged_bundle_folders", "path_entries", "json_bytes", "replay_maturity", "BUNDLE_FORMAT", "MANIFEST",
           "COMBOS_FORMAT", "REPLAYS_FORMAT", "PATH_ENV", "PACKAGED_ROOT"]

BUNDLE_FORMAT = "mmaemu-profile-bundle/1"
COMBOS_FORMAT = "mmaemu-verified-split-combos/1"
REPLAYS_FORMAT = "mmaemu-replays/1"
MANIFEST = "profile.json"
PATH_ENV = "MMAEMU_PROFILE_PATH"
MAX_MANIFEST_BYTES = 4 << 20  # a manifest lists a few files and profiles: kilobytes
MAX_FILE_BYTES = 256 << 20  # the default grid's table is about 2 MB; findings keep small operands
MAX_BUNDLE_BYTES = 512 << 20  # all the listed files together
MAX_NPZ_UNPACKED_BYTES = 1 << 30  # 15 columns of 29 bytes a row: 37 million rows, ten default grids
MAX_JSON_DEPTH = 32  # the recorder writes at most 6 levels


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

    def describe(self) -> dict:
        """What its table is, for diagnostics such as ``mmaemu info`` (the keys of
        :func:`mmaemu.platform.tables.describe_packaged`): indexed in memory when loaded, files in its folder."""
        from .tables import describe_file

        meta = self.table.meta
        return {"table_id": self.table.table_id, "rows": meta.get("rows"), "split_rows": meta.get("split_rows"),
                "index_rows": len(self.table), "index_format": f"in memory (recorded bundle {self.path})",
                "verified_combos": len(self.table.verified),
                "files": [describe_file(self.path, name) for name in sorted(self.manifest["files"])]}


# ----------------------------------------------------------------------------------------------------------------
# Reading and checking


def read_bundle(path) -> Bundle:
    """Check every file of the bundle at ``path`` (its folder or its profile.json) and build its profiles and
    table without registering them. BundleError names what is wrong; an UnsafeBundleWarning says that the
    folder or a file of it can be written by another user."""
    folder = Path(path)
    if folder.name == MANIFEST:
        folder = folder.parent
    where = f"bundle {folder}"
    concerns = _trust_concerns(folder)
    manifest_blob = _read_bytes(folder / MANIFEST, folder, MAX_MANIFEST_BYTES, concerns)
    manifest = _parse_json(manifest_blob, MANIFEST, folder, manifest_schema(BUNDLE_FORMAT))
    blobs = _checked_files(folder, manifest["files"], where, concerns)
    if concerns:
        warnings.warn(f"mmaemu: {where}: {'; '.join(concerns)}. Its files are checked against its own manifest, "
                      "which whoever can write them can rewrite: load only bundles from folders that only you (or "
                      "root) can write", UnsafeBundleWarning, stacklevel=user_stacklevel())
    table_json = manifest["table_json"]
    meta = _parse_json(_listed(blobs, table_json, where), table_json, folder, table_schema(TABLE_FORMAT),
                       check_table_rules)
    table = _table(meta, blobs, manifest, folder)
    replays_name = manifest.get("replays")
    replays = (_parse_json(_listed(blobs, replays_name, where), replays_name, folder, replays_schema(REPLAYS_FORMAT))
               if replays_name else None)
    profiles = _profiles(manifest, meta, replays, where)
    return Bundle(folder.resolve(), manifest["name"], manifest, hashlib.sha256(manifest_blob).hexdigest(), profiles,
                  table, replays)


def _expect(condition: bool, where: str, problem: str) -> None:
    if not condition:
        raise BundleError(f"{where} refused: {problem}")


def _trust_concerns(folder: Path) -> List[str]:
    """What makes the bundle folder writable by someone other than this user or root (empty: nothing)."""
    try:
        return _ownership_concerns(os.stat(folder), "the folder")
    except OSError:
        return []  # reading it fails next, with the reason


def _ownership_concerns(info: os.stat_result, what: str) -> List[str]:
    concerns = []
    if info.st_mode & stat.S_IWOTH:
        concerns.append(f"{what} can be written by other users (mode {stat.S_IMODE(info.st_mode):04o})")
    me = os.geteuid() if hasattr(os, "geteuid") else None
    if me is not None and info.st_uid not in (me, 0):
        concerns.append(f"{what} is owned by another user (uid {info.st_uid})")
    return concerns


_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def _read_bytes(path: Path, folder: Path, limit: int, concerns: List[str]) -> bytes:
    """The bytes of a bundle file: opened without following a link and without blocking (a FIFO), a regular file
    of at most ``limit`` bytes, else BundleError; adds ownership concerns about it to ``concerns``."""
    where = f"bundle {folder} refused"
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BundleError(f"{where}: {path.name} is a symbolic link (a bundle's files must be regular files "
                              "in its folder)") from exc
        raise BundleError(f"{where}: cannot read {path.name}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"{where}: {path.name} is not a regular file")
        if info.st_size > limit:
            raise BundleError(f"{where}: {path.name} has {info.st_size:,} bytes, more than the {limit:,} allowed "
                              f"({MAX_FILE_BYTES:,} a file, {MAX_BUNDLE_BYTES:,} for all files)")
        concerns += _ownership_concerns(info, path.name)
        with os.fdopen(os.dup(fd), "rb") as fh:
            blob = fh.read(limit + 1)
    except OSError as exc:
        raise BundleError(f"{where}: cannot read {path.name}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(blob) > limit:
        raise BundleError(f"{where}: {path.name} has more than the {limit:,} bytes allowed (it grew while read)")
    return blob


# A json string (escapes included) or a bracket: what the nesting depth is counted from.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _json_depth(text: str, limit: int) -> int:
    """The nesting depth of a json text, counted up to ``limit + 1`` (json's own parser recurses per level)."""
    depth = deepest = 0
    for token in _JSON_TOKENS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit:
                break
        elif bracket in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _parse_json(blob: bytes, name: str, folder: Path, schema, rules=None) -> dict:
    """The json object of a bundle file: strict JSON (no NaN or Infinity), nested at most MAX_JSON_DEPTH deep,
    with every field the code reads of the type and range ``schema`` gives (and ``rules(value)`` passed)."""
    try:
        text = blob.decode("utf-8")
        if _json_depth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
            raise BundleError(f"bundle {folder} refused: {name} is nested deeper than {MAX_JSON_DEPTH} levels")
        value = json.loads(text, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"bundle {folder} refused: {name} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise BundleError(f"bundle {folder} refused: {name} is not a JSON object")
    try:
        check_schema(value, schema)
        if rules is not None:
            rules(value)
    except SchemaError as exc:
        raise BundleError(f"bundle {folder} refused: {name}: {exc}") from exc
    return value


def _checked_files(folder: Path, files: dict, where: str, concerns: List[str]) -> Dict[str, bytes]:
    """The bytes of every listed file, each checked against its sha256 (names must be plain file names)."""
    blobs, left = {}, MAX_BUNDLE_BYTES
    for name, digest in files.items():
        _expect(name != MANIFEST, where, f"{MANIFEST}: file name {name!r} is not a plain file name")
        _expect(left > 0, where, f"the listed files have more than the {MAX_BUNDLE_BYTES:,} bytes a bundle may have")
        blob = _read_bytes(folder / name, folder, min(MAX_FILE_BYTES, left), concerns)
        left -= len(blob)
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
    table_id = manifest["table_id"]
    label = f"{table_id}.json"
    _expect(meta["table_id"] == table_id, where, f"{label}: table_id differs from {table_id!r}")
    npz_blob = _listed(blobs, f"{table_id}.npz", where)
    _expect(hashlib.sha256(npz_blob).hexdigest() == meta["npz_sha256"], where,
            f"{label}: npz_sha256 is not the sha256 of {table_id}.npz")
    columns = _columns(npz_blob, where, table_id)
    combos_name = meta["verified_combos"]
    combos = _parse_json(_listed(blobs, combos_name, where), combos_name, folder, combos_schema(COMBOS_FORMAT))
    try:
        check_columns(meta, columns)
        index = build_index(meta, columns, meta["npz_sha256"])
        return SplitTable(meta, index, combos)
    except (TableFormatError, SplitTableError, KeyError, TypeError, AttributeError) as exc:
        raise BundleError(f"{where} refused: {exc}") from exc


def _check_npy_header(archive, member, where: str, table_id: str) -> None:
    """Refuse an array whose header claims more data than its member holds: np.load allocates the header's shape
    before it reads a byte, so a 64-byte member could otherwise ask for any amount of memory."""
    with archive.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(fh)
    _expect(not dtype.hasobject, where, f"{table_id}.npz cannot be read without pickles ({member.filename} is an "
            "object array)")
    claimed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if all(n >= 0 for n in shape) else -1
    _expect(0 <= claimed <= member.file_size, where, f"{table_id}.npz: {member.filename} claims {shape} of {dtype}, "
            f"more than its {member.file_size:,} bytes hold")


def _columns(blob: bytes, where: str, table_id: str) -> Dict[str, np.ndarray]:
    """The npz's arrays: exactly the 15 table columns, one-dimensional, of the recorded dtypes, no pickles, at
    most MAX_NPZ_UNPACKED_BYTES unpacked, every numSplitsK at least 1."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            unpacked = sum(member.file_size for member in archive.infolist())
            _expect(unpacked <= MAX_NPZ_UNPACKED_BYTES, where, f"{table_id}.npz unpacks to {unpacked:,} bytes, "
                    f"more than the {MAX_NPZ_UNPACKED_BYTES:,} a table may have")
            for member in archive.infolist():
                _check_npy_header(archive, member, where, table_id)
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"{where} refused: {table_id}.npz cannot be read without pickles ({exc})") from exc
    missing, extra = set(COLUMN_DTYPES) - set(arrays), set(arrays) - set(COLUMN_DTYPES)
    _expect(not missing and not extra, where,
            f"{table_id}.npz: columns differ from the table format (missing {sorted(missing)}, "
            f"unexpected {sorted(extra)})")
    for key, dtype in COLUMN_DTYPES.items():
        _expect(arrays[key].dtype == np.dtype(dtype) and arrays[key].ndim == 1, where,
                f"{table_id}.npz: column {key} is {arrays[key].dtype} of shape {arrays[key].shape}, "
                f"expected a one-dimensional {dtype} column")
    split = arrays["splitK"]
    _expect(not len(split) or int(split.min()) >= 1, where,
            f"{table_id}.npz: column splitK holds {int(split.min()) if len(split) else 0} (numSplitsK is at least 1)")
    return arrays


def replay_maturity(replays: Optional[dict]) -> str:
    """"validated" when replays ran and every one returned the emulation's bits, else "experimental"."""
    if not replays:
        return "experimental"
    passed, failed = replays.get("passed"), replays.get("failed")
    return "validated" if isinstance(passed, int) and passed > 0 and failed == 0 else "experimental"


def _profiles(manifest: dict, meta: dict, replays: Optional[dict], where: str) -> tuple:
    """The profiles of a manifest that passed its schema: the rules between fields are checked here."""
    platform, preset = manifest["platform"], manifest["preset"]
    _check_preset(preset, where)
    maturity = replay_maturity(replays)
    _expect(manifest["maturity"] == maturity, where,
            f"{MANIFEST}: maturity {manifest['maturity']!r} does not follow from the replays "
            f"({maturity!r}: 'validated' only when replays ran and all passed)")
    rejects = tuple(RejectRule(r["fmt_a"], r["fmt_b"], r["out"], r["message"]) for r in manifest["rejects"])
    common = dict(preset=preset, gpu_name=platform["gpu"], capability=tuple(platform["capability"]),
                  sm_count=platform["sm_count"], cublaslt_version=platform["cublaslt"],
                  torch_version=platform["torch"], rejects=rejects, splitk_table=meta["table_id"], maturity=maturity)
    builtin, out = set(builtin_profile_names()), []
    for entry in manifest["profiles"]:
        out.append(_profile(entry, common, meta, builtin, where))
    _expect(len({p.name for p in out}) == len(out), where, f"{MANIFEST}: repeated profiles")
    return tuple(out)


def _profile(entry: dict, common: dict, meta: dict, builtin: set, where: str) -> Profile:
    name, workspace, splitk_maturity = entry["name"], entry["workspace_bytes"], entry["splitk_maturity"]
    _expect(name not in builtin, where, f"profile name {name!r} collides with a built-in profile")
    _expect(workspace in meta["codes"]["ws"], where,
            f"profiles: workspace {workspace} of {name!r} was not recorded (table workspaces {meta['codes']['ws']})")
    _expect(common["maturity"] == "validated" or splitk_maturity != "validated", where,
            f"profiles: {name!r} claims validated split-K decisions without passed replays")
    return Profile(name, caller=entry["caller"], workspace_bytes=workspace, align=entry["align"],
                   splitk_maturity=splitk_maturity, **common)


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


def load_profile_path(value: str) -> None:
    """Load the recorded bundles shipped in the package (``mmaemu/platform/data/recorded/<name>/``), then those on
    the profile path ``value`` (a ``$MMAEMU_PROFILE_PATH`` value, which the caller read: each entry a bundle folder
    or a folder of bundle folders; "" names none). A bundle that is refused, or a folder that cannot be read
    (another user's; the package's own, in a checkout inside a folder this user cannot enter), is skipped with a
    RuntimeWarning, once per path and reason; the others load. The same value
    again is a no-op."""
    global _path_seen
    if value == _path_seen:
        return
    with _lock:
        if value == _path_seen:
            return
        _path_seen = value
        try:
            packaged, closed = _packaged_scan()
            folders, unreadable = _bundle_folders(value)
            for folder, exc in closed:
                _skip(folder, f"the package's recorded bundles in {folder} are skipped: cannot read them: "
                      f"{exc.strerror or exc} (a checkout inside a folder this user cannot enter; the built-in "
                      "profiles still load)", where="the package's data")
            for folder, exc in unreadable:
                _skip(folder, f"bundle folder {folder} refused: cannot read it: {exc.strerror or exc}")
            for folder in packaged + folders:
                try:
                    _register(read_bundle(folder))
                except BundleError as exc:
                    _skip(folder, str(exc))
                except OSError as exc:
                    _skip(folder, f"bundle {folder} refused: {exc.strerror or exc}")
        except BaseException:
            _path_seen = None  # a later lookup tries again rather than trusting a half-read path
            raise


def _skip(folder: Path, reason: str, where: str = PATH_ENV) -> None:
    """Remember why ``folder`` was refused and warn, at the user's line, the first time it is refused for this
    reason (:func:`forget_loaded_bundles` forgets it); ``where`` names where the folder was found.

    The warning is emitted here, at once, rather than reported as a :class:`mmaemu.warn.Notice`: it is about the
    process's bundles, not the call being planned, and a notice reported inside :func:`mmaemu.warn.collecting`
    (``explain``, the plan cache's planning) is collected instead of emitted, so a refusal first met by an
    ``explain`` would never warn (its once-slot here being taken). The user's line is found by
    :func:`mmaemu.warn.user_stacklevel`, the frame finder of every mmaemu warning."""
    key = str(folder)
    if _refused.get(key) != reason:
        _refused[key] = reason
        warnings.warn(f"mmaemu: {reason} (found on {where})", RuntimeWarning, stacklevel=user_stacklevel())


RecordedProfiles = Mapping[str, Profile]


def recorded_profiles(value: str) -> RecordedProfiles:
    """The process's recorded-profile source: the recorded profiles {name: Profile}, in the order they were added
    (a read-only view), after the packaged bundles and those on the profile path ``value`` were loaded
    (:func:`load_profile_path`)."""
    from .definitions import _RECORDED

    load_profile_path(value)
    return types.MappingProxyType(_RECORDED)


def recorded_of(context) -> Callable[[str], RecordedProfiles]:
    """The recorded-profile source of a decision: its context's (``Context.recorded``, a profile path value ->
    {name: Profile}), or the process's, :func:`recorded_profiles`, when it has no context or its context names
    no source."""
    source = None if context is None else context.recorded
    return recorded_profiles if source is None else source


PACKAGED_ROOT = Path(__file__).resolve().parent / "data" / "recorded"  # the package's own bundle folders


def packaged_bundle_folders() -> List[Path]:
    """The bundles recorded by the project and shipped as package data (folders with a profile.json); none when
    that folder cannot be read (a checkout inside another user's private folder): :func:`load_profile_path` warns
    about it."""
    return _packaged_scan()[0]


def _packaged_scan():
    """(bundle folders, [(folder, OSError)] of those that could not be read) of the package's own bundle folder."""
    return _folders_of([PACKAGED_ROOT])


def path_entries(value: str) -> List[Path]:
    """The folders a ``$MMAEMU_PROFILE_PATH`` value names: ``os.pathsep``-separated, empty entries skipped, ``~``
    expanded."""
    return [Path(entry).expanduser() for entry in filter(None, value.split(os.pathsep))]


def _bundle_folders(value: str):
    """(bundle folders, [(folder, OSError)] of the folders that could not be read) of a profile path value."""
    return _folders_of(path_entries(value))


def _folders_of(roots):
    """(bundle folders, [(folder, OSError)] of the folders that could not be read) of ``roots``, each a bundle
    folder or a folder of bundle folders."""
    folders, unreadable = [], []
    for root in roots:
        try:
            if (root / MANIFEST).is_file():
                folders.append(root)
                continue
            children = sorted(root.iterdir()) if root.is_dir() else []
        except OSError as exc:
            unreadable.append((root, exc))
            continue
        for child in children:
            try:
                if (child / MANIFEST).is_file():
                    folders.append(child)
            except OSError as exc:
                unreadable.append((child, exc))
    return folders, unreadable


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
    staging = _new_folder(folder.parent, f".{folder.name}.")
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


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new, uniquely named folder with the umask's mode (readable by others under the usual umask 022, unlike
    tempfile.mkdtemp's 0700): the bundle keeps it when it is renamed into place."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(6)}"
        try:
            path.mkdir(mode=0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a staging folder in {parent}")


def json_bytes(value) -> bytes:
    """The canonical JSON bytes of a bundle file (sorted keys, one space indents, trailing newline)."""
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")
