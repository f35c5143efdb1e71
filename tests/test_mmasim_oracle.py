"""An external oracle: ``mmaemu.model.dot`` against MMA-Sim's instruction models, bit for bit.

MMA-Sim (PyPI ``mmasim``, Microsoft Research, arXiv:2511.10909) models NVIDIA tensor-core instructions from its
authors' own hardware measurements, with code that shares nothing with mmaemu. It is an optional test dependency:
these tests skip, with the reason, where it is not installed (``.ci/run`` installs it and sets
``MMAEMU_TEST_REQUIRE_MMASIM=1``, which turns the skip into a failure: the ``sim`` fixture of tests/conftest.py).
It is used by the tests only; none of its code is copied into mmaemu.

For every (instruction, format pair): at least 100,000 single instructions on the random and adversarial cases of
:mod:`instruction_cases`, then 12,500 chains of 8 instructions (the result of one is the accumulator of the
next, as in a GEMM's main loop) over the same kinds of data, shuffled. mmaemu evaluates one chain of its preset's
blocks per case (``dot``); MMA-Sim evaluates the instruction ``dpa(a, b, c)`` once per instruction. Any
disagreement fails and prints the first cases: inputs as hex codes, both outputs as fp32 bit patterns.

Instructions (fp32 accumulator) and the presets that claim them:

* Hopper ``wgmma.mma_async m64nNk32`` -> ``hopper`` (32-product blocks, 13 fraction bits);
* Ada ``mma.sync m16n8k32`` and ``m16n8k16`` -> ``ada`` (16-product blocks, 13 fraction bits);
* Blackwell ``tcgen05.mma kind::f8f6f4 k32`` -> ``tcgen05_f8f6f4`` (32 products, 25 fraction bits);
* RTX Blackwell (sm_120) ``mma.sync m16n8k32 kind::f8f6f4`` and ``m16n8k32`` -> ``sm120_mma_sync``;
  ``m16n8k16`` -> the same with 16-product blocks (a k16 instruction is one block of its 16 products, so a chain
  of them is a chain of 16-product blocks: ``sm120_mma_sync.variant(..., nfma=16)``).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

from instruction_cases import KINDS, hex_codes, instruction_cases, mismatch_report

import mmaemu

CASES = 100_000
CHAINS, CHAIN_LENGTH = 12_500, 8
PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
SHOWN = 5
_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


# A kernel that issues the sm_120 m16n8k16 FP8 instruction accumulates 16-product blocks.
SM120_K16 = mmaemu.get_preset("sm120_mma_sync", warn=False).variant("sm120_mma_sync_k16", nfma=16)


@dataclasses.dataclass(frozen=True)
class Instruction:
    label: str
    preset: object  # a preset name or a mmaemu.Preset
    k: int
    arch: str
    kind: str  # the MMA-Sim class: "MMA", "WGMMA" or "TCGen05MMA"
    shape: str  # MMA-Sim's shape_and_type with {a} and {b} for the PTX type names

    def model(self, sim, fmt_a, fmt_b):
        return getattr(sim, self.kind)(self.arch, self.shape.format(a=fmt_a, b=fmt_b))


INSTRUCTIONS = [
    Instruction("Hopper wgmma k32", "hopper", 32, "Hopper", "WGMMA", "m64n8k32.f32.{a}.{b}"),
    Instruction("Ada mma.sync m16n8k32", "ada", 32, "Ada Lovelace", "MMA", "m16n8k32.f32.{a}.{b}.f32"),
    Instruction("Ada mma.sync m16n8k16", "ada", 16, "Ada Lovelace", "MMA", "m16n8k16.f32.{a}.{b}.f32"),
    Instruction("B200 tcgen05.mma kind::f8f6f4 k32", "tcgen05_f8f6f4", 32, "Blackwell", "TCGen05MMA",
                "m64n8k32.kind::f8f6f4.f32.{a}.{b}"),
    Instruction("sm_120 mma.sync m16n8k32 kind::f8f6f4", "sm120_mma_sync", 32, "RTX Blackwell", "MMA",
                "m16n8k32.kind::f8f6f4.f32.{a}.{b}.f32"),
    Instruction("sm_120 mma.sync m16n8k32", "sm120_mma_sync", 32, "RTX Blackwell", "MMA", "m16n8k32.f32.{a}.{b}.f32"),
    Instruction("sm_120 mma.sync m16n8k16", SM120_K16, 16, "RTX Blackwell", "MMA", "m16n8k16.f32.{a}.{b}.f32"),
]


# The MMA-Sim fixture ``sim`` (its models, or a skip that says why not): tests/conftest.py.


def _tensor(codes, fmt):
    return torch.from_numpy(np.ascontiguousarray(codes)).view(_DTYPE[fmt])


def _mmaemu_chain(a, b, c_bits, fmt_a, fmt_b, preset):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        out = mmaemu.model.dot(_tensor(a, fmt_a), _tensor(b, fmt_b), torch.from_numpy(c_bits.view(np.float32)),
                               preset=preset)
    return out.numpy().view(np.uint32)


def _mmasim_chain(model, a, b, c_bits, fmt_a, fmt_b, k):
    """The instruction applied to consecutive k-wide slices, each result the next accumulator."""
    c = torch.from_numpy(c_bits.view(np.float32).copy())
    a_t, b_t = _tensor(a, fmt_a), _tensor(b, fmt_b)
    for k0 in range(0, a.shape[1], k):
        c = model.dpa(a_t[:, k0:k0 + k], b_t[:, k0:k0 + k], c)
    return c.numpy().view(np.uint32)


def _report(title, a, b, c_bits, ours, theirs, kinds):
    """None if ``ours`` equals ``theirs`` (fp32 bits); else ``title`` and the first differing cases in hex."""
    return mismatch_report(title, ours, theirs, kinds, c_bits, lambda i: [f"a = {hex_codes(a[i])}",
                                                                          f"b = {hex_codes(b[i])}"], SHOWN)


def _frac(preset) -> int:
    return mmaemu.get_preset(preset, warn=False).frac


def _name(preset) -> str:
    return mmaemu.get_preset(preset, warn=False).name


@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS, ids=[f"{a}x{b}" for a, b in PAIRS])
@pytest.mark.parametrize("instruction", INSTRUCTIONS, ids=[i.label for i in INSTRUCTIONS])
def test_dot_equals_mmasim(sim, instruction, fmt_a, fmt_b):
    model = instruction.model(sim, fmt_a, fmt_b)
    seed = 1000 * INSTRUCTIONS.index(instruction) + 10 * PAIRS.index((fmt_a, fmt_b))
    k, frac = instruction.k, _frac(instruction.preset)
    failures = []

    a, b, c, kinds = instruction_cases(fmt_a, fmt_b, k, CASES, frac, seed)
    ours = _mmaemu_chain(a, b, c, fmt_a, fmt_b, instruction.preset)
    theirs = _mmasim_chain(model, a, b, c, fmt_a, fmt_b, k)
    title = (f"{instruction.label} {fmt_a} x {fmt_b}: mmaemu.model.dot(preset={_name(instruction.preset)!r}) vs "
             "MMA-Sim")
    failures.append(_report(f"{title}, single instructions", a, b, c, ours, theirs, kinds))

    # Chains: CHAIN_LENGTH instructions of shuffled cases back to back, from the first one's accumulator.
    a, b, c, kinds = instruction_cases(fmt_a, fmt_b, k, CHAINS * CHAIN_LENGTH, frac, seed + 1)
    order = np.random.default_rng(seed + 2).permutation(len(a))
    a = a[order].reshape(CHAINS, CHAIN_LENGTH * k)
    b = b[order].reshape(CHAINS, CHAIN_LENGTH * k)
    c = c[order][::CHAIN_LENGTH].copy()
    kinds = np.array(["+".join(sorted(set(row))) for row in kinds[order].reshape(CHAINS, CHAIN_LENGTH)])
    ours = _mmaemu_chain(a, b, c, fmt_a, fmt_b, instruction.preset)
    theirs = _mmasim_chain(model, a, b, c, fmt_a, fmt_b, k)
    failures.append(_report(f"{title}, chains of {CHAIN_LENGTH}", a, b, c, ours, theirs, kinds))

    failures = [f for f in failures if f]
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


def test_the_cases_reach_what_they_claim():
    """The adversarial kinds really produce their situations (so that agreement above means something)."""
    a, b, c, kinds = instruction_cases("e5m2", "e4m3", 32, 11_000, 25, 7)
    va = torch.from_numpy(a).view(torch.float8_e5m2).double().numpy()
    vb = torch.from_numpy(b).view(torch.float8_e4m3fn).double().numpy()
    c32 = c.view(np.float32)
    assert set(kinds) == set(KINDS)
    with np.errstate(invalid="ignore"):
        p = va * vb
    assert np.isnan(p[kinds == "nonfinite"]).any(axis=1).mean() > 0.3
    assert np.isinf(p[kinds == "nonfinite"]).any() and np.isinf(va[kinds == "nonfinite"]).any()
    cancel = kinds == "cancel"
    assert (p[cancel].sum(axis=1) == 0).mean() > 0.3                     # exact cancellations
    special = c32[kinds == "c-special"]
    assert np.isnan(special).any() and np.isinf(special).any() and (np.abs(special) < 2.0 ** -126).any()
    assert (np.abs(special) > 2.0 ** 126).any()
    sub = np.abs(va[kinds == "subnormal"])
    assert ((sub > 0) & (sub < 2.0 ** -14)).any()
    # boundary: the products below the block's largest lie 21 to 27 binades lower (frac = 25)
    bp = np.abs(p[kinds == "boundary"])
    ratio = np.log2(bp.max(axis=1, keepdims=True) / np.where(bp > 0, bp, np.nan))
    assert np.nanmin(ratio[ratio > 0]) < 25 < np.nanmax(ratio)
    # c-dominant: c often 2**20 times the largest product or more
    dom = kinds == "c-dominant"
    assert (np.abs(c32[dom]) > 2.0 ** 20 * np.abs(p[dom]).max(axis=1)).mean() > 0.3


GEMM_PROFILES = [("hopper", INSTRUCTIONS[0]), ("ada", INSTRUCTIONS[1]),
                 ("tcgen05-f8f6f4-experimental", INSTRUCTIONS[3]), ("sm120-mma-sync-experimental", INSTRUCTIONS[4])]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("profile,instruction", GEMM_PROFILES, ids=[p for p, _ in GEMM_PROFILES])
def test_unsplit_fast_gemm_equals_chained_instructions(sim, profile, instruction, backend):
    """A GEMM whose every output is one chain of instructions from +0 (fast accumulation, S = 1): mmaemu.accumulate
    on the profile, with the fast CPU path and with the reference loop, against MMA-Sim's instruction chained over
    K (K ragged: MMA-Sim gets zero codes up to a whole instruction; NaN/Inf codes in some rows)."""
    M, N, K = 24, 40, 300
    failures = []
    for fmt_a, fmt_b in PAIRS:
        seed = 50_000 + 10 * PAIRS.index((fmt_a, fmt_b))
        frac = _frac(mmaemu.get_profile(profile).preset)
        a = instruction_cases(fmt_a, fmt_b, K, 2 * M, frac, seed)[0][::2]        # every kind of data in turn
        b = instruction_cases(fmt_a, fmt_b, K, 2 * N, frac, seed + 1)[1][1::2]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
            ours = mmaemu.accumulate(_tensor(a, fmt_a), _tensor(b, fmt_b), use_fast_accum=True, profile=profile,
                                     splitk=1, backend=backend).numpy().view(np.uint32).reshape(-1)
        k = instruction.k
        padded = -(-K // k) * k
        a_rows = np.zeros((M, N, padded), np.uint8)
        b_rows = np.zeros((M, N, padded), np.uint8)
        a_rows[:, :, :K] = a[:, None, :]
        b_rows[:, :, :K] = b[None, :, :]
        theirs = _mmasim_chain(instruction.model(sim, fmt_a, fmt_b), a_rows.reshape(M * N, padded),
                               b_rows.reshape(M * N, padded), np.zeros(M * N, np.uint32), fmt_a, fmt_b, k)
        kinds = np.array([f"output ({m}, {n})" for m in range(M) for n in range(N)])
        title = (f"mmaemu.accumulate({M}x{N}x{K}, profile={profile!r}, backend={backend!r}) {fmt_a} x {fmt_b} vs "
                 f"MMA-Sim's {instruction.label} chained over K")
        failures.append(_report(title, a_rows.reshape(M * N, padded), b_rows.reshape(M * N, padded),
                                np.zeros(M * N, np.uint32), ours, theirs, kinds))
    failures = [f for f in failures if f]
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
