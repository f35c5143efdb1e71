"""The shapes a recording queries: the shipped tables' grid, a shapes file, or a sweep spec.

Every shape (M, N, K) is a torch._scaled_mm call mat1 [M, K] x mat2 [K, N]: 1 <= M, N, K < 2**21 (the table key's
limit, platform.md 3.4) and N, K multiples of 16 (torch requires them of FP8 operands; the shipped tables hold no
other shapes). Shapes are queried in a seeded random order, so that a recording stopped early by its time budget
holds a uniform sample of the grid, and a resumed one continues the same order.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable, Tuple

import numpy as np

from ..platform.tables import SHAPE_BITS, get_table

__all__ = ["GridError", "default_grid", "read_shapes_file", "parse_sweep", "check_shapes", "ordered", "grid_sha256",
           "DEFAULT_TABLES", "MAX_SHAPES"]

DEFAULT_TABLES = ("heur_h100pcie_lt12.8.3.14", "heur_rtx4060_lt12.8.3.14")
# The most shapes one recording plans: 23 times the default grid (42,949 shapes), 84 million queries at 84 a
# shape, hours of sweep and 1.1 GB of partial answers; a larger grid is a mistake more often than a plan.
MAX_SHAPES = 1_000_000
_LIMIT = 1 << SHAPE_BITS
Shape = Tuple[int, int, int]


class GridError(ValueError):
    """A shapes file or sweep spec that does not describe valid torch._scaled_mm shapes."""


def default_grid() -> np.ndarray:
    """The distinct (M, N, K) of the shipped tables (H100 PCIe and RTX 4060), sorted: int64 [n, 3]."""
    keys = [table._keys for table in (get_table(table_id) for table_id in DEFAULT_TABLES)]
    unique = np.unique(np.concatenate(keys))
    mask = _LIMIT - 1
    return np.stack([unique >> (2 * SHAPE_BITS), (unique >> SHAPE_BITS) & mask, unique & mask], axis=1)


def read_shapes_file(path) -> np.ndarray:
    """Shapes from a text file: one "M N K" per line (spaces or commas), '#' starts a comment."""
    shapes = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].replace(",", " ").split()
        if not text:
            continue
        if len(text) != 3 or not all(t.isdigit() for t in text):
            raise GridError(f"{path}:{number}: expected three positive integers 'M N K', got {line.strip()!r}")
        shapes.append(tuple(int(t) for t in text))
        if len(shapes) > MAX_SHAPES:
            raise GridError(f"{path}: more than {MAX_SHAPES:,} shapes (the most one recording plans)")
    return check_shapes(shapes, str(path))


_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?:([:*])(\d+))?)?$")


def parse_sweep(spec: str) -> np.ndarray:
    """The product of three axes, e.g. "M=1-4096*2;N=64-8192*2;K=1024-16384:1024;K=1040".

    Each axis lists comma-separated items: ``a`` (one value), ``a-b:s`` (a, a+s, ... <= b), ``a-b*f`` (a, a*f, ...
    <= b). An axis may be given several times (the items add up); all three must be given. Every value must lie in
    [1, 2**21) and the product of the three axis lengths must not exceed MAX_SHAPES: both are checked before the
    grid is built.
    """
    axes = {"M": set(), "N": set(), "K": set()}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        axis, _, items = part.partition("=")
        if axis.strip() not in axes or not items:
            raise GridError(f"sweep spec: {part!r} is not AXIS=VALUES with AXIS one of M, N, K")
        for item in items.split(","):
            axes[axis.strip()].update(_expand(item.strip(), part))
    if not all(axes.values()):
        raise GridError(f"sweep spec {spec!r} must give values for M, N and K")
    size = len(axes["M"]) * len(axes["N"]) * len(axes["K"])
    if size > MAX_SHAPES:
        raise GridError(f"sweep spec: {len(axes['M']):,} x {len(axes['N']):,} x {len(axes['K']):,} = {size:,} "
                        f"shapes, more than the {MAX_SHAPES:,} one recording plans (record several sweeps into "
                        "bundles of other names, or a coarser one)")
    grid = np.array(np.meshgrid(*(sorted(axes[a]) for a in "MNK"), indexing="ij")).reshape(3, -1).T
    return check_shapes([tuple(int(x) for x in row) for row in grid], "sweep spec")


def _expand(item: str, part: str) -> Iterable[int]:
    match = _ITEM.match(item)
    if not match:
        raise GridError(f"sweep spec: {item!r} in {part!r} is not a, a-b:step or a-b*factor")
    first, last, op, by = match.groups()
    first = int(first)
    if not 0 < max(first, int(last or first)) < _LIMIT or first < 1:
        raise GridError(f"sweep spec: {item!r} in {part!r} has a value outside 1 <= value < 2**{SHAPE_BITS}")
    if last is None:
        return [first]
    last, by = int(last), int(by or 1)
    if op == "*" and by < 2 or by < 1:
        raise GridError(f"sweep spec: {item!r} needs a factor >= 2 or a step >= 1, from a value >= 1")
    if op != "*":
        return range(first, last + 1, by)
    values, value = [], first
    while value <= last:
        values.append(value)
        value = value * by if op == "*" else value + by
    return values


def check_shapes(shapes: Iterable[Shape], source: str) -> np.ndarray:
    """int64 [n, 3] of distinct shapes, in the given order, at most MAX_SHAPES; GridError names the first invalid
    one."""
    out, seen = [], set()
    for M, N, K in shapes:
        if len(out) >= MAX_SHAPES:
            raise GridError(f"{source}: more than {MAX_SHAPES:,} shapes (the most one recording plans)")
        if not (0 < M < _LIMIT and 0 < N < _LIMIT and 0 < K < _LIMIT):
            raise GridError(f"{source}: shape ({M}, {N}, {K}) outside 1 <= M, N, K < 2**{SHAPE_BITS}")
        if N % 16 or K % 16:
            raise GridError(f"{source}: shape ({M}, {N}, {K}): torch._scaled_mm needs N and K multiples of 16")
        if (M, N, K) not in seen:
            seen.add((M, N, K))
            out.append((M, N, K))
    if not out:
        raise GridError(f"{source}: no shapes")
    return np.array(out, dtype=np.int64)


def ordered(shapes: np.ndarray, seed: int) -> np.ndarray:
    """The shapes in the recording's order: a permutation drawn from ``seed``."""
    return shapes[np.random.default_rng(seed).permutation(len(shapes))]


def grid_sha256(shapes: np.ndarray) -> str:
    """Identity of an ordered grid (a resumed recording must continue the same one)."""
    return hashlib.sha256(np.ascontiguousarray(shapes, dtype="<i8").tobytes()).hexdigest()
