"""Loaders for the test vectors kept in tests/data (the repository is self-contained).

* ``spec_vectors()`` / ``spec_gemms()``: the contract's vectors (``spec_vectors.json``, an unchanged copy of the
  specification's ``vectors.json``), with operands expanded to code lists and every hex/decimal field turned
  into integers.
* ``km_cases(gpu, fmt)``: the Khattak-Mikaitis hardware vectors (``km_vectors.npz``, written by
  ``scripts/convert_km_vectors.py``; provenance and licence in ``tests/data/README.md``).
"""

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
SPEC_VECTORS = DATA / "spec_vectors.json"
KM_VECTORS = DATA / "km_vectors.npz"

KM_GPUS = ("H100", "H200", "Ada", "B200")
KM_FORMATS = ("E4M3", "E5M2")


def fp32_bits_of_scale(text: str) -> int:
    """A scale as written in vectors.json -> fp32 bit pattern.

    'bits:0x3F8077F9' is the pattern itself; a decimal string ('1.0', '8.470329472543003e-22', 'nan') is the
    float64 a test would pass to torch.tensor(..., dtype=float32), hence converted float64 -> fp32 (RNE).
    """
    if text.startswith("bits:"):
        return int(text[5:], 16)
    return int(np.array(float(text), dtype=np.float64).astype(np.float32).view(np.uint32))


def _sparse_codes(sparse: dict, K: int) -> list:
    """{k: '0xCC'} -> K codes, all others 0x00."""
    codes = [0] * K
    for k, code in sparse.items():
        codes[int(k)] = int(code, 16)
    return codes


def _hex_codes(text: str) -> list:
    return list(bytes.fromhex(text))


def _parse_splitk(splitk) -> tuple:
    """1 -> (1, 'none'); [S, scheme] -> (S, scheme)."""
    if splitk is None or splitk == 1:
        return 1, "none"
    S, scheme = splitk
    return int(S), scheme


def _optional_hex(text):
    return None if text is None else int(text, 16)


@lru_cache(maxsize=None)
def _spec_json() -> dict:
    return json.loads(SPEC_VECTORS.read_text())


def spec_vectors() -> list:
    """The ``vectors`` entries of vectors.json, normalised.  Each dict keeps its original keys, with:

    a, b: lists of K FP8 codes (from the sparse A/B or from A_hex/B_hex); fmt_a, fmt_b: 'e4m3'/'e5m2';
    S, scheme: from splitk; result, ieee_fp32_sequential, ieee_fp32_exact_once: ints (or None);
    sa, sb, scale_result: fp32 bit patterns (scale_result None when absent), for scaled_mm rows.
    """
    out = []
    for raw in _spec_json()["vectors"]:
        v = dict(raw)
        K = v["K"]
        v["a"] = _hex_codes(v["A_hex"]) if "A_hex" in v else _sparse_codes(v["A"], K)
        v["b"] = _hex_codes(v["B_hex"]) if "B_hex" in v else _sparse_codes(v["B"], K)
        assert len(v["a"]) == len(v["b"]) == K, v["id"]
        v.setdefault("fmt_a", "e4m3")
        v.setdefault("fmt_b", "e4m3")
        v["S"], v["scheme"] = _parse_splitk(v.get("splitk"))
        v["result"] = int(v["result"], 16)
        for key in ("ieee_fp32_sequential", "ieee_fp32_exact_once"):
            if key in v:
                v[key] = _optional_hex(v[key])
        if v["api"] == "scaled_mm":
            v["sa"], v["sb"] = fp32_bits_of_scale(v["sa"]), fp32_bits_of_scale(v["sb"])
            v["scale_result"] = fp32_bits_of_scale(v["scale_result"]) if "scale_result" in v else None
        out.append(v)
    return out


def spec_gemms() -> list:
    """The ten full GEMMs of vectors.json, one dict per config, with:

    id, profile, fast, out, fmt_a, fmt_b, S, scheme, M, N, K;
    a: [M][K] codes; w: [N][K] codes (rows of the weight, i.e. columns of mat2 = w.t());
    scale_a, scale_b: fp32 bit patterns; result: [M][N] output bit patterns (row-major).
    """
    g = _spec_json()["gemms"]
    M, N, K = g["M"], g["N"], g["K"]
    a = _hex_codes(g["A_hex"])
    a_rows = [a[m * K:(m + 1) * K] for m in range(M)]
    out = []
    for cfg in g["configs"]:
        w = _hex_codes(g[cfg["W"]])
        S, scheme = _parse_splitk(cfg["splitk"])
        result = [int(x, 16) for x in cfg["result"]]
        out.append({
            "id": cfg["id"], "profile": cfg["profile"], "fast": cfg["fast"], "out": cfg["out"],
            "fmt_a": cfg["fmt_a"], "fmt_b": cfg["fmt_b"], "S": S, "scheme": scheme, "M": M, "N": N, "K": K,
            "a": a_rows, "w": [w[n * K:(n + 1) * K] for n in range(N)],
            "scale_a": fp32_bits_of_scale(g["scale_a"]), "scale_b": fp32_bits_of_scale(g["scale_b"]),
            "result": [result[m * N:(m + 1) * N] for m in range(M)],
        })
    return out


@lru_cache(maxsize=None)
def _km_npz() -> dict:
    with np.load(KM_VECTORS) as z:
        return {k: z[k] for k in z.files}


def km_cases(gpu: str, fmt: str):
    """Khattak-Mikaitis fp32-output cases of one GPU ('H100', 'H200', 'Ada', 'B200') and format ('E4M3',
    'E5M2'; the same format for both operands).

    Returns numpy arrays (a_codes uint8 [5000, 32], b_codes uint8 [5000, 32], c_bits uint32 [5000],
    d_bits uint32 [5000]): case i is d = sum_k a[i, k] * b[i, k] + c[i] on one K = 32 instruction.
    For H100/H200 the hardware did NOT use c (wgmma with a zero accumulator): model them with c = 0.
    H200's d equals H100's (identical upstream files).
    """
    if gpu not in KM_GPUS or fmt not in KM_FORMATS:
        raise KeyError(f"unknown Khattak-Mikaitis set {gpu}/{fmt}")
    z = _km_npz()
    return z[f"a_{fmt}"], z[f"b_{fmt}"], z[f"c_{gpu}_{fmt}"], z[f"d_{gpu}_{fmt}"]

