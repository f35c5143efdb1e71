#!/usr/bin/env python
"""Speed of mmaemu's CUDA kernels on a GPU, from ONE run (``python scripts/bench.py --cuda`` runs this).

Two sections, each guarded (an error is recorded and the next runs; a global time budget skips what no longer
fits); every timed result has rows checked against the CPU engine, and the mismatches are reported (the device
checks themselves are the tests of ``pytest -m cuda``, ``tests/test_gpu_kernels.py``):

1. ``offset`` - the offset kernel (``cuda:offset``) on (M, N, K) = (2048, 5760, 1920) and (64, 5760, 1920)
   (``--shapes``) for hopper fast, hopper slow, hopper with a 4-way contiguous split, ada fast and hopper
   E4M3 x E5M2: best of a few runs, TMAC/s and the fraction of the instruction-issue bound (the device's SMs x 128
   thread instructions per clock x its clock, 33.4e12 per second on an H200, divided by the SASS instructions per
   product of the kernel's block loop, counted offline by ``scripts/sass_report.py --json`` or given with
   ``--sass-per-product``); for comparison the reference kernel (``cuda:simple``, the small shape) and native
   ``torch._scaled_mm`` where the GPU has FP8 (sm_89+); and, for information, the agreement of
   ``mmaemu.scaled_mm(profile="hopper")`` with native ``torch._scaled_mm`` bits on this GPU (not a pass/fail
   criterion: this GPU need not be the H100 PCIe of the hopper profile, nor run its cuBLASLt);
2. ``native`` - ``cuda:native`` next to native ``torch._scaled_mm`` on ``--native-shapes`` ((2048, 5760, 1920) and
   (16384, 8192, 8192)): the accumulation alone and the whole ``mmaemu.scaled_mm`` with the device epilogue, fast
   and slow, for the device's own instruction.

Without a usable CUDA device both sections are skipped, saying why. ``--dry-run`` runs their code on numba's CUDA
simulator (it sets ``NUMBA_ENABLE_CUDASIM=1``): the offset kernel's timed cases on one tiny shape, and for both
native instructions an 8 x 8 x 160 GEMM, fast and slow, every output checked; the times mean nothing.

    python scripts/bench.py --cuda [--json PATH] [--quick | --dry-run] [--budget SECONDS] [--device N]
                                   [--kernels native,offset,simple] [--shapes M,N,K;M,N,K]
                                   [--native-shapes M,N,K;M,N,K] [--sass-per-product hopper=3.16,ada=3.72]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FORMAT = "mmaemu-bench-cuda/1"
START = time.monotonic()


def log(message):
    print(f"[bench --cuda {time.monotonic() - START:7.1f}s] {message}", flush=True)


class Skip(Exception):
    """A section that does not apply here (no device, no budget); the message says why."""


class Run:
    """The options, the device (torch.device, or None with the reason) and the time budget of a run."""

    def __init__(self, args):
        self.args = args
        self.deadline = START + args.budget
        self.device = None
        self.device_reason = None
        self.report = {"format": FORMAT, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
                       "quick": args.quick, "dry_run": args.dry_run, "budget_s": args.budget, "device": None,
                       "sections": []}

    def remaining(self):
        return self.deadline - time.monotonic()

    def checks(self, kernel):
        """Whether this run times GEMM kernel ``kernel`` (``--kernels``; default all)."""
        return self.args.kernels is None or kernel in self.args.kernels

    def find_device(self):
        from mmaemu.context import for_call
        from mmaemu.cuda import device as cuda_device

        try:
            import torch

            probed = cuda_device.probe(self.args.device, disabled=for_call().cuda_disabled)
            self.device = torch.device("cuda", probed.index)
            self.report["device"] = probed.identity()
        except cuda_device.DeviceUnavailable as exc:
            self.device_reason = str(exc)
            self.report["device"] = f"unavailable: {exc}"
        log(f"device: {self.report['device']}")

    def section(self, name, function, *, needs_device=True, min_seconds=30.0):
        entry = {"name": name, "status": None, "seconds": 0.0, "result": None, "error": None}
        self.report["sections"].append(entry)
        start = time.monotonic()
        try:
            if needs_device and self.device is None and not self.args.dry_run:
                raise Skip(f"no usable CUDA device: {self.device_reason}")
            if self.remaining() < min_seconds:
                raise Skip(f"time budget exhausted ({self.remaining():.0f} s left, {min_seconds:.0f} s needed)")
            entry["result"] = function()
            entry["status"] = "failed" if isinstance(entry["result"], dict) and entry["result"].get("failed") \
                else "ok"
        except Skip as exc:
            entry["status"], entry["error"] = "skipped", str(exc)
        except Exception as exc:  # every section is guarded: record and continue
            entry["status"], entry["error"] = "error", f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-4000:]
        entry["seconds"] = round(time.monotonic() - start, 2)
        log(f"section {name}: {entry['status']} in {entry['seconds']:.1f} s"
            + (f" - {entry['error']}" if entry["error"] else ""))
        return entry


def _codes(rng, shape, fmt="e4m3"):
    """Finite FP8 codes with magnitudes around 32 (both formats)."""
    from mmaemu import formats

    return formats.random_codes(rng, shape, fmt, spread=1.5, centre=5)



def _best_cuda_seconds(function, repeat):
    """The best of ``repeat`` calls of ``function`` timed with CUDA events, after one untimed call (compilation,
    warm-up)."""
    import torch

    function()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return min(times)


# The offset kernel's timed cases: (label, preset, format of A, format of B, fast, splits, scheme).
TIMED_CASES = (("hopper fast", "hopper", "e4m3", "e4m3", True, 1, "none"),
               ("hopper slow", "hopper", "e4m3", "e4m3", False, 1, "none"),
               ("hopper 4-way split", "hopper", "e4m3", "e4m3", True, 4, "contiguous"),
               ("ada fast", "ada", "e4m3", "e4m3", True, 1, "none"),
               ("hopper e4m3 x e5m2 fast", "hopper", "e4m3", "e5m2", True, 1, "none"))
THREAD_INSTRUCTIONS_PER_SM_CLOCK = 128  # 4 schedulers x 32 lanes (design note, section 1)
NOMINAL_H200 = (132, 1.98e9)  # SMs, clock (Hz): the dry run's stand-in device


def issue_rate(run):
    """(thread instructions per second, how it was found): SMs x 128 x clock of the device (nominal H200 in a dry
    run or when the clock cannot be read)."""
    sms, clock = NOMINAL_H200
    source = "nominal H200 (132 SMs, 1.98 GHz)"
    if run.device is not None:
        try:
            import torch
            from numba import cuda

            sms = torch.cuda.get_device_properties(run.device).multi_processor_count
            with cuda.gpus[run.device.index]:
                clock = cuda.get_current_device().CLOCK_RATE * 1e3  # kHz
            source = f"{sms} SMs x {THREAD_INSTRUCTIONS_PER_SM_CLOCK} x {clock / 1e9:.3f} GHz (this device)"
        except Exception as exc:
            source += f" (this device's clock unreadable: {type(exc).__name__})"
    return sms * THREAD_INSTRUCTIONS_PER_SM_CLOCK * clock, source


def sass_per_product(run, cc):
    """{preset: SASS instructions per product of the offset kernel's block loop} for compute capability ``cc``:
    ``--sass-per-product`` if given, else counted offline by ``scripts/sass_report.py --json`` in a subprocess
    (it fakes a device inside numba, which must not happen next to real kernels); None if neither works."""
    if run.args.sass_per_product:
        return dict(run.args.sass_per_product), "--sass-per-product"
    import subprocess

    command = [sys.executable, str(ROOT / "scripts" / "sass_report.py"), "--json", "--cc", f"{cc[0]}.{cc[1]}"]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        costs = json.loads(done.stdout.strip().splitlines()[-1])[f"sm_{cc[0]}{cc[1]}"]
        return costs["per_product"], f"scripts/sass_report.py (offline, sm_{cc[0]}{cc[1]})"
    except Exception as exc:
        tail = (done.stderr.strip().splitlines() or [""])[-1] if "done" in locals() else ""
        return None, f"not counted: {type(exc).__name__} {tail}"[:300]


class Gemm:
    """One GEMM's operands, on the device (torch) or for the simulator (numpy), made on first use per side and
    format: ``timed(kernel, case, repeat, rows)`` returns the best time in seconds and rows of the fp32 accumulators
    on the host."""

    def __init__(self, run, shape, seed):
        self.run, self.shape, self.seed = run, shape, seed
        self._codes, self._tensors = {}, {}

    def codes(self, side, fmt):
        """uint8 codes [M, K] of A (``side`` "a") or [N, K] of B, format ``fmt``."""
        import numpy as np

        if (side, fmt) not in self._codes:
            M, N, K = self.shape
            rng = np.random.default_rng([self.seed, side == "b", fmt == "e5m2"])
            self._codes[side, fmt] = _codes(rng, (M if side == "a" else N, K), fmt)
        return self._codes[side, fmt]

    def tensor(self, side, fmt):
        """:meth:`codes` as a torch FP8 tensor on the device."""
        if (side, fmt) not in self._tensors:
            import torch

            from mmaemu import formats

            self._tensors[side, fmt] = torch.from_numpy(self.codes(side, fmt)).to(self.run.device).view(
                formats.DTYPE_OF[fmt])
        return self._tensors[side, fmt]

    def _call(self, kernel, case):
        from mmaemu.cuda.dispatch import engine
        from mmaemu.model.presets import get_preset

        label, preset, fmt_a, fmt_b, fast, splits, scheme = case
        preset = get_preset(preset, warn=False)
        if self.run.device is None:
            a, b = self.codes("a", fmt_a), self.codes("b", fmt_b)
            return lambda: engine.accumulate_numpy(kernel, a, b, fmt_a, fmt_b, preset, fast, splits, scheme)
        a, b = self.tensor("a", fmt_a), self.tensor("b", fmt_b)
        return lambda: engine.accumulate_tensors(kernel, a, b, fmt_a, fmt_b, preset, fast, splits, scheme)

    def timed(self, kernel, case, repeat, rows):
        """(best seconds, rows ``rows`` of the accumulators of the last run, on the host)."""
        call = self._call(kernel, case)
        result = {}
        if self.run.device is None:
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                result["acc"] = call()
                times.append(time.perf_counter() - start)
            return min(times), result["acc"][rows]
        import torch

        best = _best_cuda_seconds(lambda: result.__setitem__("acc", call()), repeat)
        return best, result["acc"][torch.from_numpy(rows).to(self.run.device)].cpu().numpy()


def _check_rows(acc_rows, gemm, case, rows):
    """Mismatching bits of the accumulators of the given rows against the CPU path (mmaemu.cpu.accumulate_codes)."""
    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda.verdicts.selftest import compare_bits
    from mmaemu.model.presets import get_preset

    label, preset, fmt_a, fmt_b, fast, splits, scheme = case
    want = accumulate_codes(gemm.codes("a", fmt_a)[rows], gemm.codes("b", fmt_b), fmt_a, fmt_b,
                            get_preset(preset, warn=False), fast, splits, scheme)
    return compare_bits(acc_rows, want)



def offset_timing(run):
    import numpy as np

    dry = run.args.dry_run
    shapes = run.args.shapes if not dry else [[4, 8, 64]]
    rate, rate_source = issue_rate(run)
    cc = (9, 0)
    if run.device is not None:
        import torch

        cc = torch.cuda.get_device_capability(run.device)
    counts, counts_source = sass_per_product(run, cc)
    out = {"dry_run": dry, "issue_rate": rate, "issue_rate_source": rate_source, "sass_per_product": counts,
           "sass_source": counts_source, "cases": [], "native": {}, "agreement": {}}
    log(f"issue rate {rate:.3g} thread instructions/s ({rate_source}); SASS per product {counts} ({counts_source})")
    for index, shape in enumerate(shapes):
        gemm = Gemm(run, shape, 11 + index)
        M = shape[0]
        rows = np.unique(np.r_[np.arange(min(16, M)), np.arange(max(0, M - 16), M)])
        timed = [("cuda:offset", case) for case in TIMED_CASES] if run.checks("offset") else []
        if not dry and M <= 256 and run.checks("simple"):
            timed.append(("cuda:simple", TIMED_CASES[0]))
        for backend, case in timed:
            entry = {"kernel": backend, "case": case[0], "shape": list(shape)}
            out["cases"].append(entry)
            if run.remaining() < 30 and not dry:
                entry["skipped"] = "time budget"
                continue
            seconds, acc = gemm.timed(backend[len("cuda:"):], case, 1 if dry else 3, rows)
            count, first = _check_rows(acc, gemm, case, rows)
            tmacs = float(np.prod(shape)) / seconds / 1e12
            entry.update({"best_s": round(seconds, 6), "tmac_per_s": _figures(tmacs), "checked_rows": len(rows),
                          "mismatches": count, "first": first})
            # E4M3 x E4M3 runs the power-sum kernel, the other pairs the add-max one (sass_report.offset_costs keys)
            key = case[1] if case[2:4] == ("e4m3", "e4m3") else case[1] + "/add-max"
            per_product = (counts or {}).get(key) if backend == "cuda:offset" else None
            if per_product:
                bound = rate / per_product / 1e12
                entry.update({"sass_per_product": per_product, "bound_tmac_per_s": _figures(bound),
                              "fraction_of_bound": _figures(tmacs / bound)})
            log(f"timing {backend} {case[0]} {tuple(shape)}: {tmacs:.3f} TMAC/s"
                + (f" ({entry['fraction_of_bound']:.0%} of the issue bound)" if per_product else "")
                + f", {count} mismatches in {len(rows)} checked rows")
    if not dry:
        _native(run, out, shapes)
    out["failed"] = any(c.get("mismatches") for c in out["cases"])
    return out


def _figures(x, digits=4):
    """x to ``digits`` significant figures (a simulator's TMAC/s is tiny, a GPU's is not)."""
    return float(f"{x:.{digits}g}")


def _native(run, out, shapes):
    """torch._scaled_mm on the same shapes (bf16 out) where the GPU has FP8, and the hopper profile's agreement
    with its bits (information only)."""
    import numpy as np
    import torch

    import mmaemu

    cc = torch.cuda.get_device_capability(run.device)
    if cc < (8, 9) or not hasattr(torch, "_scaled_mm"):
        out["native"] = f"skipped: sm_{cc[0]}{cc[1]} has no FP8 tensor cores for torch._scaled_mm"
        return
    one = torch.tensor(1.0, device=run.device)
    for index, shape in enumerate(shapes):
        gemm = Gemm(run, shape, 11 + index)
        a, b = gemm.tensor("a", "e4m3"), gemm.tensor("b", "e4m3")
        for fast in (True, False):
            label = f"{tuple(shape)} bf16 {'fast' if fast else 'slow'}"
            try:
                function = lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16,  # noqa: E731
                                                    use_fast_accum=fast)
                best = _best_cuda_seconds(function, 10)
                out["native"][label] = {"best_s": round(best, 6),
                                        "tmac_per_s": _figures(float(np.prod(shape)) / best / 1e12)}
            except Exception as exc:
                out["native"][label] = f"{type(exc).__name__}: {exc}"
            if index or run.remaining() < 60:
                continue
            try:
                native = torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)
                emulated = mmaemu.scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                            profile="hopper")
                plan = mmaemu.explain(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                      profile="hopper")
                equal = mmaemu.testing.bits(native) == mmaemu.testing.bits(emulated)
                out["agreement"][label] = {"identical_fraction": float(equal.float().mean().item()),
                                           "split": str(plan.split), "backend": plan.backend}
            except Exception as exc:
                out["agreement"][label] = f"{type(exc).__name__}: {exc}"



def _native_targets(run):
    """[(instruction name, preset)] the cuda:native stages check: the device's own instruction (Skip, saying why,
    where cuda:native cannot run), or in a dry run (numba's CUDA simulator) every instruction."""
    from mmaemu.cuda.native import kernel as native_kernel

    if run.args.dry_run:
        return [(name, module.PRESET) for name, module in native_kernel.INSTRUCTIONS.items()]
    if run.device is None:
        raise Skip(f"no usable CUDA device: {run.device_reason}")
    from mmaemu.cuda import device as cuda_device
    from mmaemu.cuda.dispatch import gating
    from mmaemu.cuda.catalog import NATIVE_INSTRUCTIONS
    from mmaemu.model.presets import get_preset

    info = cuda_device.probe(run.device)
    why = gating.device_skip("native", info)
    if why is not None:
        raise Skip(f"cuda:native cannot run here: {why}")
    name, preset_name, _ = NATIVE_INSTRUCTIONS[tuple(info.capability)]
    return [(name, get_preset(preset_name, warn=False))]


def native_timing(run):
    """cuda:native next to native torch._scaled_mm on --native-shapes: the accumulation alone and the whole
    mmaemu.scaled_mm (NaN/Inf rule and exact epilogue on the device), fast and slow accumulation of the device's
    preset, rows checked against the CPU engine. Under the simulator: a tiny shape, every output checked, nothing
    timed that means anything."""
    import numpy as np

    dry = run.args.dry_run
    out = {"shapes": []}
    for instruction, preset in _native_targets(run):
        shapes = [(8, 8, 160)] if dry else [(64, 256, 512)] if run.args.quick else run.args.native_shapes
        for M, N, K in shapes:
            if run.remaining() < 40:
                out["shapes"].append({"instruction": instruction, "shape": [M, N, K], "skipped": "time budget"})
                continue
            gemm = Gemm(run, (M, N, K), M + N + K)
            entry = {"instruction": instruction, "preset": preset.name, "shape": [M, N, K], "macs": M * N * K}
            rows = np.arange(M) if dry else np.unique(np.r_[0:4, M // 2:M // 2 + 2, M - 4:M])
            for fast in (True, False):
                label = "fast" if fast else "slow"
                case = (label, preset.name, "e4m3", "e4m3", fast, 1, "none")
                best, acc = gemm.timed("native", case, 1 if dry else 5, rows)
                count, first = _check_rows(acc, gemm, case, rows)
                entry[label] = {"accumulate_best_s": round(best, 6),
                                "accumulate_tmacs": round(M * N * K / best / 1e12, 1), "checked_rows": len(rows),
                                "mismatches": count, "first": first}
                if run.device is not None:
                    entry[label].update(_scaled_mm_times(run, gemm.tensor("a", "e4m3"), gemm.tensor("b", "e4m3"),
                                                         preset, fast))
                log(f"native {instruction} {M}x{N}x{K} {label}: " + ", ".join(
                    f"{k} {v}" for k, v in entry[label].items() if k.endswith("tmacs")) + f"; {count} mismatches")
            if "scaled_mm_best_s" in entry.get("fast", {}) and "scaled_mm_best_s" in entry.get("slow", {}):
                entry["slow_over_fast_time"] = round(entry["slow"]["scaled_mm_best_s"]
                                                     / entry["fast"]["scaled_mm_best_s"], 3)
            out["shapes"].append(entry)
    out["failed"] = any(isinstance(e.get(k), dict) and e[k]["mismatches"] for e in out["shapes"]
                        for k in ("fast", "slow"))
    return out


def _scaled_mm_times(run, a, b, preset, fast):
    """Best seconds and TMAC/s of mmaemu.scaled_mm through cuda:native (with the device epilogue) and of native
    torch._scaled_mm on the same operands (bf16 out)."""
    import torch

    import mmaemu

    M, K = a.shape
    N = b.shape[0]
    one = torch.tensor(1.0, device=run.device)
    full = lambda: mmaemu.scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16,  # noqa: E731
                                    use_fast_accum=fast, profile=preset.name, splitk=1, backend="cuda:native")
    native = lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16,  # noqa: E731
                                      use_fast_accum=fast)
    out = {}
    for name, function, repeat in (("scaled_mm", full, 5), ("torch_scaled_mm", native, 10)):
        best = _best_cuda_seconds(function, repeat)
        out[f"{name}_best_s"] = round(best, 6)
        out[f"{name}_tmacs"] = round(M * N * K / best / 1e12, 1)
    return out


def markdown(report):
    """The sections' tables (what docs/validation.md and docs/performance.md record)."""
    lines = [f"# mmaemu CUDA kernels' speed ({report['started']})", "", f"device: {report['device']}", "",
             "| section | status | seconds | note |", "|---|---|---|---|"]
    for s in report["sections"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']} | {(s['error'] or '').replace('|', '/')[:200]} |")
    for s in report["sections"]:
        r = s.get("result")
        if not isinstance(r, dict):
            continue
        if s["name"] == "offset":
            lines += ["", "## Timing" + (" (dry run on the simulator: the times mean nothing)" if r["dry_run"] else ""),
                      "", f"Issue rate {r['issue_rate']:.3g} thread instructions/s ({r['issue_rate_source']}); "
                      f"SASS instructions per product of the offset kernel's block loop: {r['sass_per_product']} "
                      f"({r['sass_source']}).", "",
                      "| kernel | case | M, N, K | best s | TMAC/s | SASS/product | bound TMAC/s | of bound | "
                      "mismatches (rows checked) |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
            for c in r["cases"]:
                if "skipped" in c:
                    lines.append(f"| {c['kernel']} | {c['case']} | {c['shape']} | skipped: {c['skipped']} | | | | | |")
                    continue
                bound = (f"{c['sass_per_product']} | {c['bound_tmac_per_s']} | {c['fraction_of_bound']:.0%}"
                         if "fraction_of_bound" in c else " | | ")
                lines.append(f"| {c['kernel']} | {c['case']} | {c['shape']} | {c['best_s']} | {c['tmac_per_s']} | "
                             f"{bound} | {c['mismatches']} ({c['checked_rows']}) |")
            if isinstance(r["native"], dict):
                for label, v in r["native"].items():
                    value = f"{v['best_s']} s, {v['tmac_per_s']} TMAC/s" if isinstance(v, dict) else v
                    lines.append(f"\ntorch._scaled_mm {label}: {value}")
            elif r["native"]:
                lines.append(f"\ntorch._scaled_mm: {r['native']}")
            for label, v in r.get("agreement", {}).items():
                lines.append(f"\nhopper profile vs this GPU's native bits ({label}, information only): {v}")
        elif s["name"] == "native":
            lines += ["", "## cuda:native timing (TMAC/s)", "",
                      "| shape | case | scaled_mm (with epilogue) | accumulation alone | torch._scaled_mm | "
                      "mismatches |",
                      "|---|---|---|---|---|---|"]
            for e in r["shapes"]:
                for label in ("fast", "slow"):
                    v = e.get(label)
                    if isinstance(v, dict):
                        lines.append(f"| {e['shape']} | {e['instruction']} {e.get('preset')} {label} | "
                                     f"{v.get('scaled_mm_tmacs', '-')} | {v['accumulate_tmacs']} | "
                                     f"{v.get('torch_scaled_mm_tmacs', '-')} | {v['mismatches']} |")
                if "slow_over_fast_time" in e:
                    lines.append(f"| {e['shape']} | slow / fast time | {e['slow_over_fast_time']} | | | |")
                if "skipped" in e:
                    lines.append(f"| {e['shape']} | skipped: {e['skipped']} | | | | |")
    return "\n".join(lines) + "\n"


def parse_shape(text):
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 3 or min(parts) < 1:
        raise argparse.ArgumentTypeError("expected M,N,K with positive integers")
    return parts


def parse_shapes(text):
    return [parse_shape(part) for part in text.split(";")]


def parse_counts(text):
    try:
        return {name: float(value) for name, value in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError("expected preset=count pairs, e.g. hopper=3.16,ada=3.72") from None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="also write the report here (and its markdown next to it)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes")
    parser.add_argument("--budget", type=float, default=300.0, help="time budget in seconds (default 300)")
    parser.add_argument("--device", type=int, default=None, help="CUDA device ordinal (default: current)")
    parser.add_argument("--shapes", type=parse_shapes, default=[[2048, 5760, 1920], [64, 5760, 1920]],
                        help="offset timing shapes M,N,K;M,N,K")
    parser.add_argument("--native-shapes", type=parse_shapes, default=[[2048, 5760, 1920], [16384, 8192, 8192]],
                        help="cuda:native timing shapes M,N,K;M,N,K")
    parser.add_argument("--kernels", type=lambda t: [k.strip().replace("cuda:", "") for k in t.split(",")],
                        default=None, help="GEMM kernels to time, e.g. native (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="the sections on numba's CUDA simulator, tiny shapes")
    parser.add_argument("--sass-per-product", type=parse_counts, default=None,
                        help="SASS instructions per product of the offset kernel, e.g. hopper=3.16,ada=3.72 "
                             "(E4M3 x E4M3), hopper/add-max=3.24 (other pairs; default: counted offline by "
                             "scripts/sass_report.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.native_shapes = [[64, 256, 512]], [[64, 256, 512]]
    if args.dry_run:
        args.quick = True
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is imported (nothing has imported it yet)
    return args


def main(argv=None):
    args = parse_args(argv)
    run = Run(args)
    if not args.dry_run:
        run.find_device()
    if run.checks("offset") or run.checks("simple"):
        run.section("offset", lambda: offset_timing(run))
    if run.checks("native"):
        run.section("native", lambda: native_timing(run), min_seconds=40)
    run.report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    text = markdown(run.report)
    print(text)
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run.report, indent=1, default=str))
        path.with_suffix(".md").write_text(text)
    return 1 if any(s["status"] in ("failed", "error") for s in run.report["sections"]) else 0


if __name__ == "__main__":
    sys.exit(main())
