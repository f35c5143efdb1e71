"""Static instruction counts of mmaemu's CUDA kernels, without a GPU: PTX -> ptxas -> SASS, loop by loop.

Usage::

    python scripts/sass_report.py [--kernels biased,lanes] [--cc 9.0]
    python scripts/sass_report.py --kernels wgmma_fast_e4m3_e4m3,wgmma_slow_e4m3_e4m3 --cc 9.0a
    python scripts/sass_report.py --kernels mma_sync_fast_e4m3_e4m3,mma_sync_slow_e4m3_e4m3 --cc 8.9

Numba compiles each kernel to PTX for the target (:func:`mmaemu.cuda.offline.compile_ptx`: a fake current device
stands in for the missing GPU), ``ptxas`` assembles it (registers, spills, shared memory) and ``nvdisasm -c``
disassembles the cubin. Every loop of the SASS (a backward branch) is listed innermost first with its instruction count
and most frequent opcodes, so that the cost of a kernel's inner loops per product can be read off: these are
static counts of one loop iteration, not measurements; how fast a GPU runs them is for ``scripts/gpu_check.py``.

Needs libNVVM (a CUDA toolkit, or the ``nvidia-nvvm`` wheel with numba-cuda), ``ptxas`` (``$CUDA_HOME/bin`` or
PATH) and ``nvdisasm`` (PATH, or the ``nvidia-cuda-nvdisasm`` wheel).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SASS_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*);")


def _tool(name: str) -> str:
    """Path of a CUDA tool: $CUDA_HOME/bin, PATH, then the nvidia-* wheels' bin folders."""
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    for candidate in (pathlib.Path(home) / "bin" / name, shutil.which(name)):
        if candidate and pathlib.Path(candidate).is_file():
            return str(candidate)
    try:
        import nvidia

        for base in nvidia.__path__:
            for found in pathlib.Path(base).glob(f"*/bin/{name}"):
                return str(found)
    except ImportError:
        pass
    raise SystemExit(f"{name} not found: install a CUDA toolkit or the nvidia-cuda-{name} wheel")


def compile_ptx(names, cc):
    """{name: (PTX text, register cap or None)} of the kernels of mmaemu.cuda.launch.signatures() for compute
    capability ``cc`` (the cap is the kernel's ``max_registers`` option, which ptxas applies at load time)."""
    from mmaemu.cuda import launch, native_kernel, offline

    signatures = dict(launch.signatures())
    for instruction in native_kernel.INSTRUCTIONS:  # the native kernels, for their own target only
        if any(name.startswith(instruction + "_") for name in names):
            signatures.update(launch.native_signatures(instruction))
    out = {}
    for name in names:
        kernel, signature = signatures[name]
        cap = getattr(kernel, "targetoptions", {}).get("max_registers")
        out[name] = (offline.compile_ptx(kernel, signature, cc), cap)
    return out


def assemble(ptx: str, sm: str, folder: pathlib.Path, name: str, cap=None):
    """(ptxas resource lines, SASS text) of one PTX module (``cap``: registers per thread, as the driver applies a
    kernel's max_registers)."""
    ptx_path = folder / f"{name}.ptx"
    # ptxas accepts PTX up to its own ISA version; NVVM may label the module with a newer one.
    version = re.search(r"^\.version (\d+)\.(\d+)", ptx, re.M)
    ptx_path.write_text(ptx)
    cubin = folder / f"{name}.cubin"
    command = [_tool("ptxas"), f"-arch={sm}", "-v", str(ptx_path), "-o", str(cubin)]
    if cap:
        command.append(f"-maxrregcount={cap}")
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode and version and "Unsupported .version" in run.stderr:
        supported = re.search(r"current version is '(\d+\.\d+)'", run.stderr)
        if supported:
            ptx_path.write_text(ptx.replace(version.group(0), f".version {supported.group(1)}", 1))
            run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"ptxas failed for {name}: {run.stderr[-2000:]}")
    resources = [ln.split("info    :")[-1].strip() for ln in run.stderr.splitlines()
                 if "Used" in ln or "spill" in ln]
    return resources, disassemble(cubin)


def disassemble(cubin: pathlib.Path) -> str:
    """SASS text of a cubin (``nvdisasm -c``: code sections only), with branch-target labels replaced by the
    address they label, as ``(0x0430)``."""
    sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    addresses, pending = {}, []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        match = SASS_LINE.match(line)
        if match:
            addresses.update((name, match.group(1)) for name in pending)
            pending = []
    return re.sub(r"`?\((\.L_x_\d+)\)", lambda m: f"(0x{addresses.get(m.group(1), m.group(1))})", sass)


def loops(sass: str):
    """[(start, end, count, Counter of opcodes)] of every loop (backward branch), innermost first."""
    instructions = []
    for line in sass.splitlines():
        match = SASS_LINE.match(line)
        if match:
            instructions.append((int(match.group(1), 16), match.group(3).split(".")[0], match.group(4)))
    found = []
    for address, opcode, args in instructions:
        target = re.search(r"0x([0-9a-f]+)", args) if opcode == "BRA" else None
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            body = [op for a, op, _ in instructions if start <= a <= address]
            found.append((start, address, len(body), collections.Counter(body)))
    return sorted(found, key=lambda loop: loop[2]), len(instructions)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="biased,biased_split,lanes",
                        help="names of mmaemu.cuda.launch.signatures()")
    parser.add_argument("--cc", default="9.0",
                        help="compute capability, e.g. 9.0 (9.0a for cuda:native's wgmma kernels, 8.9 for mma_sync)")
    args = parser.parse_args(argv)
    major, minor = args.cc.split(".")
    suffix = minor.lstrip("0123456789")
    cc = (int(major), int(minor[:len(minor) - len(suffix)])) + ((suffix,) if suffix else ())
    sm = f"sm_{cc[0]}{cc[1]}{suffix}"
    import numba

    try:
        from importlib.metadata import version

        numba_cuda = version("numba-cuda")
    except Exception:
        numba_cuda = None
    print(f"# SASS of mmaemu kernels for {sm} (numba {numba.__version__}"
          f"{', numba-cuda ' + numba_cuda if numba_cuda else ', built-in CUDA target'})\n")
    ptx = compile_ptx(args.kernels.split(","), cc)
    with tempfile.TemporaryDirectory() as folder:
        for name, (text, cap) in ptx.items():
            resources, sass = assemble(text, sm, pathlib.Path(folder), name, cap)
            found, total = loops(sass)
            print(f"## {name}: {total} instructions; " + "; ".join(resources) + "\n")
            print("| loop | instructions | most frequent opcodes |")
            print("|---|---|---|")
            for start, end, count, ops in found:
                mix = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
                print(f"| {start:#06x}-{end:#06x} | {count} | {mix} |")
            print()


if __name__ == "__main__":
    main()
