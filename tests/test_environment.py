"""The environment: one module reads the MMAEMU_* variables, one parser per variable (one for every boolean), and
the bugs that reading them in several places caused (issues 17.2, 23.14-16)."""

from __future__ import annotations

import ast
import os
import pathlib
import warnings

import pytest
import torch

import mmaemu
from mmaemu.base import _cache, device_facts
from mmaemu.cli import diagnostics
from mmaemu import environment, warn
from mmaemu.errors import CacheWarning
from mmaemu.platform import cublaslt

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mmaemu"


def _environ_reads(tree: ast.AST):
    """(line, key expression) of every read of the environment in a module: os.environ[...], os.environ.get(...),
    os.getenv(...), ... in os.environ, and the same through ``from os import environ, getenv``."""
    def is_environ(node):
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id == "environ")

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            yield node.lineno, node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault") and is_environ(func.value):
                yield node.lineno, node.args[0]
            elif (isinstance(func, ast.Attribute) and func.attr == "getenv") or (
                    isinstance(func, ast.Name) and func.id == "getenv"):
                yield node.lineno, node.args[0]
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            yield node.lineno, node.left


def _string_constants(tree: ast.AST) -> dict:
    """{name: value} of the string constants a module assigns (NAME = "MMAEMU_X" at any level)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _key_text(key: ast.AST, constants: dict, imported: dict):
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    if isinstance(key, ast.JoinedStr):
        return "".join(str(v.value) for v in key.values if isinstance(v, ast.Constant))
    if isinstance(key, ast.Name):
        return constants.get(key.id, imported.get(key.id, f"<name {key.id}>"))
    if isinstance(key, ast.Attribute):
        return imported.get(key.attr, f"<attribute {key.attr}>")
    return f"<{type(key).__name__}>"


def test_only_the_environment_module_reads_mmaemu_variables():
    """No module but mmaemu/environment.py reads an MMAEMU_* variable from os.environ (a constant holding the name
    counts, as does a computed name that cannot be checked)."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}
    every_constant = {}
    for tree in trees.values():
        every_constant.update(_string_constants(tree))
    offenders = []
    for path, tree in trees.items():
        if path == PACKAGE / "environment.py":
            continue
        constants = _string_constants(tree)
        for line, key in _environ_reads(tree):
            text = _key_text(key, constants, every_constant)
            if text.startswith("MMAEMU_") or text.startswith("<"):
                offenders.append(f"{path.relative_to(ROOT)}:{line} reads {text}")
    assert offenders == [], "read the variable through mmaemu.environment.snapshot(): " + "; ".join(offenders)


def test_the_scan_finds_each_form_of_read():
    code = ("import os\nfrom os import environ, getenv\nNAME = 'MMAEMU_X'\n"
            "a = os.environ.get('MMAEMU_A')\nb = os.environ[NAME]\nc = getenv('MMAEMU_C')\n"
            "d = 'MMAEMU_D' in environ\ne = os.getenv('HOME')\n")
    tree = ast.parse(code)
    texts = [_key_text(key, _string_constants(tree), {}) for _, key in _environ_reads(tree)]
    assert sorted(texts) == ["HOME", "MMAEMU_A", "MMAEMU_C", "MMAEMU_D", "MMAEMU_X"]


# Who may take a reading of the variables (mmaemu.environment.snapshot / texts / set_variables / problems with no
# snapshot given): the edge, and the few readers of where things are that no call decides. A decision reads the
# environment of its context (mmaemu.context.environment_of, which is the one reading of a decision called without
# a context: by a test, or by code outside the entry points).
READERS = {
    "mmaemu.environment": "the variables' own module",
    "mmaemu.context": "for_call (the reading of an entry point) and environment_of (of a call without a context)",
    "mmaemu.base._cache": "where the compiled-code cache lives, read when the cache is first opened",
    "mmaemu.base.device_facts": "which libcuda the device probe loads",
    "mmaemu.plan.cache": "the raw texts of the variables, the key of the plan cache at the entry point",
    "mmaemu.cli.diagnostics": "the edge: mmaemu info",
    "mmaemu.record": "the edge: mmaemu record",
    "mmaemu.cli": "the edge: the command line",
}
_READING_FUNCTIONS = ("snapshot", "texts", "set_variables", "problems")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _environment_readings(tree: ast.AST):
    """Lines of the calls ``environment.<reading function>(...)`` in a module, and of the same functions imported
    by name from mmaemu.environment (``problems`` counts only without a snapshot given)."""
    imported = {alias.asname or alias.name: alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").endswith("environment") for alias in node.names
                if alias.name in _READING_FUNCTIONS}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (func.attr if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == "environment" else imported.get(func.id) if isinstance(func, ast.Name)
                else None)
        if name in _READING_FUNCTIONS and not (name == "problems" and len(node.args) + len(node.keywords) > 1):
            yield node.lineno


