#!/usr/bin/env python
"""One prepared GPU validation run of mmaemu's CUDA kernels; writes a JSON and a markdown report.

Stages (each one guarded: an error is recorded and the next stage runs; a global time budget skips what no
longer fits):

1. ``environment`` - versions (python, torch, numba, numba-cuda, mmaemu), the device, the driver, how numba
   compiles for it, and why the kernels cannot run if they cannot;
2. ``cpu_reference`` - the CPU engine against the reference loop on a small GEMM (sanity of this install);
3. ``selftest`` - every kernel's self-test on the device (``mmaemu.selftest(force=True)``: random and adversarial
   GEMMs against the CPU reference, hopper and ada, fast, slow and split-K, mixed formats, NaN/Inf; the epilogue
   for every output dtype);
4. ``compare`` - every GEMM kernel against the CPU reference on more random and adversarial GEMMs for hopper and
   ada (fast, slow, contiguous / serial / pairwise splits, larger shapes), and the full ``mmaemu.scaled_mm`` path
   (device epilogue) against ``backend="cpu"``;
5. ``timing`` - each kernel on (M, N, K) = (2048, 5760, 1920) (``--shape``) for hopper fast and slow, rows of the
   result checked against the CPU reference, against native ``torch._scaled_mm`` of the same shape where the GPU
   has FP8 (sm_89+); and, for information, the agreement of ``mmaemu.scaled_mm(profile="hopper")`` with native
   ``torch._scaled_mm`` bits on this GPU (not a pass/fail criterion: this GPU need not be the H100 PCIe of the
   hopper profile, nor run its cuBLASLt).

Without a usable CUDA device the GPU stages are skipped, saying why, and the run still succeeds (exit 0).
``--quick`` uses tiny shapes (CI runs it on a CPU-only machine). Exit status: 0 if no stage failed, 1 otherwise.

    python scripts/gpu_check.py [--out DIR] [--quick] [--budget SECONDS] [--device N] [--shape M,N,K]
                                [--kernels native,biased] [--native-shapes "M,N,K;M,N,K"]
                                [--simulator wgmma,mma_sync]

``cuda:native`` adds two stages for the device's own instruction (sm_90: the warpgroup MMA, hopper preset; sm_89:
mma.sync, ada preset): ``native_probe`` (its instruction probe alone, with the first differing cases) before the
self-tests, and ``native_timing`` right after them (accumulation alone and the whole ``mmaemu.scaled_mm`` with the
device epilogue, fast and slow, on (2048, 5760, 1920) and (16384, 8192, 8192), next to native
``torch._scaled_mm``, rows checked against the CPU engine). ``--kernels native --budget 240`` runs just these and
cuda:native's self-test, comparison and timing: about four minutes on an H200 (kernel compilation included).
``--simulator`` is a dry run of the two native stages under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``):
two probe tiles and an 8 x 8 x 160 GEMM per instruction, every output checked (CI runs it).

``--out`` defaults to ``$OUT`` if set, else ``./gpu_check_out``. Run it with ``PYTHONUNBUFFERED=1`` (or ``-u``) to
follow the progress lines live.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FORMAT = "mmaemu-gpu-check/1"
START = time.monotonic()


def log(message):
    print(f"[gpu_check {time.monotonic() - START:7.1f}s] {message}", flush=True)


class Skip(Exception):
    """A stage that does not apply here (no device, no budget); the message says why."""


class Run:
    def __init__(self, args):
        self.args = args
        self.out = pathlib.Path(args.out)
        self.deadline = START + args.budget
        self.report = {"format": FORMAT, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
                       "quick": args.quick, "budget_s": args.budget, "stages": [], "finished": None}
        self.device = None  # torch.device when usable
        self.device_reason = None

    def remaining(self):
        return self.deadline - time.monotonic()

    def gemm_kernels(self):
        """The GEMM kernels this run checks (``--kernels``; default all), in the dispatcher's order."""
        from mmaemu import backends

        chosen = self.args.kernels
        return [k for k in backends.gemm_kernels() if chosen is None or k.name in chosen]

    def kernel_names(self, with_epilogue=False):
        names = [k.name for k in self.gemm_kernels()]
        return names + ["epilogue"] if with_epilogue else names

    def stage(self, name, function, *, needs_device=False, min_seconds=5.0):
        entry = {"name": name, "status": None, "seconds": 0.0, "result": None, "error": None}
        self.report["stages"].append(entry)
        start = time.monotonic()
        log(f"stage {name}: start ({self.remaining():.0f} s of budget left)")
        try:
            if needs_device and self.device is None:
                raise Skip(f"no usable CUDA device: {self.device_reason}")
            if self.remaining() < min_seconds:
                raise Skip(f"time budget exhausted ({self.remaining():.0f} s left, {min_seconds:.0f} s needed)")
            entry["result"] = function()
            entry["status"] = "ok"
            if isinstance(entry["result"], dict) and entry["result"].get("failed"):
                entry["status"] = "failed"
        except Skip as exc:
            entry["status"], entry["error"] = "skipped", str(exc)
        except Exception as exc:  # every stage is guarded: record and continue
            entry["status"] = "error"
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-4000:]
        entry["seconds"] = round(time.monotonic() - start, 2)
        log(f"stage {name}: {entry['status']} in {entry['seconds']:.1f} s"
            + (f" - {entry['error']}" if entry["error"] else ""))
        self.write()
        return entry

    def write(self):
        self.report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.report["elapsed_s"] = round(time.monotonic() - START, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.report, indent=1, default=str))
        (self.out / "gpu_check.md").write_text(markdown(self.report))


