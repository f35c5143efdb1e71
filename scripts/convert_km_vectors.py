"""Convert the Khattak-Mikaitis FP8 tensor-core hardware vectors into one compact test-data file.

Source: the data files of https://github.com/north-numerical-computing/MATLAB-tensor-core
(commit b12b5a700957655375a1b0c1d0c26e76065da015, `model_validation/<GPU>/<FMT>/`, BSD 2-Clause,
(c) 2025 Faizan A. Khattak and Mantas Mikaitis), in the renamed/deduplicated layout of the project's shared
vector folder:

    inputs/{a,b}_{E4M3,E5M2}.txt          32 words per line, each the fp32 bit pattern of an FP8 value (hex)
    <GPU>/<FMT>/c_<GPU>_fp32.txt          accumulator input c, one 32-char binary string per line
    <GPU>/<FMT>/d_<GPU>_fp32.txt          hardware result (fp32 output), same encoding
    (H200 has no d fp32 file there: it was dropped upstream-side as byte-identical to H100's.)

Writes tests/data/km_vectors.npz (fp32-output cases only; the fp16-output files are not converted):

    a_E4M3, b_E4M3, a_E5M2, b_E5M2      uint8  [5000, 32]  FP8 codes (float8_e4m3fn / float8_e5m2)
    c_<GPU>_<FMT>, d_<GPU>_<FMT>        uint32 [5000]      fp32 bit patterns, GPU in H100 H200 Ada B200
                                                           (d_H200_* is H100's d, per the source README)

and copies the licence to tests/data/km_vectors.LICENCE.  Every input word is converted to its FP8 code by a
round trip through torch's float8 dtypes; a word that does not come back bit-identical is not an FP8 value of
that format and stops the conversion with an error.

Rerun from the repository root:

    python scripts/convert_km_vectors.py [SOURCE_FOLDER]

SOURCE_FOLDER defaults to ../shared/vectors/khattak-mikaitis-MATLAB-tensor-core (relative to the repo root).
"""

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO_ROOT / ".." / "shared" / "vectors" / "khattak-mikaitis-MATLAB-tensor-core"
OUT_FILE = REPO_ROOT / "tests" / "data" / "km_vectors.npz"
LICENCE_FILE = REPO_ROOT / "tests" / "data" / "km_vectors.LICENCE"

CASES, K = 5000, 32
FP8_DTYPES = {"E4M3": torch.float8_e4m3fn, "E5M2": torch.float8_e5m2}
GPUS = ("H100", "H200", "Ada", "B200")
D_ALIASES = {"H200": "H100"}  # source README: H200 fp32 results are byte-identical to H100's


def read_hex_words(path: Path) -> np.ndarray:
    rows = [[int(w, 16) for w in line.split()] for line in path.read_text().splitlines() if line.strip()]
    words = np.array(rows, dtype=np.uint32)
    if words.shape != (CASES, K):
        sys.exit(f"{path}: expected {CASES}x{K} words, got {words.shape}")
    return words


def read_binary_words(path: Path) -> np.ndarray:
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(lines) != CASES or any(len(s) != 32 or set(s) - {"0", "1"} for s in lines):
        sys.exit(f"{path}: expected {CASES} lines of 32 binary digits")
    return np.array([int(s, 2) for s in lines], dtype=np.uint32)


def fp32_words_to_fp8_codes(words: np.ndarray, fmt: str, path: Path) -> np.ndarray:
    """Exact conversion: the FP8 code whose value has exactly this fp32 bit pattern, else an error."""
    as_fp32 = torch.from_numpy(words.view(np.float32).copy())
    codes = as_fp32.to(FP8_DTYPES[fmt])
    back = codes.to(torch.float32).numpy().view(np.uint32)
    bad = np.argwhere(back != words)
    if bad.size:
        case, k = bad[0]
        sys.exit(f"{path}: case {case}, k {k}: 0x{words[case, k]:08X} is not an exact {fmt} value")
    return codes.view(torch.uint8).numpy().copy()


def convert(source: Path) -> dict:
    arrays = {}
    for fmt in FP8_DTYPES:
        for operand in "ab":
            path = source / "inputs" / f"{operand}_{fmt}.txt"
            arrays[f"{operand}_{fmt}"] = fp32_words_to_fp8_codes(read_hex_words(path), fmt, path)
        for gpu in GPUS:
            arrays[f"c_{gpu}_{fmt}"] = read_binary_words(source / gpu / fmt / f"c_{gpu}_fp32.txt")
            d_gpu = D_ALIASES.get(gpu, gpu)
            arrays[f"d_{gpu}_{fmt}"] = read_binary_words(source / d_gpu / fmt / f"d_{d_gpu}_fp32.txt")
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE,
                        help="folder of the Khattak-Mikaitis vectors (default: %(default)s)")
    source = parser.parse_args().source
    arrays = convert(source)
    np.savez_compressed(OUT_FILE, **arrays)
    shutil.copyfile(source / "LICENCE", LICENCE_FILE)
    print(f"wrote {OUT_FILE.relative_to(REPO_ROOT)} ({OUT_FILE.stat().st_size} bytes, {len(arrays)} arrays)")


if __name__ == "__main__":
    main()