def _is_reader(module: str) -> bool:
    return any(module == reader or module.startswith(reader + ".") for reader in READERS)


def test_only_the_edge_takes_a_reading_of_the_variables():
    """No policy layer reads the environment itself: the profile, split-K, backend, kernel and engine choices read
    the snapshot of the context they are given (issue 17: one context for every decision)."""
    offenders = [f"{path.relative_to(ROOT)}:{line}"
                 for path in sorted(PACKAGE.rglob("*.py")) if not _is_reader(_module_name(path))
                 for line in _environment_readings(ast.parse(path.read_text(encoding="utf-8")))]
    assert offenders == [], ("read the environment of the decision's context (mmaemu.context.environment_of): "
                             + "; ".join(offenders))


def test_the_reading_scan_finds_each_form():
    code = ("from mmaemu import environment\nfrom mmaemu.environment import snapshot as now, problems\n"
            "a = environment.snapshot()\nb = now()\nc = environment.texts()\nd = problems(CHECKS)\n"
            "e = problems(CHECKS, env)\nf = other.snapshot()\n")
    assert list(_environment_readings(ast.parse(code))) == [3, 4, 5, 6]


@pytest.mark.parametrize("call", ["scaled_mm", "accumulate"])
def test_a_planned_call_reads_the_environment_once(monkeypatch, call):
    """A call that is planned decides everything (profile, split-K, backend, CPU engine) from one reading of the
    environment, its context's; a call served by the plan cache takes none (the cache's key is the variables'
    raw texts)."""
    from mmaemu.plan import cache

    readings = []
    real = environment.snapshot

    def counting(environ=None):
        readings.append(environ)
        return real(environ)

    a = torch.full((4, 32), 0.5).to(torch.float8_e4m3fn)
    b = torch.full((16, 32), 0.25).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    mmaemu.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, splitk=1)  # compiled and cache folder opened
    monkeypatch.setattr(environment, "snapshot", counting)
    run = {"scaled_mm": lambda: mmaemu.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, splitk=1),
           "accumulate": lambda: mmaemu.accumulate(a, b.t(), use_fast_accum=False, splitk=1)}[call]
    cache.clear()
    run()
    assert readings == [None]
    run()
    assert readings == [None]


# ----------------------------------------------------------------------------------------------------------------
# The parsers and the snapshot


@pytest.mark.parametrize("text, value", [("1", True), ("true", True), ("YES", True), (" On ", True), ("True", True),
                                         ("0", False), ("false", False), ("No", False), ("OFF", False)])
def test_one_boolean_parser(text, value):
    assert environment.parse_bool(text) is value


def test_every_boolean_variable_uses_the_one_parser():
    booleans = [v.name for v in environment.VARIABLES if v.parse is environment.parse_bool]
    assert booleans == ["MMAEMU_SPLITK_STRICT", "MMAEMU_DISABLE_CUDA"]
    env = environment.snapshot({"MMAEMU_SPLITK_STRICT": "maybe", "MMAEMU_DISABLE_CUDA": "True"})
    assert env["MMAEMU_DISABLE_CUDA"] is True and env["MMAEMU_SPLITK_STRICT"] is False  # invalid: the default
    assert set(env.invalid) == {"MMAEMU_SPLITK_STRICT"} and "not a boolean" in env.invalid["MMAEMU_SPLITK_STRICT"]


def test_snapshot_is_immutable_and_empty_means_unset():
    env = environment.snapshot({"MMAEMU_PROFILE": "", "MMAEMU_BACKEND": "cpu", "MMAEMU_OTHER": "secret"})
    assert dict(env.raw) == {"MMAEMU_BACKEND": "cpu"} and env["MMAEMU_PROFILE"] is None
    assert env["MMAEMU_TEST_FORCE_FAIL"] == () and env["MMAEMU_DISABLE_CUDA"] is False
    with pytest.raises(TypeError):
        env.values["MMAEMU_BACKEND"] = "cuda"
    with pytest.raises(Exception):
        env.raw = {}


def test_texts_follow_every_change_of_the_variables(monkeypatch):
    """texts() keeps the decoded texts of its last call and compares the raw ones at each call: a value set,
    changed, set back (a new object with equal text) or unset is read as os.environ reads it."""
    for name in environment.NAMES:
        monkeypatch.delenv(name, raising=False)
    assert environment.texts() == tuple(map(os.environ.get, environment.NAMES)) == (None,) * len(environment.NAMES)
    profile = environment.NAMES.index("MMAEMU_PROFILE")
    for value in ("ada", "hopper", "h\u00f6pper", "ada", ""):
        monkeypatch.setenv("MMAEMU_PROFILE", value)
        texts = environment.texts()
        assert texts == tuple(map(os.environ.get, environment.NAMES)) and texts[profile] == value
        assert environment.texts() == texts
    monkeypatch.setenv("MMAEMU_BACKEND", "cpu")
    assert environment.texts() == tuple(map(os.environ.get, environment.NAMES))
    monkeypatch.delenv("MMAEMU_PROFILE")
    assert environment.texts()[profile] is None and environment.texts() == tuple(map(os.environ.get,
                                                                                      environment.NAMES))