# ----------------------------------------------------------------------------------------------------------------
# Stages


def stage_environment(run):
    import numba
    import numpy
    import torch

    import mmaemu

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
        available = torch.cuda.is_available()
    except Exception as exc:
        available, info["torch_cuda_error"] = False, str(exc)
    info["torch_cuda_available"] = available
    if available:
        index = run.args.device if run.args.device is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info["device"] = {"index": index, "name": props.name, "capability": [props.major, props.minor],
                          "sm_count": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1)}
    from mmaemu.cuda import device as cuda_device

    try:
        probed = cuda_device.probe(run.args.device)
        info["kernels_can_run"] = True
        info["probe"] = probed.identity()
        run.device = torch.device("cuda", probed.index)
    except cuda_device.DeviceUnavailable as exc:
        info["kernels_can_run"] = False
        info["probe"] = str(exc)
        run.device_reason = str(exc)
    log(f"device: {info.get('device')}; kernels can run: {info['kernels_can_run']} ({info['probe']})")
    return info


def _codes(rng, shape, fmt="e4m3", scale=40.0):
    import numpy as np
    import torch

    x = np.clip(rng.standard_normal(shape) * scale, -448 if fmt == "e4m3" else -57344, 448 if fmt == "e4m3" else 57344)
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    return torch.from_numpy(x.astype(np.float32)).to(dtype).view(torch.uint8).numpy()


def stage_cpu_reference(run):
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda.selftest import compare_bits
    from mmaemu.model.presets import get_preset

    rng = np.random.default_rng(1)
    M, N, K = (8, 8, 96) if run.args.quick else (64, 64, 1024)
    a, b = _codes(rng, (M, K)), _codes(rng, (N, K))
    result = {"shape": [M, N, K], "cases": []}
    for preset, fast, S, scheme in (("hopper", True, 1, "none"), ("hopper", False, 2, "contiguous"),
                                    ("ada", False, 3, "pairwise")):
        p = get_preset(preset, warn=False)
        fast_path = accumulate_codes(a, b, "e4m3", "e4m3", p, fast, S, scheme)
        reference = accumulate_codes(a, b, "e4m3", "e4m3", p, fast, S, scheme, reference=True)
        count, first = compare_bits(fast_path, reference)
        result["cases"].append({"preset": preset, "fast": fast, "splits": S, "scheme": scheme, "mismatches": count})
    result["failed"] = any(c["mismatches"] for c in result["cases"])
    return result


def stage_selftest(run):
    from mmaemu import backends

    results = backends.selftest(run.device, kernels=run.kernel_names(with_epilogue=True), force=True)
    verdict, reason = backends.selftest_verdict(results)
    out = {"verdict": verdict, "reason": reason, "kernels": {}}
    for name, gates in results.items():
        out["kernels"][name] = [{"passed": g.passed, "reason": g.reason, "seconds": round(g.seconds, 2),
                                 "details": g.details} for g in gates]
        log(f"selftest {name}: {'PASS' if all(g.passed for g in gates) else 'FAIL'} - {gates[0].reason}")
    out["failed"] = verdict == "FAIL"
    return out


