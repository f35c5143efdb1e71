"""Launching the CUDA kernels: grids, work arrays and the calls each kernel declines.

Arguments are numba device arrays or objects with ``__cuda_array_interface__`` (the torch path) or simulator arrays;
``stream`` is a numba stream or 0. Importing this module imports ``numba.cuda`` (no driver call).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
from numba import cuda

from ..arith import tile as _tile
from .biased_kernel import (BIASED_K, BIASED_M, BIASED_N, BIASED_TX, BIASED_TY, DECODE_BLOCK, biased_decline,
                            decode_operand, gemm_biased, gemm_biased_split)
from .catalog import CODES_KERNELS
from .kernels import (BLOCK, CHUNK, EPILOGUE_THREADS, LANES_M, LANES_N, LANES_TX, LANES_TY, MAX_GRID_Y,
                      SCHEDULE_FIELDS, TILE_FORMATS_E4M3, TILE_M, TILE_N, epilogue, gemm_lanes, gemm_simple,
                      gemm_tiled, lanes_decline, override_nonfinite, tiled_chunk)
from .native_kernel import (CTA_M, CTA_N, COMBINE_THREADS, GROUP_THREADS, INSTRUCTIONS, THREADS, combine_partials,
                            gemm_kernel, instruction_of, native_decline, pad_codes, padded_shape, stage_plan)
from .probe_kernel import probe_kernel

# Decoded operand panels of the biased kernel are kept below this size (rows of A or B per launch).
PANEL_BYTES = 256 * 2**20
DECODED_BYTES = 12  # pos, neg (fp32) and exp (int32) per operand element


GEMM_KERNELS = ("native", "biased", "lanes", "tiled", "simple")


def codes_kernel_decline(kernel, schedule, params):
    """Why a codes kernel does not compute this schedule and preset (None if it does)."""
    if kernel == "biased":
        return biased_decline(schedule, params)
    if kernel == "native":
        return native_decline(schedule, params)
    return lanes_decline(schedule, params)


def launch_codes(kernel, a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, chunk=None,
                 alloc=None):
    """Launch a codes kernel (:data:`CODES_KERNELS`); ``chunk``: lanes kernel only; ``alloc(shape, dtype)``: the
    work arrays of the biased kernel (the lanes kernel needs none)."""
    if kernel == "biased":
        if chunk is not None:
            raise ValueError("the biased kernel stages a fixed number of k; chunk is for the lanes kernel")
        launch_biased(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream, alloc=alloc)
    elif kernel == "lanes":
        launch_lanes(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream, chunk=chunk)
    elif kernel == "native":
        launch_native(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream, alloc=alloc)
    else:
        raise ValueError(f"unknown codes kernel {kernel!r}; expected one of {CODES_KERNELS}")


@contextlib.contextmanager
def quiet_launches():
    """Silence numba's low-occupancy performance warnings for tiny launches (self-tests, tests)."""
    with warnings.catch_warnings():
        try:
            from numba.core.errors import NumbaPerformanceWarning

            warnings.simplefilter("ignore", NumbaPerformanceWarning)
        except ImportError:  # pragma: no cover
            pass
        yield


