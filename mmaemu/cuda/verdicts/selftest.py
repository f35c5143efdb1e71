"""The self-test a CUDA kernel passes on a device before mmaemu uses it there, and its cached verdicts.

A GEMM kernel is compared, as int32 bit patterns (+0 differs from -0, NaN payloads count), with the CPU reference
``mmaemu.cpu.accumulate_codes(..., reference=True)`` on random and adversarial GEMMs: hopper and ada, fast and slow
accumulation, contiguous, serial and pairwise split-K (ragged K, splits that own no or only padding tiles), mixed
formats, NaN/Inf codes, and b200_mma_sync fast. Cases a kernel does not compute by design (the offset kernel:
b200_mma_sync, which the dispatcher gives to the next kernel) are listed as skipped, never failed. The epilogue
kernel is compared with
``mmaemu.cpu.epilogue_codes`` on special and random accumulators, scales and every output dtype.

The same cases, shrunk (``size="tiny"``: M, N <= 4, K <= 96), run under numba's CUDA simulator in CI
(``tests/test_cuda_sim.py``).

Verdicts are kept in memory and in ``verdicts/<sha256>.json`` of the cache folder (:mod:`mmaemu.base._cache`), the
sha256 of a key made of the device identity (name, uuid, capability, driver, numba CUDA implementation, torch), the
mmaemu version, the sources (:func:`mmaemu.base._cache.source_hash` and the sources of :mod:`mmaemu.cuda`), the kernel
and the self-test version. They are read only from a private folder (:mod:`mmaemu.base._private`: a planted "pass"
would put a wrong kernel to work); a damaged file makes the self-test run again. A self-test that raises
(compilation or launch error) is not written to disk, so it is retried by the next process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Callable, List, Optional

import numpy as np

from ... import formats
from ..._version import __version__

SELFTEST_VERSION = 1
VERDICT_FORMAT = "mmaemu-verdict/1"
_CUDA_DIR = pathlib.Path(__file__).resolve().parent.parent  # mmaemu/cuda, every sub-package


@dataclasses.dataclass(frozen=True)
class GemmCase:
    label: str
    preset: str
    fmt_a: str
    fmt_b: str
    fast: bool
    splits: int
    scheme: str
    M: int
    N: int
    K: int
    data: str  # "random" | "adversarial" | "nonfinite"
    seed: int

    def shrunk(self) -> "GemmCase":
        """The tiny version run under the simulator (M, N <= 4, K <= 96)."""
        return dataclasses.replace(self, M=min(self.M, 4), N=min(self.N, 4), K=min(self.K, 96))


CASES_FILE = pathlib.Path(__file__).resolve().with_name("gemm_cases.json")


def _load_gemm_cases(path: pathlib.Path = CASES_FILE):
    """The GEMM cases of the self-test, from their table (``gemm_cases.json`` beside this module: one row a case,
    the columns those of :class:`GemmCase`; part of the sources a verdict is keyed by, :func:`sources_hash`)."""
    table = json.loads(path.read_text(encoding="utf-8"))
    columns = [f.name for f in dataclasses.fields(GemmCase)]
    if table["columns"] != columns:
        raise ValueError(f"{path}: columns {table['columns']} are not GemmCase's {columns}")
    return tuple(GemmCase(*row) for row in table["gemm"])


# hopper and ada, fast and slow, contiguous/serial/pairwise split-K (ragged K, splits that own no or only padding
# tiles), mixed formats, NaN/Inf codes, b200_mma_sync fast and multi-block shapes (see the module docstring).
GEMM_CASES = _load_gemm_cases()


# ----------------------------------------------------------------------------------------------------------------
# Operand generators (numpy only, deterministic)


def _finite_codes(fmt):
    return np.flatnonzero(~np.asarray(formats.nonfinite_codes(fmt))).astype(np.uint8)


def _random_codes(rng, shape, fmt):
    """Gaussian-like magnitudes: exponent fields around the binade of 2.0, random mantissas and signs."""
    return formats.random_codes(rng, shape, fmt, spread=2.5, centre=1)


def _adversarial_codes(rng, rows, K, fmt, nfma):
    """Row groups of the hard cases of the block arithmetic (one group per row, cycling)."""
    mbits = formats.MANT_BITS[fmt]
    top = (1 << (7 - mbits)) - 1
    finite = _finite_codes(fmt)
    out = np.empty((rows, K), np.uint8)
    for r in range(rows):
        group = r % 7
        sign = rng.integers(0, 2, K)
        mant = rng.integers(0, 1 << mbits, K)
        if group == 0:  # subnormals and signed zeros
            row = formats.encode(fmt, sign, np.zeros(K, np.int64), mant)
        elif group == 1:  # the largest magnitudes
            row = formats.encode(fmt, sign, np.full(K, formats.TOP_FIELD[fmt]), mant)
        elif group == 2:  # one exponent per block of nfma
            exps = np.repeat(rng.integers(0, top, (K + nfma - 1) // nfma), nfma)[:K]
            row = formats.encode(fmt, sign, exps, mant)
        elif group == 3:  # exact cancellation: the second half negates the first
            half = _random_codes(rng, (K + 1) // 2, fmt)
            row = np.concatenate([half, half ^ 0x80])[:K]
        elif group == 4:  # every finite code, with about 5% negative zeros
            row = rng.choice(finite, K)
            row[rng.random(K) < 0.05] = 0x80
        elif group == 5:  # huge next to tiny: truncation of small products below the block exponent
            exps = np.where(np.arange(K) % 2 == 0, top - 1, rng.integers(0, 3, K))
            row = formats.encode(fmt, sign, exps, mant)
        else:  # near cancellation: pairs x, -(x +- one ulp)
            half = _random_codes(rng, (K + 1) // 2, fmt)
            other = half ^ 0x80
            bump = rng.integers(0, 2, half.shape[0]).astype(np.uint8)
            nudged = np.where((other & ((1 << mbits) - 1)) < (1 << mbits) - 1, other + bump, other).astype(np.uint8)
            row = np.concatenate([half, nudged])[:K]
            row = np.where(np.asarray(formats.nonfinite_codes(fmt))[row], 0, row).astype(np.uint8)
        out[r] = row
    return out


def _inject_nonfinite(rng, codes, fmt, pattern):
    """Put NaN / +-Inf codes into rows (row r gets ``pattern[r % len(pattern)]``: "finite", "nan", "+inf",
    "-inf" or "+-inf"; e4m3 has no Inf, its Inf rows get NaN); return the codes and the k positions used."""
    codes = codes.copy()
    rows, K = codes.shape
    has_inf = fmt == "e5m2"
    nan = np.uint8(0x7E if has_inf else 0x7F)
    pos, neg = (np.uint8(0x7C), np.uint8(0xFC)) if has_inf else (nan, np.uint8(0xFF))
    used = []
    for r in range(rows):
        kind = pattern[r % len(pattern)]
        if kind == "finite" or K == 0:
            continue
        k = int(rng.integers(0, K))
        used.append(k)
        if kind == "nan":
            codes[r, k] = nan
        elif kind == "+inf":
            codes[r, k] = pos
        elif kind == "-inf":
            codes[r, k] = neg
        else:  # +Inf and -Inf terms: NaN
            codes[r, k] = pos
            codes[r, (k + 1) % K] = neg
    return codes, used


def gemm_operands(case: GemmCase):
    """(a_codes [M, K], b_codes [N, K]) uint8 of a case."""
    from ...model.presets import get_preset

    rng = np.random.default_rng(20261012 + case.seed)
    nfma = get_preset(case.preset, warn=False).nfma
    if case.data == "adversarial":
        a = _adversarial_codes(rng, case.M, case.K, case.fmt_a, nfma)
        b = _adversarial_codes(rng, case.N, case.K, case.fmt_b, nfma)
        if case.N > 1 and case.M > 0:  # near cancellation across operands: B row 1 mirrors A row 0 negated
            b[1] = a[0] ^ 0x80
            b[1] = np.where(np.asarray(formats.nonfinite_codes(case.fmt_b))[b[1]], 0, b[1])
    else:
        a = _random_codes(rng, (case.M, case.K), case.fmt_a)
        b = _random_codes(rng, (case.N, case.K), case.fmt_b)
    if case.data == "nonfinite":
        a, used = _inject_nonfinite(rng, a, case.fmt_a, ("finite", "nan", "+inf", "+-inf", "-inf"))
        b, used_b = _inject_nonfinite(rng, b, case.fmt_b, ("finite", "-inf", "finite", "+inf"))
        if case.N > 2 and used:  # Inf x 0: zeros in a finite B row where A rows hold specials
            b[2, used] = 0
        if case.M > 0 and used_b:  # and -0 in the finite A row where B rows hold specials
            a[0, used_b] = 0x80
    return a, b


# ----------------------------------------------------------------------------------------------------------------
# Checks


def compare_bits(got, want, limit=5):
    """Mismatches of two arrays as bit patterns: (count, [(index, got hex, want hex), ...])."""
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(want)
    if got.shape != want.shape:
        return -1, [("shape", str(got.shape), str(want.shape))]
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    g, w = got.view(uint), want.view(uint)
    bad = np.argwhere(g != w)
    first = [(tuple(int(i) for i in idx), hex(int(g[tuple(idx)])), hex(int(w[tuple(idx)]))) for idx in bad[:limit]]
    return int(bad.shape[0]), first


def run_gemm_cases(compute: Callable, cases, *, stop_on_error=False, skip: Optional[Callable] = None):
    """Run ``compute(case, a_codes, b_codes) -> fp32 [M, N]`` on every case against the CPU reference.

    Returns (passed, details) where details lists every case with its mismatch count. ``skip(case)``: why the
    kernel does not compute the case by design (None if it does); such a case is not run and is listed with
    ``"skipped": reason`` (a skip is never a failure: the dispatcher gives such calls to another kernel).
    """
    from ...cpu import accumulate_codes
    from ...model.presets import get_preset

    details = []
    passed = True
    for case in cases:
        why = skip(case) if skip is not None else None
        if why is not None:
            details.append({"case": case.label, "shape": [case.M, case.N, case.K], "mismatches": 0, "first": [],
                            "skipped": why})
            continue
        a, b = gemm_operands(case)
        preset = get_preset(case.preset, warn=False)
        want = accumulate_codes(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme,
                                reference=True)
        got = np.asarray(compute(case, a, b))
        count, first = compare_bits(got.astype(np.float32, copy=False), want)
        details.append({"case": case.label, "shape": [case.M, case.N, case.K], "mismatches": count,
                        "first": first})
        if count:
            passed = False
            if stop_on_error:
                break
    return passed, details


_F32 = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000,
    0x3F800001, 0x3F808000, 0x3F818000, 0x3F7FFFFF, 0x477FE000, 0x477FF000, 0x47800000, 0x43E00000,
    0x43E80000, 0x43F00000, 0x47600000, 0x47700000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
    0x7FC00000, 0x7FFFFFFF, 0x33800000, 0x38800000, 0x3B000000, 0x3A800000, 0x387FC000, 0x37800000,
], dtype=np.uint32)
_SCALES = (  # (scale_a, scale_b, scale_result or None) as fp32 bits
    (0x3F800000, 0x3F800000, None),
    (0x3F000000, 0x40400000, None),
    (0x3DCCCCCD, 0x3E4CCCCD, 0x41200000),  # 0.1 * 0.2 (rounded), scale_result 10
    (0x00800000, 0x3F000000, 0x3F800000),  # alpha subnormal
    (0x7F000000, 0x40000000, None),  # alpha overflows to Inf
    (0xBF800000, 0x3FC00000, 0xC0000000),  # negative scales
    (0x3F800000, 0x00000000, None),  # alpha = 0
    (0x7FC00000, 0x3F800000, 0x3F800000),  # NaN scale
)
OUT_NAMES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def epilogue_inputs(size="full"):
    """Accumulators (fp32 [rows, cols]) for the epilogue check: special values and random bit patterns."""
    rng = np.random.default_rng(20261013)
    count = 64 if size == "tiny" else 4096
    randoms = rng.integers(0, 1 << 32, count, dtype=np.uint64).astype(np.uint32)
    near = (rng.integers(0x30000000, 0x48000000, count, dtype=np.uint64).astype(np.uint32) & ~np.uint32(0xFF)) | \
        rng.choice(np.array([0x00, 0x7F, 0x80, 0x81, 0xFF], np.uint32), count)
    bits = np.concatenate([_F32, randoms, near])
    pad = (-bits.size) % 16
    bits = np.concatenate([bits, np.zeros(pad, np.uint32)])
    return bits.view(np.float32).reshape(-1, 16)


def run_epilogue_cases(compute: Callable, size="full"):
    """Run ``compute(acc, sa_bits, sb_bits, sr_bits, out_name) -> uint bits`` against mmaemu.cpu.epilogue_codes."""
    from ...cpu import epilogue_codes

    acc = epilogue_inputs(size)
    scales = _SCALES if size != "tiny" else _SCALES[:4] + _SCALES[5:6]
    details = []
    passed = True
    for sa, sb, sr in scales:
        for out_name in OUT_NAMES:
            want = epilogue_codes(acc, sa, sb, sr, out_name)
            got = np.asarray(compute(acc, sa, sb, sr, out_name))
            count, first = compare_bits(got.astype(want.dtype, copy=False), want)
            details.append({"case": f"{out_name} scales {hex(sa)} {hex(sb)} {hex(sr) if sr is not None else None}",
                            "mismatches": count, "first": first})
            passed = passed and count == 0
    return passed, details


# ----------------------------------------------------------------------------------------------------------------
# Verdicts


def sources_hash() -> str:
    """sha256 (16 hex digits) of the arithmetic's sources (mmaemu.base._cache.source_hash) and of mmaemu/cuda (its
    modules and its tables: the self-test cases)."""
    from ...base import _cache

    digest = hashlib.sha256(_cache.source_hash().encode())
    for path in sorted([*_CUDA_DIR.rglob("*.py"), *_CUDA_DIR.rglob("*.json")]):
        digest.update(path.relative_to(_CUDA_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def verdict_key(identity: dict, kernel: str) -> dict:
    return {
        "format": VERDICT_FORMAT,
        "device": identity,
        "mmaemu": __version__,
        "sources": sources_hash(),
        "kernel": kernel,
        "selftest_version": SELFTEST_VERSION,
    }


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def verdict_dir(location=None) -> Optional[pathlib.Path]:
    """``verdicts/`` of the cache folder in use (mmaemu.base._cache.cache_location), None if there is none or the
    folder breaks the rules of mmaemu.base._private (a planted "pass" could put a wrong kernel to work)."""
    from ...base import _cache

    return (location or _cache.cache_location()).subfolder("verdicts")


def load_verdict(key: dict) -> Optional[dict]:
    """The stored verdict of a key, or None (missing, not private, damaged, or written for another key). A file
    that cannot be read or parsed is reported once per process (CacheWarning) and the self-test runs again."""
    from ...base import _cache, _private

    directory = verdict_dir()
    if directory is None:
        return None
    path = directory / f"{key_digest(key)}.json"
    try:
        blob = _private.read_private_file(path)
        data = None if blob is None else json.loads(blob)
    except (OSError, ValueError, RecursionError) as exc:
        _cache.warn_once("verdict", f"mmaemu ignores the self-test verdict {path} ({type(exc).__name__}: {exc}); "
                                    f"the self-test runs again")
        return None
    if not (isinstance(data, dict) and data.get("key") == key and isinstance(data.get("passed"), bool)
            and isinstance(data.get("reason", ""), str) and isinstance(data.get("seconds", 0.0), (int, float))):
        return None
    return data


def store_verdict(key: dict, passed: bool, reason: str, details, seconds: float) -> Optional[pathlib.Path]:
    """Write a verdict (0600, atomically) into a private folder; None if the cache is not writable (never
    raises)."""
    from ...base import _cache, _private

    location = _cache.cache_location()
    directory = verdict_dir(location)
    if directory is None or not location.writable:
        return None
    record = {"key": key, "passed": passed, "reason": reason, "details": details, "seconds": round(seconds, 3),
              "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        _private.make_private_folder(location.root, directory)
        path = directory / f"{key_digest(key)}.json"
        _private.write_private_file(path, json.dumps(record, indent=1, default=str).encode())
        return path
    except (OSError, ValueError):
        return None


def summarize(details: List[dict]) -> str:
    bad = [d for d in details if d.get("mismatches")]
    skipped = [d for d in details if d.get("skipped")]
    if not bad:
        ran = len(details) - len(skipped)
        return f"{ran} cases bit-identical to the CPU reference" + (
            f" ({len(skipped)} skipped by design)" if skipped else "")
    first = bad[0]
    if first.get("reason"):  # a gate with its own summary (the native kernel's instruction probe)
        return first["reason"]
    return (f"{len(bad)} of {len(details)} cases differ from the CPU reference; first: {first['case']}: "
            f"{first['mismatches']} outputs, e.g. {first['first'][:2]}")
