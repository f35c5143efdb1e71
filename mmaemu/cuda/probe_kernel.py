"""The kernel of the instruction probe (:mod:`mmaemu.cuda.probe`): one warpgroup per tile runs the tile's chained
``wgmma`` steps with the native kernel's instruction forms, staging, descriptors and fragment layout, from the
tile's accumulator (loaded into the fragment) or with scale-d = 0, and stores the fragment. On a device it runs
the tensor cores; under numba's CUDA simulator the instructions' CPU twins (:mod:`mmaemu.cuda.wgmma`).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint8

from . import shim, wgmma
from .native_kernel import ALIGN, LEADING_BYTES, OPERAND_STAGE_BYTES, STRIDE_BYTES, stage_offset
from .wgmma import (FRAGMENT, MMA_K, MMA_M, MMA_N, WARPGROUP, copies_commit, copies_wait_all, copy16,
                    fragment_from_array, fragment_to_array, shared_address, wgmma_commit, wgmma_fence,
                    wgmma_wait_all)

matrix_descriptor = shim.device(wgmma.matrix_descriptor)
fragment_coord = shim.device(wgmma.fragment_coord)
_stage_offset = shim.device(stage_offset)
SMEM_BYTES = 2 * OPERAND_STAGE_BYTES + ALIGN
ROW_CHUNKS = MMA_K // 16


def _make_probe(fmt_a, fmt_b):
    mma = wgmma.WGMMA[(fmt_a, fmt_b)]

    @cuda.jit(fastmath=False)
    def probe(a, b, c, use_c, steps, out):
        smem = cuda.shared.array(SMEM_BYTES, uint8)
        registers = cuda.local.array(FRAGMENT, float32)
        t = cuda.threadIdx.x
        tile = cuda.blockIdx.x
        base = shared_address(smem)
        first = base + (ALIGN - base % ALIGN) % ALIGN
        for i in range(FRAGMENT):
            row, col = fragment_coord(t, i)
            registers[i] = c[tile, row, col]
        acc = fragment_from_array(registers)
        for step in range(steps):
            tile_step = tile * steps + step
            for q in range(MMA_M * ROW_CHUNKS // WARPGROUP):
                chunk = q * WARPGROUP + t
                row = chunk // ROW_CHUNKS
                j = chunk % ROW_CHUNKS
                copy16(smem, np.uint32(first + _stage_offset(row, j)), a, (tile_step * MMA_M + row) * MMA_K + j * 16)
            for q in range(MMA_N * ROW_CHUNKS // WARPGROUP):
                chunk = q * WARPGROUP + t
                row = chunk // ROW_CHUNKS
                j = chunk % ROW_CHUNKS
                copy16(smem, np.uint32(first + OPERAND_STAGE_BYTES + _stage_offset(row, j)), b,
                       (tile_step * MMA_N + row) * MMA_K + j * 16)
            copies_commit()
            copies_wait_all()
            cuda.syncthreads()
            desc_a = matrix_descriptor(first, LEADING_BYTES, STRIDE_BYTES)
            desc_b = matrix_descriptor(first + OPERAND_STAGE_BYTES, LEADING_BYTES, STRIDE_BYTES)
            scale_d = np.int32(step > 0 or use_c[tile] != 0)
            acc = wgmma_fence(acc)
            acc = mma(acc, desc_a, desc_b, scale_d, smem, t)
            wgmma_commit()
            acc = wgmma_wait_all(acc)
            cuda.syncthreads()
        fragment_to_array(acc, registers)
        for i in range(FRAGMENT):
            row, col = fragment_coord(t, i)
            out[tile, row, col] = registers[i]

    return probe


_PROBES = {}


def probe_kernel(fmt_a, fmt_b):
    if (fmt_a, fmt_b) not in _PROBES:
        _PROBES[(fmt_a, fmt_b)] = _make_probe(fmt_a, fmt_b)
    return _PROBES[(fmt_a, fmt_b)]
