"""Random and adversarial operands for single FP8 tensor-core instructions, built in bulk (numpy arrays).

One case is one instruction: ``a`` and ``b`` codes [k] and an fp32 accumulator ``c``; the result is
``c + sum(a*b)`` as the instruction's arithmetic computes it. :func:`instruction_cases` builds ``n`` of them for a
format pair, a block of kinds at a time, so that an external model and mmaemu can both evaluate them as tensors.

Values are decoded with torch's own float8 dtypes (not with mmaemu), so the cases share no code with what they
test. Kinds (each row carries its kind's name, for failure reports):

* ``random``: any finite code (zeros of both signs and subnormals included), c = +0 or a random fp32 value near
  the products;
* ``gaussian``: N(0, 1) values at a random scale, rounded to the format (typical GEMM data);
* ``subnormal``: subnormal and zero codes mixed with the smallest normals;
* ``signed-zeros``: half the codes +-0, c = +-0;
* ``one-huge``: one product of the largest codes among the smallest ones;
* ``cancel``: products that cancel in pairs exactly, or up to one leftover (and one more for an odd k);
* ``boundary``: one product at exponent E and the others at E - d with d around the kept fraction bits, so that
  their significands fall on both sides of the truncation grid 2**(E - frac);
* ``c-dominant``: c far above (or just above) the products, so that they are cut to c's grid;
* ``c-cancel``: c = minus the (rounded) sum of the products, or minus the largest product;
* ``c-special``: c subnormal, +-0, near the fp32 maximum, or NaN / +-Inf;
* ``nonfinite``: one or two NaN / Inf codes (both signs; some times a zero partner, or infinities of both signs).
"""

from __future__ import annotations

import numpy as np
import torch

KINDS = ("random", "gaussian", "subnormal", "signed-zeros", "one-huge", "cancel", "boundary", "c-dominant",
         "c-cancel", "c-special", "nonfinite")
_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_F32_MAX_EXP = 127


class CodeTable:
    """Values and alignment exponents of the 256 codes of a format, from torch's float8 dtype."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(_DTYPE[fmt]).double().numpy()
        finite = np.isfinite(self.values)
        self.nonfinite = np.flatnonzero(~finite).astype(np.uint8)
        self.nan = np.flatnonzero(np.isnan(self.values)).astype(np.uint8)
        self.inf = np.flatnonzero(np.isinf(self.values)).astype(np.uint8)
        self.finite = np.flatnonzero(finite).astype(np.uint8)
        positive = finite & (self.values > 0)
        self.min_normal = float(torch.finfo(_DTYPE[fmt]).tiny)
        self.emin = int(np.log2(self.min_normal))
        self.subnormal = np.flatnonzero(positive & (self.values < self.min_normal)).astype(np.uint8)
        self.positive = np.flatnonzero(positive).astype(np.uint8)
        mag = np.abs(np.where(finite, self.values, 0.0))
        exps = np.full(256, -10_000, np.int64)
        nz = mag > 0
        exps[nz] = np.maximum(np.floor(np.log2(mag[nz])).astype(np.int64), self.emin)
        self.exps = exps
        self.emax = int(exps[positive].max())
        self.max_code = int(self.positive[np.argmax(self.values[self.positive])])
        # Positive codes grouped by alignment exponent: codes_at(e) for e in [emin, emax].
        order = self.positive[np.argsort(exps[self.positive], kind="stable")]
        self._sorted = order
        self._start = {e: int(np.searchsorted(exps[order], e, "left")) for e in range(self.emin, self.emax + 1)}
        self._stop = {e: int(np.searchsorted(exps[order], e, "right")) for e in range(self.emin, self.emax + 1)}

    def pick_at(self, exps: np.ndarray, rng) -> np.ndarray:
        """A random positive code with each given alignment exponent (all within [emin, emax])."""
        start = np.vectorize(self._start.get)(exps)
        stop = np.vectorize(self._stop.get)(exps)
        return self._sorted[start + (rng.random(exps.shape) * (stop - start)).astype(np.int64)]


def _with_signs(codes, rng, p_negative=0.5):
    return (codes | np.where(rng.random(codes.shape) < p_negative, 0x80, 0)).astype(np.uint8)


def _f32_bits(x) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).view(np.uint32)


def _products(ta, tb, a, b):
    with np.errstate(invalid="ignore", over="ignore"):
        return ta.values[a] * tb.values[b]


def _c_near(p, rng, spread=6):
    """fp32 bits of random accumulators about the size of each row's largest product (or +0 for half)."""
    top = np.abs(p).max(axis=1)
    top = np.where(top > 0, top, 1.0)
    exp = np.floor(np.log2(top)) + rng.integers(-spread, spread + 1, top.shape)
    c = np.ldexp(1 + rng.random(top.shape), exp.astype(np.int64)) * np.where(rng.random(top.shape) < 0.5, -1, 1)
    return np.where(rng.random(top.shape) < 0.5, _f32_bits(c), np.uint32(0))


