"""``cuda:native`` on sm_90: the GPU's own FP8 warpgroup MMA computes every block, mmaemu walks the chains.

On an sm_90 GPU ``wgmma.mma_async ... m64nNk32.f32.e4m3/e5m2`` computes one 32-product block per output with the
fp32 accumulator inside the alignment: the hopper preset's block step (semantics.md b.1), if the device's probe
(:mod:`mmaemu.cuda.probe`) says so. What differs between GPUs is the structure around the blocks, and that stays
here, walked with the same schedule functions as every other backend:

* the k-stages each split computes come from :func:`stage_plan`, built on the host with
  :func:`mmaemu.arith.schedule.split_chains`, :func:`~mmaemu.arith.schedule.chain_tiles_of`,
  :func:`mmaemu.arith.chain.chain_range_count` and :func:`~mmaemu.arith.chain.chain_range` (the walk of
  ``accumulate_one``): fast accumulation = one MMA accumulator over the split's K; slow = the accumulator restarts
  (``scale-d = 0``) with every chain (128 k) and each chain's result is added into fp32 registers in K order;
* a split's partial is written to ``partials[s]``; with S > 1 :func:`combine_partials` adds them in the order of
  :func:`mmaemu.arith.schedule.combine_step` / :func:`~mmaemu.arith.schedule.combine` (fp32 adds);
* the NaN/Inf rule and the epilogue are the other kernels' (``override_nonfinite``, ``cuda:epilogue``).

Blocks past K are not issued: a block of zero products leaves an accumulator of at most 14 significant bits
unchanged when frac >= frac_out, which :func:`native_decline` requires. The ragged end of the last stage reads
zero codes (the operands are padded on the host to whole thread blocks and stages when their shape needs it).

Geometry: a thread block of two warpgroups (256 threads) owns 128 x 128 outputs, each warpgroup 64 rows of them
(one ``m64n128k32`` per 32 k). Operands are staged 64 k at a time with ``cp.async`` (16 bytes per copy) into two
shared-memory buffers (the next stage loads while the tensor cores work on this one), K-major in 8 x 16-byte core
matrices without swizzle (:func:`stage_offset`). Instructions and their simulator twins: :mod:`mmaemu.cuda.wgmma`.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint8

from .._jit import arithmetic
from ..arith import chain as _chain
from ..arith import schedule as _schedule
from . import shim, wgmma
from .wgmma import (FRAGMENT, MMA_K, MMA_M, WARPGROUP, copies_commit, copies_wait_one, copy16, fragment_add,
                    fragment_to_array, fragment_zero, shared_address, wgmma_commit, wgmma_fence, wgmma_wait_all)

shim.install_builtin_minmax()

matrix_descriptor = shim.device(wgmma.matrix_descriptor)
fragment_coord = shim.device(wgmma.fragment_coord)
combine_step = shim.device(_schedule.combine_step)
combine = shim.device(_schedule.combine)

# Geometry (see the module docstring).
CTA_M = 128
CTA_N = 128
THREADS = 2 * WARPGROUP
STAGE_K = 64
STAGES = 2
CHUNK = 16  # bytes per cp.async
CHUNKS = STAGE_K // CHUNK  # per staged row
CORE_BYTES = 128  # 8 rows x 16 bytes
OPERAND_STAGE_BYTES = CTA_M * STAGE_K  # A and B alike (CTA_M == CTA_N)
STAGE_BYTES = 2 * OPERAND_STAGE_BYTES
ALIGN = 128
SMEM_BYTES = STAGES * STAGE_BYTES + ALIGN
# Core matrix (8-row group g, 16-byte k chunk j) of a staged operand lies at (j * CTA_M // 8 + g) * 128: the
# descriptors' leading byte offset (K-adjacent core matrices) and stride byte offset (row-adjacent ones).
LEADING_BYTES = CTA_M // 8 * CORE_BYTES
STRIDE_BYTES = CORE_BYTES
STEPS_PER_STAGE = STAGE_K // MMA_K
# The second step's descriptor: its start address 2 * LEADING_BYTES on (the address field counts 16-byte units;
# a stage never crosses the 256 KiB the 14-bit field spans, so the addition does not carry out of it).
DESCRIPTOR_STEP = np.uint64(2 * LEADING_BYTES >> 4)
# Stage plan flags: the stage starts a chain, ends one; the number of 32-k steps it issues sits above them.
PLAN_START = 1
PLAN_END = 2
PLAN_STEPS_SHIFT = 2
COMBINE_THREADS = 256


@arithmetic
def stage_offset(row, chunk):
    """Byte offset in a staged operand of 16-byte k chunk ``chunk`` of staged row ``row`` (core-matrix layout)."""
    return (chunk * (CTA_M // 8) + row // 8) * CORE_BYTES + (row % 8) * CHUNK


def native_decline(schedule, params):
    """Why the native kernel does not compute this schedule and preset (None if it does).

    The instruction computes one block of the hopper preset (:data:`mmaemu.cuda.wgmma.INSTRUCTION_PRESET`), so the
    preset must have exactly those block parameters; every chain must start on a stage.
    """
    tile, splits, interleaved, chain_tiles, pairwise, padded = (int(v) for v in schedule)
    nfma, lshift, rshift, frac, frac_out, min_exp, late_c = (int(v) for v in params)
    block = (nfma, frac, frac_out, min_exp, late_c)
    instruction = wgmma.INSTRUCTION_PRESET
    wanted = (instruction.nfma, instruction.frac, instruction.frac_out, instruction.min_exp, int(instruction.late_c))
    if block != wanted:
        return (f"computes the block of the sm_90 warpgroup MMA ({instruction.name}: nfma={wanted[0]}, "
                f"frac={wanted[1]}, frac_out={wanted[2]}, early accumulator) only; this preset's block differs")
    if (splits > 1 or chain_tiles) and tile % STAGE_K:
        return f"starts chains on its {STAGE_K}-wide stages, the schedule's k-tiles are {tile} wide"
    return None


def stage_plan(K, schedule):
    """(plan int32 [S, n, 2], counts int32 [S]): for split s the k offset and flags of each stage it computes, in
    order (the walk of ``accumulate_one``: ``split_chains``, ``chain_tiles_of``, ``chain_range_count``,
    ``chain_range``), stopped at K; flags = PLAN_START | PLAN_END | steps << PLAN_STEPS_SHIFT."""
    tile, splits, interleaved, chain_tiles, pairwise, padded = schedule
    per_split = []
    for s in range(splits):
        stages = []
        for c in range(_schedule.split_chains(K, s, schedule)):
            first, stride, count = _schedule.chain_tiles_of(K, s, c, schedule)
            chain = []
            for i in range(_chain.chain_range_count(stride, count)):
                k0, k1 = _chain.chain_range(K, first, stride, count, tile, padded, i)
                end = min(k1, K)
                for k in range(k0, end, STAGE_K):
                    steps = min(STEPS_PER_STAGE, (end - k + MMA_K - 1) // MMA_K)
                    chain.append([k, steps << PLAN_STEPS_SHIFT])
            if chain:
                chain[0][1] |= PLAN_START
                chain[-1][1] |= PLAN_END
                stages += chain
        per_split.append(stages)
    width = max(1, max(len(stages) for stages in per_split))
    plan = np.zeros((splits, width, 2), np.int32)
    for s, stages in enumerate(per_split):
        if stages:
            plan[s, :len(stages)] = stages
    return plan, np.array([len(stages) for stages in per_split], np.int32)


# ----------------------------------------------------------------------------------------------------------------
# Kernels

_stage_offset = shim.device(stage_offset)


@cuda.jit(device=True, fastmath=False)
def _stage(a, b, row_bytes, k, m0, n0, buffer, smem, t):
    """Issue the cp.async copies of k in [k, k + STAGE_K) of the block's CTA_M rows of A and CTA_N rows of B into
    the stage at shared address ``buffer`` (A, then B)."""
    for q in range(CTA_M * CHUNKS // THREADS):
        c = q * THREADS + t
        row = c // CHUNKS
        chunk = c % CHUNKS
        offset = _stage_offset(row, chunk)
        copy16(smem, np.uint32(buffer + offset), a, (m0 + row) * row_bytes + k + chunk * CHUNK)
        copy16(smem, np.uint32(buffer + OPERAND_STAGE_BYTES + offset), b,
               (n0 + row) * row_bytes + k + chunk * CHUNK)


def _make_gemm(fmt_a, fmt_b, multi_chain):
    """The GEMM kernel for one format pair; ``multi_chain``: a split has several chains (slow accumulation), whose
    results are added into fp32 registers; otherwise the MMA accumulator is the split's partial."""
    mma = wgmma.WGMMA[(fmt_a, fmt_b)]

    @cuda.jit(fastmath=False)
    def gemm_native(a, b, row_bytes, plan, counts, partials):
        smem = cuda.shared.array(SMEM_BYTES, uint8)
        t = cuda.threadIdx.x
        group = t // WARPGROUP
        m0 = cuda.blockIdx.y * CTA_M
        n0 = cuda.blockIdx.x * CTA_N
        s = cuda.blockIdx.z
        base = shared_address(smem)
        first = base + (ALIGN - base % ALIGN) % ALIGN
        count = counts[s]
        acc = fragment_zero()
        partial = fragment_zero()
        if count > 0:
            _stage(a, b, row_bytes, plan[s, 0, 0], m0, n0, first, smem, t)
        copies_commit()
        for n in range(count):
            if n + 1 < count:  # the next stage loads while this one computes
                _stage(a, b, row_bytes, plan[s, n + 1, 0], m0, n0, first + ((n + 1) % STAGES) * STAGE_BYTES, smem,
                       t)
            copies_commit()
            copies_wait_one()
            cuda.syncthreads()
            flags = plan[s, n, 1]
            a_start = first + (n % STAGES) * STAGE_BYTES + group * (MMA_M // 8) * CORE_BYTES
            b_start = first + (n % STAGES) * STAGE_BYTES + OPERAND_STAGE_BYTES
            # A stage issues one or two 32-k steps; a chain's first step ignores the accumulator (scale-d = 0: the
            # chain starts from +0). A step covers two 16-byte k chunks: the second step's core matrices start
            # 2 * LEADING_BYTES further on. The fence comes after every operand is computed (ptxas then needs no
            # warpgroup.arrive of its own).
            desc_a = matrix_descriptor(a_start, LEADING_BYTES, STRIDE_BYTES)
            desc_b = matrix_descriptor(b_start, LEADING_BYTES, STRIDE_BYTES)
            scale_d = np.int32((flags & PLAN_START) == 0)
            acc = wgmma_fence(acc)
            acc = mma(acc, desc_a, desc_b, scale_d, smem, t)
            if (flags >> PLAN_STEPS_SHIFT) > 1:
                acc = mma(acc, desc_a + DESCRIPTOR_STEP, desc_b + DESCRIPTOR_STEP, np.int32(1), smem, t)
            wgmma_commit()
            acc = wgmma_wait_all(acc)
            if multi_chain and (flags & PLAN_END) != 0:
                partial = fragment_add(partial, acc)  # the chain's result, in k order, onto the split's partial
            cuda.syncthreads()  # every warpgroup is done with this buffer before it is refilled
        result = cuda.local.array(FRAGMENT, float32)
        fragment_to_array(partial if multi_chain else acc, result)
        for i in range(FRAGMENT):
            row, col = fragment_coord(t % WARPGROUP, i)
            m = m0 + group * MMA_M + row
            n = n0 + col
            if m < partials.shape[1] and n < partials.shape[2]:
                partials[s, m, n] = result[i]

    return gemm_native


_GEMMS = {}


def gemm_kernel(fmt_a, fmt_b, multi_chain):
    """The (cached) GEMM kernel of a format pair and chain structure."""
    key = (fmt_a, fmt_b, bool(multi_chain))
    if key not in _GEMMS:
        _GEMMS[key] = _make_gemm(*key)
    return _GEMMS[key]


@cuda.jit(fastmath=False)
def combine_partials(partials, splits, pairwise, out):
    """out[i] = the split partials of output i combined in the order of combine_step (fp32 adds from +0)."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        acc = np.float32(0.0)
        slot = np.float32(0.0)
        for j in range(splits):
            s, target, flush = combine_step(splits, pairwise, j)
            acc, slot = combine(acc, slot, partials[s, i], target, flush)
        out[i] = acc


def padded_shape(rows, K, row_multiple):
    """(rows, row bytes) of an operand padded to whole thread blocks and stages."""
    return -(-max(rows, 1) // row_multiple) * row_multiple, -(-max(K, 1) // STAGE_K) * STAGE_K


@cuda.jit(fastmath=False)
def pad_codes(codes, padded):
    """Row r of padded = row r of codes, then zero codes (+0); rows past codes all zero. One thread per row
    (padding is needed only for shapes that are not whole thread blocks and stages)."""
    r = cuda.grid(1)
    if r < padded.shape[0]:
        for k in range(padded.shape[1]):
            padded[r, k] = codes[r, k] if r < codes.shape[0] and k < codes.shape[1] else 0
