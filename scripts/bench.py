#!/usr/bin/env python
"""Throughput of mmaemu's CPU path against float64 ``np.dot`` of the same shapes, from ONE run.

For every shape (M, N, K), profile preset (hopper, ada) and accumulation mode (fast, slow) it times
``mmaemu.cpu.accumulate_codes`` (decode + the fast tile path + the NaN/Inf rule, i.e. everything from FP8
codes to the fp32 accumulator) and ``np.dot`` of float64 [M, K] x [K, N] (the BLAS NumPy is linked to), each the
best of a few repetitions, interleaved so that both see the same machine load (mmaemu is timed after a pause
that lets BLAS's spinning workers fall asleep), and prints GMAC/s and the ratio. Then what cutting the loops into
tasks costs (hopper fast on the largest shape: the default tasks against the coarsest cut, one task per panel of
B, interleaved) and how long a SIGINT takes to interrupt a long call (:mod:`mmaemu.cpu.threads`). Last, in a fresh
Python process with the cache this run has warmed, the import time and the first-call compile/load time of the CPU
path (target: at most 1 s); the start-up of the package's entry points: the first split-K decision of a fresh
process, a later decision, ``python -m mmaemu explain`` (target: under 1.5 s) against ``import torch`` alone.
``--cold-cache`` adds the first call of a fresh process with an empty Numba cache (what a new user waits once).

    python scripts/bench.py                 # all cores, the four shapes of docs/performance.md
    python scripts/bench.py --threads 1     # one thread for mmaemu and for BLAS
    python scripts/bench.py --quick         # smaller shapes, fewer repetitions (a few seconds)
    python scripts/bench.py --startup       # only the start-up figures (seconds)
    python scripts/bench.py --startup --cold-cache   # and the cold-cache first call (a minute or more)
    python scripts/bench.py --rowwise-only  # row-wise (+ bias) against tensor-wise scaled_mm, hopper, S = 1
    python scripts/bench.py --blockwise     # only block-wise (DeepGEMM) against tensor-wise slow accumulation
    python scripts/bench.py --overhead      # only the per-call figures and the kept weight
    python scripts/bench.py --minilm        # only the MiniLM example against fp32 (needs sentence-transformers)
    python scripts/bench.py --models        # MiniLM and docs/examples/decoder.py (every recipe) against native
    python scripts/bench.py --cuda [...]    # only the CUDA kernels on a GPU (scripts/bench_cuda.py, its options)
    python scripts/bench.py --proto DIR     # only accumulate_codes against the offset prototype in DIR (issue 29)
    python scripts/bench.py --recipes       # only the recipe layers' forwards against the tensor-wise layer
    python scripts/bench.py --whole-call    # only scaled_mm (kept weight, bf16 out) against np.dot, every schedule

The block-wise section (also at the end of a full run) times mmaemu.cpu.chunked.accumulate_chunked_codes (DeepGEMM's
sm_90 1d2d kernel: 128-k chunks and the scaled FMA combine) against accumulate_codes with the hopper preset and slow
accumulation (the same 128-k chunks, combined by adds) on (64, 5760, 1920), (2048, 5760, 1920) and a DeepSeek-V3
MoE layer (8 groups of (128, 2048, 7168), each group its own GEMM as the M-grouped kernels run them); target: at
most 1.3 times the tensor-wise time.

The overhead section times whole ``mmaemu.scaled_mm`` calls (hopper, fast, S = 1, bf16 output; CPU time of the
calling thread per call, the steadiest measure on a shared machine) of (1, 64, 64) and (16, 256, 256) against
``torch.matmul`` in fp32 and torch's CPU ``torch._scaled_mm`` of the same FP8 operands, and (1, 5760, 1920) with
its weight's panels kept (:mod:`mmaemu.cpu.prepared`) against decoded at every call. The MiniLM section runs
``docs/examples/minilm.py``'s model (20 sentences, hopper, ``splitk="assume-unsplit"``) against its fp32 forward,
the two forwards alternating, when sentence-transformers and the model package are installed (offline); where
``OMP_WAIT_POLICY`` is unset, again in a fresh process with ``OMP_WAIT_POLICY=PASSIVE`` (torch's OpenMP workers
then sleep after each operation instead of spinning beside mmaemu's threads: docs/performance.md).

Set ``MMAEMU_CACHE_DIR`` to keep the compiled kernels somewhere else than the default cache.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

BLAS_SETTLE_S = 1.0
SHAPES = [(64, 5760, 1920), (2048, 5760, 1920), (256, 256, 4096), (16, 16, 65536), (1, 5760, 1920), (8, 5760, 1920),
          (1, 4096, 4096)]
# Per-call cost of small scaled_mm calls against torch (issue 22: (1, 64, 64) at most 60 us; issue 29, the weight
# kept by the repeated calls: (1, 64, 64) at most 40 us, (1, 576, 576) and (1, 1536, 576) at most 3x fp32 matmul).
PER_CALL_SHAPES = [(1, 64, 64), (16, 256, 256), (1, 576, 576), (1, 1536, 576)]
# A weight seen again: its panels kept (mmaemu.cpu.prepared) against decoded at every call (target: 2x).
KEPT_WEIGHT_SHAPE = (1, 5760, 1920)
MINILM_SENTENCES = 20
# Row-wise against tensor-wise scaled_mm (hopper, S = 1 both, bf16 output): target within 1.3x (issue 19).
ROWWISE_SHAPES = [(64, 5760, 1920), (2048, 5760, 1920)]
QUICK_ROWWISE_SHAPES = [(64, 1536, 1920), (256, 1536, 1920)]
BLOCKWISE_SHAPES = SHAPES[:2]
MOE_LAYER = (8, 128, 2048, 7168)  # groups, rows per group, N, K: DeepSeek-V3's routed experts (gate/up of 7168)
QUICK_MOE_LAYER = (2, 128, 1024, 1792)
QUICK_SHAPES = [(64, 1536, 1920), (256, 1536, 1920), (128, 128, 4096), (16, 16, 16384), (1, 5760, 1920),
                (8, 5760, 1920), (1, 4096, 4096)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for mmaemu and BLAS")
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer repetitions")
    parser.add_argument("--repeats", type=int, default=None, help="repetitions per measurement (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup", action="store_true", help="only the start-up measurements")
    parser.add_argument("--cold-cache", action="store_true",
                        help="also time the first call of a fresh process with an empty Numba cache")
    parser.add_argument("--rowwise-only", action="store_true",
                        help="only the row-wise against tensor-wise scaled_mm comparison")
    parser.add_argument("--blockwise", action="store_true", help="only the block-wise section")
    parser.add_argument("--overhead", action="store_true",
                        help="only the per-call figures of small calls and the kept weight")
    parser.add_argument("--minilm", action="store_true", help="only the MiniLM example against fp32")
    parser.add_argument("--models", action="store_true",
                        help="only the models: MiniLM, and the 135 M decoder of docs/examples/decoder.py with "
                             "every recipe, against the native models")
    parser.add_argument("--decoder-layers", type=int, default=30, help="layers of the --models decoder")
    parser.add_argument("--engines", action="store_true",
                        help="only the offset engine against the tile engine (the shapes of auto's rule)")
    parser.add_argument("--block-scaled", action="store_true",
                        help="only the block-scaled (MXFP8/NVFP4) against unscaled tcgen05_f8f6f4 section")
    parser.add_argument("--recipes", action="store_true",
                        help="only the recipe layers' forwards (row-wise, block-wise, MXFP8, NVFP4) against the "
                             "tensor-wise layer on the same shapes")
    parser.add_argument("--whole-call", action="store_true",
                        help="only mmaemu.scaled_mm's whole call (bf16 out, kept weight) against float64 np.dot, "
                             "with hopper fast, hopper slow, ada and E5M2 weights")
    parser.add_argument("--proto", nargs="?", const="", default=None, metavar="DIR",
                        help="only accumulate_codes hopper fast against the offset prototype's offset_cpu.py in DIR "
                             f"(default: ${PROTO_ENV}), 1 and 2 threads, checking the bits")
    return parser.parse_args(argv)


def _set_thread_env(n: int):
    """Before NumPy and Numba are imported: the same thread count for Numba and every BLAS flavour."""
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "BLIS_NUM_THREADS"):
        os.environ[name] = str(n)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return "unknown CPU"


def fp8_codes(rng, fmt, shape):
    """Finite FP8 codes with magnitudes like typical FP8 activations/weights (around 16 in e4m3, 256 in e5m2)."""
    from mmaemu import formats

    return formats.random_codes(rng, shape, fmt, spread=1.5, centre=4 if fmt == "e4m3" else 8)


def best_of(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


FIRST_CALL = r"""
import time
t0 = time.perf_counter()
import numpy as np
from mmaemu.cpu import accumulate_codes
from mmaemu.model.presets import ADA, HOPPER
t1 = time.perf_counter()
a = np.full((4, 256), 0x38, np.uint8)
accumulate_codes(a, a, "e4m3", "e4m3", HOPPER, True)
t2 = time.perf_counter()
accumulate_codes(a, a, "e4m3", "e4m3", ADA, False, 2, "pairwise")
t3 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f}")
"""


def first_call_times():
    """(import, first call, a second schedule) seconds in a fresh interpreter with the warm cache."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, env=env, check=True)
    return tuple(float(x) for x in out.stdout.split())


