"""Launching the CUDA kernels: grids, work arrays and the calls each kernel declines.

Arguments are numba device arrays or objects with ``__cuda_array_interface__`` (the torch path) or simulator arrays;
``stream`` is a numba stream or 0. Importing this module imports ``numba.cuda`` (no driver call).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
from numba import cuda

from ...arith import offset as _offset
from ...arith.params import BlockParams, Schedule
from .. import shim
from ..offset import kernel as offset_kernel
from ..catalog import CODES_KERNELS, GEMM, REGISTRY, gemm_kernels
from ..simple.kernels import (BLOCK, EPILOGUE_THREADS, MAX_GRID_Y, epilogue, gemm_simple, override_nonfinite,
                              rowwise_epilogue)
from ..native.kernel import (CTA_M, CTA_N, COMBINE_THREADS, GROUP_THREADS, INSTRUCTIONS, THREADS, combine_partials,
                             gemm_kernel, instruction_of, native_decline, pad_codes, padded_shape, stage_plan)
from ..native.probe_kernel import probe_kernel

# Packed operand panels of the offset kernel are kept below this size (rows of A or B per launch).
PANEL_BYTES = 256 * 2**20
PACKED_BYTES = 8  # value (fp32), half an exponent word, a low byte and a sign byte per element
BF16X2_CAPABILITY = (8, 0)  # fma.rn.bf16x2, the power-sum exponent pass of the offset kernel


def kernel_decline(kernel, schedule, params):
    """Why the GEMM kernel ``kernel`` does not compute this schedule and preset (None if it does): its own rule,
    declared beside the kernel and named by its registry entry (:attr:`mmaemu.cuda.catalog.KernelInfo.declines`)."""
    entry = REGISTRY.get(kernel)
    if entry is None or entry.kind != GEMM or entry.declines is None:
        known = sorted(k.name for k in REGISTRY.values() if k.declines is not None)
        raise ValueError(f"unknown GEMM kernel {kernel!r}; expected one of {known}")
    return entry.declines(schedule, params)


def launch_codes(kernel, a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, alloc=None):
    """Launch a codes kernel (:data:`CODES_KERNELS`); ``alloc(shape, dtype)``: its work arrays."""
    if kernel == "native":
        launch_native(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream, alloc=alloc)
    elif kernel == "offset":
        launch_offset(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream, alloc=alloc)
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


def _row_slices(M, N):
    """The launches of a (BLOCK, BLOCK)-thread kernel over the outputs [M, N], one thread per output: (r0, r1,
    grid) for rows r0 .. r1-1, in slices of at most MAX_GRID_Y blocks of rows (CUDA's limit on a grid's y)."""
    step = MAX_GRID_Y * BLOCK
    for r0 in range(0, M, step):
        r1 = min(M, r0 + step)
        yield r0, r1, ((N + BLOCK - 1) // BLOCK, (r1 - r0 + BLOCK - 1) // BLOCK)


def _rows_of(arrays, r0, r1, M):
    """Rows r0 .. r1-1 of each of ``arrays`` ([M, ...]): the arrays themselves when that is all M rows."""
    return arrays if (r0, r1) == (0, M) else tuple(array[r0:r1] for array in arrays)


def launch_gemm(kernel, sa, ea, sb, eb, schedule, params, out, stream=0):
    """out [M, N] (fp32) = accumulators of the decoded A [M, K] and B [N, K] with the reference kernel
    (``"simple"``)."""
    M, N = out.shape
    if M == 0 or N == 0:
        return
    schedule = Schedule(*(int(v) for v in schedule))
    params = BlockParams(*(int(v) for v in params))
    if kernel in CODES_KERNELS:
        raise ValueError(f"the {kernel} kernel takes FP8 codes: use launch_codes")
    if kernel != "simple":
        raise ValueError(f"unknown GEMM kernel {kernel!r}; expected one of {[k.name for k in gemm_kernels()]}")
    with quiet_launches():
        for r0, r1, grid in _row_slices(M, N):
            a_s, a_e, o = _rows_of((sa, ea, out), r0, r1, M)
            gemm_simple[grid, (BLOCK, BLOCK), stream](a_s, a_e, sb, eb, schedule, params, o)


def launch_override(a_codes, a_flags, a_table, b_codes, b_flags, b_table, out_bits, stream=0):
    """Apply the NaN/Inf rule in place to out_bits (int32 view of the fp32 accumulators)."""
    M, N = out_bits.shape
    if M == 0 or N == 0:
        return
    with quiet_launches():
        for r0, r1, grid in _row_slices(M, N):
            a_c, a_f, o = _rows_of((a_codes, a_flags, out_bits), r0, r1, M)
            override_nonfinite[grid, (BLOCK, BLOCK), stream](a_c, a_f, a_table, b_codes, b_flags, b_table, o)


def launch_epilogue(acc_flat, scale_bits, has_scale_result, out_code, width, out_bits_flat, stream=0):
    """out_bits_flat[i] = epilogue bits of acc_flat[i] (flat arrays of the same length)."""
    size = acc_flat.shape[0]
    if size == 0:
        return
    with quiet_launches():
        grid = (size + EPILOGUE_THREADS - 1) // EPILOGUE_THREADS
        epilogue[grid, EPILOGUE_THREADS, stream](acc_flat, scale_bits, int(has_scale_result), int(out_code),
                                                 int(width), out_bits_flat)


def launch_rowwise_epilogue(acc, x_scale_bits, w_scale_bits, bias_bits, has_bias, x_first, out_bits, stream=0):
    """out_bits [M, N] (int16) = bf16 bits of the row-wise epilogue of acc [M, N] (rows in slices of at most
    MAX_GRID_Y blocks)."""
    M, N = acc.shape
    if M == 0 or N == 0:
        return
    with quiet_launches():
        for r0, r1, grid in _row_slices(M, N):
            rowwise_epilogue[grid, (BLOCK, BLOCK), stream](acc[r0:r1], x_scale_bits[r0:r1], w_scale_bits, bias_bits,
                                                           int(has_bias), int(x_first), out_bits[r0:r1])


def signatures():
    """``{name: (kernel, argument types)}`` of every kernel for C-contiguous operands (PTX checks, warm-up)."""
    import numba
    from numba import types

    from ...arith.params import preset_params, schedule_params
    from ...model.presets import HOPPER

    a8, a16, f32 = types.int8[:, ::1], types.int16[:, ::1], types.float32[:, ::1]
    schedule = numba.typeof(schedule_params(HOPPER, 256, False, 2, "contiguous"))
    params = numba.typeof(preset_params(HOPPER, "e4m3", "e4m3"))
    i64 = types.int64
    codes, flags, table = types.uint8[:, ::1], types.uint8[::1], types.float64[::1]
    u32 = types.uint32[::1]
    constants = numba.typeof(_offset.offset_params(preset_params(HOPPER, "e4m3", "e4m3"), "e4m3", "e4m3"))
    offset_args = (types.float32[::1], u32, u32, i64) * 2 + (i64, schedule, constants, types.float32[:, :],
                                                              types.float32[:, :])
    tables = numba.typeof(tuple(_offset.offset_tables("e4m3")))
    return {
        "offset": (offset_kernel.gemm_offset, offset_args),
        "offset_powers": (offset_kernel.gemm_offset_powers, offset_args),
        "offset_decode": (offset_kernel.decode_operand, (types.uint8[:, ::1], tables, i64, f32, types.uint32[:, ::1],
                                                         types.uint32[:, ::1], types.boolean)),
        "simple": (gemm_simple, (a8, a16, a8, a16, schedule, params, f32)),
        "override": (override_nonfinite, (codes, flags, table, codes, flags, table, types.int32[:, ::1])),
        "epilogue": (epilogue, (types.float32[::1], types.int32[::1], i64, i64, i64, types.int16[::1])),
        "rowwise_epilogue": (rowwise_epilogue, (f32, types.int32[::1], types.int32[::1], types.int16[::1], i64, i64,
                                                types.int16[:, ::1])),
    }


def _numba_allocator(stream):
    """``alloc(shape, dtype)`` of work arrays from numba's allocator on ``stream`` (when the caller gives none)."""

    def alloc(shape, dtype):
        return cuda.device_array(shape, dtype, stream=stream)

    return alloc


