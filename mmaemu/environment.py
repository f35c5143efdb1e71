"""The environment variables mmaemu reads: one list, one reader, one parser per variable.

This is the only module that reads ``os.environ`` for ``MMAEMU_*`` names (a test scans the package for others).
Each variable of :data:`VARIABLES` is declared once with its parser; :func:`snapshot` reads them all at once into
an immutable :class:`Snapshot` of parsed values, which the consumers read (``snapshot()["MMAEMU_DISABLE_CUDA"]``).
An unset or empty variable takes its default; so does one whose value its parser refuses, and
``python -m mmaemu info`` flags that value (:func:`problems`). Every boolean has the one parser
:func:`parse_bool`: 1/true/yes/on and 0/false/no/off, in any case.

``mmaemu info`` prints these variables (and no other ``MMAEMU_*`` variable: an unknown one may hold anything, a
token included), and the environment table of ``docs/guide.md`` lists exactly these names. Checks that need
other parts of mmaemu (is this a profile, a backend?) are not made here: this module imports nothing of mmaemu,
and the caller (the ``info`` report) passes them to :func:`problems`, which gives them the parsed values.
"""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

__all__ = ["EnvVar", "VARIABLES", "NAMES", "Snapshot", "snapshot", "texts", "parse_bool", "set_variables",
           "problems", "unread_count"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
CPU_ENGINES = ("auto", "offset", "tile")


# ----------------------------------------------------------------------------------------------------------------
# Parsers: text -> value, ValueError (its message says what is wrong) for a value the variable cannot take


def parse_text(text: str) -> str:
    return text


def parse_stripped(text: str) -> str:
    """The text without surrounding blanks (a word whose valid values its owner checks)."""
    return text.strip()


def parse_bool(text: str) -> bool:
    """1/true/yes/on -> True, 0/false/no/off -> False (case and surrounding blanks ignored); else ValueError."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"not a boolean: use one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}")


def parse_absolute_path(text: str) -> str:
    """An absolute path (``~`` expanded); a relative one is refused, as the XDG base directory rules refuse
    relative paths: it would name another folder in every working directory."""
    path = os.path.expanduser(text)
    if not os.path.isabs(path):
        raise ValueError(f"a relative path ({text!r}) is ignored: it would name another folder in every working "
                         "directory; give an absolute path")
    return path


def parse_cpu_engine(text: str) -> str:
    """auto, offset or tile (case and surrounding blanks ignored); else ValueError."""
    word = text.strip().lower()
    if word not in CPU_ENGINES:
        raise ValueError(f"not a CPU engine: use one of {', '.join(CPU_ENGINES)}")
    return word


def parse_name_list(text: str) -> Tuple[str, ...]:
    """A comma list of names (blanks around names and empty entries dropped)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


# ----------------------------------------------------------------------------------------------------------------
# The variables


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """A variable mmaemu reads: its name, what it does, its parser and the value when unset, empty or invalid."""

    name: str
    effect: str
    parse: Callable[[str], Any] = parse_text
    default: Any = None


VARIABLES = (
    EnvVar("MMAEMU_PROFILE", "default profile when profile=None (unset or empty: hopper)"),
    EnvVar("MMAEMU_BACKEND", "replaces backend='auto'"),
    EnvVar("MMAEMU_SPLITK_POLICY", "assume-unsplit: splitk='auto' takes S = 1 (and warns) where the evidence does "
           "not decide", parse_stripped),
    EnvVar("MMAEMU_SPLITK_STRICT", "true (1/true/yes/on): envelope inferences raise SplitKUnknownError",
           parse_bool, False),
    EnvVar("MMAEMU_DISABLE_CUDA", "true (1/true/yes/on): never touch CUDA; no live cuBLASLt query",
           parse_bool, False),
    EnvVar("MMAEMU_CPU_ENGINE", "the CPU backend's engine: auto (the offset engine where the CPU has AVX-512, or "
           "AVX2 and FMA, and the call fits it, else the tile engine), offset (raises where it cannot run) or tile",
           parse_cpu_engine, "auto"),
    EnvVar("MMAEMU_CACHE_DIR", "where compiled code and self-test verdicts are cached (an absolute path)",
           parse_absolute_path),
    EnvVar("MMAEMU_LIBCUDA_PATH", "explicit path of libcuda for the device probe"),
    EnvVar("MMAEMU_NVRTC_PATH", "explicit path of libnvrtc, whose version mmaemu info reports"),
    EnvVar("MMAEMU_PROFILE_PATH", "recorded profile bundles to load (os.pathsep-separated folders)"),
    EnvVar("MMAEMU_TEST_FORCE_FAIL", "tests only: comma list of CUDA kernels whose self-test is made to fail",
           parse_name_list, ()),
)
NAMES = tuple(v.name for v in VARIABLES)
_BY_NAME = {v.name: v for v in VARIABLES}


# ----------------------------------------------------------------------------------------------------------------
# The snapshot


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The variables of :data:`VARIABLES` as read at one moment.

    ``raw``: {name: text} of the set (non-empty) ones, in declaration order; ``invalid``: {name: what is wrong} of
    those whose parser refused the text; ``snapshot[name]``: the parsed value (the default when unset, empty or
    invalid). Read-only mappings.
    """

    raw: Mapping[str, str]
    invalid: Mapping[str, str]
    values: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def is_set(self, name: str) -> bool:
        """The variable has a value that its parser accepted."""
        return name in self.raw and name not in self.invalid


def snapshot(environ: Optional[Mapping[str, str]] = None) -> Snapshot:
    """Read and parse every variable now (``environ``: os.environ, or a mapping given by a test)."""
    environ = os.environ if environ is None else environ
    raw: Dict[str, str] = {}
    invalid: Dict[str, str] = {}
    values: Dict[str, Any] = {}
    for var in VARIABLES:
        text = environ.get(var.name)
        values[var.name] = var.default
        if not text:
            continue
        raw[var.name] = text
        try:
            values[var.name] = var.parse(text)
        except ValueError as exc:
            invalid[var.name] = str(exc)
    return Snapshot(types.MappingProxyType(raw), types.MappingProxyType(invalid), types.MappingProxyType(values))


def texts() -> Tuple[Optional[str], ...]:
    """The raw text of every variable of :data:`VARIABLES` (None when unset), in declaration order: what
    :func:`snapshot` parses, read without parsing (a key of everything the variables can decide, for caches).

    Read on every call of the plan cache (:mod:`mmaemu.plan.cache`), so it is read straight from the store of
    ``os.environ`` where that is CPython's own mapping on POSIX (its ``_data`` dict of encoded names and values:
    about 0.3 us for the eleven names, against 6 us through ``os.environ.get``, which raises and catches a
    KeyError per unset name); the same texts, decoded as ``os.environ`` decodes them. Any other ``os.environ``
    (Windows, a mapping put in its place) is read through ``get``."""
    global _LAST_DECODED
    environ = os.environ
    if type(environ) is _POSIX_ENVIRON:
        raw = tuple(map(environ._data.get, _ENCODED_NAMES))
        if raw.count(None) == len(raw):  # none set (the usual case): nothing to decode
            return raw
        last = _LAST_DECODED
        if last[0] == raw:  # the same texts as at the last call (compared, not assumed): decoded then
            return last[1]
        decoded = tuple(None if text is None else environ.decodevalue(text) for text in raw)
        _LAST_DECODED = (raw, decoded)  # one assignment: a thread reads the old pair or the new one
        return decoded
    return tuple(map(environ.get, NAMES))


# (raw texts, their decoded texts) of the last texts() call that had any variable set: 7 us of decoding per call
# of the plan cache where one is set (MMAEMU_PROFILE, MMAEMU_CACHE_DIR), 0.1 us to compare.
_LAST_DECODED = (None, None)


# os.environ's own class where its keys are the encoded names (POSIX); None elsewhere (texts() then uses get).
_POSIX_ENVIRON = os._Environ if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict) else None
_ENCODED_NAMES = tuple(os.environ.encodekey(name) for name in NAMES) if _POSIX_ENVIRON is not None else ()


def set_variables() -> Dict[str, str]:
    """{name: value} of the variables of :data:`VARIABLES` that are set (and not empty), in that order."""
    return dict(snapshot().raw)


def problems(checks: Optional[Mapping[str, Callable[[Any], Optional[str]]]] = None,
             env: Optional[Snapshot] = None) -> Dict[str, str]:
    """{name: what is wrong} for the set variables whose value is invalid: refused by its parser, or (``checks``:
    {name: check}) found wrong by a check given the parsed value (the check returns None when it is fine)."""
    env = snapshot() if env is None else env
    found = dict(env.invalid)
    for name, check in (checks or {}).items():
        if env.is_set(name):
            problem = check(env[name])
            if problem is not None:
                found[name] = problem
    return {name: found[name] for name in NAMES if name in found}


def unread_count() -> int:
    """How many other ``MMAEMU_*`` variables are set (their names and values are never shown)."""
    return sum(1 for name in os.environ if name.startswith("MMAEMU_") and name not in _BY_NAME)
