"""Split-K tables: the recorded cuBLASLt heuristic answers, shipped as indexed package data.

Evidence: ``data/splitk/`` at the repository root holds the recordings as published (npz + json per GPU, see its
README): one row per (M, N, K, fa, fb, out, fast, ws) query with the first algorithm's numSplitsK (``splitK``),
customOption (``custom``), ``algo`` and ``tile``. ``scripts/build_splitk_tables.py`` converts each table into
``mmaemu/platform/data/<table_id>.index.npz`` (format ``mmaemu-splitk-index/1``):

* ``setting_offsets`` int64[161]: rows of setting code c are ``offsets[c]:offsets[c+1]``, where
  c = (((ws_index * 5 + out) * 2 + fast) * 2 + fa) * 2 + fb with the json's ``codes``;
* ``shape_key_delta`` int64[rows]: first differences of the shape keys (M << 42) | (N << 21) | K, sorted within
  each setting (differences compress ~30x better than the keys; a cumulative sum restores them);
* ``splitK``, ``custom``, ``algo``, ``tile``: the value columns in the same order;
* ``format``, ``table_id``, ``source_npz_sha256`` (the recorded npz it was built from), ``rows``.

The table json (metadata, codes, settings, envelope) and the verified-combos json are shipped unchanged next to it.
Loading is lazy (first use), checked against the json, thread-safe and done once per process; a lookup is a binary
search in one setting's slice (platform.md 3.4: every M, N, K < 2**21 can be keyed exactly). A decision reads its
tables from the source of its :class:`mmaemu.context.Context` (:func:`tables_of`): these, unless the context names
another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from importlib import resources
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import MmaemuError
from .definitions import FORMATS, OUT_DTYPES, builtin_profiles

__all__ = [
    "INDEX_FORMAT",
    "SHAPE_BITS",
    "N_SETTING_CODES",
    "TableRow",
    "UnsplitEvidence",
    "SplitTable",
    "SplitTableError",
    "get_table",
    "tables_of",
    "register_table",
    "setting_code",
    "shape_key",
    "packaged_files",
    "DEFAULT_VERIFIED_COMBOS",
]

INDEX_FORMAT = "mmaemu-splitk-index/1"
SHAPE_BITS = 21  # platform.md 3.4: M, N, K < 2**21 (all recorded values are)
N_WS_CODES = 4  # the json's codes.ws: [0, 1 MiB, 4 MiB, 32 MiB]
N_SETTING_CODES = N_WS_CODES * len(OUT_DTYPES) * 2 * 2 * 2
DEFAULT_VERIFIED_COMBOS = "verified_split_combos.json"  # the RTX 4060 json names none (data README section 2)
_DATA_PACKAGE = __package__
_SHAPE_LIMIT = 1 << SHAPE_BITS


class SplitTableError(MmaemuError, RuntimeError):
    """The packaged split-K table is missing, corrupt or inconsistent with its json."""


def setting_code(ws_index: int, out: int, fast: int, fa: int, fb: int) -> int:
    """Dense code of a setting (ws index, out code, fast, fa code, fb code), 0 <= code < N_SETTING_CODES."""
    return (((ws_index * len(OUT_DTYPES) + out) * 2 + fast) * 2 + fa) * 2 + fb


def shape_key(M, N, K):
    """(M << 42) | (N << 21) | K: exact for M, N, K < 2**21; works on ints and int64 arrays alike."""
    return (M << (2 * SHAPE_BITS)) | (N << SHAPE_BITS) | K


@dataclasses.dataclass(frozen=True)
class TableRow:
    """The first heuristic result recorded for a key: numSplitsK, customOption, algorithm id, tile enum."""

    splitK: int
    custom: int
    algo: int
    tile: int


class UnsplitEvidence(NamedTuple):
    """What the rows of one setting say about unsplit calls (the evidence behind ``splitk="assume-unsplit"``).

    ``rows``: the setting's recorded rows; ``K_min``/``K_max``: the recorded K range; ``K_split_min``: the smallest
    K of a split row (None: no row splits); ``K_unsplit_max``: the largest recorded K such that no row with a K at
    most that large splits (None: a row at the smallest K splits); ``MN_split_max``: the largest M*N of a split row
    (None: no row splits); ``MN_unsplit_min``: the smallest recorded M*N such that no row with an M*N at least that
    large splits (None: the row of the largest M*N splits). Facts of the recorded table only, no inference.
    """

    rows: int
    K_min: int
    K_max: int
    K_split_min: Optional[int]
    K_unsplit_max: Optional[int]
    MN_split_max: Optional[int]
    MN_unsplit_min: Optional[int]


class SplitTable:
    """One recorded table (json metadata + index), answering exact-key lookups and envelope facts."""

    def __init__(self, meta: dict, index: Dict[str, np.ndarray], verified_combos: dict):
        self.meta = meta
        self.table_id: str = meta["table_id"]
        _check_consistency(meta, index, verified_combos)
        codes = meta["codes"]
        self.ws_values: Tuple[int, ...] = tuple(codes["ws"])
        self.custom_to_scheme: Dict[str, str] = dict(codes["custom -> scheme"])
        self.unlisted_scheme: Optional[str] = codes.get("custom -> scheme, unlisted")
        self.ragged_k_verified: bool = bool(
            meta.get("split_layouts", {}).get("ragged_K", {}).get("verified", False))
        self.workspace0_note: Optional[str] = meta.get("workspace0_note")
        self.envelope: dict = meta.get("envelope", {})
        self.verified = frozenset(
            (bool(c["fast"]), int(c["S"]), c["scheme"], c["out"], c["fmt_pair"])
            for c in verified_combos["combos"] if c["verified"])
        # The largest numSplitsK seen on this GPU: in the heuristic's rows (``settings[*].S_values``) and in the
        # live split calls that were replayed (the verified-combos file).
        self.max_recorded_splits: int = max(
            [1] + [int(S) for entry in meta["settings"] for S in entry["S_values"]]
            + [int(c["S"]) for c in verified_combos["combos"]])
        self._ws_index = {ws: i for i, ws in enumerate(self.ws_values)}
        self._offsets: List[int] = [int(x) for x in index["setting_offsets"]]
        self._keys = np.cumsum(index["shape_key_delta"], dtype=np.int64)
        self._split_k = index["splitK"]
        self._custom = index["custom"]
        self._algo = index["algo"]
        self._tile = index["tile"]
        self._settings = {_setting_tuple(s): s for s in meta["settings"]}
        self._bounds = {_setting_tuple(b): b["B"] for b in self.envelope.get("bounds", [])}
        self._evidence: Dict[int, Optional[UnsplitEvidence]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    # -- exact rows (platform.md 3.4) --------------------------------------------------------------------------

    def lookup(self, M: int, N: int, K: int, fmt_a: str, fmt_b: str, out: str, fast: bool,
               workspace_bytes: int) -> Optional[TableRow]:
        """The recorded row of the key, or None (workspace not in ``codes.ws``, a size >= 2**21, or no row)."""
        ws_index = self._ws_index.get(workspace_bytes)
        if ws_index is None or not (0 <= M < _SHAPE_LIMIT and 0 <= N < _SHAPE_LIMIT and 0 <= K < _SHAPE_LIMIT):
            return None
        code = setting_code(ws_index, OUT_DTYPES.index(out), int(bool(fast)), FORMATS.index(fmt_a),
                            FORMATS.index(fmt_b))
        lo, hi = self._offsets[code], self._offsets[code + 1]
        key = shape_key(M, N, K)
        j = lo + int(self._keys[lo:hi].searchsorted(key))
        if j >= hi or int(self._keys[j]) != key:
            return None
        return TableRow(int(self._split_k[j]), int(self._custom[j]), int(self._algo[j]), int(self._tile[j]))

    # -- per-setting facts (json ``settings`` and ``envelope.bounds``) -----------------------------------------

    def setting(self, workspace_bytes: int, out: str, fast: bool, fmt_a: str, fmt_b: str) -> Optional[dict]:
        """The json ``settings`` entry of (ws, out, fast, fmt_a, fmt_b), or None."""
        return self._settings.get((workspace_bytes, out, bool(fast), fmt_a, fmt_b))

    def settings_over_outputs(self, workspace_bytes: int, fast: bool, fmt_a: str, fmt_b: str) -> List[dict]:
        """The ``settings`` entries with this (ws, fast, fmt_a, fmt_b), over all output dtypes."""
        return [s for out in OUT_DTYPES
                if (s := self._settings.get((workspace_bytes, out, bool(fast), fmt_a, fmt_b))) is not None]

    def envelope_bounds(self, workspace_bytes: int, out: str, fast: bool, fmt_a: str,
                        fmt_b: str) -> Optional[list]:
        """The ``envelope.bounds`` B list of the setting (aligned with ``envelope.K_grid``), or None."""
        return self._bounds.get((workspace_bytes, out, bool(fast), fmt_a, fmt_b))

    def unsplit_evidence(self, workspace_bytes: int, out: str, fast: bool, fmt_a: str,
                         fmt_b: str) -> Optional[UnsplitEvidence]:
        """The :class:`UnsplitEvidence` of the setting's rows (None: the table has no row for it); computed from
        the index on first use, vectorised over the setting's slice, then kept."""
        ws_index = self._ws_index.get(workspace_bytes)
        if ws_index is None:
            return None
        code = setting_code(ws_index, OUT_DTYPES.index(out), int(bool(fast)), FORMATS.index(fmt_a),
                            FORMATS.index(fmt_b))
        if code not in self._evidence:  # a race computes the same value twice: harmless
            self._evidence[code] = self._setting_evidence(code)
        return self._evidence[code]

    def _setting_evidence(self, code: int) -> Optional[UnsplitEvidence]:
        lo, hi = self._offsets[code], self._offsets[code + 1]
        if hi == lo:
            return None
        keys = self._keys[lo:hi]
        mask = (1 << SHAPE_BITS) - 1
        K = keys & mask
        MN = (keys >> (2 * SHAPE_BITS)) * ((keys >> SHAPE_BITS) & mask)
        split = self._split_k[lo:hi] > 1
        if not split.any():
            return UnsplitEvidence(hi - lo, int(K.min()), int(K.max()), None, int(K.max()), None, int(MN.min()))
        K_split_min, MN_split_max = int(K[split].min()), int(MN[split].max())
        below, above = K[K < K_split_min], MN[MN > MN_split_max]
        return UnsplitEvidence(hi - lo, int(K.min()), int(K.max()), K_split_min,
                               int(below.max()) if below.size else None, MN_split_max,
                               int(above.min()) if above.size else None)

    def is_verified(self, fast: bool, S: int, scheme: str, out: str, fmt_a: str, fmt_b: str) -> bool:
        """(fast, S, scheme, out, "faxfb") is a verified combination of the table's verified-combos file."""
        return (bool(fast), int(S), scheme, out, f"{fmt_a}x{fmt_b}") in self.verified