def _fresh_python(code_or_args, env=None):
    """(seconds, stdout) of a fresh interpreter running ``-c code`` (a str) or the given arguments (a list)."""
    env = dict(os.environ if env is None else env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=True)
    return time.perf_counter() - start, out.stdout


FIRST_DECISION = r"""
import time
t0 = time.perf_counter()
from mmaemu.platform.splitk import resolve_splitk
d = resolve_splitk(48, 64, 5760, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                   profile="hopper")
t1 = time.perf_counter()
n = 2000
for _ in range(n):
    resolve_splitk(48, 64, 5760, a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False,
                   profile="hopper")
t2 = time.perf_counter()
from mmaemu.plan.flush import check_no_flush_to_zero
t3 = time.perf_counter()
for _ in range(n):
    check_no_flush_to_zero()
print(t1 - t0, (t2 - t1) / n, (time.perf_counter() - t3) / n)
"""

COLD_FIRST_CALL = r"""
import time
t0 = time.perf_counter()
import torch, mmaemu
t1 = time.perf_counter()
x = torch.ones(16, 64).to(torch.float8_e4m3fn)
one = torch.tensor(1.0)
mmaemu.scaled_mm(x, x.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)
print(t1 - t0, time.perf_counter() - t1)
"""


def startup_times(repeats=3):
    """{measure: best seconds} of fresh processes with the warm cache: the first split-K decision (import
    included), one later decision, the flush-to-zero check, ``import torch`` alone and ``python -m mmaemu explain 64 5760 1920``."""
    firsts, laters, ftz = zip(*(map(float, _fresh_python(FIRST_DECISION)[1].split()) for _ in range(repeats)))
    torch_import = min(_fresh_python("import torch")[0] for _ in range(repeats))
    explain = min(_fresh_python(["-m", "mmaemu", "explain", "64", "5760", "1920"])[0] for _ in range(repeats))
    return {"first decision": min(firsts), "later decision": min(laters), "ftz check": min(ftz),
            "import torch": torch_import,
            "explain CLI": explain}


