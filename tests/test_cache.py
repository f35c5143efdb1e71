"""The compiled-code cache: damaged entries, private folders, read-only caches, what ``info`` reports.

The subprocess tests copy this session's warm cache (so that nothing is compiled in them) and run a small GEMM in a
fresh interpreter; the child prints its result, how many compilations of ``mmaemu.cpu.gemm``'s loops missed the
cache, its cache folder and what ``info`` says about it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from mmaemu.base import _cache, _numba_cache, _private
from mmaemu import cli
from mmaemu.cpu import accumulate_codes
from mmaemu.model.presets import HOPPER

CHILD = r"""
import json, warnings
import numpy as np
warnings.simplefilter("always")
from mmaemu.base import _cache; from mmaemu.cli import diagnostics
from mmaemu.cli import info
from mmaemu.cpu import accumulate_codes, gemm
from mmaemu.model.presets import HOPPER
a = np.full((4, 64), 0x38, np.uint8)
result = float(accumulate_codes(a, a, "e4m3", "e4m3", HOPPER, True, cpu_engine="tile")[0, 0])
loops = [f for f in vars(gemm).values() if hasattr(f, "stats")]
print(json.dumps({"result": result, "misses": sum(sum(f.stats.cache_misses.values()) for f in loops),
                  "hits": sum(sum(f.stats.cache_hits.values()) for f in loops),
                  "folder": str(_cache.numba_location().root),
                  "info": info._numba_cache(diagnostics._numba_cache())}))
"""
CHILD_TIMEOUT_S = 120


def warm_up():
    """The CHILD's GEMM in this process: its loops are then compiled into this session's cache. Both run the tile
    engine (whose loops are the module ``gemm`` the tests count and damage) whatever engine the CPU would choose."""
    a = np.full((4, 64), 0x38, np.uint8)
    assert accumulate_codes(a, a, "e4m3", "e4m3", HOPPER, True, cpu_engine="tile")[0, 0] == 64.0


@pytest.fixture
def warm_copy(tmp_path):
    """A private cache folder holding a copy of this session's compiled code (``<folder>/numba/<key>``)."""
    warm_up()
    location = _cache.numba_location()
    if not location.writable:
        pytest.skip("this session's cache is not writable, so it may not hold the child's loops")
    folder = tmp_path / "cache"
    shutil.copytree(location.numba_dir, folder / "numba" / _cache.cache_key())
    return folder