def _kind_random(ta, tb, n, k, rng):
    a = rng.choice(ta.finite, (n, k))
    b = rng.choice(tb.finite, (n, k))
    return a, b, _c_near(_products(ta, tb, a, b), rng)


def _round_to(table, x):
    x = np.clip(x, -table.values[table.max_code], table.values[table.max_code])
    return torch.from_numpy(x).to(_DTYPE[table.fmt]).view(torch.uint8).numpy()


def _kind_gaussian(ta, tb, n, k, rng):
    scale_a = np.ldexp(1.0, rng.integers(ta.emin, ta.emax - 2, (n, 1)))
    scale_b = np.ldexp(1.0, rng.integers(tb.emin, tb.emax - 2, (n, 1)))
    a = _round_to(ta, rng.standard_normal((n, k)) * scale_a)
    b = _round_to(tb, rng.standard_normal((n, k)) * scale_b)
    return a, b, _c_near(_products(ta, tb, a, b), rng)


def _kind_subnormal(ta, tb, n, k, rng):
    def pool(t):
        smallest = t.positive[np.argsort(t.values[t.positive])][: len(t.subnormal) + 8]
        return np.concatenate([np.array([0], np.uint8), smallest])

    a = _with_signs(rng.choice(pool(ta), (n, k)), rng)
    b = _with_signs(rng.choice(pool(tb), (n, k)), rng)
    return a, b, _c_near(_products(ta, tb, a, b), rng, spread=3)


def _kind_signed_zeros(ta, tb, n, k, rng):
    a = rng.choice(ta.finite, (n, k))
    b = rng.choice(tb.finite, (n, k))
    a = np.where(rng.random((n, k)) < 0.5, rng.choice(np.array([0x00, 0x80], np.uint8), (n, k)), a)
    b = np.where(rng.random((n, k)) < 0.5, rng.choice(np.array([0x00, 0x80], np.uint8), (n, k)), b)
    c = rng.choice(np.array([0, 0x80000000], np.uint32), n)
    return a.astype(np.uint8), b.astype(np.uint8), c


def _kind_one_huge(ta, tb, n, k, rng):
    small_a = ta.positive[np.argsort(ta.values[ta.positive])][:12]
    small_b = tb.positive[np.argsort(tb.values[tb.positive])][:12]
    a = _with_signs(rng.choice(small_a, (n, k)), rng)
    b = _with_signs(rng.choice(small_b, (n, k)), rng)
    where = rng.integers(0, k, n)
    rows = np.arange(n)
    a[rows, where] = _with_signs(np.full(n, ta.max_code, np.uint8), rng)
    b[rows, where] = _with_signs(np.full(n, tb.max_code, np.uint8), rng)
    c = np.where(rng.random(n) < 0.7, np.uint32(0), _c_near(_products(ta, tb, a, b), rng, spread=30))
    return a, b, c