def _round_up(x: int, step: int) -> int:
    return (x + step - 1) // step * step


def _panel_rows(K: int, block_rows: int) -> int:
    """Rows of an operand packed at a time: whole thread blocks, at most PANEL_BYTES (at least one block)."""
    rows = PANEL_BYTES // (PACKED_BYTES * _round_up(max(K, 1), offset_kernel.STAGE_K))
    return max(block_rows, min(rows, MAX_GRID_Y * block_rows) // block_rows * block_rows)


# ----------------------------------------------------------------------------------------------------------------
# The offset kernel


def _packed_panel(codes, fmt, method, row0, rows, K, alloc, stream):
    """Packed (val, exp, byte words) arrays of codes[row0:row0 + rows] (zero codes past the rows and past K, to
    whole stages; exponent words of the exponent pass ``method``), flat, and their number of columns. The kernel
    reads them 16 bytes at a time: RuntimeError if an allocation does not start on a 16-byte boundary."""
    Kp = _round_up(max(K, 1), offset_kernel.STAGE_K)
    arrays = (alloc((Kp, rows), np.float32), alloc((Kp // 2, rows), np.uint32), alloc((Kp // 4, 2 * rows), np.uint32))
    for array in arrays:
        interface = getattr(array, "__cuda_array_interface__", None)
        if interface is not None and interface["data"][0] % 16:
            raise RuntimeError("the offset kernel reads its packed operands 16 bytes at a time; the allocator gave "
                               f"an address {interface['data'][0]:#x} that is not a multiple of 16")
    tables = tuple(cuda.to_device(t, stream=stream) for t in _offset.offset_tables(fmt, method))
    block = offset_kernel.DECODE_BLOCK
    grid = ((rows + block[0] - 1) // block[0], min((Kp // 4 + block[1] - 1) // block[1], MAX_GRID_Y))
    offset_kernel.decode_operand[grid, block, stream](codes, tables, row0, *arrays, method == _offset.POWER_SUMS)
    return tuple(array.reshape(-1) for array in arrays) + (rows,)


def launch_offset(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, alloc=None):
    """out [M, N] (fp32) = accumulators of A [M, K] and B [N, K] given as uint8 FP8 codes of formats fmt_a, fmt_b,
    with the offset kernel. RuntimeError if it declines the call. ``alloc(shape, dtype)`` gives the packed panels'
    arrays (default ``cuda.device_array``; the torch path passes torch's caching allocator); operands are packed
    in panels of at most PANEL_BYTES."""
    M, N = out.shape
    K = a_codes.shape[1]
    if M == 0 or N == 0:
        return
    schedule = Schedule(*(int(v) for v in schedule))
    params = BlockParams(*(int(v) for v in params))
    why = offset_kernel.offset_decline(schedule, params)
    block_rows = max(offset_kernel.BLOCK_M, offset_kernel.BLOCK_N)
    if why is None and _round_up(K, offset_kernel.STAGE_K) * block_rows >= 2**32:
        why = f"indexes a packed panel with 32-bit integers, K = {K} is too long for one"
    if why is not None:
        raise RuntimeError(f"the offset kernel {why}")
    alloc = alloc or _numba_allocator(stream)
    method = _exponent_method(fmt_a, fmt_b, params.nfma)
    constants = _offset.offset_params(params, fmt_a, fmt_b, method)
    kernel = offset_kernel.gemm_offset_powers if method == _offset.POWER_SUMS else offset_kernel.gemm_offset
    if shim.simulator_enabled():
        offset_kernel.compile_for_simulator(
            _offset.power_offset_block if method == _offset.POWER_SUMS else _offset.offset_block, constants)
    bm, bn = offset_kernel.BLOCK_M, offset_kernel.BLOCK_N
    rows_a, rows_b = _panel_rows(K, bm), _panel_rows(K, bn)
    # The pairwise scheme's slot per output (gemm_offset); other schedules never touch it.
    slot = alloc((M, N) if schedule.splits > 1 and schedule.pairwise else (1, 1), np.float32)
    with quiet_launches():
        # A in one panel is packed once; in several, once per panel of B (a panel of each at a time).
        whole_a = _packed_panel(a_codes, fmt_a, method, 0, _round_up(M, bm), K, alloc, stream) if M <= rows_a else None
        for n0 in range(0, N, rows_b):
            n1 = min(N, n0 + rows_b)
            b = _packed_panel(b_codes, fmt_b, method, n0, _round_up(n1 - n0, bn), K, alloc, stream)
            for m0 in range(0, M, rows_a):
                m1 = min(M, m0 + rows_a)
                a = whole_a or _packed_panel(a_codes, fmt_a, method, m0, _round_up(m1 - m0, bm), K, alloc, stream)
                grid = ((n1 - n0 + bn - 1) // bn, (m1 - m0 + bm - 1) // bm)
                kernel[grid, (offset_kernel.TX, offset_kernel.TY), stream](
                    *a, *b, K, schedule, constants, out[m0:m1, n0:n1], slot if slot.shape[0] == 1 else
                    slot[m0:m1, n0:n1])


def _exponent_method(fmt_a, fmt_b, nfma):
    """The offset kernel's exponent pass for a call (:func:`mmaemu.arith.offset.exponent_method`): the power sums
    need ``fma.rn.bf16x2`` (sm_80 and newer; numba's simulator runs its exact twin)."""
    method = _offset.exponent_method(fmt_a, fmt_b, int(nfma))
    if method == _offset.POWER_SUMS and not shim.simulator_enabled():
        if tuple(cuda.get_current_device().compute_capability) < BF16X2_CAPABILITY:
            return _offset.ADD_MAX
    return method


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
    if shim.simulator_enabled():
        return
    capability = tuple(cuda.get_current_device().compute_capability)
    if capability != tuple(instruction.TARGET[:2]):
        raise RuntimeError(f"the native kernel issues {instruction.NAME} for the {instruction.PRESET.name} preset on "
                           f"sm_{instruction.TARGET[0]}{instruction.TARGET[1]} only; this device is "
                           f"sm_{capability[0]}{capability[1]}")


def launch_native(a_codes, b_codes, fmt_a, fmt_b, schedule, params, out, stream=0, *, alloc=None):
    """out [M, N] (fp32) = accumulators of A [M, K] and B [N, K] (uint8 FP8 codes, device arrays) with the native
    kernel, before the NaN/Inf rule; the instruction is the one whose block is the preset's
    (:func:`~mmaemu.cuda.native.kernel.instruction_of`), and the current device must be the one it runs on.
    ``alloc(shape, dtype)``: device work arrays (padded operands, stage plan, split partials; default numba's
    allocator). RuntimeError if the kernel declines the call (:func:`~mmaemu.cuda.native.kernel.native_decline`).
    """
    schedule = Schedule(*(int(v) for v in schedule))
    params = BlockParams(*(int(v) for v in params))
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
    alloc = alloc or _numba_allocator(stream)
    splits, pairwise = schedule.splits, schedule.pairwise
    plan, counts = stage_plan(K, schedule)
    with quiet_launches():
        a = _padded(a_codes, CTA_M, alloc, stream)
        b = _padded(b_codes, CTA_N, alloc, stream)
        partials = alloc((splits, M, N), np.float32) if splits > 1 else out.reshape(1, M, N)
        kernel = gemm_kernel(instruction.NAME, fmt_a, fmt_b, schedule.chain_tiles != 0)
        plan_d, counts_d = alloc(plan.shape, np.int32), alloc(counts.shape, np.int32)
        plan_d.copy_to_device(plan, stream=stream)
        counts_d.copy_to_device(counts, stream=stream)
        kernel[((N + CTA_N - 1) // CTA_N, (M + CTA_M - 1) // CTA_M, splits), THREADS, stream](
            a, b, padded_shape(M, K, CTA_M)[1], plan_d, counts_d, partials)
        if splits > 1:
            combine_partials[(M * N + COMBINE_THREADS - 1) // COMBINE_THREADS, COMBINE_THREADS, stream](
                partials.reshape(splits, M * N), splits, pairwise, out.reshape(M * N))


def launch_probe(tiles, instruction, stream=0, *, leading_bytes=None):
    """fp32 [64, 128] results of every instruction-probe tile (:class:`mmaemu.cuda.verdicts.probe.ProbeTile`) through
    ``instruction`` (a name of :data:`~mmaemu.cuda.native.kernel.INSTRUCTIONS`; one launch of
    :func:`~mmaemu.cuda.native.probe_kernel.probe_kernel` per format pair and step count). ``leading_bytes`` (tests): a
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
    :data:`~mmaemu.cuda.native.kernel.INSTRUCTIONS`), for its target ``INSTRUCTIONS[instruction].TARGET`` only (so
    apart from :func:`signatures`: ``scripts/sass_report.py``, the offline SASS check of tests/test_native_sim.py).
    """
    from numba import types

    from ..native.instruction_model import FORMAT_PAIRS

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
