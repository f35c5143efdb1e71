"""Static SASS of mmaemu's kernels without a GPU: assemble, disassemble, find the loops, count the block loop.

The speed of a CUDA-core kernel is bound by instruction issue (shared/design/gpu-kernels.md, section 1), so the
offset kernel's budget is a static count: SASS instructions per product in its block loop. This module measures
it from PTX (:func:`tools.ptx_offline.compile_ptx`) without a device:

* :func:`assemble` runs ``ptxas -v`` (registers, spill stores and loads, stack frame) and ``nvdisasm -c`` (the
  SASS of the cubin);
* :func:`loops` finds every loop of the SASS (a backward branch and its target) and nests them by address;
* :func:`block_loop_cost` reads the offset kernel's loop nest - the stage loop (it holds the barriers and the
  stage copies), the block loop inside it, and in that the exponent-pass loop and the product loop - and weighs
  each loop's own instructions by how often it runs per stage for a preset. Every instruction in a loop's body is
  counted once per pass, including those of branches a pass does not take: an upper bound of the hot path.

These are static counts, not measurements; how fast a GPU runs them is for ``scripts/gpu_check.py``. The tools
come from a CUDA toolkit (``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``, PATH) or NVIDIA's wheels
(``nvidia-cuda-nvdisasm``); :func:`find_tool` says which is missing.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional, Tuple

# An instruction line of ``nvdisasm -c``: address, predicate, opcode with its modifiers (which may hold lower case:
# ``QGMMA.64x128x32.F32.E4M3.E4M3``, ``VIADDMNMX.U16x2``), operands.
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+(?:\.[0-9A-Za-z_]+)*)([^;]*);")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH_TARGET = re.compile(r"`\(\s*(\.L_x_\d+)\s*\)")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")
STACK = re.compile(r"(\d+) bytes stack frame")
EXPONENT_OPCODES = ("VIADDMNMX", "VIMNMX", "HMNMX2", "HFMA2")  # the exponent pass's maxima (or power sums)


class ToolMissing(RuntimeError):
    """A CUDA tool this module needs is not installed."""


def find_tool(name: str) -> Optional[str]:
    """Path of a CUDA tool (``ptxas``, ``nvdisasm``): ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``, PATH, then the
    ``bin`` folders of NVIDIA's pip wheels (``nvidia-cuda-nvdisasm``); None if none has it."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for candidate in [pathlib.Path(h) / "bin" / name for h in homes if h] + [shutil.which(name)]:
        if candidate and pathlib.Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for found in sorted(pathlib.Path(base).glob(f"*/bin/{name}")):
            if os.access(found, os.X_OK):
                return str(found)
    return None


def _tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        wheel = {"nvdisasm": " or `pip install nvidia-cuda-nvdisasm`"}.get(name, "")
        raise ToolMissing(f"{name} not found (CUDA_HOME, /usr/local/cuda, PATH, NVIDIA wheels): install a CUDA "
                          f"toolkit{wheel}")
    return path


@dataclasses.dataclass(frozen=True)
class Assembly:
    """One kernel assembled for one architecture: ptxas's resource report and the disassembled SASS."""

    sm: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    log: str
    sass: str

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def assemble(ptx: str, sm: str, register_cap: Optional[int] = None) -> Assembly:
    """``ptxas -v -arch=sm`` (with the kernel's register cap, as the driver applies ``max_registers``) and
    ``nvdisasm -c`` of one PTX module. A PTX ``.version`` newer than this ptxas reads is lowered to the newest it
    reads (NVVM may label a module with a newer ISA version than the instructions it uses need)."""
    ptxas, nvdisasm = _tool("ptxas"), _tool("nvdisasm")
    with tempfile.TemporaryDirectory(prefix="mmaemu-sass-") as folder:
        source, cubin = pathlib.Path(folder) / "kernel.ptx", pathlib.Path(folder) / "kernel.cubin"
        command = [ptxas, f"-arch={sm}", "-v", str(source), "-o", str(cubin)]
        if register_cap:
            command.append(f"-maxrregcount={register_cap}")
        source.write_text(ptx)
        run = subprocess.run(command, capture_output=True, text=True)
        version = re.search(r"^\.version (\d+\.\d+)", ptx, re.M)
        supported = re.search(r"current version is '(\d+\.\d+)'", run.stderr)
        if run.returncode and version and supported:
            source.write_text(ptx.replace(version.group(0), f".version {supported.group(1)}", 1))
            run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"ptxas -arch={sm} failed: {run.stderr[-2000:]}")
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    log = run.stdout + run.stderr
    spills = SPILLS.search(log)
    return Assembly(sm, int(REGISTERS.search(log).group(1)), int(spills.group(1)) if spills else 0,
                    int(spills.group(2)) if spills else 0, int(STACK.search(log).group(1)) if STACK.search(log)
                    else 0, log, sass)


@dataclasses.dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str  # with its modifiers, e.g. "FFMA.RZ"
    operands: str  # e.g. "R1, R2, R3, R4"

    @property
    def base(self) -> str:
        """The opcode without modifiers ("FFMA")."""
        return self.opcode.split(".")[0]


def instructions(sass: str) -> Tuple[List[Instruction], Dict[str, int]]:
    """The instructions of ``nvdisasm -c`` output and the addresses of its labels."""
    found, labels, pending = [], {}, []
    for line in sass.splitlines():
        label = LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        match = INSTRUCTION.match(line)
        if match:
            address = int(match.group(1), 16)
            labels.update((name, address) for name in pending)
            pending = []
            found.append(Instruction(address, match.group(3), match.group(4).strip()))
    return found, labels


