"""The descriptor probe: a few torch._scaled_mm calls run with cuBLASLt's trace log on (see :mod:`.trace`).

It runs in a child process (``python -m mmaemu.record.probe``) because cuBLASLt reads CUBLASLT_LOG_LEVEL and
CUBLASLT_LOG_FILE when it is loaded, and a child leaves the recording process's cuBLASLt untouched; the child
inherits the environment, so it measures the workspace torch uses under the same CUBLASLT_WORKSPACE_SIZE /
CUBLAS_WORKSPACE_CONFIG settings. Every (mat1 format, mat2 format, output dtype, use_fast_accum) is tried on a
few shapes chosen to include split-K decisions; the calls torch refuses tell which combinations it accepts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Tuple

from ..formats import DTYPE_OF
from ..platform.profiles import FORMATS, OUT_DTYPES
from .trace import ProbeCall, TracedMatmul, parse_matmul_trace

__all__ = ["PROBE_SHAPES", "probe_calls", "run_probe", "ProbeError"]

# Small M*N with long K (split on the H100 PCIe: M=48, N=64, K=5760 splits in two), and two unsplit shapes.
PROBE_SHAPES = ((16, 64, 8192), (48, 64, 5760), (64, 128, 16384), (128, 256, 4096), (1024, 1024, 2048))
LOG_LEVEL_TRACE = "2"


class ProbeError(RuntimeError):
    """The probe child process failed."""


def probe_calls() -> List[ProbeCall]:
    return [ProbeCall(M, N, K, fa, fb, out, fast) for fa in FORMATS for fb in FORMATS for out in OUT_DTYPES
            for fast in (False, True) for M, N, K in PROBE_SHAPES]


def _run_calls(device: int) -> List[dict]:
    import torch

    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    gen = torch.Generator(device=dev).manual_seed(20261201)
    results = []
    for call in probe_calls():
        a = torch.randn(call.M, call.K, device=dev, generator=gen).to(DTYPE_OF[call.fa])
        b = torch.randn(call.N, call.K, device=dev, generator=gen).to(DTYPE_OF[call.fb]).t()
        error = None
        try:
            torch._scaled_mm(a, b, one, one, out_dtype=getattr(torch, call.out), use_fast_accum=call.fast)
            torch.cuda.synchronize(dev)
        except Exception as exc:  # torch refused the combination: recorded, not fatal
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        results.append(dict(call.__dict__, error=error))
    return results


def run_probe(device: int, timeout_s: float = 300.0) -> Tuple[List[ProbeCall], List[TracedMatmul], str]:
    """Run the probe in a child process; (calls with torch's errors, traced matmuls, log text)."""
    with tempfile.TemporaryDirectory(prefix="mmaemu-probe-") as tmp:
        log, result = Path(tmp) / "cublaslt.log", Path(tmp) / "calls.json"
        env = dict(os.environ, CUBLASLT_LOG_LEVEL=LOG_LEVEL_TRACE, CUBLASLT_LOG_FILE=str(log))
        env.pop("CUBLASLT_LOG_MASK", None)
        done = subprocess.run([sys.executable, "-m", "mmaemu.record.probe", "--device", str(device), str(result)],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not result.exists():
            raise ProbeError(f"the descriptor probe failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        calls = [ProbeCall(**c) for c in json.loads(result.read_text(encoding="utf-8"))]
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return calls, parse_matmul_trace(text), text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run the recorder's torch._scaled_mm probe calls (child process).")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("result")
    args = parser.parse_args(argv)
    Path(args.result).write_text(json.dumps(_run_calls(args.device)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
