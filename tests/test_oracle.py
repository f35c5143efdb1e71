"""The slow oracle (tests/oracle.py) reproduces every vector of the contract and the hardware vectors bit for bit,
and its exact rounding helpers agree with numpy/torch casts where those are IEEE RNE."""

import os
import random
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # oracle/vectors are siblings, not a package

import oracle  # noqa: E402
import vectors  # noqa: E402
from oracle import PRESETS  # noqa: E402

SPEC_VECTORS = vectors.spec_vectors()
SPEC_GEMMS = vectors.spec_gemms()


@pytest.mark.subprocess
def test_oracle_imports_nothing_numeric():
    """The oracle must stay independent: no mmaemu, numpy or torch behind its arithmetic."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import sys, oracle; print(sorted({'mmaemu', 'numpy', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------
# Contract vectors (semantics.md g, vectors.json)
# ---------------------------------------------------------------------------------------------------------------

def run_spec_vector(v) -> int:
    """One vectors.json row through the oracle; scaled_mm rows use one of the 16 identical weight rows."""
    if v["api"] == "accumulate":
        acc = oracle.accumulate([v["a"]], [v["b"]], v["fmt_a"], v["fmt_b"], PRESETS[v["profile"]], v["fast"],
                                v["S"], v["scheme"])
        return acc[0][0]
    if v["api"] == "scaled_mm":
        out = oracle.scaled_mm([v["a"]], [v["b"]], v["fmt_a"], v["fmt_b"], v["sa"], v["sb"], v["out"],
                               PRESETS[v["profile"]], v["fast"], v["S"], v["scheme"],
                               scale_result_bits=v["scale_result"])
        return out[0][0]
    assert v["api"] == "dot"
    return oracle.dot(v["a"], v["b"], v["fmt_a"], v["fmt_b"], 0, PRESETS[v["preset"]])


@pytest.mark.parametrize("v", SPEC_VECTORS, ids=[v["id"] for v in SPEC_VECTORS])
def test_spec_vector(v):
    assert f"{run_spec_vector(v):#x}" == f"{v['result']:#x}"


@pytest.mark.parametrize("g", SPEC_GEMMS, ids=[g["id"] for g in SPEC_GEMMS])
def test_spec_gemm(g):
    got = oracle.scaled_mm(g["a"], g["w"], g["fmt_a"], g["fmt_b"], g["scale_a"], g["scale_b"], g["out"],
                           PRESETS[g["profile"]], g["fast"], g["S"], g["scheme"])
    assert [[hex(x) for x in row] for row in got] == [[hex(x) for x in row] for row in g["result"]]


def test_spec_vectors_cover_every_kind():
    kinds = {v["api"] for v in SPEC_VECTORS}
    assert kinds == {"accumulate", "scaled_mm", "dot"} and len(SPEC_VECTORS) == 94 and len(SPEC_GEMMS) == 10
    assert sum("A_hex" in v for v in SPEC_VECTORS) == 20  # the dense D1/D2 rows


# ---------------------------------------------------------------------------------------------------------------
# Khattak-Mikaitis hardware vectors (one K = 32 instruction per case)
# ---------------------------------------------------------------------------------------------------------------

# GPU -> (preset, whether the hardware used c).  H100/H200 ran wgmma with a zero accumulator (c ignored).
KM_SETUP = {"H100": ("hopper", False), "H200": ("hopper", False), "Ada": ("ada", True),
            "B200": ("b200_mma_sync", True)}


def km_mismatches(gpu, fmt, preset, use_c, cases=None):
    a, b, c, d = vectors.km_cases(gpu, fmt)
    rows = range(len(d)) if cases is None else cases
    f = fmt.lower()  # E5M2 files are E5M2 x E5M2
    return [i for i in rows
            if oracle.dot(a[i].tolist(), b[i].tolist(), f, f, int(c[i]) if use_c else 0, PRESETS[preset]) != d[i]]


@pytest.mark.parametrize("fmt", vectors.KM_FORMATS)
@pytest.mark.parametrize("gpu", vectors.KM_GPUS)
def test_khattak_mikaitis_all_cases(gpu, fmt):
    """All 5000 cases of each file (about a second per file)."""
    preset, use_c = KM_SETUP[gpu]
    assert km_mismatches(gpu, fmt, preset, use_c) == []


def test_khattak_mikaitis_vectors_discriminate():
    """The hardware vectors reject the neighbouring models, so passing them means something."""
    first = range(300)
    assert km_mismatches("H100", "E4M3", "ada", False, first)  # block length 16 instead of 32
    assert km_mismatches("H100", "E4M3", "hopper", True, first)  # H100 ignored c
    assert km_mismatches("Ada", "E4M3", "hopper", True, first)  # block length 32 instead of 16
    assert km_mismatches("B200", "E5M2", "hopper", True, first)  # early instead of late c


# ---------------------------------------------------------------------------------------------------------------
# Rules of the text that no vector pins down directly
# ---------------------------------------------------------------------------------------------------------------

def fp32_bits(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


@pytest.mark.parametrize("preset", ["hopper", "ada"])
def test_dot_model_only_clamps(preset):
    """b.1 'Model-only details': with no products, |c| < 2**-139 gives +0, 2**-139 survives, and a c with
    more than 14 significant bits is truncated."""
    zeros = [0] * 32
    run = lambda c_bits: oracle.dot(zeros, zeros, "e4m3", "e4m3", c_bits, PRESETS[preset])  # noqa: E731
    assert run(oracle.round_fp32(oracle.pow2(-140))) == 0
    assert run(oracle.round_fp32(oracle.pow2(-139))) == 0x00000400
    assert run(oracle.round_fp32(1 + oracle.pow2(-20))) == 0x3F800000
    assert run(0x80000000) == 0  # -0 with no products: b.1 step 2 gives +0


def test_dot_special_values():
    """b.4 as read in oracle.dot_block: IEEE propagation of NaN/Inf in operands and in c."""
    hopper, late = PRESETS["hopper"], PRESETS["b200_mma_sync"]
    one, inf, ninf = [0x38] + [0] * 31, [0x7C] + [0] * 31, [0xFC] + [0] * 31
    assert oracle.dot(one, inf, "e4m3", "e5m2", 0, hopper) == 0x7F800000
    assert oracle.dot([0] * 32, inf, "e4m3", "e5m2", 0, hopper) == 0x7FFFFFFF  # Inf x 0
    assert oracle.dot(one, ninf, "e4m3", "e5m2", 0x7F800000, late) == 0x7FFFFFFF  # +Inf c meets -Inf
    assert oracle.dot(one, one, "e4m3", "e4m3", 0xFFC00000, hopper) == 0x7FFFFFFF  # NaN c, canonical
    assert oracle.dot(one, one, "e4m3", "e4m3", 0x7F7FFFFF, late) == 0x7F7FFFFF  # RNE add absorbs 1
    assert oracle.dot(one, one, "e4m3", "e4m3", 0x7F7FFFFF, hopper) == 0x7F7FFC00  # c truncated to 14 bits


def test_subnormal_factor_aligns_at_emin():
    """(a)/b.1 step 1: a subnormal factor's exponent is emin (-6 for E4M3), not floor(log2|v|) = -9.

    No vector (spec or hardware) pins this down.  Here 2**-9 * 1 has exponent sum -6, so u = 2**-19 and the
    second product 2**-9 * 2**-11 = 2**-20 is cut to zero; the true exponent -9 would have kept it.
    """
    a, b = [0x01, 0x01] + [0] * 30, [0x3C, 0x10] + [0] * 30  # E4M3 2**-9; E5M2 1.0 and 2**-11
    for preset in ("hopper", "ada"):
        assert oracle.accumulate([a], [b], "e4m3", "e5m2", PRESETS[preset], True) == [[0x3B000000]]


def test_late_c_gemm_chain_equals_dot_from_zero():
    """b.2 through both code paths: accumulate's chain (c as a value) and dot's chain (c as fp32 bits)."""
    rng = random.Random(7)
    for _ in range(20):
        a = [rng.choice([0, rng.randrange(0x7F), 0x80 | rng.randrange(0x7F)]) for _ in range(96)]
        b = [rng.choice([0, rng.randrange(0x7C), 0x80 | rng.randrange(0x7C)]) for _ in range(96)]
        want = oracle.dot(a, b, "e4m3", "e5m2", 0, PRESETS["b200_mma_sync"])
        assert oracle.accumulate([a], [b], "e4m3", "e5m2", PRESETS["b200_mma_sync"], True) == [[want]]


def test_pairwise_orders_of_the_table():
    """d.2: the generic pairwise rule gives exactly the tabulated orders for S = 2..8."""
    table = {2: "p1 ⊕ p0", 3: "(p2 ⊕ p0) ⊕ p1", 4: "(p3 ⊕ (p0 ⊕ p2)) ⊕ p1",
             5: "((p4 ⊕ (p0 ⊕ p3)) ⊕ p1) ⊕ p2", 6: "((p5 ⊕ (p0 ⊕ p3)) ⊕ (p1 ⊕ p4)) ⊕ p2",
             7: "(((p6 ⊕ (p0 ⊕ p4)) ⊕ (p1 ⊕ p5)) ⊕ p2) ⊕ p3",
             8: "(((p7 ⊕ (p0 ⊕ p4)) ⊕ (p1 ⊕ p5)) ⊕ (p2 ⊕ p6)) ⊕ p3"}
    for S, order in table.items():
        symbolic = oracle.combine_pairwise([f"p{i}" for i in range(S)], lambda x, y: f"({x} ⊕ {y})")
        assert symbolic == f"({order})"


def test_split_layouts():
    """d.1: K = 384, S = 4 gives tiles {0}, {1}, {2}, {}; d.2: interleaved ownership with padded tile count."""
    assert oracle.contiguous_split_tiles(384, 4) == [[0], [1], [2], []]
    assert oracle.interleaved_split_tiles(320, 3) == [[0, 3], [1, 4], [2, 5]]  # T = 5 padded to 6


def test_accumulate_nonfinite_rule_only_hits_its_row_and_column():
    """c.4: outputs whose row and column are finite are computed normally."""
    a_rows = [[0x38] * 32, [0x7F] + [0x38] * 31]  # row 1 holds an E4M3 NaN
    b_rows = [[0x3C] * 32, [0x7C] + [0] * 31]  # E5M2 1.0; column 1 holds an E5M2 +Inf (times 1 in row 0)
    acc = oracle.accumulate(a_rows, b_rows, "e4m3", "e5m2", PRESETS["hopper"], True)
    assert acc == [[0x42000000, 0x7F800000], [0x7FFFFFFF, 0x7FFFFFFF]]


# ---------------------------------------------------------------------------------------------------------------
# Exact rounding helpers against numpy / torch casts
# ---------------------------------------------------------------------------------------------------------------

RNG = np.random.default_rng(20250101)


def random_float64(n: int, lo_exp: int, hi_exp: int) -> np.ndarray:
    """Random finite float64 values with exponents in [lo_exp, hi_exp) and random full mantissas."""
    mant = RNG.uniform(1.0, 2.0, n) * RNG.choice([-1.0, 1.0], n)
    return np.ldexp(mant, RNG.integers(lo_exp, hi_exp, n))


def random_fp32_bits(n: int) -> np.ndarray:
    return RNG.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)


def fp32_ties(n: int) -> np.ndarray:
    """float64 values exactly halfway between neighbouring fp32 values (normal and subnormal)."""
    base = np.abs(random_float64(n, -150, 127).astype(np.float32))
    up = np.nextafter(base, np.float32(np.inf))
    return (base.astype(np.float64) + up.astype(np.float64)) / 2


def test_round_fp32_matches_numpy_float64_to_float32():
    values = np.concatenate([random_float64(3000, -160, 130), fp32_ties(1000), -fp32_ties(500),
                             [2.0 ** -150, -(2.0 ** -150), 2.0 ** -150 * 1.5, 3.4028235677973366e38]])
    with np.errstate(over="ignore"):
        expected = values.astype(np.float32).view(np.uint32)
    for x, want in zip(values.tolist(), expected.tolist()):
        assert oracle.round_fp32(Fraction(x)) == want, x


def same_fp32_result(got: int, want: int) -> bool:
    """Bit equality, except that any NaN matches the oracle's canonical NaN."""
    if np.isnan(np.array(want, dtype=np.uint32).view(np.float32)):
        return got == oracle.CANONICAL_NAN_FP32
    return got == want