def child_env(folder, xdg=None, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMAEMU_")}
    env.update(MMAEMU_CACHE_DIR=str(folder), XDG_CACHE_HOME=str(xdg or folder.parent / "no-xdg"), **extra)
    return env


def run_child(env, prefix=()):
    proc = subprocess.run([*prefix, sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "CacheWarning" in line]
    return json.loads(proc.stdout.splitlines()[-1]), warnings


def entry(folder, pattern):
    found = sorted(folder.rglob(pattern))
    assert found, pattern
    return found[0]


# ----------------------------------------------------------------------------------------------------------------
# Damaged entries


@pytest.mark.subprocess
def test_damaged_entries_are_recompiled_with_one_warning_then_repaired(warm_copy):
    for data in warm_copy.rglob("gemm.accumulate_*.nbc"):  # the GEMM loops' compiled code
        os.truncate(data, 100)
    entry(warm_copy, "gemm.decode_panel-*.nbi").write_bytes(os.urandom(300))
    report, warnings = run_child(child_env(warm_copy))
    assert report["result"] == 64.0 and report["misses"] == 2
    assert len(warnings) == 1 and "mmaemu ignores the compiled-code cache entry" in warnings[0]
    report, warnings = run_child(child_env(warm_copy))  # the writable cache has repaired itself
    assert report["result"] == 64.0 and report["misses"] == 0 and report["hits"] > 0 and not warnings


@pytest.mark.filterwarnings("ignore::mmaemu.errors.CacheWarning")
def test_checked_cache_file_detects_every_damage(tmp_path):
    """Truncation, a flipped bit, a foreign file: each is refused before anything is unpickled."""
    folder = tmp_path / "entries"
    _private.make_private_folder(tmp_path, folder)
    cache_file = _numba_cache._CheckedCacheFile(str(folder), "f-1.py311", ("stamp", 1))
    cache_file.save("key", ("payload", 1))
    assert cache_file.load("key") == ("payload", 1)
    data = entry(folder, "*.nbc")
    blob = data.read_bytes()
    for damaged in (blob[:len(blob) // 2], blob[:-1], blob[:-1] + bytes([blob[-1] ^ 1]), pickle.dumps(("payload", 1))):
        data.write_bytes(damaged)
        assert cache_file.load("key") is None
    index = entry(folder, "*.nbi")
    index.write_bytes(b"garbage")
    assert cache_file.load("key") is None and cache_file._load_index() == {}


# ----------------------------------------------------------------------------------------------------------------
# Read-only caches


def run_child_read_only(folder, env):
    """CHILD with ``folder`` read-only: its modes without write bits, or (as root, whom modes do not stop) a
    read-only bind mount in a mount namespace of its own."""
    if os.geteuid() != 0:
        paths = [folder, *folder.rglob("*")]
        for path in paths:
            path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
        try:
            return run_child(env)
        finally:
            for path in paths:
                path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR)
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount, str(folder), "true"], capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("running as root and no read-only bind mount can be made here")
    return run_child(env, prefix=("unshare", "-m", "sh", "-c", mount, str(folder)))


@pytest.mark.subprocess
def test_read_only_populated_cache_is_loaded_not_recompiled(warm_copy):
    report, warnings = run_child_read_only(warm_copy, child_env(warm_copy))
    assert report["result"] == 64.0 and report["misses"] == 0 and report["hits"] > 0
    assert report["folder"] == str(warm_copy.resolve()) and not warnings
    numba_dir = warm_copy.resolve() / "numba" / _cache.cache_key()
    assert report["info"] == [f"  {numba_dir} (read-only: compiled code is loaded from it, nothing is saved; from "
                              f"MMAEMU_CACHE_DIR)"]


# ----------------------------------------------------------------------------------------------------------------
# Private folders


def plant(folder):
    """An index of the child's panel decode loop whose unpickling would create ``folder/PWNED`` (valid checksum)."""
    index = entry(folder, "gemm.decode_panel-*.nbi")

    class Payload:
        def __reduce__(self):
            return (open, (str(folder / "PWNED"), "w"))

    _numba_cache._CheckedCacheFile._write(index, pickle.dumps(Payload()))
    return folder / "PWNED"


@pytest.mark.subprocess
def test_code_planted_in_a_folder_others_can_write_is_never_run(warm_copy, tmp_path):
    private = tmp_path / "xdg" / "mmaemu"
    shutil.copytree(warm_copy, private)
    marker = plant(warm_copy)
    warm_copy.chmod(0o777)
    report, warnings = run_child(child_env(warm_copy, xdg=tmp_path / "xdg"))
    assert not marker.exists()
    assert report["result"] == 64.0 and report["misses"] == 0 and report["folder"] == str(private.resolve())
    assert len(warnings) == 1 and f"does not use the cache folder {warm_copy}" in warnings[0]
    assert "writable by its group and others" in warnings[0]


@pytest.mark.subprocess
def test_the_planted_entry_would_run_from_a_private_folder(warm_copy):
    """The test above is not vacuous: the same planted entry runs when its folder is trusted."""
    marker = plant(warm_copy)
    run_child(child_env(warm_copy))
    assert marker.exists()


def test_location_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fallback = (tmp_path / "xdg" / "mmaemu").resolve()

    def location_of(path):
        monkeypatch.setenv(_cache.ENV, str(path))
        return _cache.cache_location()

    fine = location_of(tmp_path / "new" / "cache")  # created 0700 at the first compilation
    assert fine.root == (tmp_path / "new" / "cache").resolve() and fine.state == "read-write"
    assert not fine.passed_over and fine.source == "MMAEMU_CACHE_DIR"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o775)
    shared.chmod(0o775)
    loose_parent = tmp_path / "loose"
    loose_parent.mkdir()
    loose_parent.chmod(0o757)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    for path, why in ((a_file, "is not a directory"), (shared, "writable by its group (mode 0775)"),
                      (loose_parent / "cache", f"{loose_parent} is writable by others without the sticky bit")):
        location = location_of(path)
        assert location.root == fallback and location.state == "read-write"
        assert location.passed_over[0][0] == str(path) and why in location.passed_over[0][1], location
    assert location_of(sticky / "cache").root == (sticky / "cache").resolve()  # like /tmp: fine
    # Nothing usable at all: no caching, and no folder in the shared temporary directory.
    monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))
    location = location_of(shared)
    assert location.root is None and location.state == "disabled"
    assert [path for path, _ in location.passed_over] == [str(shared), str(a_file / "mmaemu")]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_folders_and_files_of_another_user_are_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv(_cache.ENV, str(theirs))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    location = _cache.cache_location()
    assert location.root != theirs and "owned by uid 65534" in location.passed_over[0][1]
    planted = tmp_path / "planted.nbi"
    planted.write_bytes(b"x")
    os.chown(planted, 65534, 65534)
    with pytest.raises(_private.UnsafePath, match="owned by uid 65534"):
        _private.read_private_file(planted)


