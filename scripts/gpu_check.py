#!/usr/bin/env python
"""One prepared GPU validation run: the environment, the device checks and the CUDA kernels' speed, in one folder.

1. ``environment`` - versions (python, torch, numba, numba-cuda, mmaemu), the device, the driver, how numba
   compiles for it, and why the kernels cannot run if they cannot;
2. ``device checks`` - ``python -m pytest -m cuda`` on the test files with ``cuda`` tests
   (``tests/test_gpu_kernels.py``: every kernel's self-test, ``cuda:native``'s instruction probe, every GEMM
   kernel and the whole ``scaled_mm`` path against the CPU reference; ``tests/test_cuda_device.py``), on
   ``--device`` (``$MMAEMU_TEST_DEVICE``);
3. ``speed`` - ``python scripts/bench.py --cuda`` (``scripts/bench_cuda.py``: the offset kernel against the
   instruction-issue bound, ``cuda:native`` and native ``torch._scaled_mm``; rows of every timed result checked).

It writes ``gpu_check.json`` (the three parts), ``gpu_check.md`` (what docs/validation.md records: versions, the
device, the device checks' counts and failures, the speed tables), ``pytest.xml`` and ``bench_cuda.json``/``.md``.
Without a usable CUDA device the device checks skip and the speed sections say why; the run still succeeds.
Exit status: 0 if no device check failed and no speed section failed, 1 otherwise.

    python scripts/gpu_check.py [--out DIR] [--budget SECONDS] [--device N] [--quick] [bench options]

``--out`` defaults to ``$OUT`` if set, else ``./gpu_check_out``; ``--budget`` (default 450 s) is shared: the speed
sections get what the device checks leave (at least 60 s). Other options (``--kernels``, ``--shapes``,
``--native-shapes``, ``--sass-per-product``) go to ``scripts/bench.py --cuda``. Run it with ``PYTHONUNBUFFERED=1``
to follow the progress lines live.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
FORMAT = "mmaemu-gpu-check/2"
START = time.monotonic()
MIN_BENCH_S = 60


def log(message):
    print(f"[gpu_check {time.monotonic() - START:7.1f}s] {message}", flush=True)


def environment(device):
    """Versions, the ``MMAEMU_``/``NUMBA_``/``CUDA_`` variables and the device as torch and mmaemu see it."""
    import numba
    import numpy
    import torch

    import mmaemu
    from mmaemu.context import for_call
    from mmaemu.cuda import device as cuda_device

    info = {"python": sys.version.split()[0], "platform": platform.platform(), "numpy": numpy.__version__,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "numba": numba.__version__,
            "mmaemu": mmaemu.__version__, "mmaemu_path": str(pathlib.Path(mmaemu.__file__).parent)}
    try:
        from importlib.metadata import version

        info["numba_cuda"] = version("numba-cuda")
    except Exception:
        info["numba_cuda"] = None
    info["env"] = {k: v for k, v in os.environ.items() if k.startswith(("MMAEMU_", "NUMBA_", "CUDA_"))}
    try:
        info["torch_cuda_available"] = torch.cuda.is_available()
    except Exception as exc:
        info["torch_cuda_available"], info["torch_cuda_error"] = False, str(exc)
    if info["torch_cuda_available"]:
        index = device if device is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info["device"] = {"index": index, "name": props.name, "capability": [props.major, props.minor],
                          "sm_count": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1)}
    try:
        probed = cuda_device.probe(device, disabled=for_call().cuda_disabled)
        info["probe"], info["kernels_can_run"] = probed.identity(), True
    except cuda_device.DeviceUnavailable as exc:
        info["probe"], info["kernels_can_run"] = str(exc), False
    log(f"device: {info.get('device')}; kernels can run: {info['kernels_can_run']} ({info['probe']})")
    return info


def device_checks(out, device, timeout_s):
    """``pytest -m cuda`` in a fresh process (its kernels next to no other numba state): counts, failures, seconds."""
    xml = out / "pytest.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    if device is not None:
        env["MMAEMU_TEST_DEVICE"] = str(device)
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rA", "-p", "no:cacheprovider",
               f"--junitxml={xml}"] + cuda_test_files()
    log("device checks: " + " ".join(command[1:]))
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=str(ROOT), env=env, timeout=timeout_s, capture_output=True, text=True)
        code, tail = done.returncode, (done.stdout + done.stderr)[-6000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = "timeout", f"killed after {timeout_s:.0f} s; " + str(exc.stdout or "")[-4000:]
    print(tail, flush=True)
    result = {"exit": code, "seconds": round(time.monotonic() - start, 1), "tail": tail}
    result.update(_junit_counts(xml))
    # pytest's exit code 5: no test collected (cannot happen with the cuda tests in the tree; a failure then)
    result["failed"] = code != 0
    log(f"device checks: exit {code}, {result.get('counts')} in {result['seconds']} s")
    return result


def cuda_test_files():
    """The test files that hold ``cuda``-marked tests (only they are collected: a GPU machine need not have every
    optional test dependency of the other files)."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
                  if "mark.cuda" in path.read_text(encoding="utf-8"))