@pytest.mark.parametrize("op", ["add", "mul"])
def test_fp32_add_and_mul_match_numpy(op):
    x, y = random_fp32_bits(3000), random_fp32_bits(3000)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x80000001, 0x3F800000],
                        dtype=np.uint32)
    x = np.concatenate([x, np.repeat(specials, len(specials))])
    y = np.concatenate([y, np.tile(specials, len(specials))])
    with np.errstate(all="ignore"):
        fx, fy = x.view(np.float32), y.view(np.float32)
        want = (fx + fy if op == "add" else fx * fy).view(np.uint32)
    fn = oracle.fp32_add if op == "add" else oracle.fp32_mul
    for a, b, w in zip(x.tolist(), y.tolist(), want.tolist()):
        assert same_fp32_result(fn(a, b), w), (hex(a), hex(b))


@pytest.mark.parametrize("out, dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_bf16_fp16_rounding_matches_torch(out, dtype):
    bits = np.concatenate([random_fp32_bits(3000),
                           np.array(random_float64(2000, -26, 17), dtype=np.float32).view(np.uint32)])
    bits = bits[~np.isnan(bits.view(np.float32))]
    want = torch.from_numpy(bits.view(np.float32).copy()).to(dtype).view(torch.int16).numpy().view(np.uint16)
    for b, w in zip(bits.tolist(), want.tolist()):
        assert oracle.convert_fp32(b, out) == w, hex(b)


def fp8_grid_midpoints(fmt: str) -> np.ndarray:
    """Exact ties between neighbouring finite FP8 values (fp32-representable), both signs."""
    values = sorted({oracle.decode(c, fmt) for c in range(128)} - {oracle.NAN, oracle.POS_INF})
    mids = [float((lo + hi) / 2) for lo, hi in zip(values, values[1:])]
    return np.array(mids + [-m for m in mids], dtype=np.float32)


@pytest.mark.parametrize("fmt, dtype, limit", [("e4m3", torch.float8_e4m3fn, 448.0),
                                               ("e5m2", torch.float8_e5m2, 57344.0)])
def test_fp8_rounding_matches_torch_in_range(fmt, dtype, limit):
    """RNE to FP8 of fp32 values within +-limit, where torch's cast is plain RNE too (outside, torch gives NaN
    or Inf while the epilogue clamps first, so out-of-range values are not compared)."""
    lo = -12 if fmt == "e4m3" else -19
    values = np.concatenate([random_float64(4000, lo, 16).astype(np.float32), fp8_grid_midpoints(fmt)])
    values = values[np.abs(values) <= limit]
    want = torch.from_numpy(values).to(dtype).view(torch.uint8).numpy()
    out = "float8_e4m3fn" if fmt == "e4m3" else "float8_e5m2"
    for x, w in zip(values.view(np.uint32).tolist(), want.tolist()):
        assert oracle.convert_fp8(x, None, out) == w, hex(x)
        assert oracle.round_to(oracle.fp32_value(x), fmt, negative_zero=x >> 31 == 1) == w, hex(x)


@pytest.mark.parametrize("fmt, dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_decode_matches_torch_for_all_codes(fmt, dtype):
    widened = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32).numpy()
    for code, x in enumerate(widened.tolist()):
        got = oracle.decode(code, fmt)
        if np.isnan(x):
            assert got == oracle.NAN, hex(code)
        elif np.isinf(x):
            assert got == (oracle.POS_INF if x > 0 else oracle.NEG_INF), hex(code)
        else:
            assert got == Fraction(x), hex(code)
            assert oracle.value_of(code, fmt) == got  # the generic decoder agrees with the table of (a)
        assert oracle.is_negative_zero(code, fmt) == (x == 0 and np.signbit(x))


def test_fp32_decode_encode_round_trip():
    for bits in random_fp32_bits(3000).tolist() + [0, 0x80000000, 1, 0x007FFFFF, 0x7F7FFFFF, 0xFF7FFFFF]:
        value = oracle.fp32_value(bits)
        if isinstance(value, str):
            continue
        assert value == Fraction(float(np.array(bits, dtype=np.uint32).view(np.float32)))
        assert oracle.round_fp32(value, negative_zero=bits >> 31 == 1) == bits


def test_epilogue_rules_beyond_the_vectors():
    """e.2-e.3: FFMA sign rules, FP8 clamp of +-Inf, NaN canonical in every output, scale_result for FP8."""
    one, minus_one, tiny = fp32_bits(1.0), fp32_bits(-1.0), fp32_bits(2.0 ** -149)
    assert oracle.epilogue(0x7F800000, minus_one, one, None, "float8_e4m3fn") == 0xFE  # -Inf clamps to -448
    assert oracle.epilogue(0x7F800000, one, one, None, "float8_e5m2") == 0x7B
    assert oracle.epilogue(fp32_bits(-0.25), tiny, one, None, "float32") == 0x80000000  # underflow keeps sign
    assert oracle.epilogue(fp32_bits(-0.25), tiny, one, None, "float16") == 0x8000
    assert oracle.epilogue(fp32_bits(1.0), 0x80000000, one, None, "float32") == 0  # alpha -0: +0
    for out, nan in [("float32", 0x7FFFFFFF), ("bfloat16", 0x7FFF), ("float16", 0x7FFF),
                     ("float8_e4m3fn", 0x7F), ("float8_e5m2", 0x7F)]:
        assert oracle.epilogue(0xFFC00000, one, one, None, out) == nan
        assert oracle.epilogue(0x7F800000, 0, one, None, out) == nan  # Inf x alpha 0
    assert oracle.epilogue(one, one, one, fp32_bits(0.5), "float8_e5m2") == 0x38  # 0.5
    assert oracle.epilogue(one, one, one, fp32_bits(0.5), "bfloat16") == 0x3F80  # ignored
