"""The schema of a recorded profile bundle's json files: every field the loader and the split-K code read, with its
type and value range, checked once when a bundle is read (:func:`mmaemu.platform.bundles.read_bundle`).

A schema is built from a few node types (:class:`Int`, :class:`Str`, :class:`Bool`, :class:`Nullable`,
:class:`List`, :class:`Map`, :class:`Obj`); :func:`check` walks a parsed json value against one and raises
:class:`SchemaError` naming the field by its path (``platform.sm_count``, ``profiles[1].workspace_bytes``).
Fields no code reads are not constrained (a newer recorder may add some). Rules that tie fields together (the
envelope's grid and bounds) are checked by :func:`check_table_rules` after the types.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Optional, Tuple

from .definitions import CALLERS, FORMATS, OUT_DTYPES

__all__ = ["SchemaError", "Int", "Str", "Bool", "Nullable", "List", "Map", "Obj", "check", "check_table_rules",
           "manifest_schema", "table_schema", "combos_schema", "replays_schema", "NAME_PATTERN", "FILE_PATTERN"]

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}\Z")  # bundle and profile names (lowercase slugs)
FILE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\Z")  # plain file names inside the bundle folder
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DIGITS = re.compile(r"^[0-9]{1,15}$")
_SPLIT_SCHEMES = ("serial", "pairwise", "contiguous")
_MATURITIES = ("validated", "experimental")
_SHAPE_LIMIT = 1 << 21  # platform.md 3.4
_BYTES_LIMIT = 1 << 40  # workspaces: any size a GPU could hand cuBLASLt
_TEXT = 4096  # longest free text (messages, notes, versions)
_MANY = 100_000  # longest list of a json file (settings, bounds, replays, combos)


def _slug() -> "Str":
    return Str(pattern=NAME_PATTERN, what="a lowercase slug (a-z, 0-9, '.', '_', '-'; at most 80)")


def _code() -> "Str":
    return Str(pattern=_DIGITS, what="a decimal code")


def _file() -> "Str":
    return Str(pattern=FILE_PATTERN, what="a plain file name")


class SchemaError(ValueError):
    """A field of a bundle json that is missing, of the wrong type or outside its range; ``path`` names it."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"field {path or '(top level)'} {problem}")
        self.path, self.problem = path, problem