def _setting_tuple(entry: dict) -> tuple:
    return (entry["ws"], entry["out"], bool(entry["fast"]), entry["fmt_a"], entry["fmt_b"])


def _check_consistency(meta: dict, index: Dict[str, np.ndarray], verified_combos: dict) -> None:
    """Refuse an index that was not built from the npz this json describes (data README: npz_sha256)."""
    problems = []
    if str(index["format"]) != INDEX_FORMAT:
        problems.append(f"index format {str(index['format'])!r} is not {INDEX_FORMAT!r}")
    if str(index["table_id"]) != meta["table_id"]:
        problems.append(f"index table_id {str(index['table_id'])!r}")
    if str(index["source_npz_sha256"]) != meta["npz_sha256"]:
        problems.append("index built from an npz whose sha256 differs from the json's npz_sha256")
    if int(index["rows"]) != meta["rows"] or len(index["shape_key_delta"]) != meta["rows"]:
        problems.append(f"index has {int(index['rows'])} rows, the json {meta['rows']}")
    ws_codes = list(meta["codes"]["ws"])  # at most four distinct workspace sizes (recorded bundles: any four)
    ws_ok = 0 < len(set(ws_codes)) == len(ws_codes) <= N_WS_CODES
    if len(index["setting_offsets"]) != N_SETTING_CODES + 1 or not ws_ok:
        problems.append("setting codes differ from the index format's")
    if verified_combos.get("table_id") != meta["table_id"]:
        problems.append(f"verified-combos file belongs to {verified_combos.get('table_id')!r}")
    if problems:
        raise SplitTableError(f"split-K table {meta['table_id']}: " + "; ".join(problems)
                              + " (rebuild with scripts/build_splitk_tables.py)")