def stage_compare(run):
    import numpy as np
    import torch

    import mmaemu
    from mmaemu import formats
    from mmaemu.cuda import engine, selftest
    from mmaemu.model.presets import get_preset

    quick = run.args.quick
    cases = [
        selftest.GemmCase("random hopper fast 256x320x1920", "hopper", "e4m3", "e4m3", True, 1, "none",
                          256, 320, 1920, "random", 201),
        selftest.GemmCase("random hopper slow 200x136x2000", "hopper", "e4m3", "e4m3", False, 1, "none",
                          200, 136, 2000, "random", 202),
        selftest.GemmCase("adversarial hopper contiguous S=3 slow", "hopper", "e4m3", "e5m2", False, 3, "contiguous",
                          96, 80, 1500, "adversarial", 203),
        selftest.GemmCase("random ada fast 256x320x1920", "ada", "e4m3", "e4m3", True, 1, "none",
                          256, 320, 1920, "random", 204),
        selftest.GemmCase("adversarial ada serial S=6 fast", "ada", "e4m3", "e4m3", True, 6, "serial",
                          64, 240, 4096, "adversarial", 205),
        selftest.GemmCase("random ada pairwise S=3 slow", "ada", "e5m2", "e4m3", False, 3, "pairwise",
                          96, 96, 1600, "random", 206),
        selftest.GemmCase("NaN/Inf ada slow", "ada", "e5m2", "e5m2", False, 1, "none", 64, 64, 512, "nonfinite", 207),
    ]
    if quick:
        cases = [c.shrunk() for c in cases[:3]]
    out = {"kernels": {}, "scaled_mm": []}
    for kernel in run.gemm_kernels():
        if run.remaining() < 20:
            out["kernels"][kernel.backend] = "skipped: time budget"
            continue

        def compute(case, a, b, kernel=kernel.name):
            at = torch.from_numpy(a).to(run.device).view(formats.DTYPE_OF[case.fmt_a])
            bt = torch.from_numpy(b).to(run.device).view(formats.DTYPE_OF[case.fmt_b])
            return engine.accumulate_tensors(kernel, at, bt, case.fmt_a, case.fmt_b,
                                             get_preset(case.preset, warn=False), case.fast, case.splits,
                                             case.scheme).cpu().numpy()

        def skip(case, kernel=kernel.name):
            from mmaemu.cuda import device as cuda_device
            from mmaemu.cuda import gating

            preset = get_preset(case.preset, warn=False)
            info = cuda_device.probe(run.device)
            return (gating.schedule_skip(kernel, preset, case.fmt_a, case.fmt_b, case.fast, case.splits, case.scheme)
                    or gating.device_skip(kernel, info, preset))

        start = time.monotonic()
        passed, details = selftest.run_gemm_cases(compute, cases, skip=skip)
        out["kernels"][kernel.backend] = {"passed": passed, "seconds": round(time.monotonic() - start, 2),
                                          "cases": details}
        skipped = sum(1 for d in details if d.get("skipped"))
        log(f"compare {kernel.backend}: {'identical' if passed else 'MISMATCH'} on {len(cases) - skipped} GEMMs"
            + (f" ({skipped} skipped by design)" if skipped else ""))
    # The whole scaled_mm path (epilogue on the device) against the CPU backend.
    rng = np.random.default_rng(7)
    M, N, K = (4, 4, 64) if quick else (128, 256, 1920)
    x = torch.from_numpy(_codes(rng, (M, K))).view(torch.float8_e4m3fn)
    w = torch.from_numpy(_codes(rng, (N, K))).view(torch.float8_e4m3fn)
    one, half = torch.tensor(1.0), torch.tensor(0.5)
    for kernel in run.gemm_kernels():
        for out_dtype, fast in ((torch.bfloat16, True), (torch.float32, False), (torch.float8_e4m3fn, True)):
            kwargs = dict(out_dtype=out_dtype, use_fast_accum=fast, splitk=1)
            want = mmaemu.scaled_mm(x, w.t(), half, one, backend="cpu", **kwargs)
            got = mmaemu.scaled_mm(x.to(run.device), w.to(run.device).t(), half.to(run.device), one.to(run.device),
                                   backend=kernel.backend, **kwargs)
            same = got.device.type == "cuda" and torch.equal(mmaemu.testing.bits(got).cpu(),
                                                             mmaemu.testing.bits(want))
            out["scaled_mm"].append({"kernel": kernel.backend, "out": str(out_dtype), "fast": fast,
                                     "identical": bool(same), "result_device": str(got.device)})
    out["failed"] = (any(isinstance(v, dict) and not v["passed"] for v in out["kernels"].values())
                     or any(not r["identical"] for r in out["scaled_mm"]))
    return out


