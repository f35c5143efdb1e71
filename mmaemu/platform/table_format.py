"""The recorded split-K table format (``mmaemu-splitk-table/1``) and the sorted index built from it.

A recorded table is an npz of one-dimensional columns of equal length, one row per heuristic query (data README
section 1.1), plus a json of metadata whose ``codes`` give the meaning of the coded columns and whose
``npz_sha256`` names the npz. The shipped tables (``data/splitk/``, converted once by
``scripts/build_splitk_tables.py``) and recorded profile bundles (:mod:`mmaemu.platform.bundles`, indexed when
loaded) are checked and indexed by the same functions here:

* :func:`check_columns`: exactly the 15 columns with the recorded dtypes, codes inside the json's code tables,
  sizes below 2**21 (platform.md 3.4), the json's row count;
* :func:`build_index`: rows sorted by (setting code, shape key), refused when a key repeats; the arrays of the
  ``mmaemu-splitk-index/1`` format described in :mod:`mmaemu.platform.tables`.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from ..errors import MmaemuError
from .definitions import FORMATS, OUT_DTYPES
from .tables import INDEX_FORMAT, N_SETTING_CODES, N_WS_CODES, SHAPE_BITS, setting_code, shape_key

__all__ = ["TableFormatError", "KEY_COLUMNS", "VALUE_COLUMNS", "COLUMN_DTYPES", "TABLE_FORMAT", "check_columns",
           "check_codes", "build_index", "npz_bytes"]

TABLE_FORMAT = "mmaemu-splitk-table/1"
KEY_COLUMNS = ("M", "N", "K", "fa", "fb", "out", "fast", "ws")
# The index keeps these four of the value columns (the decision needs S and customOption; notes show algo, tile).
VALUE_COLUMNS = {"splitK": np.uint8, "custom": np.uint8, "algo": np.int16, "tile": np.int16}
# data README section 1.1: every column of a recorded npz and its dtype.
COLUMN_DTYPES = {"M": "int32", "N": "int32", "K": "int32", "fa": "uint8", "fb": "uint8", "out": "uint8",
                 "fast": "uint8", "ws": "uint8", "splitK": "uint8", "custom": "uint8", "algo": "int16",
                 "tile": "int16", "stages": "int16", "reduction": "uint8", "swizzle": "uint8"}
_FORMAT_CODES = {"0": "e4m3", "1": "e5m2"}


class TableFormatError(MmaemuError, ValueError):
    """A recorded table whose columns or codes do not follow the table format."""


def check_codes(meta: dict) -> None:
    """The json's ``codes`` must be those the index format assumes: formats e4m3/e5m2, the five output dtypes in
    order, and at most four distinct workspace sizes (bytes, non-negative ints)."""
    codes = meta["codes"]
    ws = codes["ws"]
    ws_ok = (isinstance(ws, list) and 0 < len(ws) <= N_WS_CODES and len(set(ws)) == len(ws)
             and all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in ws))
    if (not ws_ok or codes["fa/fb"] != _FORMAT_CODES or list(codes["out"].values()) != list(OUT_DTYPES)
            or list(codes["out"]) != [str(i) for i in range(len(OUT_DTYPES))]):
        raise TableFormatError(f"{meta['table_id']}: codes differ from those the index format assumes "
                               f"(formats {list(FORMATS)}, outputs {list(OUT_DTYPES)}, at most {N_WS_CODES} "
                               "workspace sizes)")


def check_columns(meta: dict, cols: dict) -> None:
    """Codes within the json's code tables, sizes below 2**21, one value per row in every column.

    ``cols`` maps column names to int64 arrays (or arrays of any integer dtype)."""
    rows = meta["rows"]
    missing = set(KEY_COLUMNS) | set(VALUE_COLUMNS)
    missing -= set(cols)
    if missing:
        raise TableFormatError(f"{meta['table_id']}: missing columns {sorted(missing)}")
    if any(np.ndim(c) != 1 or len(c) != rows for c in cols.values()):
        raise TableFormatError(f"{meta['table_id']}: columns are not one-dimensional of length rows = {rows}")
    check_codes(meta)
    codes = meta["codes"]
    limits = {"fa": len(codes["fa/fb"]), "fb": len(codes["fa/fb"]), "out": len(codes["out"]), "fast": 2,
              "ws": len(codes["ws"]), "M": 1 << SHAPE_BITS, "N": 1 << SHAPE_BITS, "K": 1 << SHAPE_BITS}
    for name, limit in limits.items():
        if rows and (cols[name].min() < 0 or cols[name].max() >= limit):
            raise TableFormatError(f"{meta['table_id']}: column {name} outside [0, {limit})")
    for name, dtype in VALUE_COLUMNS.items():
        info = np.iinfo(dtype)
        if rows and (cols[name].min() < info.min or cols[name].max() > info.max):
            raise TableFormatError(f"{meta['table_id']}: column {name} does not fit {np.dtype(dtype).name}")


def build_index(meta: dict, cols: dict, source_sha256: str) -> dict:
    """The arrays of ``<table_id>.index.npz`` (see mmaemu.platform.tables); TableFormatError on a repeated key."""
    cols = {name: np.asarray(cols[name], dtype=np.int64) for name in KEY_COLUMNS + tuple(VALUE_COLUMNS)}
    codes = setting_code(cols["ws"], cols["out"], cols["fast"], cols["fa"], cols["fb"])
    keys = shape_key(cols["M"], cols["N"], cols["K"])
    order = np.lexsort((keys, codes))
    codes, keys = codes[order], keys[order]
    same = (codes[1:] == codes[:-1]) & (keys[1:] == keys[:-1])
    if same.any():
        raise TableFormatError(f"{meta['table_id']}: {int(same.sum())} duplicate keys")
    offsets = np.searchsorted(codes, np.arange(N_SETTING_CODES + 1), side="left").astype(np.int64)
    index = {
        "format": np.array(INDEX_FORMAT),
        "table_id": np.array(meta["table_id"]),
        "source_npz_sha256": np.array(source_sha256),
        "rows": np.array(len(keys), dtype=np.int64),
        "setting_offsets": offsets,
        "shape_key_delta": np.diff(keys, prepend=np.int64(0)).astype(np.int64),
    }
    for name, dtype in VALUE_COLUMNS.items():
        index[name] = cols[name][order].astype(dtype)
    return index


_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def npz_bytes(arrays: dict) -> bytes:
    """An npz of ``arrays`` like np.savez_compressed, but with fixed zip timestamps and no pickles, so identical
    input gives identical bytes (and an identical sha256)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(array, order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)
    return out.getvalue()