# ----------------------------------------------------------------------------------------------------------------
# Package data loading (lazy, once per process, thread-safe)

_lock = threading.Lock()
_tables: Dict[str, SplitTable] = {}


def _data_file(name: str):
    return resources.files(_DATA_PACKAGE).joinpath("data").joinpath(name)


def _read_json(name: str) -> dict:
    try:
        return json.loads(_data_file(name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SplitTableError(f"cannot read packaged split-K file {name}: {exc}") from exc


def _read_index(name: str) -> Dict[str, np.ndarray]:
    try:
        with _data_file(name).open("rb") as fh, np.load(fh, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (OSError, ValueError, KeyError) as exc:
        raise SplitTableError(f"cannot read packaged split-K index {name}: {exc}") from exc


def _load(table_id: str) -> SplitTable:
    meta = _read_json(f"{table_id}.json")
    index = _read_index(f"{table_id}.index.npz")
    verified = _read_json(meta.get("verified_combos", DEFAULT_VERIFIED_COMBOS))
    return SplitTable(meta, index, verified)


def get_table(table_id: str) -> SplitTable:
    """The table of this id, loaded on first use: a registered one (recorded bundles, see
    :func:`register_table`) or the packaged one (SplitTableError if missing or inconsistent)."""
    table = _tables.get(table_id)
    if table is None:
        with _lock:
            table = _tables.get(table_id)
            if table is None:
                factory = _registered.get(table_id)
                table = _tables[table_id] = factory() if factory is not None else _load(table_id)
    return table


def tables_of(context) -> Callable[[str], SplitTable]:
    """The split-K table source of a decision: its context's (``Context.tables``, a table id -> SplitTable), or
    the process's own, :func:`get_table`, when the decision has no context or its context names no source."""
    source = None if context is None else context.tables
    return get_table if source is None else source


_registered: Dict[str, Callable[[], SplitTable]] = {}


def _is_packaged(table_id: str) -> bool:
    """A table id of the package data: one a built-in profile names, or one whose json the package holds. A
    package folder this user cannot read (a checkout inside another user's private folder) holds none it can load,
    and the built-in profiles' ids are refused by name all the same."""
    if table_id in {p.splitk_table for p in builtin_profiles()}:
        return True
    try:
        return _data_file(f"{table_id}.json").is_file()
    except OSError:
        return False


def register_table(table_id: str, factory: Callable[[], SplitTable]) -> None:
    """Make ``get_table(table_id)`` build its table with ``factory()`` on first use (recorded bundles). A table id
    of the package data cannot be registered; registering an id again replaces its factory and drops the loaded
    table."""
    if _is_packaged(table_id):
        raise SplitTableError(f"split-K table id {table_id!r} belongs to the packaged tables")
    with _lock:
        _registered[table_id] = factory
        _tables.pop(table_id, None)


def describe_file(folder, file_name: str) -> dict:
    """{name, bytes, sha256} of a file of a table (``folder``: a path or a package resource folder)."""
    blob = folder.joinpath(file_name).read_bytes()
    return {"name": file_name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def describe_packaged(table_id: str) -> dict:
    """What a packaged table is, for diagnostics such as ``mmaemu info``: ``{table_id, rows, split_rows,
    index_rows, index_format, verified_combos, files}``, the row counts from its json and the index's own ``rows``
    member (the big arrays are not loaded)."""
    data = resources.files(_DATA_PACKAGE).joinpath("data")
    meta = json.loads(data.joinpath(f"{table_id}.json").read_text(encoding="utf-8"))
    combos_name = meta.get("verified_combos", DEFAULT_VERIFIED_COMBOS)
    combos = json.loads(data.joinpath(combos_name).read_text(encoding="utf-8"))
    index_name = f"{table_id}.index.npz"
    with data.joinpath(index_name).open("rb") as fh, np.load(fh, allow_pickle=False) as npz:
        index_rows = int(npz["rows"])
        index_format = str(npz["format"])
    return {
        "table_id": table_id,
        "rows": meta.get("rows"),
        "split_rows": meta.get("split_rows"),
        "index_rows": index_rows,
        "index_format": index_format,
        "verified_combos": sum(1 for c in combos.get("combos", []) if c.get("verified")),
        "files": [describe_file(data, name) for name in (f"{table_id}.json", index_name, combos_name)],
    }


def packaged_files() -> List[dict]:
    """[{name, bytes, sha256}] of the shipped split-K data files (for diagnostics such as ``mmaemu info``)."""
    out = []
    for entry in sorted(resources.files(_DATA_PACKAGE).joinpath("data").iterdir(), key=lambda e: e.name):
        if entry.is_file():
            blob = entry.read_bytes()
            out.append({"name": entry.name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
    return out