def launch_gemm(kernel, sa, ea, sb, eb, schedule, params, out, stream=0, *, chunk=None):
    """out [M, N] (fp32) = accumulators of the decoded A [M, K] and B [N, K] with the named kernel.

    ``chunk`` (tiled kernel, tests only): k per stage, a multiple of nfma up to CHUNK (default the largest).
    """
    M, N = out.shape
    if M == 0 or N == 0:
        return
    schedule = tuple(int(v) for v in schedule)
    params = tuple(int(v) for v in params)
    if kernel == "tiled":
        if len(schedule) != len(SCHEDULE_FIELDS):
            raise RuntimeError(f"the tiled kernel walks schedules of {len(SCHEDULE_FIELDS)} fields "
                               f"{SCHEDULE_FIELDS}, the arithmetic gives {len(schedule)}")
        nfma = params[0]
        if chunk is None:
            chunk = tiled_chunk(nfma)
        if chunk < 1 or chunk > CHUNK or chunk % nfma:
            raise RuntimeError(f"the tiled kernel stages at most {CHUNK} k at a time, a multiple of nfma: "
                               f"nfma={nfma}, chunk={chunk} does not fit")
        rows = TILE_M
    elif kernel == "simple":
        rows = BLOCK
    elif kernel in CODES_KERNELS:
        raise ValueError(f"the {kernel} kernel takes FP8 codes: use launch_codes")
    else:
        raise ValueError(f"unknown GEMM kernel {kernel!r}; expected one of {GEMM_KERNELS}")
    step = MAX_GRID_Y * rows
    with quiet_launches():
        for r0 in range(0, M, step):
            r1 = min(M, r0 + step)
            grid = ((N + rows - 1) // rows, (r1 - r0 + rows - 1) // rows)
            a_s, a_e, o = (sa, ea, out) if (r0, r1) == (0, M) else (sa[r0:r1], ea[r0:r1], out[r0:r1])
            if kernel == "tiled":
                gemm_tiled[grid, (TILE_N, TILE_M), stream](a_s, a_e, sb, eb, schedule, params, chunk, o)
            else:
                gemm_simple[grid, (BLOCK, BLOCK), stream](a_s, a_e, sb, eb, schedule, params, o)


def launch_lanes(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, chunk=None):
    """out [M, N] (fp32) = accumulators of A [M, K] and B [N, K] given as uint8 FP8 codes of formats fmt_a, fmt_b
    (names of mmaemu.arith.tile.TILE_FORMATS), with the lanes kernel. RuntimeError if it declines the schedule
    (:func:`lanes_decline`). ``chunk`` (tests only): k per stage, a multiple of nfma up to CHUNK."""
    M, N = out.shape
    if M == 0 or N == 0:
        return
    schedule = tuple(int(v) for v in schedule)
    params = tuple(int(v) for v in params)
    if len(schedule) != len(SCHEDULE_FIELDS):
        raise RuntimeError(f"the lanes kernel walks schedules of {len(SCHEDULE_FIELDS)} fields "
                           f"{SCHEDULE_FIELDS}, the arithmetic gives {len(schedule)}")
    why = lanes_decline(schedule, params)
    if why is not None:
        raise RuntimeError(f"the lanes kernel {why}")
    nfma = params[0]
    if chunk is None:
        chunk = tiled_chunk(nfma)
    if chunk < 1 or chunk > CHUNK or chunk % nfma:
        raise RuntimeError(f"the lanes kernel stages at most {CHUNK} k at a time, a multiple of nfma: "
                           f"nfma={nfma}, chunk={chunk} does not fit")
    fa = tuple(int(v) for v in _tile.TILE_FORMATS[fmt_a])
    fb = tuple(int(v) for v in _tile.TILE_FORMATS[fmt_b])
    step = MAX_GRID_Y * LANES_M
    with quiet_launches():
        for r0 in range(0, M, step):
            r1 = min(M, r0 + step)
            grid = ((N + LANES_N - 1) // LANES_N, (r1 - r0 + LANES_M - 1) // LANES_M)
            a, o = (a_codes, out) if (r0, r1) == (0, M) else (a_codes[r0:r1], out[r0:r1])
            gemm_lanes[grid, (LANES_TX, LANES_TY), stream](a, b_codes, fa, fb, schedule, params, chunk, o)


def launch_override(a_codes, a_flags, a_table, b_codes, b_flags, b_table, out_bits, stream=0):
    """Apply the NaN/Inf rule in place to out_bits (int32 view of the fp32 accumulators)."""
    M, N = out_bits.shape
    if M == 0 or N == 0:
        return
    step = MAX_GRID_Y * BLOCK
    with quiet_launches():
        for r0 in range(0, M, step):
            r1 = min(M, r0 + step)
            grid = ((N + BLOCK - 1) // BLOCK, (r1 - r0 + BLOCK - 1) // BLOCK)
            if (r0, r1) == (0, M):
                override_nonfinite[grid, (BLOCK, BLOCK), stream](a_codes, a_flags, a_table, b_codes, b_flags,
                                                                 b_table, out_bits)
            else:
                override_nonfinite[grid, (BLOCK, BLOCK), stream](a_codes[r0:r1], a_flags[r0:r1], a_table, b_codes,
                                                                 b_flags, b_table, out_bits[r0:r1])


def launch_epilogue(acc_flat, scale_bits, has_scale_result, out_code, width, out_bits_flat, stream=0):
    """out_bits_flat[i] = epilogue bits of acc_flat[i] (flat arrays of the same length)."""
    size = acc_flat.shape[0]
    if size == 0:
        return
    with quiet_launches():
        grid = (size + EPILOGUE_THREADS - 1) // EPILOGUE_THREADS
        epilogue[grid, EPILOGUE_THREADS, stream](acc_flat, scale_bits, int(has_scale_result), int(out_code),
                                                 int(width), out_bits_flat)


def signatures():
    """``{name: (kernel, argument types)}`` of every kernel for C-contiguous operands (PTX checks, warm-up)."""
    import numba
    from numba import types

    from ..arith.params import preset_params, schedule_params
    from ..model.presets import HOPPER

    a8, a16, f32 = types.int8[:, ::1], types.int16[:, ::1], types.float32[:, ::1]
    fmt = numba.typeof(tuple(int(v) for v in TILE_FORMATS_E4M3))
    schedule = numba.typeof(schedule_params(HOPPER, 256, False, 2, "contiguous"))
    params = numba.typeof(preset_params(HOPPER, "e4m3", "e4m3"))
    i64 = types.int64
    codes, flags, table = types.uint8[:, ::1], types.uint8[::1], types.float64[::1]
    biased_args = (types.float32[::1], types.float32[::1], types.int32[::1], i64) * 2 + (i64, schedule, params, f32)

    return {
        "biased": (gemm_biased, biased_args),
        "biased_split": (gemm_biased_split, biased_args),
        "decode": (decode_operand, (types.uint8[:, ::1], fmt, i64, f32, f32, types.int32[:, ::1])),
        "simple": (gemm_simple, (a8, a16, a8, a16, schedule, params, f32)),
        "lanes": (gemm_lanes, (types.uint8[:, ::1], types.uint8[:, ::1], fmt, fmt, schedule, params, i64, f32)),
        "tiled": (gemm_tiled, (a8, a16, a8, a16, schedule, params, i64, f32)),
        "override": (override_nonfinite, (codes, flags, table, codes, flags, table, types.int32[:, ::1])),
        "epilogue": (epilogue, (types.float32[::1], types.int32[::1], i64, i64, i64, types.int16[::1])),
    }


def _round_up(x: int, step: int) -> int:
    return (x + step - 1) // step * step


def _panel_rows(K: int, block_rows: int) -> int:
    """Rows of an operand decoded at a time: whole thread blocks, at most PANEL_BYTES (at least one block)."""
    rows = PANEL_BYTES // (DECODED_BYTES * _round_up(max(K, 1), BIASED_K))
    return max(block_rows, min(rows, MAX_GRID_Y * BIASED_M) // block_rows * block_rows)


def _decode_panel(codes, fmt, row0, rows, K, alloc, stream):
    """Decoded (pos, neg, exp) arrays [Kp, rows] of codes[row0:row0 + rows] (padded with absent terms), flat, and
    their number of columns."""
    Kp = _round_up(max(K, 1), BIASED_K)
    pos, neg = alloc((Kp, rows), np.float32), alloc((Kp, rows), np.float32)
    exp = alloc((Kp, rows), np.int32)
    grid = ((rows + DECODE_BLOCK[0] - 1) // DECODE_BLOCK[0],
            min((Kp + DECODE_BLOCK[1] - 1) // DECODE_BLOCK[1], MAX_GRID_Y))
    decode_operand[grid, DECODE_BLOCK, stream](codes, fmt, row0, pos, neg, exp)
    return pos.reshape(-1), neg.reshape(-1), exp.reshape(-1), rows


def launch_biased(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, alloc=None):
    """out [M, N] (fp32) = accumulators of A [M, K] and B [N, K] given as uint8 FP8 codes of formats fmt_a, fmt_b
    (names of mmaemu.arith.tile.TILE_FORMATS), with the biased kernel. RuntimeError if it declines the call.

    ``alloc(shape, dtype)`` gives the work arrays of the decoded panels (default ``cuda.device_array``; the torch
    path passes torch's caching allocator). Operands are decoded in panels of rows (:func:`_panel_rows`).
    """
    M, N = out.shape
    K = a_codes.shape[1]
    if M == 0 or N == 0:
        return
    schedule = tuple(int(v) for v in schedule)
    params = tuple(int(v) for v in params)
    why = biased_decline(schedule, params)
    if why is None and _round_up(K, BIASED_K) * max(BIASED_M, BIASED_N) >= 2**32:
        why = f"indexes a decoded panel with 32-bit integers, K = {K} is too long for one"
    if why is not None:
        raise RuntimeError(f"the biased kernel {why}")
    if alloc is None:
        def alloc(shape, dtype):
            return cuda.device_array(shape, dtype, stream=stream)
    fa = tuple(int(v) for v in _tile.TILE_FORMATS[fmt_a])
    fb = tuple(int(v) for v in _tile.TILE_FORMATS[fmt_b])
    rows_a, rows_b = _panel_rows(K, BIASED_M), _panel_rows(K, BIASED_N)
    with quiet_launches():
        # A in one panel is decoded once; in several, once per panel of B (a panel of each at a time).
        whole_a = _decode_panel(a_codes, fa, 0, _round_up(M, BIASED_M), K, alloc, stream) if M <= rows_a else None
        for n0 in range(0, N, rows_b):
            n1 = min(N, n0 + rows_b)
            b = _decode_panel(b_codes, fb, n0, _round_up(n1 - n0, BIASED_N), K, alloc, stream)
            for m0 in range(0, M, rows_a):
                m1 = min(M, m0 + rows_a)
                a = whole_a or _decode_panel(a_codes, fa, m0, _round_up(m1 - m0, BIASED_M), K, alloc, stream)
                grid = ((n1 - n0 + BIASED_N - 1) // BIASED_N, (m1 - m0 + BIASED_M - 1) // BIASED_M)
                kernel = gemm_biased if schedule[1] == 1 else gemm_biased_split
                kernel[grid, (BIASED_TX, BIASED_TY), stream](*a, *b, K, schedule, params, out[m0:m1, n0:n1])


# ----------------------------------------------------------------------------------------------------------------
# cuda:native


def _padded(codes, rows_multiple, alloc, stream):
    """``codes`` [rows, K] (a device array), or a zero-padded copy when its shape is not whole thread blocks and
    stages; flattened."""
    rows, K = codes.shape
    shape = padded_shape(rows, K, rows_multiple)
    if shape == (rows, K):
        return codes.reshape(rows * K)
    padded = alloc(shape, np.uint8)
    pad_codes[(shape[0] + 127) // 128, 128, stream](codes, padded)
    return padded.reshape(shape[0] * shape[1])


def _check_native_device(instruction):
    """RuntimeError unless the current device is the one ``instruction`` computes its preset's block on (never FP8
    mma.sync on sm_90/sm_100, where ptxas rewrites it with fp16 MMAs; never an instruction on another GPU)."""
    from .shim import simulator_enabled

    if simulator_enabled():
        return
    capability = tuple(cuda.get_current_device().compute_capability)
    if capability != tuple(instruction.TARGET[:2]):
        raise RuntimeError(f"the native kernel issues {instruction.NAME} for the {instruction.PRESET.name} preset on "
                           f"sm_{instruction.TARGET[0]}{instruction.TARGET[1]} only; this device is "
                           f"sm_{capability[0]}{capability[1]}")


def launch_native(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, alloc=None):
    """out [M, N] (fp32) = accumulators of A [M, K] and B [N, K] (uint8 FP8 codes, device arrays) with the native
    kernel, before the NaN/Inf rule; the instruction is the one whose block is the preset's
    (:func:`~mmaemu.cuda.native_kernel.instruction_of`), and the current device must be the one it runs on.
    ``alloc(shape, dtype)``: device work arrays (padded operands, stage plan, split partials; default numba's
    allocator). RuntimeError if the kernel declines the call (:func:`~mmaemu.cuda.native_kernel.native_decline`).
    """
    why = native_decline(schedule, params)
    if why is not None:
        raise RuntimeError(f"the native kernel {why}")
    instruction = instruction_of(params)
    _check_native_device(instruction)
    M, K = a_codes.shape
    N = b_codes.shape[0]
    if M == 0 or N == 0 or K == 0:
        return
    if (M + CTA_M - 1) // CTA_M > MAX_GRID_Y:
        raise RuntimeError(f"the native kernel launches at most {MAX_GRID_Y * CTA_M} rows of A at once, got {M}")
    if alloc is None:
        def alloc(shape, dtype):
            return cuda.device_array(shape, dtype, stream=stream)
    schedule = tuple(int(v) for v in schedule)
    splits, pairwise = schedule[1], schedule[4]
    plan, counts = stage_plan(K, schedule)
    with quiet_launches():
        a = _padded(a_codes, CTA_M, alloc, stream)
        b = _padded(b_codes, CTA_N, alloc, stream)
        partials = alloc((splits, M, N), np.float32) if splits > 1 else out.reshape(1, M, N)
        kernel = gemm_kernel(instruction.NAME, fmt_a, fmt_b, schedule[3] != 0)
        plan_d, counts_d = alloc(plan.shape, np.int32), alloc(counts.shape, np.int32)
        plan_d.copy_to_device(plan, stream=stream)
        counts_d.copy_to_device(counts, stream=stream)
        kernel[((N + CTA_N - 1) // CTA_N, (M + CTA_M - 1) // CTA_M, splits), THREADS, stream](
            a, b, padded_shape(M, K, CTA_M)[1], plan_d, counts_d, partials)
        if splits > 1:
            combine_partials[(M * N + COMBINE_THREADS - 1) // COMBINE_THREADS, COMBINE_THREADS, stream](
                partials.reshape(splits, M * N), splits, pairwise, out.reshape(M * N))


def launch_probe(tiles, instruction, stream=0, *, leading_bytes=None):
    """fp32 [64, 128] results of every instruction-probe tile (:class:`mmaemu.cuda.probe.ProbeTile`) through
    ``instruction`` (a name of :data:`~mmaemu.cuda.native_kernel.INSTRUCTIONS`; one launch of
    :func:`~mmaemu.cuda.probe_kernel.probe_kernel` per format pair and step count). ``leading_bytes`` (tests): a
    K distance between core matrices other than the staging's, to show the probe catches a layout bug."""
    _check_native_device(INSTRUCTIONS[instruction])
    options = {} if leading_bytes is None else {"leading_bytes": leading_bytes}
    results = [None] * len(tiles)
    groups = {}
    for i, tile in enumerate(tiles):
        groups.setdefault((tile.fmt_a, tile.fmt_b, tile.steps), []).append(i)
    with quiet_launches():
        for (fmt_a, fmt_b, steps), members in groups.items():
            a = np.ascontiguousarray(np.stack([tiles[i].a for i in members]), np.uint8).reshape(-1)
            b = np.ascontiguousarray(np.stack([tiles[i].b for i in members]), np.uint8).reshape(-1)
            c = np.ascontiguousarray(np.stack([tiles[i].c for i in members]), np.float32)
            use_c = np.array([int(tiles[i].use_c) for i in members], np.int32)
            out = cuda.device_array((len(members),) + tiles[members[0]].c.shape, np.float32, stream=stream)
            probe_kernel(instruction, fmt_a, fmt_b, **options)[len(members), GROUP_THREADS, stream](
                cuda.to_device(a, stream=stream), cuda.to_device(b, stream=stream), cuda.to_device(c, stream=stream),
                cuda.to_device(use_c, stream=stream), steps, out)
            host = out.copy_to_host(stream=stream)
            if hasattr(stream, "synchronize"):
                stream.synchronize()
            for j, i in enumerate(members):
                results[i] = host[j]
    return results


def native_signatures(instruction):
    """``{name: (kernel, argument types)}`` of the native kernels of ``instruction`` (a name of
    :data:`~mmaemu.cuda.native_kernel.INSTRUCTIONS`), for its target ``INSTRUCTIONS[instruction].TARGET`` only (so
    apart from :func:`signatures`: ``scripts/sass_report.py``, the offline SASS check of tests/test_native_sim.py).
    """
    from numba import types

    from .instruction_model import FORMAT_PAIRS

    codes, plan = types.uint8[::1], types.int32[:, :, ::1]
    gemm_args = (codes, codes, types.int64, plan, types.int32[::1], types.float32[:, :, ::1])
    out = {}
    for fmt_a, fmt_b in FORMAT_PAIRS:
        for multi_chain in (False, True):
            name = f"{instruction}_{'slow' if multi_chain else 'fast'}_{fmt_a}_{fmt_b}"
            out[name] = (gemm_kernel(instruction, fmt_a, fmt_b, multi_chain), gemm_args)
        out[f"{instruction}_probe_{fmt_a}_{fmt_b}"] = (probe_kernel(instruction, fmt_a, fmt_b), (
            codes, codes, types.float32[:, :, ::1], types.int32[::1], types.int64, types.float32[:, :, ::1]))
    return out