def _junit_counts(xml):
    """{"counts": {passed, failed, errors, skipped}, "failures": [(test id, message)]} of a JUnit XML report."""
    if not xml.exists():
        return {"counts": None, "failures": []}
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in ElementTree.parse(xml).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
        elif outcome.tag == "skipped":
            counts["skipped"] += 1
        else:
            counts["failed" if outcome.tag == "failure" else "errors"] += 1
            failures.append((name, (outcome.get("message") or "")[:500]))
    return {"counts": counts, "failures": failures}


def speed(out, device, budget_s, bench_args):
    """``scripts/bench.py --cuda`` in a fresh process: its report (bench_cuda.json), or why there is none."""
    command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--cuda", "--json", str(out / "bench_cuda.json"),
               "--budget", str(int(budget_s))] + (["--device", str(device)] if device is not None else []) + bench_args
    log("speed: " + " ".join(command[1:]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    try:
        done = subprocess.run(command, cwd=str(ROOT), env=env, timeout=budget_s + 120, text=True)
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    path = out / "bench_cuda.json"
    report = json.loads(path.read_text()) if path.exists() else None
    return {"exit": code, "report": report, "failed": code != 0}


def markdown(report):
    env = report["environment"]
    lines = [f"# mmaemu GPU check ({report['started']})", "", f"elapsed {report.get('elapsed_s')} s", "",
             "## Environment", ""] + [f"* {k}: {env.get(k)}" for k in ("python", "torch", "torch_cuda", "numba",
                                                                         "numba_cuda", "mmaemu", "device",
                                                                         "kernels_can_run", "probe")]
    checks = report["device_checks"]
    lines += ["", f"## Device checks (pytest -m cuda): exit {checks['exit']}, {checks.get('counts')}, "
              f"{checks['seconds']} s", ""] + [f"* FAILED {name}: {message}" for name, message in checks["failures"]]
    bench = report["speed"]
    tables = pathlib.Path(report["out"]) / "bench_cuda.md"  # written by the speed part with its report
    lines += ["", f"## Speed (scripts/bench.py --cuda): exit {bench['exit']}", ""]
    if bench.get("report") is not None and tables.exists():
        lines.append(tables.read_text())
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="report folder")
    parser.add_argument("--budget", type=float, default=450.0, help="time budget in seconds (default 450)")
    parser.add_argument("--device", type=int, default=None, help="CUDA device ordinal (default: current)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes for the speed sections")
    args, bench_args = parser.parse_known_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"format": FORMAT, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "out": str(out), "budget_s": args.budget}
    report["environment"] = environment(args.device)
    report["device_checks"] = device_checks(out, args.device, max(MIN_BENCH_S, args.budget - MIN_BENCH_S))
    left = max(MIN_BENCH_S, args.budget - (time.monotonic() - START))
    report["speed"] = speed(out, args.device, left, bench_args + (["--quick"] if args.quick else []))
    report["elapsed_s"] = round(time.monotonic() - START, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(report))
    failed = report["device_checks"]["failed"] or report["speed"]["failed"]
    log(f"done: device checks {'FAILED' if report['device_checks']['failed'] else 'passed'}, speed "
        f"{'FAILED' if report['speed']['failed'] else 'ok'}; report in {out / 'gpu_check.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
