"""The environment variables mmaemu reads: one list, kept here.

``mmaemu info`` prints these (and no other ``MMAEMU_*`` variable: an unknown one may hold anything, a token
included), the environment table of ``docs/guide.md`` lists exactly these names, and a test checks that no other
``MMAEMU_*`` name appears in the package's code. A variable with a set of valid values has a check that says what
is wrong with a value (``info`` flags it).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Optional

__all__ = ["EnvVar", "VARIABLES", "NAMES", "set_variables", "problems", "unread_count"]


def _profile_problem(value: str) -> Optional[str]:
    from .platform.profiles import get_profile

    try:
        get_profile(value)
    except KeyError as exc:
        return exc.args[0] if exc.args else str(exc)
    return None


def _backend_problem(value: str) -> Optional[str]:
    from .backends import requested_backend

    try:
        requested_backend(value)
    except ValueError as exc:
        return str(exc)
    return None


def _profile_path_problem(value: str) -> Optional[str]:
    from .platform.bundles import path_entries  # the entries as the loader reads them

    missing = [str(entry) for entry in path_entries(value) if not entry.is_dir()]
    return f"not a folder: {', '.join(missing)}" if missing else None


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """A variable mmaemu reads: its name, what it does, and (optionally) what is wrong with a value (None: fine).
    An empty value counts as unset everywhere mmaemu reads these."""

    name: str
    effect: str
    problem: Optional[Callable[[str], Optional[str]]] = None


VARIABLES = (
    EnvVar("MMAEMU_PROFILE", "default profile when profile=None (unset or empty: hopper)", _profile_problem),
    EnvVar("MMAEMU_BACKEND", "replaces backend='auto'", _backend_problem),
    EnvVar("MMAEMU_SPLITK_POLICY", "assume-unsplit: splitk='auto' takes S = 1 (and warns) where the evidence does "
           "not decide", lambda v: None if v.strip() in ("auto", "assume-unsplit") else
           "not a split-K policy: use auto or assume-unsplit"),
    EnvVar("MMAEMU_SPLITK_STRICT", "1: envelope inferences raise SplitKUnknownError"),
    EnvVar("MMAEMU_DISABLE_CUDA", "1 (or true/yes/on): never touch CUDA; no live cuBLASLt query"),
    EnvVar("MMAEMU_CACHE_DIR", "where compiled code and self-test verdicts are cached"),
    EnvVar("MMAEMU_LIBCUDA_PATH", "explicit path of libcuda for the device probe"),
    EnvVar("MMAEMU_NVRTC_PATH", "explicit path of libnvrtc, whose version mmaemu info reports"),
    EnvVar("MMAEMU_PROFILE_PATH", "recorded profile bundles to load (os.pathsep-separated folders)",
           _profile_path_problem),
    EnvVar("MMAEMU_TEST_FORCE_FAIL", "tests only: comma list of CUDA kernels whose self-test is made to fail"),
)
NAMES = tuple(v.name for v in VARIABLES)
_BY_NAME = {v.name: v for v in VARIABLES}


def set_variables() -> Dict[str, str]:
    """{name: value} of the variables of :data:`VARIABLES` that are set (and not empty), in that order."""
    return {name: os.environ[name] for name in NAMES if os.environ.get(name)}


def problems() -> Dict[str, str]:
    """{name: what is wrong} for the set variables whose value is invalid."""
    found = {}
    for name, value in set_variables().items():
        check = _BY_NAME[name].problem
        problem = check(value) if check is not None else None
        if problem is not None:
            found[name] = problem
    return found


def unread_count() -> int:
    """How many other ``MMAEMU_*`` variables are set (their names and values are never shown)."""
    return sum(1 for name in os.environ if name.startswith("MMAEMU_") and name not in _BY_NAME)