def _time_cuda(function, repeat):
    import torch

    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return times


def stage_timing(run):
    import numpy as np
    import torch

    import mmaemu
    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import device as cuda_device
    from mmaemu.cuda import engine, gating, selftest
    from mmaemu.model.presets import get_preset

    M, N, K = run.args.shape
    if run.args.quick:
        M, N, K = 32, 48, 256
    rng = np.random.default_rng(11)
    a_codes, b_codes = _codes(rng, (M, K)), _codes(rng, (N, K))
    a = torch.from_numpy(a_codes).to(run.device).view(torch.float8_e4m3fn)
    b = torch.from_numpy(b_codes).to(run.device).view(torch.float8_e4m3fn)
    check_rows = np.unique(np.r_[np.arange(min(16, M)), np.arange(max(0, M - 16), M)])
    out = {"shape": [M, N, K], "kernels": {}, "native": {}, "agreement": {}}
    cc = torch.cuda.get_device_capability(run.device)
    for kernel in run.gemm_kernels():
        entry = out["kernels"].setdefault(kernel.backend, {})
        for preset_name, fast in (("hopper", True), ("hopper", False)):
            label = f"{preset_name} {'fast' if fast else 'slow'}"
            preset = get_preset(preset_name, warn=False)
            why = gating.device_skip(kernel.name, cuda_device.probe(run.device), preset)
            if why is not None:
                entry[label] = f"skipped: {why}"
                continue
            if run.remaining() < 30:
                entry[label] = "skipped: time budget"
                continue
            # Predict the full run from a slice of rows (compiled already by the self-test) before committing.
            rows = max(1, min(M, 128))
            probe_time = min(_time_cuda(lambda: engine.accumulate_tensors(kernel.name, a[:rows], b, "e4m3", "e4m3",
                                                                          preset, fast), 2))
            predicted = probe_time * M / rows
            if predicted * 2 > run.remaining() - 20:
                entry[label] = f"skipped: predicted {predicted:.1f} s per run exceeds the budget"
                continue
            result = {}
            times = _time_cuda(lambda: result.__setitem__(
                "acc", engine.accumulate_tensors(kernel.name, a, b, "e4m3", "e4m3", preset, fast)), 2)
            acc = result["acc"][torch.from_numpy(check_rows).to(run.device)].cpu().numpy()
            want = accumulate_codes(a_codes[check_rows], b_codes, "e4m3", "e4m3", preset, fast, reference=True)
            count, first = selftest.compare_bits(acc, want)
            entry[label] = {"seconds": [round(t, 4) for t in times], "best_s": round(min(times), 4),
                            "products_per_s": round(M * N * K / min(times)), "checked_rows": len(check_rows),
                            "mismatches": count, "first": first}
            log(f"timing {kernel.backend} {label}: best {min(times):.3f} s, {count} mismatches in checked rows")
    # Native torch._scaled_mm.
    if cc >= (8, 9) and hasattr(torch, "_scaled_mm"):
        one = torch.tensor(1.0, device=run.device)
        for fast in (True, False):
            try:
                function = lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16,  # noqa: E731
                                                    use_fast_accum=fast)
                function()
                times = _time_cuda(function, 10)
                out["native"][f"bf16 {'fast' if fast else 'slow'}"] = {"best_s": round(min(times), 6),
                                                                       "products_per_s": round(M * N * K / min(times))}
            except Exception as exc:
                out["native"][f"bf16 {'fast' if fast else 'slow'}"] = f"{type(exc).__name__}: {exc}"
        # Information only: the hopper profile's bits against this GPU's native bits.
        if run.remaining() > 60:
            for fast in (True, False):
                try:
                    native = torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)
                    emulated = mmaemu.scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                                profile="hopper")
                    plan = mmaemu.explain(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                          profile="hopper")
                    equal = (mmaemu.testing.bits(native) == mmaemu.testing.bits(emulated))
                    out["agreement"][f"bf16 {'fast' if fast else 'slow'}"] = {
                        "identical_fraction": float(equal.float().mean().item()),
                        "split": str(plan.split), "backend": plan.backend}
                except Exception as exc:
                    out["agreement"][f"bf16 {'fast' if fast else 'slow'}"] = f"{type(exc).__name__}: {exc}"
    else:
        out["native"] = f"skipped: sm_{cc[0]}{cc[1]} has no FP8 tensor cores for torch._scaled_mm"
    out["failed"] = any(isinstance(v, dict) and v.get("mismatches") for e in out["kernels"].values()
                        for v in e.values())
    return out