def cold_first_call():
    """(import seconds, first scaled_mm seconds) of a fresh process whose Numba cache folder is empty."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, MMAEMU_CACHE_DIR=cache)
        return tuple(float(x) for x in _fresh_python(COLD_FIRST_CALL, env)[1].split())


def print_startup(args):
    load = os.getloadavg()
    print(f"# start-up, fresh processes, warm cache (best of 3); load average {load[0]:.1f} {load[1]:.1f} "
          f"{load[2]:.1f} on {os.cpu_count()} logical CPUs")
    times = startup_times()
    print(f"#   first split-K decision (import included) {times['first decision'] * 1e3:.0f} ms, a later one "
          f"{times['later decision'] * 1e6:.0f} us; the flush-to-zero check of each call "
          f"{times['ftz check'] * 1e6:.1f} us")
    print(f"#   python -m mmaemu explain 64 5760 1920: {times['explain CLI']:.2f} s (target < 1.5 s; a CPU call is "
          f"planned without torch, whose import alone takes {times['import torch']:.2f} s)")
    if args.cold_cache:
        imp, first = cold_first_call()
        load = os.getloadavg()
        print(f"# cold cache: import {imp:.2f} s, first scaled_mm (hopper fast) {first:.0f} s "
              f"(compiles the arithmetic once; load average now {load[0]:.1f})")


def task_cost(a, b, preset, repeats):
    """{setting: (best seconds, tasks)} of the same call with the default task sizes and with the coarsest cut (one
    task per panel of B), interleaved."""
    from mmaemu.cpu import accumulate_codes, engine, threads

    default = (threads.TASK_WORK, threads.TASKS_PER_THREAD)
    settings = {"default tasks": default, "one task per panel": (1 << 62, 1)}
    best = {name: float("inf") for name in settings}
    tasks = {}
    (M, K), N = a.shape, b.shape[0]
    try:
        for _ in range(repeats):
            for name, setting in settings.items():
                threads.TASK_WORK, threads.TASKS_PER_THREAD = setting
                tasks[name] = len(engine.fast_path_tasks(M, N, K, threads.num_threads()))
                best[name] = min(best[name], best_of(lambda: accumulate_codes(a, b, "e4m3", "e4m3", preset, True),
                                                     1))
    finally:
        threads.TASK_WORK, threads.TASKS_PER_THREAD = default
    return {name: (best[name], tasks[name]) for name in settings}


def interrupt_latency(preset, after_s=0.3):
    """(seconds from SIGINT to KeyboardInterrupt or None, products of the call) for a SIGINT sent ``after_s``
    into a long call (1024 x 4096 x 16384)."""
    import signal
    import threading

    import numpy as np

    from mmaemu.cpu import accumulate_codes

    M, N, K = 1024, 4096, 16384
    a, b = np.full((M, K), 0x38, np.uint8), np.full((N, K), 0x38, np.uint8)
    sent = []

    def interrupt():
        sent.append(time.perf_counter())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    timer = threading.Timer(after_s, interrupt)
    timer.start()
    try:
        accumulate_codes(a, b, "e4m3", "e4m3", preset, True)
        caught = None
    except KeyboardInterrupt:
        caught = time.perf_counter()
    timer.join()
    time.sleep(0.5)  # the tasks already running end by themselves
    return (None if caught is None else caught - sent[0]), M * N * K


def rowwise_vs_tensorwise(rng, shapes, repeats):
    """Rows (M, N, K, mode, tensor-wise s, row-wise s) of ``mmaemu.scaled_mm`` on the hopper profile, bf16 output,
    S = 1 for both, the same operands; the two calls interleaved (best of ``repeats``)."""
    import warnings

    import torch

    import mmaemu

    rows = []
    for M, N, K in shapes:
        a = torch.from_numpy(fp8_codes(rng, "e4m3", (M, K))).view(torch.float8_e4m3fn)
        w = torch.from_numpy(fp8_codes(rng, "e4m3", (N, K))).view(torch.float8_e4m3fn)
        one = torch.tensor(1.0)
        sa = torch.from_numpy(rng.uniform(0.5, 2, (M, 1)).astype("float32"))
        sb = torch.from_numpy(rng.uniform(0.5, 2, (1, N)).astype("float32"))
        bias = torch.from_numpy(rng.standard_normal(N).astype("float32")).to(torch.bfloat16)
        for fast in (True, False):
            def tensorwise():
                mmaemu.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast, splitk=1)

            def rowwise():
                mmaemu.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=fast)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tensorwise(), rowwise()  # compile / load outside the timings
                best_t = best_r = float("inf")
                for _ in range(repeats):
                    best_t = min(best_t, best_of(tensorwise, 1))
                    best_r = min(best_r, best_of(rowwise, 1))
            rows.append((M, N, K, "fast" if fast else "slow", best_t, best_r))
    return rows


# The whole call with a kept weight (issue 29): at least 0.6x np.dot on these, no shape below 0.3x, and the other
# schedules and formats within 1.2x of hopper fast.
WHOLE_CALL_SHAPES = SHAPES
WHOLE_CALL_VARIANTS = (  # (label, profile, use_fast_accum, weight format)
    ("hopper fast", "hopper", True, "e4m3"),
    ("hopper slow", "hopper", False, "e4m3"),
    ("ada fast", "ada", True, "e4m3"),
    ("ada slow", "ada", False, "e4m3"),
    ("hopper fast, E5M2 weight", "hopper", True, "e5m2"),
)


def whole_call_section(rng, shapes, repeats):
    """Print ``mmaemu.scaled_mm`` (tensor-wise scales of 1, bf16 out, splitk=1, the weight kept: called twice
    before timing) against float64 ``np.dot`` of the same shape, and each variant against hopper fast. One pass per
    weight format (the store emptied before each: two kept 4096 x 4096 weights exceed its
    ``mmaemu.cpu.prepared.MAX_BYTES``, and interleaving them would time their decoding); within a pass the
    variants and ``np.dot`` are interleaved; best of ``repeats``, each ``np.dot`` and each round of variants after a
    pause of BLAS_SETTLE_S (OpenBLAS's workers and torch's, which take mmaemu's calls from the main thread, spin for
    a while after their work: each would slow the other down), and each round after one untimed call (torch's
    team awake, as between the calls of a model)."""
    import warnings

    import numpy as np
    import torch

    import mmaemu
    from mmaemu.cpu import prepared

    dtypes = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    one = torch.tensor(1.0)
    print(f"# {time.strftime('%c')}, load average {os.getloadavg()[0]:.2f}")
    print("| M | N | K | call | scaled_mm ms | np.dot f64 ms | vs np.dot | time / hopper fast |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    worst = float("inf")
    for M, N, K in shapes:
        a = torch.from_numpy(fp8_codes(rng, "e4m3", (M, K))).view(torch.float8_e4m3fn)
        af, bf = rng.standard_normal((M, K)), rng.standard_normal((N, K))
        best, best_dot = {}, float("inf")
        for fmt, dtype in dtypes.items():
            w = torch.from_numpy(fp8_codes(rng, fmt, (N, K))).view(dtype)
            calls = {label: (lambda profile=profile, fast=fast: mmaemu.scaled_mm(
                a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast, profile=profile, splitk=1))
                for label, profile, fast, weight_fmt in WHOLE_CALL_VARIANTS if weight_fmt == fmt}
            prepared.WEIGHTS.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for call in calls.values():  # seen, then kept; compiled or loaded outside the timings
                    call(), call()
                np.dot(af, bf.T)
                best.update(dict.fromkeys(calls, float("inf")))
                for _ in range(repeats):
                    time.sleep(BLAS_SETTLE_S)  # torch's workers, spinning after mmaemu's calls, asleep
                    best_dot = min(best_dot, best_of(lambda: np.dot(af, bf.T), 1))
                    time.sleep(BLAS_SETTLE_S)
                    next(iter(calls.values()))()  # torch's team awake, as between the calls of a model
                    for label, call in calls.items():
                        best[label] = min(best[label], best_of(call, 1))
        for label in best:
            worst = min(worst, best_dot / best[label])
            print(f"| {M} | {N} | {K} | {label} | {best[label] * 1e3:.2f} | {best_dot * 1e3:.2f} | "
                  f"{best_dot / best[label]:.3f} | {best[label] / best['hopper fast']:.2f} |")
    prepared.WEIGHTS.clear()
    print(f"# lowest ratio to np.dot: {worst:.3f}; load average at the end {os.getloadavg()[0]:.2f}")

def print_rowwise(rows):
    print("| M | N | K | accumulation | tensor-wise s | row-wise + bias s | ratio (target <= 1.3) |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    for M, N, K, mode, t, r in rows:
        print(f"| {M} | {N} | {K} | {mode} | {t:.3f} | {r:.3f} | {r / t:.2f} |")


def blockwise_section(rng, quick, repeats):
    """Print block-wise (DeepGEMM 1d2d) against tensor-wise slow accumulation (hopper), interleaved runs."""
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cpu.chunked import accumulate_chunked_codes
    from mmaemu.model.chunked import DEEPGEMM_SM90_1D2D
    from mmaemu.model.presets import HOPPER

    shapes = QUICK_SHAPES[:2] if quick else BLOCKWISE_SHAPES
    groups, rows, n, k = QUICK_MOE_LAYER if quick else MOE_LAYER
    cases = [(f"({M}, {N}, {K})", [(M, N, K)]) for M, N, K in shapes]
    cases.append((f"MoE {groups} x ({rows}, {n}, {k})", [(rows, n, k)] * groups))
    print("\n| GEMM | tensor-wise slow (s) | block-wise (s) | ratio |")
    print("|---|---:|---:|---:|")
    for label, gemms in cases:
        operands = []
        for M, N, K in gemms:
            chunks = -(-K // 128)
            sfa = (rng.uniform(1, 2, (M, chunks)) * 2.0 ** -7).astype(np.float32)
            sfb = np.repeat((rng.uniform(1, 2, (-(-N // 128), chunks)) * 2.0 ** -9).astype(np.float32), 128,
                            axis=0)[:N]
            operands.append((fp8_codes(rng, "e4m3", (M, K)), fp8_codes(rng, "e4m3", (N, K)), sfa, sfb))

        def tensorwise():
            for a, b, _, _ in operands:
                accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, False)

        def blockwise():
            for a, b, sfa, sfb in operands:
                accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, DEEPGEMM_SM90_1D2D)

        tensorwise(), blockwise()  # compile / load outside the timings
        t_tensor = t_block = float("inf")
        for _ in range(repeats):
            t_tensor = min(t_tensor, best_of(tensorwise, 1))
            t_block = min(t_block, best_of(blockwise, 1))
        print(f"| {label} | {t_tensor:.3f} | {t_block:.3f} | {t_block / t_tensor:.2f} |")


def cpu_time_per_call(fn, calls, repeats):
    """Best over ``repeats`` of the calling thread's CPU seconds per call of ``calls`` calls."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def overhead_section(repeats):
    """Per-call cost of small calls against torch, and a kept weight against one decoded at every call."""
    import torch

    import mmaemu
    import mmaemu.api
    from mmaemu.cpu import prepared

    one = torch.tensor(1.0)
    gen = torch.Generator().manual_seed(0)

    def fp8(shape):
        return (torch.randn(shape, generator=gen) * 8).to(torch.float8_e4m3fn)

    print("| call | mmaemu.scaled_mm us | torch.matmul fp32 us | torch._scaled_mm (CPU) us | vs matmul | "
          "vs _scaled_mm |")
    print("|---|---:|---:|---:|---:|---:|")
    for M, N, K in PER_CALL_SHAPES:
        a, w = fp8((M, K)), fp8((N, K))
        af, wf = a.float(), w.float().t()
        calls = max(20, 20000 // max(1, M * N * K // 4096))
        ours = cpu_time_per_call(lambda: mmaemu.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16,
                                                          use_fast_accum=True, splitk=1), calls, repeats)
        mm = cpu_time_per_call(lambda: torch.matmul(af, wf), calls, repeats)
        try:
            theirs = cpu_time_per_call(lambda: torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16),
                                       calls, repeats)
        except RuntimeError:  # a torch without a CPU FP8 GEMM
            theirs = float("nan")
        print(f"| ({M}, {N}, {K}) | {ours * 1e6:.1f} | {mm * 1e6:.1f} | {theirs * 1e6:.1f} | {ours / mm:.1f} | "
              f"{ours / theirs:.2f} |")
    M, N, K = KEPT_WEIGHT_SHAPE
    a, w = fp8((M, K)), fp8((N, K))

    def call():
        return mmaemu.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)

    def process_seconds():
        start = time.process_time()
        call()
        return time.process_time() - start

    limit = mmaemu.recipes.tensorwise._PREPARED_MIN_CODES
    prepared.WEIGHTS.clear()
    for _ in range(2):  # seen, then kept (mmaemu.cpu.prepared keeps a B the second time it is seen unchanged)
        call()
    assert len(prepared.WEIGHTS) == 1
    kept = decoded = float("inf")
    for _ in range(repeats):  # interleaved, so that both see the same load
        kept = min(kept, process_seconds())
        mmaemu.recipes.tensorwise._PREPARED_MIN_CODES = 1 << 62  # decoded at every call, as before the store
        try:
            decoded = min(decoded, process_seconds())
        finally:
            mmaemu.recipes.tensorwise._PREPARED_MIN_CODES = limit
    print(f"\n# {KEPT_WEIGHT_SHAPE} hopper fast, CPU time of all threads per call (best of {repeats}): weight "
          f"decoded at every "
          f"call {decoded * 1e3:.2f} ms, panels kept {kept * 1e3:.2f} ms: {decoded / kept:.2f}x")