def _kind_cancel(ta, tb, n, k, rng):
    half = k // 2
    a_half = rng.choice(ta.finite, (n, half))
    b_half = rng.choice(tb.finite, (n, half))
    odd = [rng.choice(ta.finite, (n, k % 2))], [rng.choice(tb.finite, (n, k % 2))]
    a = np.concatenate([a_half, a_half ^ 0x80] + odd[0], axis=1)  # the same products with the opposite sign
    b = np.concatenate([b_half, b_half] + odd[1], axis=1)
    leftover = rng.random(n) < 0.5  # one pair made unequal: a small residue survives the cancellation
    a[leftover, -1] = rng.choice(ta.finite, leftover.sum())
    perm = np.argsort(rng.random((n, k)), axis=1)
    a, b = np.take_along_axis(a, perm, 1), np.take_along_axis(b, perm, 1)
    c = np.where(rng.random(n) < 0.8, np.uint32(0), _c_near(_products(ta, tb, a, b), rng, spread=2))
    return a.astype(np.uint8), b.astype(np.uint8), c


def _split_exponent(ta, tb, e, rng):
    """Exponents (ea, eb) with ea + eb = e, each within its format's range (e must be reachable)."""
    lo = np.maximum(ta.emin, e - tb.emax)
    hi = np.minimum(ta.emax, e - tb.emin)
    ea = lo + (rng.random(e.shape) * (hi - lo + 1)).astype(np.int64)
    return ea, e - ea


def _kind_boundary(ta, tb, n, k, rng, frac):
    lo_sum, hi_sum = ta.emin + tb.emin, ta.emax + tb.emax
    d = rng.integers(max(frac - 4, 0), frac + 3, (n, k))           # distance below the block exponent
    d = np.minimum(d, hi_sum - lo_sum)
    top = lo_sum + d.max(axis=1) + (rng.random(n) * (hi_sum - lo_sum - d.max(axis=1) + 1)).astype(np.int64)
    e = top[:, None] - d
    lead = rng.integers(0, k, n)
    e[np.arange(n), lead] = top
    ea, eb = _split_exponent(ta, tb, e, rng)
    a = _with_signs(ta.pick_at(ea, rng), rng)
    b = _with_signs(tb.pick_at(eb, rng), rng)
    c_bits = np.where(rng.random(n) < 0.5, np.uint32(0), _f32_bits(
        np.ldexp(1 + rng.random(n), top - rng.integers(0, frac + 3, n)) * np.where(rng.random(n) < 0.5, -1, 1)))
    return a, b, c_bits


def _kind_c_dominant(ta, tb, n, k, rng):
    a, b, _ = _kind_random(ta, tb, n, k, rng)
    p = np.abs(_products(ta, tb, a, b)).max(axis=1)
    p = np.where(p > 0, p, 1.0)
    above = rng.integers(-2, 41, n)
    exp = np.minimum(np.floor(np.log2(p)).astype(np.int64) + above, _F32_MAX_EXP)
    c = np.ldexp(1 + rng.random(n), exp) * np.where(rng.random(n) < 0.5, -1, 1)
    return a, b, _f32_bits(c)


def _kind_c_cancel(ta, tb, n, k, rng):
    a, b, _ = _kind_gaussian(ta, tb, n, k, rng)
    p = _products(ta, tb, a, b)
    total = p.sum(axis=1)
    largest = p[np.arange(n), np.argmax(np.abs(p), axis=1)]
    c = np.where(rng.random(n) < 0.6, -total, -largest)
    bits = _f32_bits(c).astype(np.int64)
    bits += np.where(c != 0, rng.integers(-1, 2, n), 0)               # exactly, or one fp32 ulp off
    return a, b, bits.astype(np.uint32)


def _kind_c_special(ta, tb, n, k, rng):
    a, b, _ = _kind_random(ta, tb, n, k, rng)
    zero_rows = rng.random(n) < 0.3                                   # c alone in the block now and then
    a[zero_rows] = 0
    choice = rng.integers(0, 5, n)
    sub = rng.integers(1, 1 << 23, n).astype(np.uint32)               # subnormal fp32
    big = (np.uint32(0x7F000000) + rng.integers(0, 1 << 23, n)).astype(np.uint32)   # just below the maximum
    special = rng.choice(np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001], np.uint32), n)
    zero = rng.choice(np.array([0, 0x80000000], np.uint32), n)
    c = np.select([choice == 0, choice == 1, choice == 2, choice == 3], [sub, big, special, zero], sub | 0x80000000)
    c = np.where((choice == 1) & (rng.random(n) < 0.5), c | np.uint32(0x80000000), c)
    return a, b, c.astype(np.uint32)


