"""``cuda:native``: the GPU's own FP8 tensor-core instruction computes every block, mmaemu walks the chains.

On an sm_90 GPU ``wgmma.mma_async ... m64nNk32.f32.e4m3/e5m2`` computes one 32-product block per output with the
fp32 accumulator inside the alignment: the hopper preset's block step (semantics.md b.1); on an sm_89 GPU
``mma.sync ... m16n8k32`` computes two 16-product blocks of the ada preset in k order. That holds on a device if
its probe (:mod:`mmaemu.cuda.verdicts.probe`) says so. What differs between GPUs is the structure around the blocks, and
that stays here, walked with the same schedule functions as every other backend:

* the k-stages each split computes come from :func:`stage_plan`, built on the host with
  :func:`mmaemu.arith.schedule.split_chains`, :func:`~mmaemu.arith.schedule.chain_tiles_of`,
  :func:`mmaemu.arith.chain.chain_range_count` and :func:`~mmaemu.arith.chain.chain_range` (the walk of
  ``accumulate_one``): fast accumulation = one MMA accumulator over the split's K; slow = the accumulator restarts
  from +0 (``scale-d = 0``) with every chain (128 k) and each chain's result is added into fp32 registers in K
  order;
* a split's partial is written to ``partials[s]``; with S > 1 :func:`combine_partials` adds them in the order of
  :func:`mmaemu.arith.schedule.combine_step` / :func:`~mmaemu.arith.schedule.combine` (fp32 adds);
* the NaN/Inf rule and the epilogue are the other kernels' (``override_nonfinite``, ``cuda:epilogue``).

Blocks past K are not issued (or are, in the 16-product half of a last mma.sync step, as zero products): a block of
zero products leaves an accumulator of at most 14 significant bits unchanged when frac >= frac_out, which both
instructions' presets have (:func:`native_decline` accepts exactly their blocks). The ragged end of the last stage
reads zero codes (the operands are padded on the device to whole thread blocks and stages when their shape needs
it).

Geometry: a thread block of 256 threads owns 128 x 128 outputs, two groups of 128 threads 64 rows each (a group is
one warpgroup issuing one ``m64n128k32`` per 32 k, or four warps issuing 16 ``m16n8k32`` each), 64 fp32
accumulators per thread either way (:mod:`.fragment`). Operands are staged 64 k at a time with
``cp.async`` (16 bytes per copy, :mod:`.cp_async`) into two shared-memory buffers (the next stage loads
while the tensor cores work on this one), K-major in 8 x 16-byte core matrices without swizzle
(:func:`stage_offset`): the layout wgmma's descriptors read, and one mma.sync's fragment loads read without bank
conflicts. The instructions and their simulator twins: :mod:`.wgmma`, :mod:`.mma_sync`
(:data:`INSTRUCTIONS`); each kernel is made for one of them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint8

from ...base._jit import arithmetic
from ...arith import chain as _chain
from ...arith import schedule as _schedule
from .. import shim
from . import mma_sync, wgmma
from .cp_async import copies_commit, copy16, shared_address
from .fragment import FRAGMENT, fragment_add, fragment_to_array, fragment_zero
from ..simple.kernels import combine, combine_step

# The instructions, by name (each module offers the same names; see mmaemu.cuda.native.wgmma's docstring).
INSTRUCTIONS = {wgmma.NAME: wgmma, mma_sync.NAME: mma_sync}
GROUP_THREADS = 128  # threads that compute one instruction group's 64 x 128 outputs
GROUP_M, GROUP_N, MMA_K = 64, 128, 32
assert all((i.GROUP_M, i.GROUP_N, i.MMA_K) == (GROUP_M, GROUP_N, MMA_K) for i in INSTRUCTIONS.values())

# Geometry (see the module docstring).
CTA_M = 128
CTA_N = 128
THREADS = 2 * GROUP_THREADS
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
# distance between core matrices adjacent in K ("leading") and between those adjacent in rows ("stride").
LEADING_BYTES = CTA_M // 8 * CORE_BYTES
STRIDE_BYTES = CORE_BYTES
STEPS_PER_STAGE = STAGE_K // MMA_K
STEP_BYTES = 2 * LEADING_BYTES  # a 32-k step covers two 16-byte k chunks
# Stage plan flags: the stage starts a chain, ends one; the number of 32-k steps it issues sits above them.
PLAN_START = 1
PLAN_END = 2
PLAN_STEPS_SHIFT = 2
COMBINE_THREADS = 256


@arithmetic
def stage_offset(row, chunk):
    """Byte offset in a staged operand of 16-byte k chunk ``chunk`` of staged row ``row`` (core-matrix layout)."""
    return (chunk * (CTA_M // 8) + row // 8) * CORE_BYTES + (row % 8) * CHUNK


def instruction_of(params):
    """The instruction module (:data:`INSTRUCTIONS`) whose block is the preset's (``preset_params``), or None."""
    block = (params.nfma, params.frac, params.frac_out, params.min_exp, params.late_c)
    for instruction in INSTRUCTIONS.values():
        p = instruction.PRESET
        if tuple(int(v) for v in block) == (p.nfma, p.frac, p.frac_out, p.min_exp, int(p.late_c)):
            return instruction
    return None