def minilm_section(repeats):
    """docs/examples/minilm.py's model, hopper, against its fp32 forward (skipped without the packages)."""
    import warnings

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    example = load_example("minilm")
    try:
        model = example.load_model()
    except SystemExit as missing:
        print(f"# MiniLM: skipped ({missing})")
        return
    sentences = example.SENTENCES[:MINILM_SENTENCES]
    converted = example.fp8_model(model, "hopper")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the assumed-unsplit warnings the example lists
        fp32, fp8 = example.best_times((model, converted), sentences, repeats)
    policy = os.environ.get("OMP_WAIT_POLICY")
    print(f"# MiniLM ({len(sentences)} sentences), best of {repeats} alternated: fp32 {fp32 * 1e3:.1f} ms, fp8 "
          f"hopper {fp8 * 1e3:.1f} ms = {fp8 / fp32:.2f}x fp32 (target: at most 3x); OMP_WAIT_POLICY "
          f"{'unset' if policy is None else policy}")
    if policy is None:  # the user's remedy for torch's spinning OpenMP workers (docs/performance.md): both models
        _, out = _fresh_python([os.path.abspath(__file__), "--minilm", "--threads", os.environ["NUMBA_NUM_THREADS"],
                                "--repeats", str(repeats)], env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
        print("\n".join(line for line in out.splitlines() if line.startswith("# MiniLM")))


def load_example(name):
    """A script of docs/examples as a module."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(f"{name}_example", os.path.join(root, "docs", "examples",
                                                                                  f"{name}.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def decoder_section(layers, repeats):
    """docs/examples/decoder.py's Llama-architecture decoder (prefill 64, greedy decoding 8), every recipe, against
    the native float32 model run beside each (skipped without transformers). Targets (issue 29): tensor-wise
    prefill at most 3x and decoding at most 2x native per token; every other recipe within 1.5x of tensor-wise."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        print("# decoder: skipped (transformers not installed)")
        return
    example = load_example("decoder")
    rows = example.compare(layers, 64, 8, example.RECIPES, repeats)
    print(example.report(rows, layers, 64, 8))
    tensorwise = {recipe: fp8 for recipe, fp8, _ in rows}.get("tensorwise")
    if tensorwise is not None:
        for recipe, fp8, _ in rows:
            print(f"# {recipe} / tensorwise: prefill {fp8.prefill_s / tensorwise.prefill_s:.2f}, decoding "
                  f"{fp8.decode_s_per_token / tensorwise.decode_s_per_token:.2f}")


BLOCK_SCALED_SHAPES = [(256, 1024, 2048)]
QUICK_BLOCK_SCALED_SHAPES = [(64, 512, 1024)]


# The shapes that decide where "auto" takes the offset engine (mmaemu.cpu.features.OFFSET_SHAPES;
# docs/performance.md, "Two engines").
ENGINE_SHAPES = [(1, 5760, 1920), (8, 5760, 1920), (16, 5760, 1920), (32, 5760, 1920), (64, 5760, 1920),
                 (128, 5760, 1920), (512, 5760, 1920), (1024, 5760, 1920), (2048, 5760, 1920), (256, 256, 4096),
                 (16, 16, 65536), (64, 384, 384), (380, 384, 384), (380, 1536, 384)]
QUICK_ENGINE_SHAPES = [(1, 5760, 1920), (64, 5760, 1920), (16, 16, 8192), (380, 384, 384)]


# Other schedules and formats on the offset engine's best shape: ada slow accumulation, E5M2 weights.
ENGINE_VARIANTS = [((64, 5760, 1920), "ada", False, "e4m3"), ((64, 5760, 1920), "hopper", True, "e5m2")]


def engines_section(rng, quick, repeats):
    """Print accumulate_codes with the offset engine against the tile engine (hopper fast, random E4M3 codes, then
    :data:`ENGINE_VARIANTS`; best of ``repeats`` calls, the two interleaved) and check that both give the same
    bits."""
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.model.presets import ADA, HOPPER

    presets = {"hopper": HOPPER, "ada": ADA}
    rows = [(shape, "hopper", True, "e4m3") for shape in (QUICK_ENGINE_SHAPES if quick else ENGINE_SHAPES)]
    print("\n| shape (M, N, K) | preset | offset ms | tile ms | tile / offset | same bits |")
    print("|---|---|---:|---:|---:|---|")
    for (M, N, K), name, fast, fmt_b in rows + ENGINE_VARIANTS:
        a = rng.integers(0, 0x7F, (M, K), dtype=np.uint8)
        b = rng.integers(0, 0x7F if fmt_b == "e4m3" else 0x7C, (N, K), dtype=np.uint8)
        best, bits = {"offset": float("inf"), "tile": float("inf")}, {}
        for _ in range(repeats):
            for engine in best:
                start = time.perf_counter()
                bits[engine] = accumulate_codes(a, b, "e4m3", fmt_b, presets[name], fast,
                                                cpu_engine=engine).view(np.uint32)
                best[engine] = min(best[engine], time.perf_counter() - start)
        same = np.array_equal(bits["offset"], bits["tile"])
        label = f"{name} {'fast' if fast else 'slow'}" + ("" if fmt_b == "e4m3" else f", B {fmt_b}")
        print(f"| ({M}, {N}, {K}) | {label} | {best['offset'] * 1e3:.2f} | {best['tile'] * 1e3:.2f} | "
              f"{best['tile'] / best['offset']:.2f} | {same} |", flush=True)
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


# The offset prototype (issue 29's measuring stick, kept outside the repository): its folder is given on the command
# line or in this variable; the shapes are the issue's targets (ratio prototype time / accumulate_codes time).
PROTO_ENV = "MMAEMU_OFFSET_PROTOTYPE"
PROTO_SHAPES = [(8, 5760, 1920), (64, 5760, 1920), (512, 5760, 1920), (2048, 5760, 1920), (256, 256, 4096)]


def proto_section(folder, repeats):
    """Print ``accumulate_codes`` (hopper fast, E4M3: the engine ``auto`` picks, and the offset engine forced) against
    the prototype's ``accumulate_hopper_fast`` on the same codes, with 1 and 2 threads (best of ``repeats``,
    interleaved), the time ratios ours / prototype (target: at most 1.0) and whether all give the same bits."""
    import numba
    import numpy as np

    from mmaemu.arith.params import schedule_params
    from mmaemu.cpu import accumulate_codes
    from mmaemu.context import for_call
    from mmaemu.cpu.engine import cpu_engine_choice
    from mmaemu.model.presets import HOPPER

    folder = folder or os.environ.get(PROTO_ENV, "")
    if not os.path.isfile(os.path.join(folder, "offset_cpu.py")):
        raise SystemExit(f"--proto: no offset_cpu.py in {folder!r} (give the prototype's folder or set {PROTO_ENV})")
    sys.path.insert(0, os.path.abspath(folder))
    import offset_cpu as proto

    rng = np.random.default_rng(5)
    print(f"# {time.strftime('%c')}, load average {os.getloadavg()[0]:.2f}; best of {repeats}, interleaved")
    print("\n| shape (M, N, K) | threads | auto's engine | auto ms | offset ms | prototype ms | auto / prototype | "
          "offset / prototype | same bits |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for M, N, K in PROTO_SHAPES:
        a, b = fp8_codes(rng, "e4m3", (M, K)), fp8_codes(rng, "e4m3", (N, K))
        runs = {"auto": lambda: accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True),
                "offset": lambda: accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True, cpu_engine="offset"),
                "proto": lambda: proto.accumulate_hopper_fast(a, b)}
        bits = [run().view(np.uint32) for run in runs.values()]
        same = all(np.array_equal(bits[0], other) for other in bits[1:])
        engine = cpu_engine_choice(HOPPER, schedule_params(HOPPER, K, True), "e4m3", "e4m3", shape=(M, N),
                                   context=for_call()).engine  # auto's choice: MMAEMU_CPU_ENGINE as the run reads it
        if engine == "offset":
            del runs["offset"]  # the same call as auto's
        for n_threads in (1, 2):
            numba.set_num_threads(n_threads)
            best = {name: float("inf") for name in runs}
            for _ in range(repeats):
                for name, run in runs.items():
                    best[name] = min(best[name], best_of(run, 1))
            forced = best.get("offset", best["auto"])
            print(f"| ({M}, {N}, {K}) | {n_threads} | {engine} | {best['auto'] * 1e3:.2f} | {forced * 1e3:.2f} | "
                  f"{best['proto'] * 1e3:.2f} | {best['auto'] / best['proto']:.2f} | "
                  f"{forced / best['proto']:.2f} | {same} |", flush=True)
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