def _native_targets(run):
    """[(instruction name, preset)] the cuda:native stages check: the device's own instruction (Skip, saying why,
    where cuda:native cannot run), or under numba's CUDA simulator (``--simulator``) the instructions named."""
    from mmaemu.cuda import native_kernel

    if run.args.simulator:
        return [(name, native_kernel.INSTRUCTIONS[name].PRESET) for name in run.args.simulator]
    if run.device is None:
        raise Skip(f"no usable CUDA device: {run.device_reason}")
    from mmaemu.cuda import device as cuda_device
    from mmaemu.cuda import gating
    from mmaemu.cuda.catalog import NATIVE_INSTRUCTIONS
    from mmaemu.model.presets import get_preset

    info = cuda_device.probe(run.device)
    why = gating.device_skip("native", info)
    if why is not None:
        raise Skip(f"cuda:native cannot run here: {why}")
    name, preset_name, _ = NATIVE_INSTRUCTIONS[tuple(info.capability)]
    return [(name, get_preset(preset_name, warn=False))]


def stage_native_probe(run):
    """cuda:native's instruction probe alone, with its first differences (the self-test runs it too, first)."""
    from mmaemu.cuda import probe

    out = {}
    for instruction, preset in _native_targets(run):
        start = time.monotonic()
        if run.args.simulator:  # two tiles of one format pair: the plumbing, not the hardware
            passed, details = probe.run_probe(probe.device_runner(instruction), preset,
                                              probe.probe_tiles(preset, pairs=(("e4m3", "e5m2"),))[-3:-1])
        else:
            from mmaemu.cuda import engine

            with engine._OnDevice(run.device) as on:
                passed, details = probe.run_probe(probe.device_runner(instruction, on.stream), preset)
        details.update(seconds=round(time.monotonic() - start, 2), summary=probe.summarize(details), passed=passed)
        out[instruction] = details
        log(f"{instruction}: {details['summary']}")
    out["failed"] = not all(d["passed"] for d in out.values())
    return out


def _native_run(run, a_codes, b_codes, rows, preset, fast, repeat):
    """(rows ``rows`` of cuda:native's fp32 accumulators as numpy, best seconds of ``repeat`` timed runs, the
    operands as device tensors or None): on the device through torch, or under the simulator through numpy (one
    run)."""
    from mmaemu.cuda import engine

    if run.args.simulator:
        start = time.perf_counter()
        acc = engine.accumulate_numpy("native", a_codes, b_codes, "e4m3", "e4m3", preset, fast)
        return acc[rows], time.perf_counter() - start, None
    import torch

    a = torch.from_numpy(a_codes).to(run.device).view(torch.float8_e4m3fn)
    b = torch.from_numpy(b_codes).to(run.device).view(torch.float8_e4m3fn)
    result = {}

    def accumulate():
        result["acc"] = engine.accumulate_tensors("native", a, b, "e4m3", "e4m3", preset, fast)

    accumulate()
    times = _time_cuda(accumulate, repeat)
    return result["acc"][torch.from_numpy(rows).to(run.device)].cpu().numpy(), min(times), (a, b)