def native_decline(schedule, params):
    """Why the native kernel does not compute this schedule and preset (None if it does).

    Each instruction computes the block of one preset (``PRESET`` of :mod:`~mmaemu.cuda.native.wgmma`: hopper's,
    :mod:`~mmaemu.cuda.native.mma_sync`: ada's), so the preset must have exactly one of those blocks; every chain must
    start on a stage. Which device runs which instruction is the rule of :func:`mmaemu.cuda.native.devices.
    device_decline`.
    """
    tile, splits, chain_tiles = int(schedule.tile), int(schedule.splits), int(schedule.chain_tiles)
    if instruction_of(params) is None:
        blocks = "; ".join(f"{i.PRESET.name}'s on sm_{i.TARGET[0]}{i.TARGET[1]} (nfma={i.PRESET.nfma}, "
                           f"frac={i.PRESET.frac}, frac_out={i.PRESET.frac_out})" for i in INSTRUCTIONS.values())
        return (f"computes the blocks of the FP8 MMA instructions it issues only ({blocks}, early accumulator); "
                "this preset's block differs")
    if (splits > 1 or chain_tiles) and tile % STAGE_K:
        return f"starts chains on its {STAGE_K}-wide stages, the schedule's k-tiles are {tile} wide"
    return None


def stage_plan(K, schedule):
    """(plan int32 [S, n, 2], counts int32 [S]): for split s the k offset and flags of each stage it computes, in
    order (the walk of ``accumulate_one``: ``split_chains``, ``chain_tiles_of``, ``chain_range_count``,
    ``chain_range``), stopped at K; flags = PLAN_START | PLAN_END | steps << PLAN_STEPS_SHIFT."""
    tile, splits, padded = schedule.tile, schedule.splits, schedule.padded
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
def aligned_start(smem):
    """The first ALIGN-byte aligned shared address in the shared buffer ``smem`` (SMEM_BYTES leave room for it)."""
    base = shared_address(smem)
    return base + (ALIGN - base % ALIGN) % ALIGN


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


class InstructionForms(NamedTuple):
    """The device functions a kernel of one instruction module (:data:`INSTRUCTIONS`) and format pair calls: its
    MMA step over the staged operands, the bracket around a chain of steps, the waits for the asynchronous copies
    and the fragment layout."""

    step: object
    begin: object
    end: object
    copies_wait_one: object
    copies_wait_all: object
    fragment_coord: object


def instruction_forms(instruction, fmt_a, fmt_b, leading_bytes=LEADING_BYTES) -> InstructionForms:
    """The :class:`InstructionForms` of ``instruction`` (a module of :data:`INSTRUCTIONS`) for ``fmt_a`` x
    ``fmt_b``; ``leading_bytes``: the K distance between core matrices the step is told (the staging always uses
    :data:`LEADING_BYTES`; the probe's tests pass a wrong one)."""
    return InstructionForms(instruction.make_step(fmt_a, fmt_b, leading_bytes, STRIDE_BYTES), instruction.begin,
                            instruction.end, instruction.copies_wait_one, instruction.copies_wait_all,
                            shim.device(instruction.fragment_coord))


def _make_gemm(instruction, fmt_a, fmt_b, multi_chain):
    """The GEMM kernel of one instruction (a module of :data:`INSTRUCTIONS`) and format pair; ``multi_chain``: a
    split has several chains (slow accumulation), whose results are added into fp32 registers; otherwise the MMA
    accumulator is the split's partial."""
    step, begin, end, copies_wait_one, _, fragment_coord = instruction_forms(instruction, fmt_a, fmt_b)

    @cuda.jit(fastmath=False)
    def gemm_native(a, b, row_bytes, plan, counts, partials):
        smem = cuda.shared.array(SMEM_BYTES, uint8)
        t = cuda.threadIdx.x
        group = t // GROUP_THREADS
        thread = t % GROUP_THREADS
        m0 = cuda.blockIdx.y * CTA_M
        n0 = cuda.blockIdx.x * CTA_N
        s = cuda.blockIdx.z
        first = aligned_start(smem)
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
            a_start = first + (n % STAGES) * STAGE_BYTES + group * (GROUP_M // 8) * CORE_BYTES
            b_start = first + (n % STAGES) * STAGE_BYTES + OPERAND_STAGE_BYTES
            # A stage issues one or two 32-k steps; a chain's first step starts from +0 (scale-d = 0). The second
            # step's core matrices start STEP_BYTES further on.
            scale_d = np.int32((flags & PLAN_START) == 0)
            acc = begin(acc)
            acc = step(acc, a_start, b_start, scale_d, smem, thread)
            if (flags >> PLAN_STEPS_SHIFT) > 1:
                acc = step(acc, a_start + STEP_BYTES, b_start + STEP_BYTES, np.int32(1), smem, thread)
            acc = end(acc)
            if multi_chain and (flags & PLAN_END) != 0:
                partial = fragment_add(partial, acc)  # the chain's result, in k order, onto the split's partial
            cuda.syncthreads()  # every group is done with this buffer before it is refilled
        result = cuda.local.array(FRAGMENT, float32)
        fragment_to_array(partial if multi_chain else acc, result)
        for i in range(FRAGMENT):
            row, col = fragment_coord(thread, i)
            m = m0 + group * GROUP_M + row
            n = n0 + col
            if m < partials.shape[1] and n < partials.shape[2]:
                partials[s, m, n] = result[i]

    return gemm_native


_GEMMS = {}


def gemm_kernel(instruction, fmt_a, fmt_b, multi_chain):
    """The (cached) GEMM kernel of an instruction (its name), format pair and chain structure."""
    key = (instruction, fmt_a, fmt_b, bool(multi_chain))
    if key not in _GEMMS:
        _GEMMS[key] = _make_gemm(INSTRUCTIONS[instruction], fmt_a, fmt_b, multi_chain)
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
    rows, K = codes.shape
    if r < rows:
        for k in range(K):
            padded[r, k] = codes[r, k]
        padded[r, K:] = 0
    elif r < padded.shape[0]:
        padded[r, :] = 0