# The recipe layers against the tensor-wise layer (issue 29: each within 1.3x): decoding (M = 1) and small batches
# on the decoder's projections (docs/examples/decoder.py: hidden 576, intermediate 1536).
RECIPE_LAYER_ROWS = (1, 16, 64)
RECIPE_LAYER_SHAPES = [(576, 576), (1536, 576)]
# Each recipe's layer options, as the decoder example builds them.
RECIPE_LAYER_OPTIONS = {"tensorwise": dict(profile="hopper", splitk="assume-unsplit"),
                        "rowwise": dict(profile="hopper", splitk="assume-unsplit"),
                        "blockwise": {}, "mxfp8": {}, "nvfp4": {}}


def recipe_layers_section(repeats):
    """Print each recipe layer's forward (``mmaemu.nn.EmulatedFP8Linear.from_linear(..., recipe=)``, kept weight,
    fp32 input, no grad) against the tensor-wise layer of the same torch.nn.Linear, for M rows of input on
    (N, K) = (out, in) features: every layer of a shape timed in turn in one process, best of ``repeats`` rounds of
    a few calls each, in wall time per forward, the ratios of those, and the CPU time of the process (all threads)
    beside them. Wall time since the calls run on torch's OpenMP team (:mod:`mmaemu.cpu.torch_team`): the
    process's CPU time then also counts torch's workers waiting (spinning) between the regions, as they do after
    any torch operation. The tensor-wise layer's slowest round in wall time tells a stall (a round far above its
    best, e.g. torch's intra-op threads waiting for a core: docs/performance.md, "Recipe layers"). Target (issue
    29): every recipe within 1.3x."""
    import warnings

    import torch

    from mmaemu.nn import EmulatedFP8Linear

    recipes = list(RECIPE_LAYER_OPTIONS)
    print("\n| M | N | K | tensor-wise wall us (slowest round; CPU us) | "
          + " | ".join(f"{r} wall us (ratio; CPU us)" for r in recipes[1:]) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * (len(recipes) - 1))
    torch.manual_seed(0)
    for N, K in RECIPE_LAYER_SHAPES:
        linear = torch.nn.Linear(K, N)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the experimental recipes' and the assumed split's warnings
            layers = {r: EmulatedFP8Linear.from_linear(linear, recipe=r, **RECIPE_LAYER_OPTIONS[r]) for r in recipes}
            for M in RECIPE_LAYER_ROWS:
                x = torch.randn(M, K)
                calls = max(1, 64 // M)
                best = {r: float("inf") for r in recipes}
                best_cpu = dict(best)
                slowest = 0.0
                with torch.no_grad():
                    for layer in layers.values():  # compile / load and prepare the weights outside the timings
                        layer(x), layer(x)
                    for _ in range(repeats):
                        for r, layer in layers.items():
                            start, cpu = time.perf_counter(), time.process_time()
                            for _ in range(calls):
                                layer(x)
                            wall = (time.perf_counter() - start) / calls
                            best[r] = min(best[r], wall)
                            best_cpu[r] = min(best_cpu[r], (time.process_time() - cpu) / calls)
                            if r == "tensorwise":
                                slowest = max(slowest, wall)
                t0 = best["tensorwise"]
                cells = " | ".join(f"{best[r] * 1e6:.0f} ({best[r] / t0:.2f}; {best_cpu[r] * 1e6:.0f})"
                                   for r in recipes[1:])
                print(f"| {M} | {N} | {K} | {t0 * 1e6:.0f} ({slowest * 1e6:.0f}; {best_cpu['tensorwise'] * 1e6:.0f}) "
                      f"| {cells} |", flush=True)
    print(f"# load average while measuring: {os.getloadavg()}")


def block_scaled_section(rng, quick, repeats):
    """Print the block-scaled GEMMs (tcgen05 kind::mxf8f6f4 with UE8M0 scales, kind::mxf4nvf4 with UE4M3 scales)
    against the unscaled tcgen05_f8f6f4 preset on the same shape, fast CPU paths, interleaved runs (target for
    mxf8f6f4: within 2x, issue 20)."""
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cpu.block_scaled import accumulate_block_scaled
    from mmaemu.model.presets import TCGEN05_F8F6F4, TCGEN05_MXF4NVF4, TCGEN05_MXF8F6F4

    print("\n| M | N | K | tcgen05_f8f6f4 (s) | mxf8f6f4 e4m3 (s) | ratio | mxf4nvf4 nvfp4 (s) | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for M, N, K in QUICK_BLOCK_SCALED_SHAPES if quick else BLOCK_SCALED_SHAPES:
        a, b = fp8_codes(rng, "e4m3", (M, K)), fp8_codes(rng, "e4m3", (N, K))
        sa, sb = (rng.integers(120, 135, (rows, K // 32)).astype(np.uint8) for rows in (M, N))
        a4, b4 = (rng.integers(0, 16, (rows, K)).astype(np.uint8) for rows in (M, N))
        sa4, sb4 = (rng.integers(0x20, 0x50, (rows, K // 16)).astype(np.uint8) for rows in (M, N))
        runs = {
            "unscaled": lambda: accumulate_codes(a, b, "e4m3", "e4m3", TCGEN05_F8F6F4, True),
            "mxf8": lambda: accumulate_block_scaled(a, b, "e4m3", "e4m3", sa, sb, "ue8m0", TCGEN05_MXF8F6F4),
            "nvf4": lambda: accumulate_block_scaled(a4, b4, "e2m1", "e2m1", sa4, sb4, "ue4m3", TCGEN05_MXF4NVF4),
        }
        for run in runs.values():  # compile / load outside the timings
            run()
        best = {name: float("inf") for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                best[name] = min(best[name], best_of(run, 1))
        t0 = best["unscaled"]
        print(f"| {M} | {N} | {K} | {t0:.3f} | {best['mxf8']:.3f} | {best['mxf8'] / t0:.2f} | {best['nvf4']:.3f} | "
              f"{best['nvf4'] / t0:.2f} |")
    print(f"# load average while measuring: {os.getloadavg()}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--cuda" in argv:  # the CUDA kernels' timings: their own script and options (scripts/bench_cuda.py)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_cuda

        return bench_cuda.main([a for a in argv if a != "--cuda"])
    args = parse_args(argv)
    _set_thread_env(args.threads)
    if args.overhead or args.minilm or args.models:
        print(f"# {time.strftime('%c')}, load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
              f"{os.getloadavg()[2]:.2f}, {args.threads} threads")
        if args.overhead:
            overhead_section(args.repeats or 5)
        if args.minilm or args.models:
            minilm_section(args.repeats or 3)
        if args.models:
            decoder_section(args.decoder_layers, args.repeats or 2)
            print(f"# load average {os.getloadavg()[0]:.2f} at the end")
        return
    if args.startup:
        print_startup(args)
        return
    if args.rowwise_only:
        import numpy as np

        rows = rowwise_vs_tensorwise(np.random.default_rng(args.seed),
                                     QUICK_ROWWISE_SHAPES if args.quick else ROWWISE_SHAPES,
                                     args.repeats or (2 if args.quick else 3))
        print_rowwise(rows)
        return
    import numpy as np

    if args.whole_call:
        whole_call_section(np.random.default_rng(args.seed), QUICK_SHAPES if args.quick else WHOLE_CALL_SHAPES,
                           args.repeats or (2 if args.quick else 3))
        return
    if args.blockwise:
        blockwise_section(np.random.default_rng(args.seed), args.quick, args.repeats or (2 if args.quick else 3))
        return
    if args.engines:
        print(f"# {time.strftime('%c')}, load average {os.getloadavg()[0]:.2f}, {args.threads} threads")
        engines_section(np.random.default_rng(args.seed), args.quick, args.repeats or (2 if args.quick else 4))
        return
    if args.proto is not None:
        proto_section(args.proto, args.repeats or 3)
        return
    if args.block_scaled:
        block_scaled_section(np.random.default_rng(args.seed), args.quick, args.repeats or (2 if args.quick else 3))
        return
    if args.recipes:
        print(f"# {time.strftime('%c')}, load average {os.getloadavg()[0]:.2f}, {args.threads} threads")
        recipe_layers_section(args.repeats or (3 if args.quick else 10))
        return

    import mmaemu
    from mmaemu.cpu import accumulate_codes, threads
    from mmaemu.model.presets import ADA, HOPPER

    shapes = QUICK_SHAPES if args.quick else SHAPES
    repeats = args.repeats or (2 if args.quick else 5)
    rng = np.random.default_rng(args.seed)
    print(f"# mmaemu {mmaemu.__version__} CPU path vs float64 np.dot - {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    import numba

    print(f"# CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; threads: {threads.num_threads()} "
          f"(mmaemu's own pool; Numba's threading layer, untouched: {numba.config.THREADING_LAYER})")
    print(f"# NumPy {np.__version__}; each figure is the best of {repeats} timed runs after a warm-up; load average "
          f"{os.getloadavg()[0]:.2f}\n")

    rows = []
    warm = time.perf_counter()
    for M, N, K in shapes:
        a = fp8_codes(rng, "e4m3", (M, K))
        b = fp8_codes(rng, "e4m3", (N, K))
        af = rng.standard_normal((M, K))
        bf = rng.standard_normal((N, K))
        configs = [(p, fast) for p in (HOPPER, ADA) for fast in (True, False)]
        for preset, fast in configs:  # compile / load, and grow the heap, outside the timings
            accumulate_codes(a, b, "e4m3", "e4m3", preset, fast)
        np.dot(af, bf.T)
        best = {cfg: float("inf") for cfg in configs}
        best_dot = float("inf")
        for _ in range(repeats):
            best_dot = min(best_dot, best_of(lambda: np.dot(af, bf.T), 1))
            # OpenBLAS's idle workers spin (sched_yield) for a while after a call (OPENBLAS_THREAD_TIMEOUT)
            # and would take cores from the next measurement: let them fall asleep first.
            time.sleep(BLAS_SETTLE_S)
            for preset, fast in configs:
                t = best_of(lambda: accumulate_codes(a, b, "e4m3", "e4m3", preset, fast), 1)
                best[(preset, fast)] = min(best[(preset, fast)], t)
        gmac = M * N * K / 1e9
        for preset, fast in configs:
            rows.append((M, N, K, preset.name, "fast" if fast else "slow", gmac / best[(preset, fast)],
                         gmac / best_dot))
    elapsed = time.perf_counter() - warm
    largest = max(shapes, key=lambda s: s[0] * s[1] * s[2])
    a, b = fp8_codes(rng, "e4m3", (largest[0], largest[2])), fp8_codes(rng, "e4m3", (largest[1], largest[2]))
    cuts = task_cost(a, b, HOPPER, repeats)
    latency, products = interrupt_latency(HOPPER)

    print("| M | N | K | preset | accumulation | mmaemu GMAC/s | np.dot f64 GMAC/s | ratio |")
    print("|---:|---:|---:|---|---|---:|---:|---:|")
    for M, N, K, name, mode, ours, dot in rows:
        ratio = ours / dot
        print(f"| {M} | {N} | {K} | {name} | {mode} | {ours:.2f} | {dot:.2f} | {ratio:.3f} (1/{1 / ratio:.1f}) |")
    worst = min(r[5] / r[6] for r in rows)
    print(f"\n# lowest ratio: {worst:.3f} (1/{1 / worst:.1f}); timed part took {elapsed:.0f} s")
    (fine, n_fine), (coarse, n_coarse) = cuts.values()
    print(f"# task sizes, {largest} hopper fast (best of {repeats}, interleaved): {n_fine} tasks of at most "
          f"{threads.TASK_WORK} products {fine * 1e3:.1f} ms, {n_coarse} tasks (one per panel of B) "
          f"{coarse * 1e3:.1f} ms: {(fine / coarse - 1) * 100:+.1f} %")
    rate = largest[0] * largest[1] * largest[2] / fine
    print(f"# Ctrl-C: SIGINT 0.3 s into a call of {products / 1e9:.0f} G products (about {products / rate:.0f} s): "
          + (f"KeyboardInterrupt {latency * 1e3:.0f} ms later" if latency is not None else "NOT interrupted"))
    print()
    print_rowwise(rowwise_vs_tensorwise(rng, QUICK_ROWWISE_SHAPES if args.quick else ROWWISE_SHAPES, repeats))
    imp, first, second = first_call_times()
    print(f"# fresh process, warm cache: import {imp:.2f} s, first call (hopper fast) {first:.2f} s, "
          f"first call of another schedule (ada slow, 2 pairwise splits) {second:.2f} s")
    print_startup(args)
    print()
    whole_call_section(rng, QUICK_SHAPES if args.quick else WHOLE_CALL_SHAPES, repeats)
    print()
    blockwise_section(rng, args.quick, repeats)
    recipe_layers_section(repeats)
    print()
    overhead_section(repeats)
    minilm_section(min(repeats, 3))


if __name__ == "__main__":
    sys.exit(main())
