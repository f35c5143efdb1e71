"""How K is cut into chains, chains into split partials, and partials combined (semantics.md c.1, c.2, d).

A *schedule* is a tuple of six integers, built by :func:`mmaemu.arith.params.schedule_params`, that
describes every accumulation of the reference GPUs:

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

from .._jit import arithmetic
from .chain import chain_over_tiles


@arithmetic
def split_tiles(K, s, schedule):
    """``(first, stride, count)``: the k-tiles of split s (count 0 for a contiguous split that owns none)."""
    tile, splits, interleaved, chain_tiles, pairwise, padded = schedule
    n_tiles = (K + tile - 1) // tile
    if interleaved:
        # d.2: the tile count is padded to a multiple of S, so every split owns ceil(T / S) tiles, the last
        # ones possibly pure zero padding.
        return s, splits, (n_tiles + splits - 1) // splits
    per_split = (n_tiles + splits - 1) // splits
    first = s * per_split
    return first, 1, max(0, min(per_split, n_tiles - first))


@arithmetic
def split_partial(sa, ea, sb, eb, K, s, schedule, params):
    """Partial p_s: the fp32 sum, in increasing k, of the chains over split s's own tiles (+0 if it owns none)."""
    tile, splits, interleaved, chain_tiles, pairwise, padded = schedule
    first, stride, count = split_tiles(K, s, schedule)
    partial = np.float32(0.0)
    done = 0
    while done < count:
        n = count - done if chain_tiles == 0 else min(chain_tiles, count - done)
        value = chain_over_tiles(sa, ea, sb, eb, K, first + done * stride, stride, n, tile, padded, params)
        partial = np.float32(partial + value)
        done += n
    return partial


@arithmetic
def accumulate_one(sa, ea, sb, eb, K, schedule, params):
    """The fp32 accumulator of one output: every split partial, combined serially or pairwise (d.1, d.2)."""
    tile, splits, interleaved, chain_tiles, pairwise, padded = schedule
    if pairwise == 0 or splits == 1:
        acc = np.float32(0.0)
        for s in range(splits):
            acc = np.float32(acc + split_partial(sa, ea, sb, eb, K, s, schedule, params))
        return acc
    # Pairwise (d.2): acc = p[S-1]; then for i < h = ceil(S/2) add slot_i = p[i] (+) p[i+h] if i + h < S - 1,
    # else p[i]. Every partial is computed exactly once, in that order.
    half = (splits + 1) // 2
    acc = split_partial(sa, ea, sb, eb, K, splits - 1, schedule, params)
    for i in range(half):
        slot = split_partial(sa, ea, sb, eb, K, i, schedule, params)
        if i + half < splits - 1:
            slot = np.float32(slot + split_partial(sa, ea, sb, eb, K, i + half, schedule, params))
        acc = np.float32(acc + slot)
    return acc