def stage_native_timing(run):
    """cuda:native next to native torch._scaled_mm on --native-shapes: the accumulation alone and the whole
    mmaemu.scaled_mm (NaN/Inf rule and exact epilogue on the device), fast and slow accumulation of the device's
    preset, rows checked against the CPU engine. Under the simulator: a tiny shape, every output checked, nothing
    timed that means anything."""
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda import selftest

    out = {"shapes": []}
    for instruction, preset in _native_targets(run):
        shapes = [(8, 8, 160)] if run.args.simulator else [(64, 256, 512)] if run.args.quick else \
            run.args.native_shapes
        for M, N, K in shapes:
            if run.remaining() < 40:
                out["shapes"].append({"instruction": instruction, "shape": [M, N, K], "skipped": "time budget"})
                continue
            rng = np.random.default_rng(M + N + K)
            a_codes, b_codes = _codes(rng, (M, K)), _codes(rng, (N, K))
            entry = {"instruction": instruction, "preset": preset.name, "shape": [M, N, K], "macs": M * N * K}
            rows = np.unique(np.r_[0:4, M // 2:M // 2 + 2, M - 4:M]) if not run.args.simulator else np.arange(M)
            for fast in (True, False):
                label = "fast" if fast else "slow"
                got, best, operands = _native_run(run, a_codes, b_codes, rows, preset, fast, 5)
                count, first = selftest.compare_bits(got, accumulate_codes(a_codes[rows], b_codes, "e4m3", "e4m3",
                                                                           preset, fast))
                entry[label] = {"accumulate_best_s": round(best, 6),
                                "accumulate_tmacs": round(M * N * K / best / 1e12, 1), "checked_rows": len(rows),
                                "mismatches": count, "first": first}
                if operands is not None:
                    entry[label].update(_scaled_mm_times(run, *operands, preset, fast))
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
        function()
        best = min(_time_cuda(function, repeat))
        out[f"{name}_best_s"] = round(best, 6)
        out[f"{name}_tmacs"] = round(M * N * K / best / 1e12, 1)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Report


def markdown(report):
    lines = [f"# mmaemu GPU check ({report['started']})", "",
             f"budget {report['budget_s']} s, elapsed {report.get('elapsed_s')} s, quick={report['quick']}", "",
             "| stage | status | seconds | note |", "|---|---|---|---|"]
    for s in report["stages"]:
        note = (s["error"] or "").replace("|", "/")[:200]
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']} | {note} |")
    for s in report["stages"]:
        r = s.get("result")
        if not isinstance(r, dict):
            continue
        if s["name"] == "environment":
            lines += ["", "## Environment", ""] + [f"* {k}: {r.get(k)}" for k in
                                                  ("python", "torch", "torch_cuda", "numba", "numba_cuda", "mmaemu",
                                                   "device", "kernels_can_run", "probe")]
        elif s["name"] == "selftest":
            lines += ["", f"## Self-tests: {r['verdict']} - {r['reason']}", ""]
            for name, gates in r["kernels"].items():
                for g in gates:
                    lines.append(f"* {name}: {'PASS' if g['passed'] else 'FAIL'} ({g['seconds']} s) {g['reason']}")
        elif s["name"] == "compare":
            lines += ["", "## Kernels against the CPU reference", ""]
            for name, v in r["kernels"].items():
                if isinstance(v, dict):
                    bad = [c for c in v["cases"] if c["mismatches"]]
                    skipped = sum(1 for c in v["cases"] if c.get("skipped"))
                    lines.append(f"* {name}: {'identical' if v['passed'] else 'MISMATCH'} on "
                                 f"{len(v['cases']) - skipped} GEMMs ({v['seconds']} s)"
                                 + (f", {skipped} skipped by design" if skipped else "")
                                 + (f"; first bad: {bad[0]}" if bad else ""))
                else:
                    lines.append(f"* {name}: {v}")
            for row in r["scaled_mm"]:
                lines.append(f"* scaled_mm {row['kernel']} {row['out']} fast={row['fast']}: "
                             f"{'identical' if row['identical'] else 'DIFFERENT'} to backend='cpu' "
                             f"(result on {row['result_device']})")
        elif s["name"] == "native_probe":
            for instruction, d in r.items():
                if isinstance(d, dict):
                    lines += ["", f"## cuda:native instruction probe ({instruction}): {d['summary']} "
                              f"({d['seconds']} s)", ""] + [f"* {json.dumps(f)}" for f in d.get("first", [])]
        elif s["name"] == "native_timing":
            lines += ["", "## cuda:native timing (TMAC/s)", "",
                      "| shape | case | scaled_mm (with epilogue) | accumulation alone | torch._scaled_mm | mismatches |",
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
        elif s["name"] == "timing":
            M, N, K = r["shape"]
            lines += ["", f"## Timing (M, N, K) = ({M}, {N}, {K})", "", "| engine | case | best s | products/s |",
                      "|---|---|---|---|"]
            for name, cases in r["kernels"].items():
                for label, v in cases.items():
                    if isinstance(v, dict):
                        lines.append(f"| {name} | {label} | {v['best_s']} | {v['products_per_s']:.3g} |")
                    else:
                        lines.append(f"| {name} | {label} | {v} | |")
            if isinstance(r["native"], dict):
                for label, v in r["native"].items():
                    if isinstance(v, dict):
                        lines.append(f"| torch._scaled_mm | {label} | {v['best_s']} | {v['products_per_s']:.3g} |")
                    else:
                        lines.append(f"| torch._scaled_mm | {label} | {v} | |")
            else:
                lines.append(f"| torch._scaled_mm | - | {r['native']} | |")
            for label, v in r.get("agreement", {}).items():
                lines.append(f"\nhopper profile vs this GPU's native bits ({label}, information only): {v}")
    return "\n".join(lines) + "\n"


def parse_shape(text):
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 3 or min(parts) < 1:
        raise argparse.ArgumentTypeError("expected M,N,K with positive integers")
    return parts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="report folder")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU-only CI)")
    parser.add_argument("--budget", type=float, default=450.0, help="global time budget in seconds (default 450)")
    parser.add_argument("--device", type=int, default=None, help="CUDA device ordinal (default: current)")
    parser.add_argument("--shape", type=parse_shape, default=[2048, 5760, 1920], help="timing shape M,N,K")
    parser.add_argument("--kernels", type=lambda t: [k.strip().replace("cuda:", "") for k in t.split(",")],
                        default=None, help="GEMM kernels to check, e.g. native (default: all)")
    parser.add_argument("--native-shapes", type=lambda t: [parse_shape(p) for p in t.split(";")],
                        default=[[2048, 5760, 1920], [16384, 8192, 8192]],
                        help="cuda:native timing shapes, 'M,N,K;M,N,K'")
    parser.add_argument("--simulator", type=lambda t: [i.strip() for i in t.split(",")], default=None,
                        metavar="wgmma,mma_sync", help="dry run of the cuda:native stages under numba's CUDA "
                        "simulator (NUMBA_ENABLE_CUDASIM=1) for these instructions, tiny shapes (CI)")
    args = parser.parse_args(argv)
    if args.simulator:
        from mmaemu.cuda import native_kernel, shim

        if not shim.simulator_enabled():
            parser.error("--simulator needs NUMBA_ENABLE_CUDASIM=1 in the environment")
        unknown = set(args.simulator) - set(native_kernel.INSTRUCTIONS)
        if unknown:
            parser.error(f"--simulator: unknown instructions {sorted(unknown)}; known: "
                         f"{list(native_kernel.INSTRUCTIONS)}")
    run = Run(args)
    log(f"mmaemu GPU check: out={run.out}, budget={args.budget:.0f} s, quick={args.quick}")
    run.stage("environment", lambda: stage_environment(run), min_seconds=0)
    run.stage("cpu_reference", lambda: stage_cpu_reference(run), min_seconds=2)
    native = args.kernels is None or "native" in args.kernels
    if native:  # its own stages: ahead of the others, whose budget they would otherwise share
        run.stage("native_probe", lambda: stage_native_probe(run), min_seconds=30)
    run.stage("selftest", lambda: stage_selftest(run), needs_device=True, min_seconds=60)
    if native:
        run.stage("native_timing", lambda: stage_native_timing(run), min_seconds=40)
    run.stage("compare", lambda: stage_compare(run), needs_device=True, min_seconds=30)
    run.stage("timing", lambda: stage_timing(run), needs_device=True, min_seconds=30)
    run.write()
    statuses = [s["status"] for s in run.report["stages"]]
    summary = ", ".join(f"{s['name']}={s['status']}" for s in run.report["stages"])
    log(f"done: {summary}; report in {run.out / 'gpu_check.json'} and {run.out / 'gpu_check.md'}")
    return 1 if any(s in ("failed", "error") for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
