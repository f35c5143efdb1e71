"""The external oracle for the block-scaled presets: ``mmaemu.model.dot`` against MMA-Sim 2.1.1, bit for bit.

Every block-scaled instruction MMA-Sim offers (``TCGen05MMABlockScale`` for the B200's ``tcgen05.mma``,
``MMABlockScale`` for sm_120's ``mma.sync``) with FP8, FP6 and FP4 operands: ``kind::mxf8f6f4 block32`` for all 25
operand-format pairs, and ``kind::mxf4`` / ``kind::mxf4nvf4`` (block32 UE8M0, block16 UE8M0 and UE4M3). Per
instruction and format pair: 100,000 single instructions plus 2,500 chains of 8 from a nonzero accumulator (where
"scale before the alignment" and "dequantise, then accumulate" differ), over random and adversarial data; scales
cover the whole UE8M0 / UE4M3 range, the NaN code included. Any difference fails and prints the first cases.

MMA-Sim's conventions, mapped here (not in mmaemu): in ``kind::mxf8f6f4`` an FP6 code sits in bits 5:0 of a byte
and an FP4 code in bits 5:2; in ``kind::mxf4nvf4`` two FP4 codes share a byte, the HIGH nibble first (torch's
``float4_e2m1fn_x2``, which mmaemu takes, has the low nibble first). The case data are built from bit fields here,
sharing no code with mmaemu. Skips as tests/test_mmasim_oracle.py does (``MMAEMU_TEST_REQUIRE_MMASIM=1`` fails
instead).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import pytest
import torch

from instruction_cases import hex_codes, mismatch_report

import mmaemu

CASES = 100_000
CHAINS, CHAIN_LENGTH = 2_500, 8
SHOWN = 5
FORMATS = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
BITS = {"e4m3": (4, 3), "e5m2": (5, 2), "e3m2": (3, 2), "e2m3": (2, 3), "e2m1": (2, 1)}  # (exponent, mantissa)
KINDS = ("random", "wide-scales", "c-dominant", "c-cancel", "tiny-subnormal-c", "cancel", "zero-groups",
         "nan-scale", "overflow", "underflow")


class Instruction(NamedTuple):
    label: str
    preset: str
    k: int
    arch: str
    model: str  # MMA-Sim class
    shape: str  # with {a} {b} for the element formats
    block: int
    scale: str  # "ue8m0" | "ue4m3"
    packed_fp4: bool


MXF8 = [
    Instruction("B200 tcgen05.mma kind::mxf8f6f4 block32", "tcgen05_mxf8f6f4", 32, "Blackwell", "TCGen05MMABlockScale",
                "m128n8k32.kind::mxf8f6f4.block32.f32.{a}.{b}.ue8m0", 32, "ue8m0", False),
    Instruction("sm_120 mma.sync kind::mxf8f6f4 block32", "sm120_mxf8f6f4", 32, "RTX Blackwell", "MMABlockScale",
                "m16n8k32.kind::mxf8f6f4.block32.f32.{a}.{b}.f32.ue8m0", 32, "ue8m0", False),
]
MXF4 = [
    Instruction(f"{gpu} {kind} block{block} {scale}", preset, 64, arch, model, shape.format(kind=kind, block=block,
                                                                                           scale=scale),
                block, scale, True)
    for gpu, preset, arch, model, shape in [
        ("B200 tcgen05.mma", "tcgen05_mxf4nvf4", "Blackwell", "TCGen05MMABlockScale",
         "m128n8k64.kind::{kind}.block{block}.f32.e2m1.e2m1.{scale}"),
        ("sm_120 mma.sync", "sm120_mxf4nvf4", "RTX Blackwell", "MMABlockScale",
         "m16n8k64.kind::{kind}.block{block}.f32.e2m1.e2m1.f32.{scale}")]
    for kind, block, scale in [("mxf4", 32, "ue8m0"), ("mxf4nvf4", 32, "ue8m0"), ("mxf4nvf4", 16, "ue8m0"),
                               ("mxf4nvf4", 16, "ue4m3")]
]
PAIRS = [(a, b) for a in FORMATS for b in FORMATS]


# The MMA-Sim fixture ``sim`` (its models, or a skip that says why not): tests/conftest.py.


# ---------------------------------------------------------------------------------------------------------------
# Case data from bit fields (independent of mmaemu.formats)


def element_values(fmt):
    """float64 value of every code of an element format (NaN / Inf for FP8's special codes)."""
    ebits, mbits = BITS[fmt]
    bias = (1 << (ebits - 1)) - 1
    out = []
    for code in range(1 << (1 + ebits + mbits)):
        sign = -1.0 if code >> (ebits + mbits) else 1.0
        e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
        if fmt == "e4m3" and e == 15 and m == 7:
            out.append(np.nan)
        elif fmt == "e5m2" and e == 31:
            out.append(np.nan if m else sign * np.inf)
        elif e == 0:
            out.append(sign * m * 2.0 ** (1 - bias - mbits))
        else:
            out.append(sign * ((1 << mbits) + m) * 2.0 ** (e - bias - mbits))
    return np.array(out)


def scale_values(fmt):
    if fmt == "ue8m0":
        return np.array([np.nan if c == 255 else 2.0 ** (c - 127) for c in range(256)])
    return np.abs(element_values("e4m3")[np.arange(256) & 0x7F])


class Cases(NamedTuple):
    a: np.ndarray  # [n, K] codes
    b: np.ndarray
    sa: np.ndarray  # [n, K / block] scale codes
    sb: np.ndarray
    c: np.ndarray  # [n] fp32 bit patterns
    kinds: np.ndarray


def make_cases(fmt_a, fmt_b, K, block, scale_fmt, n, seed) -> Cases:
    """n cases of K elements, a block of each kind in turn."""
    rng = np.random.default_rng(seed)
    va, vb = element_values(fmt_a), element_values(fmt_b)
    finite_a, finite_b = np.flatnonzero(np.isfinite(va)), np.flatnonzero(np.isfinite(vb))
    nscale = K // block
    kinds = np.array(KINDS)[np.arange(n) % len(KINDS)]
    a = rng.choice(finite_a, (n, K)).astype(np.uint8)
    b = rng.choice(finite_b, (n, K)).astype(np.uint8)
    if scale_fmt == "ue8m0":
        sa = rng.integers(117, 138, (n, nscale)).astype(np.uint8)
        sb = rng.integers(117, 138, (n, nscale)).astype(np.uint8)
    else:
        sa = rng.integers(0, 0x7F, (n, nscale)).astype(np.uint8) | (rng.integers(0, 2, (n, nscale)) << 7).astype(
            np.uint8)
        sb = rng.integers(0, 0x7F, (n, nscale)).astype(np.uint8)
    scale_of = scale_values(scale_fmt)
    # random: any code, FP8 specials included now and then
    rows = kinds == "random"
    for x, v in ((a, va), (b, vb)):
        x[rows] = rng.integers(0, len(v), (rows.sum(), K)).astype(np.uint8)
    # wide scales: the whole scale range (products from far below fp32's subnormals to far above its maximum)
    rows = kinds == "wide-scales"
    top = 255 if scale_fmt == "ue8m0" else 0x7F
    sa[rows] = rng.integers(0, top, (rows.sum(), nscale))
    sb[rows] = rng.integers(0, top, (rows.sum(), nscale))
    rows = kinds == "overflow"
    if scale_fmt == "ue8m0":
        sa[rows] = rng.integers(230, 255, (rows.sum(), nscale))
        sb[rows] = rng.integers(230, 255, (rows.sum(), nscale))
    rows = kinds == "underflow"  # products near 2**-140: below the zero terms' exponent, around fp32's subnormals
    if scale_fmt == "ue8m0":
        sa[rows] = rng.integers(44, 60, (rows.sum(), nscale))
        sb[rows] = rng.integers(44, 60, (rows.sum(), nscale))
    rows = kinds == "nan-scale"
    nan_code = 255 if scale_fmt == "ue8m0" else 0x7F
    pick = rng.integers(0, nscale, rows.sum())
    sa[np.flatnonzero(rows), pick] = nan_code
    # cancel: products in pairs of opposite sign
    rows = np.flatnonzero(kinds == "cancel")
    half = K // 2
    a[rows, half:] = a[rows, :half]
    b[rows, half:] = b[rows, :half] ^ np.uint8(1 << (sum(BITS[fmt_b])))
    # zero groups: some 16-element groups all zero, others cancelling exactly
    rows = np.flatnonzero(kinds == "zero-groups")
    for g in range(0, K, 16):
        zero = rng.random(len(rows)) < 0.4
        a[rows[zero], g:g + 16] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (va[a] * vb[b] * np.repeat(scale_of[sa] * scale_of[sb], block, axis=1))
        total = np.nansum(np.where(np.isfinite(scaled), scaled, 0.0), axis=1)
        big = np.nanmax(np.where(np.isfinite(scaled), np.abs(scaled), 0.0), axis=1)
    c = np.zeros(n, np.float32)
    rows = kinds == "random"
    c[rows] = (rng.standard_normal(rows.sum()) * np.maximum(big[rows], 1e-30)).astype(np.float32)
    rows = kinds == "c-dominant"
    c[rows] = (big[rows] * 2.0 ** rng.integers(0, 40, rows.sum()) * rng.choice([-1, 1], rows.sum())).astype(
        np.float32)
    rows = kinds == "c-cancel"
    c[rows] = (-total[rows]).astype(np.float32)
    rows = kinds == "tiny-subnormal-c"  # a subnormal c beside products near 2**-140 (c aligns at 2**-126)
    sa[rows] = rng.integers(44, 60, (rows.sum(), nscale)) if scale_fmt == "ue8m0" else 1
    sb[rows] = rng.integers(44, 60, (rows.sum(), nscale)) if scale_fmt == "ue8m0" else 1
    c[rows] = (rng.integers(-2 ** 23, 2 ** 23, rows.sum()) * 2.0 ** -149).astype(np.float32)
    for kind in ("wide-scales", "zero-groups", "cancel", "overflow", "nan-scale", "underflow"):
        rows = kinds == kind
        c[rows] = np.where(rng.random(rows.sum()) < 0.5, 0.0, rng.standard_normal(rows.sum())
                           * np.minimum(np.maximum(big[rows], 1e-30), 1e30)).astype(np.float32)
    return Cases(a, b, sa, sb, c.view(np.uint32), kinds)


# ---------------------------------------------------------------------------------------------------------------
# The two evaluations


def _ours(inst: Instruction, fmt_a, fmt_b, cases: Cases) -> np.ndarray:
    scale_dtype = torch.float8_e8m0fnu if inst.scale == "ue8m0" else torch.float8_e4m3fn

    def operand(codes, fmt):
        if fmt == "e2m1":  # torch's packed dtype, low nibble first
            packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
            return torch.from_numpy(packed).view(torch.float4_e2m1fn_x2)
        if fmt in ("e4m3", "e5m2"):
            return torch.from_numpy(codes).view(torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)
        return torch.from_numpy(codes)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        out = mmaemu.model.dot(operand(cases.a, fmt_a), operand(cases.b, fmt_b),
                               torch.from_numpy(cases.c.view(np.float32).copy()), preset=inst.preset,
                               fmt=None if fmt_a in ("e4m3", "e5m2") and fmt_b in ("e4m3", "e5m2") else (fmt_a, fmt_b),
                               scale_a=torch.from_numpy(cases.sa).view(scale_dtype),
                               scale_b=torch.from_numpy(cases.sb).view(scale_dtype))
    return out.numpy().view(np.uint32)


def _theirs(sim, inst: Instruction, fmt_a, fmt_b, cases: Cases) -> np.ndarray:
    model = getattr(sim, inst.model)(inst.arch, inst.shape.format(a=fmt_a, b=fmt_b))
    scale_dtype = torch.float8_e8m0fnu if inst.scale == "ue8m0" else torch.float8_e4m3fn

    def operand(codes, fmt):
        if inst.packed_fp4:  # MMA-Sim unpacks the high nibble first
            return torch.from_numpy(((codes[:, 0::2] << 4) | codes[:, 1::2]).astype(np.uint8))
        if fmt in ("e4m3", "e5m2"):
            return torch.from_numpy(codes).view(torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)
        return torch.from_numpy((codes << 2 if fmt == "e2m1" else codes).astype(np.uint8))

    c = torch.from_numpy(cases.c.view(np.float32).copy())
    a, b = operand(cases.a, fmt_a), operand(cases.b, fmt_b)
    sa, sb = torch.from_numpy(cases.sa).view(scale_dtype), torch.from_numpy(cases.sb).view(scale_dtype)
    k, per = inst.k, inst.k // inst.block
    width = k // 2 if inst.packed_fp4 else k
    for i in range(cases.a.shape[1] // k):
        c = model.dpa(a[:, i * width:(i + 1) * width], b[:, i * width:(i + 1) * width], c,
                      sa[:, i * per:(i + 1) * per], sb[:, i * per:(i + 1) * per])
    return c.numpy().view(np.uint32)


def _report(title, cases: Cases, ours, theirs):
    return mismatch_report(title, ours, theirs, cases.kinds, cases.c, lambda i: [
        f"a = {hex_codes(cases.a[i])}", f"b = {hex_codes(cases.b[i])}",
        f"scale_a = {hex_codes(cases.sa[i])}; scale_b = {hex_codes(cases.sb[i])}"], SHOWN)


def _chained(cases: Cases, length: int, seed: int) -> Cases:
    """Cases of ``length`` instructions back to back (shuffled), from the first one's accumulator."""
    n = len(cases.c) // length
    order = np.random.default_rng(seed).permutation(n * length)

    def rows(x):
        return x[order].reshape(n, -1)

    kinds = np.array(["+".join(sorted(set(r))) for r in cases.kinds[order].reshape(n, length)])
    return Cases(rows(cases.a), rows(cases.b), rows(cases.sa), rows(cases.sb), cases.c[order][::length].copy(), kinds)


def _same_arithmetic(sim, insts, fmt_a, fmt_b):
    """Whether MMA-Sim computes these instructions with one arithmetic (same class, same parameters)."""
    ops = [getattr(sim, i.model)(i.arch, i.shape.format(a=fmt_a, b=fmt_b)).arithmetic_op for i in insts]
    return all(type(op) is type(ops[0]) and vars(op) == vars(ops[0]) for op in ops)


def _check_pair(sim, insts, fmt_a, fmt_b, seed):
    """Every instruction of ``insts`` (one kind: same k, block and scale format) against MMA-Sim on the same cases;
    MMA-Sim runs once where it computes the instructions with one arithmetic."""
    first = insts[0]
    shared = _same_arithmetic(sim, insts, fmt_a, fmt_b)
    single = make_cases(fmt_a, fmt_b, first.k, first.block, first.scale, CASES, seed)
    chains = _chained(make_cases(fmt_a, fmt_b, first.k, first.block, first.scale, CHAINS * CHAIN_LENGTH, seed + 1),
                      CHAIN_LENGTH, seed + 2)
    failures, theirs = [], {}
    for inst in insts:
        title = f"{inst.label} {fmt_a} x {fmt_b}: mmaemu.model.dot(preset={inst.preset!r}) vs MMA-Sim"
        for label, cases in (("single instructions", single), (f"chains of {CHAIN_LENGTH}", chains)):
            key = (label, None if shared else inst)
            if key not in theirs:
                theirs[key] = _theirs(sim, inst, fmt_a, fmt_b, cases)
            failures.append(_report(f"{title}, {label}", cases, _ours(inst, fmt_a, fmt_b, cases), theirs[key]))
    failures = [f for f in failures if f]
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS, ids=[f"{a}x{b}" for a, b in PAIRS])
def test_mxf8f6f4_equals_mmasim(sim, fmt_a, fmt_b):
    """kind::mxf8f6f4 block32 on the B200 (tcgen05.mma) and sm_120 (mma.sync), every operand-format pair."""
    _check_pair(sim, MXF8, fmt_a, fmt_b, 7_000 + 10 * PAIRS.index((fmt_a, fmt_b)))


@pytest.mark.parametrize("kind", range(4), ids=[MXF4[i].label.split(" ", 2)[2] for i in range(4)])
def test_mxf4_equals_mmasim(sim, kind):
    """kind::mxf4 and kind::mxf4nvf4 (block32 UE8M0, block16 UE8M0 and UE4M3) on the B200 and sm_120."""
    _check_pair(sim, [MXF4[kind], MXF4[kind + 4]], "e2m1", "e2m1", 8_000 + 10 * kind)


def test_the_cases_reach_what_they_claim():
    """The adversarial kinds produce their situations: overflowing and underflowing products, NaN scales, zero
    groups beside cancelling ones, subnormal accumulators, and accumulators that matter against the products."""
    cases = make_cases("e2m1", "e2m1", 64, 16, "ue8m0", 9_000, 3)
    va = element_values("e2m1")
    scale = np.repeat(scale_values("ue8m0")[cases.sa] * scale_values("ue8m0")[cases.sb], 16, axis=1)
    p = va[cases.a] * va[cases.b] * scale
    c = cases.c.view(np.float32)
    assert (np.abs(p[cases.kinds == "overflow"]).max(axis=1) > 2.0 ** 128).mean() > 0.5
    assert ((np.abs(p[cases.kinds == "wide-scales"]) < 2.0 ** -149) & (p[cases.kinds == "wide-scales"] != 0)).any()
    assert np.isnan(p[cases.kinds == "nan-scale"]).any(axis=1).all()
    groups = p[cases.kinds == "zero-groups"].reshape(-1, 4, 16)
    assert (np.abs(groups).sum(-1) == 0).any() and ((groups.sum(-1) == 0) & (np.abs(groups).sum(-1) > 0)).any()
    tiny = np.abs(p[cases.kinds == "underflow"])
    assert ((tiny > 0) & (tiny < 2.0 ** -139)).any(axis=1).mean() > 0.5
    sub = c[cases.kinds == "tiny-subnormal-c"]
    assert ((np.abs(sub) < 2.0 ** -126) & (sub != 0)).mean() > 0.9
    cancel = c[cases.kinds == "c-cancel"]
    assert (cancel != 0).mean() > 0.5


MUTATIONS = [(MXF8[0], "e4m3", "e2m1", dict(frac=24)), (MXF8[0], "e4m3", "e2m1", dict(frac=26)),
             (MXF8[0], "e5m2", "e5m2", dict(min_exp=-132)), (MXF8[0], "e5m2", "e5m2", dict(min_exp=-134)),
             (MXF4[3], "e2m1", "e2m1", dict(frac=34)), (MXF4[3], "e2m1", "e2m1", dict(frac=36)),
             (MXF4[2], "e2m1", "e2m1", dict(group=32)),
             (MXF4[2], "e2m1", "e2m1", dict(group=8))]


@pytest.mark.parametrize("inst,fmt_a,fmt_b,change", MUTATIONS,
                         ids=[f"{i.preset}-{next(iter(c))}={next(iter(c.values()))}" for i, _, _, c in MUTATIONS])
def test_a_changed_parameter_is_caught(sim, inst, fmt_a, fmt_b, change):
    """The data tell every parameter of the presets apart: a preset with one parameter changed by one unit (or the
    group length halved / doubled) differs from MMA-Sim on some of the cases above. (kind::mxf4nvf4's min_exp, -139,
    is left out: with 35 kept bits a term it would cut lies below 2**-162, far under fp32's smallest subnormal, so
    no result depends on it by one unit.)"""
    preset = mmaemu.get_preset(inst.preset, warn=False).variant("mutant", **change)
    cases = make_cases(fmt_a, fmt_b, inst.k, inst.block, inst.scale, 20_000, 11)
    ours = _ours(inst._replace(preset=preset), fmt_a, fmt_b, cases)
    assert (ours != _theirs(sim, inst, fmt_a, fmt_b, cases)).any(), f"{change} is not caught"
