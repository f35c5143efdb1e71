"""The tensor-core arithmetic, written once as plain Numba ``@njit`` functions.

The same functions run in the parallel CPU loops (:mod:`mmaemu.cpu`) and inside the CUDA kernels
(:mod:`mmaemu.cuda`), so every backend computes the same bits by construction. Layers:

* :mod:`.intbits` - bit length and truncating shifts;
* :mod:`.block` - one block multiply-accumulate (semantics.md b.1, b.2);
* :mod:`.chain` - chains of blocks over K (c);
* :mod:`.schedule` - slow restarts, split-K partials and their combination orders (c.2, d);
* :mod:`.tile` - the same block, chain and schedule arithmetic for a tile of outputs at once (the fast CPU path;
  ``schedule.accumulate_one`` stays the reference it is tested against);
* :mod:`.offset` - the same block with one offset fp32 accumulator per output: one round-toward-zero fused
  multiply-add (:mod:`.fp32`) per product and an exact count of the products floored too far (the
  ``cuda:offset`` kernel's formulation), over the packed-word primitives of :mod:`.packed`;
* :mod:`.special` - the NaN/Inf rule (c.4);
* :mod:`.rounding`, :mod:`.epilogue` - exact IEEE rounding and the scaled_mm epilogue (e);
* :mod:`.rowwise` - the epilogue of torch's CUTLASS row-wise kernel (per-row and per-column scales, a bias);
* :mod:`.params` - presets and splits as the integer tuples the compiled code takes.
"""
