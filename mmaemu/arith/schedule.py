"""How K is cut into chains, chains into split partials, and partials combined (semantics.md c.1, c.2, d).

A *schedule* (:class:`mmaemu.arith.params.Schedule`) is six integers, built by
:func:`mmaemu.arith.params.schedule_params`, that describe every accumulation of the reference GPUs:

* ``tile``: width of a k-tile (K for an unsplit fast call, the preset's slow_chunk for an unsplit slow call,
  128 for ``contiguous`` splits, 64 for ``serial``/``pairwise`` splits);
* ``splits``: S, the number of partials;
* ``interleaved``: 0 = split s owns the contiguous tiles [s*q, (s+1)*q) with q = ceil(T/S) (H100, d.1);
  1 = split s owns the tiles t = s (mod S) (RTX 4060, d.2);
* ``chain_tiles``: a chain restarts from +0 every this many of a split's own tiles (0 = never);
* ``pairwise``: 0 = partials added left to right (serial), 1 = the pairwise order of d.2;
* ``padded``: 1 = split tiles are walked at full width, zero padding included (d.1 step 1, d.2 step 1);
  0 = an unsplit chain stops at the block that holds k = K - 1 (c.1, c.2).

Within a split the chain results are added in increasing k with fp32 RNE adds from +0; the partials are then
combined with fp32 RNE adds in the scheme's order.
"""

import numpy as np

from ..base._jit import arithmetic
from .chain import chain_over_tiles


@arithmetic
def split_tiles(K, s, schedule):
    """``(first, stride, count)``: the k-tiles of split s (count 0 for a contiguous split that owns none)."""
    tile, splits = schedule.tile, schedule.splits
    n_tiles = (K + tile - 1) // tile
    if schedule.interleaved:
        # d.2: the tile count is padded to a multiple of S, so every split owns ceil(T / S) tiles, the last
        # ones possibly pure zero padding.
        return s, splits, (n_tiles + splits - 1) // splits
    per_split = (n_tiles + splits - 1) // splits
    first = s * per_split
    return first, 1, max(0, min(per_split, n_tiles - first))


# How a partial enters the accumulator (combine_step): acc = acc + p, acc = p, slot = p, slot = slot + p.
ACC_ADD = 0
ACC_SET = 1
SLOT_SET = 2
SLOT_ADD = 3


@arithmetic
def combine_step(splits, pairwise, i):
    """``(s, target, flush)``: the i-th partial to compute (0 <= i < S), how it enters the accumulator
    (:data:`ACC_ADD`, :data:`ACC_SET`, :data:`SLOT_SET`, :data:`SLOT_ADD`) and whether ``acc = acc + slot``
    follows (flush = 1); the accumulator starts at +0.

    Serial: p_0, p_1, ... each added to acc. Pairwise (d.2): acc = p[S-1]; then for q < h = ceil(S/2):
    slot = p[q], slot = slot + p[q+h] if q + h < S - 1, acc = acc + slot. Every partial is computed once.
    """
    if pairwise == 0 or splits == 1:
        return i, ACC_ADD, 0
    if i == 0:
        return splits - 1, ACC_SET, 0
    half = (splits + 1) // 2
    # Steps 1, 2, ... walk q = 0, 1, ...: one step for q when q + h >= S - 1, two (q then q + h) otherwise.
    paired = max(0, min(half, splits - 1 - half))  # q < paired have a partner q + h < S - 1
    j = i - 1
    if j < 2 * paired:
        q = j // 2
        if j % 2 == 0:
            return q, SLOT_SET, 0
        return q + half, SLOT_ADD, 1
    return paired + (j - 2 * paired), SLOT_SET, 1


@arithmetic
def combine(acc, slot, partial, target, flush):
    """``(acc, slot)`` after a partial enters as :func:`combine_step` says (fp32 RNE adds)."""
    if target == ACC_ADD:
        acc = np.float32(acc + partial)
    elif target == ACC_SET:
        acc = partial
    elif target == SLOT_SET:
        slot = partial
    else:
        slot = np.float32(slot + partial)
    if flush:
        acc = np.float32(acc + slot)
    return acc, slot


@arithmetic
def clear_tile(tile):
    """Every entry of a float32 [rows, lanes] array set to +0 (an accumulator, slot or partial before its first
    term)."""
    rows, lanes = tile.shape
    for r in range(rows):
        for j in range(lanes):
            tile[r, j] = np.float32(0.0)


@arithmetic
def combine_tile(acc, slot, partial, target, flush):
    """:func:`combine` for every output of a tile: ``(acc[r, j], slot[r, j])`` after ``partial[r, j]`` enters
    (float32 arrays [rows, lanes], in place). The engines' split-K skeleton: ``acc`` and ``slot`` cleared
    (:func:`clear_tile`), then per step i of :func:`combine_step` the partial of its split and this call."""
    rows, lanes = acc.shape
    for r in range(rows):
        for j in range(lanes):
            acc[r, j], slot[r, j] = combine(acc[r, j], slot[r, j], partial[r, j], target, flush)


@arithmetic
def split_chains(K, s, schedule):
    """Number of chains of split s: one over all of its tiles (chain_tiles = 0), or one per chain_tiles tiles;
    0 for a split that owns no tile."""
    chain_tiles = schedule.chain_tiles
    first, stride, count = split_tiles(K, s, schedule)
    if count == 0:
        return 0
    return 1 if chain_tiles == 0 else (count + chain_tiles - 1) // chain_tiles


@arithmetic
def chain_tiles_of(K, s, c, schedule):
    """``(first, stride, count)``: the k-tiles of chain c of split s (the arguments of chain_over_tiles)."""
    chain_tiles = schedule.chain_tiles
    first, stride, count = split_tiles(K, s, schedule)
    done = c * chain_tiles
    n = count if chain_tiles == 0 else min(chain_tiles, count - done)
    return first + done * stride, stride, n


@arithmetic
def split_partial(sa, ea, sb, eb, K, s, schedule, params):
    """Partial p_s: the fp32 sum, in increasing k, of the chains over split s's own tiles (+0 if it owns none)."""
    partial = np.float32(0.0)
    for c in range(split_chains(K, s, schedule)):
        first, stride, n = chain_tiles_of(K, s, c, schedule)
        chain = chain_over_tiles(sa, ea, sb, eb, K, first, stride, n, schedule.tile, schedule.padded, params)
        partial = np.float32(partial + chain)
    return partial


@arithmetic
def accumulate_one(sa, ea, sb, eb, K, schedule, params):
    """The fp32 accumulator of one output: every split partial, combined serially or pairwise (d.1, d.2), in the
    order of :func:`combine_step`."""
    acc = np.float32(0.0)
    slot = np.float32(0.0)
    for i in range(schedule.splits):
        s, target, flush = combine_step(schedule.splits, schedule.pairwise, i)
        acc, slot = combine(acc, slot, split_partial(sa, ea, sb, eb, K, s, schedule, params), target, flush)
    return acc
