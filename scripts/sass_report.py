"""Static instruction counts of mmaemu's CUDA kernels, without a GPU: PTX -> ptxas -> nvdisasm, loop by loop.

Usage::

    python scripts/sass_report.py [--kernels offset_powers,offset,simple] [--cc 9.0,8.9,12.0] [--json]
    python scripts/sass_report.py --kernels wgmma_fast_e4m3_e4m3,wgmma_slow_e4m3_e4m3 --cc 9.0a
    python scripts/sass_report.py --kernels mma_sync_fast_e4m3_e4m3,mma_sync_slow_e4m3_e4m3 --cc 8.9

Numba compiles each kernel to PTX for the target (:func:`tools.ptx_offline.compile_ptx`: a fake current device
stands in for the missing GPU), ``ptxas -v`` assembles it (registers, spills, stack frame) and ``nvdisasm -c``
disassembles it (:mod:`tools.sass`). Every loop of the SASS (a backward branch) is listed with its
instruction count and most frequent opcodes; for the offset kernels (``offset_powers``: E4M3 x E4M3 by bf16 power
sums, ``offset``: add-max, the other format pairs) the block loop's SASS instructions per product are weighed per
preset (hopper: one 32-product block per stage, ada: two of 16), part by part, against the budgets of
``tests/test_cuda_sim.py``. The kernels of ``cuda:native`` (``<instruction>_<fast|slow|probe>_<fmt_a>_<fmt_b>``,
:func:`mmaemu.cuda.dispatch.launch.native_signatures`)
compile for their instruction's own target only: ``--cc 9.0a`` for
the warpgroup MMA (``wgmma_*``), ``--cc 8.9`` for mma.sync (``mma_sync_*``). These are static counts, not
measurements; how fast a GPU runs them is for
``scripts/gpu_check.py``.

Needs libNVVM and ptxas (a CUDA toolkit: ``$CUDA_HOME`` or ``/usr/local/cuda``) and nvdisasm (the toolkit or
``pip install nvidia-cuda-nvdisasm``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESETS = {"hopper": 32, "ada": 16}  # nfma of the shipped early-accumulator presets
OFFSET_KERNELS = {"offset_powers": "", "offset": "/add-max"}  # the offset kernels and their keys' suffix (--json)


def parse_cc(text):
    """``"9.0"`` -> (9, 0); ``"9.0a"`` -> (9, 0, "a") (an architecture-specific target)."""
    major, minor = text.strip().split(".")
    suffix = minor.lstrip("0123456789")
    return (int(major), int(minor[:len(minor) - len(suffix)])) + ((suffix,) if suffix else ())


def sm_name(cc):
    return "sm_{}{}{}".format(cc[0], cc[1], cc[2] if len(cc) > 2 else "")


def signatures(names):
    """``{name: (kernel, argument types)}``: :func:`mmaemu.cuda.dispatch.launch.signatures`, plus the native kernels of
    every instruction that one of ``names`` belongs to."""
    from mmaemu.cuda.dispatch import launch
    from mmaemu.cuda.native import kernel as native_kernel

    found = dict(launch.signatures())
    for instruction in native_kernel.INSTRUCTIONS:
        if any(name.startswith(instruction + "_") for name in names):
            found.update(launch.native_signatures(instruction))
    return found


def assemble(kernel, signature, cc):
    """The kernel compiled offline for ``cc`` and assembled with its register cap (:mod:`tools.sass`)."""
    from tools import ptx_offline as offline, sass

    cap = getattr(kernel, "targetoptions", {}).get("max_registers")
    return sass.assemble(offline.compile_ptx(kernel, signature, cc), sm_name(cc), cap)


def block_loop_costs(assembly):
    """``{preset: BlockLoopCost}`` of an offset kernel's block loop for each preset of :data:`PRESETS`."""
    from mmaemu.cuda.offset import kernel as offset_kernel
    from tools import sass

    return {preset: sass.block_loop_cost(assembly.sass, offset_kernel.block_loop_trips(nfma),
                                         offset_kernel.products_per_stage()) for preset, nfma in PRESETS.items()}


def report(names, cc):
    """Lines of the report for one compute capability."""
    from tools import sass

    sm = sm_name(cc)
    lines = []
    kernels = signatures(names)
    for name in names:
        assembly = assemble(*kernels[name], cc)
        lines += [f"## {name} ({sm}): {assembly.registers} registers, {assembly.spill_stores} bytes spill stores, "
                  f"{assembly.spill_loads} bytes spill loads, {assembly.stack_bytes} bytes stack frame", "",
                  "| loop | instructions | most frequent opcodes |", "|---|---:|---|"]
        for loop in sorted(sass.loops(assembly.sass), key=lambda loop: loop.size):
            mix = ", ".join(f"{op} {n}" for op, n in loop.opcodes().most_common(8))
            lines.append(f"| {loop.start:#07x}-{loop.end:#07x} | {loop.size} | {mix} |")
        lines.append("")
        if name in OFFSET_KERNELS:
            lines += ["| preset | per product | " + " | ".join(sass.BlockLoopCost.PART_NAMES) + " |",
                      "|---|---:|" + "---:|" * len(sass.BlockLoopCost.PART_NAMES)]
            for preset, cost in block_loop_costs(assembly).items():
                parts = " | ".join(f"{v:.3f}" for v in cost.parts().values())
                lines.append(f"| {preset} | **{cost.per_product:.3f}** | {parts} |")
            lines.append("")
    return lines


def offset_costs(cc):
    """``{"registers", "spills", "per_product": {preset: float}, "parts": {preset: {part: float}}}`` of the offset
    kernels for one compute capability (what ``--json`` prints, and ``scripts/gpu_check.py`` reads): presets as
    ``hopper``, ``ada`` for E4M3 x E4M3 (power sums) and ``hopper/add-max``, ``ada/add-max`` for the other pairs;
    registers and spills of the kernel that uses more."""
    from mmaemu.cuda.dispatch import launch

    report = {"registers": 0, "spills": 0, "per_product": {}, "parts": {}}
    for name, suffix in OFFSET_KERNELS.items():
        assembly = assemble(*launch.signatures()[name], cc)
        report["registers"] = max(report["registers"], assembly.registers)
        report["spills"] = max(report["spills"], assembly.spills)
        for preset, cost in block_loop_costs(assembly).items():
            report["per_product"][preset + suffix] = round(cost.per_product, 4)
            report["parts"][preset + suffix] = {k: round(v, 4) for k, v in cost.parts().items()}
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="offset_powers,offset", help="names of "
                        "mmaemu.cuda.dispatch.launch.signatures() "
                        "or .native_signatures(instruction)")
    parser.add_argument("--cc", default="9.0,8.9,12.0", help="compute capabilities, e.g. 9.0,8.9 (9.0a: sm_90a)")
    parser.add_argument("--json", action="store_true", help="print the offset kernels' block loop costs as JSON")
    args = parser.parse_args(argv)
    if args.json:
        import json

        print(json.dumps({sm_name(cc): offset_costs(cc) for cc in map(parse_cc, args.cc.split(","))}))
        return
    import numba

    print(f"# SASS of mmaemu kernels (numba {numba.__version__}, "
          f"{'built-in CUDA target' if not _numba_cuda() else 'numba-cuda ' + _numba_cuda()})\n")
    for text in args.cc.split(","):
        print("\n".join(report(args.kernels.split(","), parse_cc(text))))


def _numba_cuda():
    try:
        from importlib.metadata import version

        return version("numba-cuda")
    except Exception:
        return None


if __name__ == "__main__":
    main()