@dataclasses.dataclass
class Loop:
    """Instructions from ``start`` (a branch target) to ``end`` (the last backward branch to it), inclusive."""

    start: int
    end: int
    body: List[Instruction]
    children: List["Loop"] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def own(self) -> List[Instruction]:
        """Instructions of the body outside the nested loops."""
        inner = [(c.start, c.end) for c in self.children]
        return [i for i in self.body if not any(s <= i.address <= e for s, e in inner)]

    def opcodes(self, own: bool = False) -> collections.Counter:
        return collections.Counter(i.base for i in (self.own if own else self.body))

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and (self.start, self.end) != (other.start,
                                                                                                     other.end)


def loops(sass: str) -> List[Loop]:
    """Every loop of the SASS, outermost first, each with its directly nested loops as ``children``."""
    found, labels = instructions(sass)
    ends: Dict[int, int] = {}
    for ins in found:
        target = BRANCH_TARGET.search(ins.operands) if ins.base == "BRA" else None
        if target and target.group(1) in labels and labels[target.group(1)] <= ins.address:
            start = labels[target.group(1)]
            ends[start] = max(ends.get(start, start), ins.address)
    result = [Loop(s, e, [i for i in found if s <= i.address <= e]) for s, e in sorted(ends.items())]
    for loop in result:
        enclosing = [o for o in result if o.contains(loop)]
        if enclosing:
            min(enclosing, key=lambda o: o.size).children.append(loop)
    return result


@dataclasses.dataclass(frozen=True)
class BlockLoopCost:
    """SASS instructions per stage of the offset kernel's block loop, by part, for one preset."""

    stage_own: int  # stage copies, barriers, the stage loop's own control
    block_own: int  # per block: the exponent pass's first words, block start and end, the block loop's control
    exponent_loop: int  # per pass of the exponent-pass loop
    product_loop: int  # per pass of the product loop
    blocks: int  # blocks per stage
    exponent_passes: int  # passes of the exponent-pass loop per block
    product_passes: int  # passes of the product loop per block
    products: int  # products per stage and thread

    PART_NAMES = ("block start/end, first exponent words", "exponent-pass loop", "product loop",
                  "stage copies and control")

    @property
    def total(self) -> int:
        return self.stage_own + self.blocks * (self.block_own + self.exponent_passes * self.exponent_loop
                                               + self.product_passes * self.product_loop)

    @property
    def per_product(self) -> float:
        return self.total / self.products

    def parts(self) -> Dict[str, float]:
        """Instructions per product of each part."""
        n = self.products
        counts = (self.blocks * self.block_own, self.blocks * self.exponent_passes * self.exponent_loop,
                  self.blocks * self.product_passes * self.product_loop, self.stage_own)
        return {name: count / n for name, count in zip(self.PART_NAMES, counts)}


def _innermost(found: List[Loop]) -> List[Loop]:
    return [loop for loop in found if not loop.children]


def block_loop_nest(sass: str) -> Tuple[Loop, Loop, Loop, Loop]:
    """(stage loop, block loop, exponent-pass loop, product loop) of the offset kernel's SASS. ValueError if the
    SASS does not have that shape (then the count would mean nothing)."""
    found = loops(sass)
    leaves = _innermost(found)
    products = [loop for loop in leaves if loop.opcodes()["FFMA"] >= 64 and loop.opcodes()["IDP"]]
    exponents = [loop for loop in leaves if not loop.opcodes()["FFMA"]
                 and sum(loop.opcodes()[op] for op in EXPONENT_OPCODES) >= 16]
    if len(products) != 1 or len(exponents) != 1:
        raise ValueError(f"expected one product loop and one exponent-pass loop, found {len(products)} and "
                         f"{len(exponents)}")
    product, exponent = products[0], exponents[0]
    common = [loop for loop in found if loop.contains(product) and loop.contains(exponent)]
    if not common:
        raise ValueError("no loop holds both the exponent pass and the products")
    block = min(common, key=lambda loop: loop.size)
    stages = [loop for loop in found if loop.contains(block) and loop.opcodes(own=True)["BAR"]]
    if not stages:
        raise ValueError("no loop around the block loop stages operands (no barrier)")
    stage = min(stages, key=lambda loop: loop.size)
    for loop, known in ((block, {id(exponent), id(product)}), (stage, {id(block)})):
        others = [c for c in loop.children if id(c) not in known]
        if others:
            raise ValueError(f"unexpected loops at {[hex(c.start) for c in others]} inside the loop at "
                             f"{loop.start:#x}")
    return stage, block, exponent, product


def block_loop_cost(sass: str, trips: Tuple[int, int, int], products: int) -> BlockLoopCost:
    """The block loop's instructions per stage for a preset: ``trips`` = (blocks per stage, exponent-pass loop
    passes per block, product loop passes per block), ``products`` per stage and thread (the kernel's
    ``block_loop_trips`` and ``products_per_stage``)."""
    stage, block, exponent, product = block_loop_nest(sass)
    blocks, exponent_passes, product_passes = trips
    return BlockLoopCost(len(stage.own), len(block.own), exponent.size, product.size, blocks, exponent_passes,
                         product_passes, products)