def _kind_nonfinite(ta, tb, n, k, rng):
    a, b, c = _kind_random(ta, tb, n, k, rng)
    rows = np.arange(n)
    for side, table in ((a, ta), (b, tb)):
        hit = rng.random(n) < 0.6
        where = rng.integers(0, k, n)
        side[rows[hit], where[hit]] = rng.choice(table.nonfinite, hit.sum())
    zero_partner = rng.random(n) < 0.2                                 # Inf or NaN times a zero code
    where = rng.integers(0, k, n)
    a[rows[zero_partner], where[zero_partner]] = rng.choice(np.concatenate([ta.nonfinite, ta.nonfinite]),
                                                            zero_partner.sum())
    b[rows[zero_partner], where[zero_partner]] = rng.choice(np.array([0x00, 0x80], np.uint8), zero_partner.sum())
    if len(ta.inf):                                                    # infinities of both signs in one row
        both = rng.random(n) < 0.2
        a[rows[both], 0], a[rows[both], k - 1] = 0x7C, 0xFC
        b[rows[both], 0] = b[rows[both], k - 1] = tb.positive[-1]
    return a, b, c


def instruction_cases(fmt_a: str, fmt_b: str, k: int, n: int, frac: int, seed: int):
    """``(a [n, k] uint8, b [n, k] uint8, c [n] uint32 fp32 bits, kinds [n] str)``, the kinds of the module
    docstring in turn (``frac``: the kept fraction bits whose truncation boundary the ``boundary`` kind targets)."""
    ta, tb = CodeTable(fmt_a), CodeTable(fmt_b)
    rng = np.random.default_rng(seed)
    makers = {"random": _kind_random, "gaussian": _kind_gaussian, "subnormal": _kind_subnormal,
              "signed-zeros": _kind_signed_zeros, "one-huge": _kind_one_huge, "cancel": _kind_cancel,
              "boundary": lambda *args: _kind_boundary(*args, frac=frac), "c-dominant": _kind_c_dominant,
              "c-cancel": _kind_c_cancel, "c-special": _kind_c_special, "nonfinite": _kind_nonfinite}
    counts = np.full(len(KINDS), n // len(KINDS))
    counts[: n - counts.sum()] += 1
    parts = [makers[kind](ta, tb, int(count), k, rng) for kind, count in zip(KINDS, counts)]
    a = np.concatenate([p[0] for p in parts]).astype(np.uint8)
    b = np.concatenate([p[1] for p in parts]).astype(np.uint8)
    c = np.concatenate([p[2] for p in parts]).astype(np.uint32)
    kinds = np.repeat(np.array(KINDS), counts)
    return a, b, c, kinds


def hex_codes(codes) -> str:
    """Codes as two-digit hex bytes, for failure reports."""
    return " ".join(f"{int(x):02X}" for x in codes)


def mismatch_report(title, ours, theirs, kinds, c_bits, operands, shown=5):
    """None if ``ours`` equals ``theirs`` (fp32 bits, one per case); else ``title`` and the first ``shown``
    differing cases: kind, the lines ``operands(i)`` says (the first beside the kind), c and both results in hex."""
    bad = np.flatnonzero(ours != theirs)
    if not bad.size:
        return None
    lines = [f"{title}: {bad.size} of {len(ours)} cases differ; first {min(shown, bad.size)}:"]
    for i in bad[:shown]:
        first, *more = operands(i)
        lines += [f"  case {i} ({kinds[i]}): {first}", *(f"    {line}" for line in more),
                  f"    c = {int(c_bits[i]):08X}; mmaemu {int(ours[i]):08X}, MMA-Sim {int(theirs[i]):08X}"]
    return "\n".join(lines)
