"""The kernel of the instruction probe (:mod:`mmaemu.cuda.verdicts.probe`):
one group of 128 threads per tile runs the
tile's chained 32-k steps with the native kernel's instruction forms, staging layout and fragment layout
(:mod:`.wgmma` on sm_90, :mod:`.mma_sync` on sm_89), from the tile's accumulator (loaded
into the fragment) or from +0 (scale-d = 0), and stores the fragment. On a device it runs the tensor cores; under
numba's CUDA simulator the instructions' CPU twins.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint8

from .. import shim
from .cp_async import copies_commit, copy16
from .fragment import FRAGMENT, fragment_from_array, fragment_to_array
from .kernel import (ALIGN, GROUP_M, GROUP_N, GROUP_THREADS, INSTRUCTIONS, LEADING_BYTES, MMA_K, OPERAND_STAGE_BYTES,
                     aligned_start, instruction_forms, stage_offset)

_stage_offset = shim.device(stage_offset)
SMEM_BYTES = 2 * OPERAND_STAGE_BYTES + ALIGN
ROW_CHUNKS = MMA_K // 16


def _make_probe(instruction, fmt_a, fmt_b, leading_bytes):
    """The probe kernel of an instruction module and format pair; ``leading_bytes``: the K distance between core
    matrices the instruction is told (the staging always uses :data:`LEADING_BYTES`; tests pass a wrong one)."""
    step, begin, end, _, copies_wait_all, fragment_coord = instruction_forms(instruction, fmt_a, fmt_b, leading_bytes)

    @cuda.jit(fastmath=False)
    def probe(a, b, c, use_c, steps, out):
        smem = cuda.shared.array(SMEM_BYTES, uint8)
        registers = cuda.local.array(FRAGMENT, float32)
        t = cuda.threadIdx.x
        tile = cuda.blockIdx.x
        first = aligned_start(smem)
        for i in range(FRAGMENT):
            row, col = fragment_coord(t, i)
            registers[i] = c[tile, row, col]
        acc = fragment_from_array(registers)
        for step_index in range(steps):
            tile_step = tile * steps + step_index
            for q in range(GROUP_M * ROW_CHUNKS // GROUP_THREADS):
                chunk = q * GROUP_THREADS + t
                row = chunk // ROW_CHUNKS
                j = chunk % ROW_CHUNKS
                copy16(smem, np.uint32(first + _stage_offset(row, j)), a, (tile_step * GROUP_M + row) * MMA_K + j * 16)
            for q in range(GROUP_N * ROW_CHUNKS // GROUP_THREADS):
                chunk = q * GROUP_THREADS + t
                row = chunk // ROW_CHUNKS
                j = chunk % ROW_CHUNKS
                copy16(smem, np.uint32(first + OPERAND_STAGE_BYTES + _stage_offset(row, j)), b,
                       (tile_step * GROUP_N + row) * MMA_K + j * 16)
            copies_commit()
            copies_wait_all()
            cuda.syncthreads()
            scale_d = np.int32(step_index > 0 or use_c[tile] != 0)
            acc = begin(acc)
            acc = step(acc, first, first + OPERAND_STAGE_BYTES, scale_d, smem, t)
            acc = end(acc)
            cuda.syncthreads()
        fragment_to_array(acc, registers)
        for i in range(FRAGMENT):
            row, col = fragment_coord(t, i)
            out[tile, row, col] = registers[i]

    return probe


_PROBES = {}


def probe_kernel(instruction, fmt_a, fmt_b, leading_bytes=LEADING_BYTES):
    """The (cached) probe kernel of an instruction (its name in :data:`INSTRUCTIONS`) and format pair."""
    key = (instruction, fmt_a, fmt_b, leading_bytes)
    if key not in _PROBES:
        _PROBES[key] = _make_probe(INSTRUCTIONS[instruction], fmt_a, fmt_b, leading_bytes)
    return _PROBES[key]