def test_info_flags_an_unrecognised_boolean(monkeypatch):
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "maybe")
    monkeypatch.setenv("MMAEMU_SPLITK_STRICT", "2")
    problems = diagnostics.environment_problems()
    assert set(problems) == {"MMAEMU_SPLITK_STRICT", "MMAEMU_DISABLE_CUDA"}
    assert all("not a boolean" in why for why in problems.values())


# ----------------------------------------------------------------------------------------------------------------
# The bugs of reading a variable in several places (issue 17.2, 23.14)


def test_disable_cuda_true_keeps_the_device_matching_off_cuda(monkeypatch):
    """MMAEMU_DISABLE_CUDA=true turned the kernels off while platform/cublaslt.py still probed libcuda."""
    probed = []

    def probe(*args, **kwargs):  # the matcher turns any error into "no match": record the call instead
        probed.append(args)
        raise RuntimeError("probed")

    monkeypatch.setattr(cublaslt, "driver_device_info", probe)
    monkeypatch.setattr(cublaslt, "load_cublaslt", probe)
    monkeypatch.setattr(device_facts, "load_libcuda", probe)
    for value in ("true", "yes", "ON"):
        monkeypatch.setenv("MMAEMU_DISABLE_CUDA", value)
        assert mmaemu.get_profile("hopper").matches_device("cuda:0") is False
        assert probed == [], f"probed CUDA although MMAEMU_DISABLE_CUDA={value}"
        assert mmaemu.backends.cuda_disabled()
        assert diagnostics.cuda_unusable(0) == f"CUDA disabled by MMAEMU_DISABLE_CUDA={value}"


def test_disable_cuda_false_words_do_not_disable(monkeypatch):
    for value in ("0", "false", "off", "no"):
        monkeypatch.setenv("MMAEMU_DISABLE_CUDA", value)
        assert not mmaemu.backends.cuda_disabled() and diagnostics.cuda_disabled_value() is None


# ----------------------------------------------------------------------------------------------------------------
# A relative cache folder (issue 23.15)


def test_relative_cache_dir_is_passed_over_with_a_warning_and_flagged(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MMAEMU_CACHE_DIR", "../../etc")
    location = _cache.cache_location()
    assert location.source != "MMAEMU_CACHE_DIR" and location.root != (tmp_path / "../../etc").resolve()
    (folder, why), *_ = location.passed_over
    assert folder == "../../etc" and why.startswith("MMAEMU_CACHE_DIR: a relative path ('../../etc') is ignored")
    assert "relative path" in diagnostics.environment_problems()["MMAEMU_CACHE_DIR"]
    warn.reset()
    monkeypatch.setattr(_cache, "_NUMBA_LOCATION", None)  # as at the first compilation of a process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _cache.numba_location()
        _cache.numba_location()
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and "does not use the cache folder ../../etc" in messages[0]
    assert list(tmp_path.iterdir()) == []  # nothing was created beside the working directory


def test_absolute_and_home_cache_dirs_are_used(monkeypatch, tmp_path):
    monkeypatch.setenv("MMAEMU_CACHE_DIR", str(tmp_path / "cache"))
    assert _cache.cache_location().source == "MMAEMU_CACHE_DIR"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MMAEMU_CACHE_DIR", "~/cache")
    location = _cache.cache_location()
    assert location.source == "MMAEMU_CACHE_DIR" and location.root == (tmp_path / "cache").resolve()


# ----------------------------------------------------------------------------------------------------------------
# Errors name the variable (issue 23.16)


def test_an_invalid_profile_variable_is_named(monkeypatch):
    monkeypatch.setenv("MMAEMU_PROFILE", "h100-sxm")
    with pytest.raises(KeyError, match=r"unknown profile 'h100-sxm' \(from MMAEMU_PROFILE\); known profiles"):
        mmaemu.get_profile(None)
    with pytest.raises(KeyError, match=r"unknown profile 'nope'; known"):  # an argument is not the variable
        mmaemu.get_profile("nope")


def test_an_invalid_backend_variable_is_named(monkeypatch):
    monkeypatch.setenv("MMAEMU_BACKEND", "tpu")
    a = torch.zeros(16, 32).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    with pytest.raises(ValueError, match=r"unknown backend 'tpu' \(from MMAEMU_BACKEND\); expected"):
        mmaemu.scaled_mm(a, a.t(), one, one, out_dtype=torch.float32, splitk=1)
    with pytest.raises(ValueError, match=r"unknown backend 'gpu'; expected"):
        mmaemu.backends.requested_backend("gpu")
    assert mmaemu.explain(a, a.t(), one, one, out_dtype=torch.float32, splitk=1).validation[0] == "ValueError"