def test_private_files_and_folders(tmp_path):
    folder = tmp_path / "a" / "b"
    _private.make_private_folder(tmp_path / "a", folder)
    assert stat.S_IMODE(folder.stat().st_mode) == stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    _private.write_private_file(folder / "f", b"data")
    assert stat.S_IMODE((folder / "f").stat().st_mode) == 0o600
    assert _private.read_private_file(folder / "f") == b"data" and _private.read_private_file(folder / "g") is None
    (folder / "f").chmod(0o620)
    with pytest.raises(_private.UnsafePath, match="writable by its group"):
        _private.read_private_file(folder / "f")
    (folder / "link").symlink_to(folder / "f")
    with pytest.raises(OSError):
        _private.read_private_file(folder / "link")
    fake = os.stat_result((stat.S_IFDIR | 0o700, 0, 0, 1, os.getuid() + 1, 0, 0, 0, 0, 0))
    assert "owned by uid" in _private.entry_problem(folder, fake)


# ----------------------------------------------------------------------------------------------------------------
# What info reports


def test_info_reports_the_folder_used_and_why(tmp_path, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    monkeypatch.setenv(_cache.ENV, str(a_file))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = CliRunner().invoke(cli.cli, ["info"], catch_exceptions=False).stdout
    section = out[out.index("Numba cache:"):].split("\n\n")[0].splitlines()
    used = (tmp_path / "xdg" / "mmaemu" / "numba" / _cache.cache_key()).resolve()
    assert section[1] == f"  {used} (read-write, created at the first compilation; from the per-user cache folder)"
    assert section[2] == f"  passed over: {a_file} (MMAEMU_CACHE_DIR: {a_file.resolve()} is not a directory)"
    monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))
    report = json.loads(CliRunner().invoke(cli.cli, ["info", "--json", "-"], catch_exceptions=False).stdout)
    assert report["numba_cache"]["path"] is None and report["numba_cache"]["state"] == "disabled"
    assert len(report["numba_cache"]["passed_over"]) == 2



COLD_CHILD = r"""
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
from mmaemu.arith.bf16 import bf16_value, low_halves_exact
assert bf16_value(0x3F80) == 1.0
assert low_halves_exact(0x12345678) == 0x56785678
"""


@pytest.mark.subprocess
def test_a_cold_cache_is_announced_once_through_logging_and_a_warm_one_not_at(tmp_path):
    """Before the first compilation into a cache without this build's code: one INFO record of the "mmaemu"
    logger (never a print); a second process, whose cache now holds the code, logs nothing."""
    folder = tmp_path / "cache"
    env = child_env(folder)
    lines = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", COLD_CHILD], env=env, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
        assert proc.returncode == 0 and proc.stdout == "", proc.stderr[-3000:]
        lines.append([line for line in proc.stderr.splitlines() if line.startswith("mmaemu ")])
    cold, warm = lines
    assert len(cold) == 1 and cold[0].startswith("mmaemu INFO mmaemu: compiling its arithmetic"), cold
    assert "happens once" in cold[0] and str(folder) in cold[0]
    assert warm == []


def test_the_command_line_shows_the_library_notes_on_stderr(monkeypatch):
    import logging

    logger = logging.getLogger("mmaemu")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    cli.show_library_notes()
    cli.show_library_notes()  # idempotent: one line per record
    runner = CliRunner()
    with runner.isolation() as (out, err, *_):
        logger.info("a note")
        logger.debug("not shown")
    assert err.getvalue().decode() == "a note\n" and out.getvalue() == b""