@dataclasses.dataclass(frozen=True)
class Int:
    lo: int = 0
    hi: int = _BYTES_LIMIT

    def check(self, value, path: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not self.lo <= value <= self.hi:
            raise SchemaError(path, f"must be an integer in [{self.lo}, {self.hi}], got {_short(value)}")


@dataclasses.dataclass(frozen=True)
class Str:
    choices: Optional[Tuple[str, ...]] = None
    pattern: Optional[re.Pattern] = None
    max_len: int = _TEXT
    what: str = ""  # what the pattern describes, for the message

    def check(self, value, path: str) -> None:
        if not isinstance(value, str) or len(value) > self.max_len:
            raise SchemaError(path, f"must be a string of at most {self.max_len} characters, got {_short(value)}")
        if self.choices is not None and value not in self.choices:
            raise SchemaError(path, f"must be one of {list(self.choices)}, got {_short(value)}")
        if self.pattern is not None and self.pattern.match(value) is None:
            raise SchemaError(path, f"must be {self.what or 'a string matching ' + self.pattern.pattern}, got "
                                    f"{_short(value)}")


@dataclasses.dataclass(frozen=True)
class Bool:
    def check(self, value, path: str) -> None:
        if not isinstance(value, bool):
            raise SchemaError(path, f"must be true or false, got {_short(value)}")


@dataclasses.dataclass(frozen=True)
class Nullable:
    inner: Any

    def check(self, value, path: str) -> None:
        if value is not None:
            self.inner.check(value, path)


@dataclasses.dataclass(frozen=True)
class List:
    item: Any
    min_len: int = 0
    max_len: int = _MANY

    def check(self, value, path: str) -> None:
        if not isinstance(value, list) or not self.min_len <= len(value) <= self.max_len:
            raise SchemaError(path, f"must be a list of {self.min_len} to {self.max_len} items, got {_short(value)}")
        for i, item in enumerate(value):
            self.item.check(item, f"{path}[{i}]")


@dataclasses.dataclass(frozen=True)
class Map:
    key: Str
    value: Any
    max_len: int = _MANY

    def check(self, value, path: str) -> None:
        if not isinstance(value, dict) or len(value) > self.max_len:
            raise SchemaError(path, f"must be an object of at most {self.max_len} entries, got {_short(value)}")
        for key, item in value.items():
            self.key.check(key, f"{path} key")
            self.value.check(item, f"{path}[{key!r}]")


@dataclasses.dataclass(frozen=True)
class Obj:
    required: Dict[str, Any]
    optional: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def check(self, value, path: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(path, f"must be an object, got {_short(value)}")
        for key, spec in self.required.items():
            if key not in value:
                raise SchemaError(_join(path, key), "is missing")
            spec.check(value[key], _join(path, key))
        for key, spec in self.optional.items():
            if key in value:
                spec.check(value[key], _join(path, key))


def check(value, schema) -> None:
    """Raise SchemaError naming the first field of ``value`` that ``schema`` refuses."""
    schema.check(value, "")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_FORMAT = Str(FORMATS)
_OUT = Str(OUT_DTYPES)
_SETTING = {"ws": Int(), "out": _OUT, "fast": Bool(), "fmt_a": _FORMAT, "fmt_b": _FORMAT}


def manifest_schema(bundle_format: str) -> Obj:
    """profile.json: what :mod:`mmaemu.platform.bundles` reads to build the profiles."""
    profile = Obj({"name": _slug(), "caller": Str(CALLERS), "workspace_bytes": Int(),
                   "align": Nullable(Int(1, 1 << 20)), "splitk_maturity": Str(_MATURITIES)})
    reject = Obj({"fmt_a": Nullable(_FORMAT), "fmt_b": Nullable(_FORMAT), "out": Nullable(_OUT),
                  "message": Str()})
    platform = Obj({"gpu": Str(max_len=200), "sm_count": Int(1, 1 << 16), "capability": List(Int(0, 99), 2, 2),
                    "cublaslt": Str(max_len=200), "torch": Str(max_len=200)})
    return Obj({"format": Str((bundle_format,)), "name": _slug(),
                "files": Map(_file(), Str(pattern=_SHA256, what="a sha256 in hex"), max_len=64),
                "table_id": _file(), "table_json": _file(),
                "preset": Str(max_len=200), "platform": platform, "maturity": Str(_MATURITIES),
                "profiles": List(profile, 1, 16), "rejects": List(reject, 0, 1000)},
               {"replays": Nullable(_file()), "splitk_notes": Map(_slug(), Str())})


def table_schema(table_format: str) -> Obj:
    """The table json (``mmaemu-splitk-table/1``): what :class:`mmaemu.platform.tables.SplitTable`, the split-K
    decisions (:mod:`mmaemu.platform.splitk`) and ``mmaemu info`` read."""
    setting = Obj(dict(_SETTING, rows=Int(), split_rows=Int(), S_values=List(Int(2, 255), 0, 255),
                       max_split_MN=Nullable(Int(0, 1 << 42))))
    bound = Obj(dict(_SETTING, B=List(Nullable(Int(0, 1 << 42)), 0, 4096)))
    failure = Obj(dict({k: Int(1, _SHAPE_LIMIT - 1) for k in "MNK"}, fmt_a=_FORMAT, fmt_b=_FORMAT, out=_OUT,
                       fast=Bool(), splitK=Int(1, 255), custom=Int(0, 255)))
    validation = Obj({}, {"status": Str(max_len=200), "tested": Int(), "split_above_bound": Int(),
                          "failures": Nullable(List(failure, 0, 1000))})
    envelope = Obj({}, {"inference": Bool(), "kind": Str(("k_grid", "max_split_MN")),
                        "K_min": Nullable(Int(1, 1 << 32)), "K_max": Nullable(Int(1, 1 << 32)),
                        "K_grid": List(Int(1, 1 << 32), 0, 4096), "bounds": List(bound, 0, 4096),
                        "validation": Map(_code(), validation, 16)})
    codes = Obj({"custom -> scheme": Map(_code(), Str(_SPLIT_SCHEMES), 256),
                 "fa/fb": Map(_code(), _FORMAT, 8), "out": Map(_code(), _OUT, 8),
                 "ws": List(Int(), 1, 4)},
                {"custom -> scheme, unlisted": Nullable(Str(_SPLIT_SCHEMES))})
    layouts = Obj({}, {"ragged_K": Obj({}, {"verified": Bool()})})
    return Obj({"format": Str((table_format,)), "table_id": _file(),
                "npz_sha256": Str(pattern=_SHA256, what="a sha256 in hex"), "rows": Int(0, 1 << 32),
                "verified_combos": _file(), "codes": codes, "settings": List(setting, 0, 4096)},
               {"split_rows": Int(0, 1 << 32), "envelope": envelope, "split_layouts": layouts,
                "workspace0_note": Str()})


def combos_schema(combos_format: str) -> Obj:
    pairs = tuple(f"{a}x{b}" for a in FORMATS for b in FORMATS)
    combo = Obj({"fast": Bool(), "S": Int(1, 255), "scheme": Str(_SPLIT_SCHEMES), "out": _OUT,
                 "fmt_pair": Str(pairs), "verified": Bool()})
    return Obj({"format": Str((combos_format,)), "table_id": _file(),
                "combos": List(combo, 0, _MANY)})


def replays_schema(replays_format: str) -> Obj:
    """replays.json: the loader reads only the counts (the maturity follows from them)."""
    return Obj({"format": Str((replays_format,)), "passed": Int(0, 1 << 32), "failed": Int(0, 1 << 32)})


def check_table_rules(meta: dict) -> None:
    """Rules between the table json's fields that the split-K decisions rely on: a k_grid envelope that infers has
    a strictly increasing K grid from K_min to K_max and one bound per grid K in every bounds entry; a setting
    with split rows names its largest split M*N."""
    for i, entry in enumerate(meta["settings"]):
        if entry["split_rows"] > entry["rows"] or (entry["split_rows"] and entry["max_split_MN"] is None):
            raise SchemaError(f"settings[{i}]", "has more split rows than rows, or split rows without max_split_MN")
    envelope = meta.get("envelope", {})
    if envelope.get("inference", True) is False or envelope.get("kind", "max_split_MN") != "k_grid":
        return
    grid = envelope.get("K_grid")
    if not grid or any(a >= b for a, b in zip(grid, grid[1:])):
        raise SchemaError("envelope.K_grid", "must be a non-empty, strictly increasing list for a k_grid envelope")
    if envelope.get("K_min") is None or envelope.get("K_max") is None or not (
            grid[0] <= envelope["K_min"] <= envelope["K_max"] <= grid[-1]):
        raise SchemaError("envelope.K_min", "and K_max must lie within the K grid for a k_grid envelope")
    for i, entry in enumerate(envelope.get("bounds", [])):
        if len(entry["B"]) != len(grid):
            raise SchemaError(f"envelope.bounds[{i}].B", f"must hold one bound per grid K ({len(grid)})")
