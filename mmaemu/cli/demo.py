"""``mmaemu demo``: the results of :func:`mmaemu.cli.demo_run.run_demo` (an FP8 GEMM of the Evo 2 1B projection shape
under hopper and ada, or the profiles named with ``--profile``, compared with IEEE accumulation) as text or JSON."""

from __future__ import annotations

from typing import List

import click

from .output import emit, json_option


def _intro(result: dict) -> List[str]:
    s, inp = result["shape"], result["inputs"]
    return [
        f"mmaemu demo: an FP8 GEMM of the Evo 2 1B projection shape M={s['M']}, N={s['N']}, K={s['K']}"
        + (" (--quick: smaller N)" if result["quick"] else ""),
        f"inputs: activations {inp['activations']}, weights {inp['weights']} (seed {result['seed']}), quantised to "
        f"E4M3 with per-tensor amax scaling to 448 as Transformer Engine does (scale_inv {inp['scale_inv_a']:.6g} "
        f"and {inp['scale_inv_b']:.6g})",
        "call: mmaemu.scaled_mm(x, w.t(), scale_inv_x, scale_inv_w, out_dtype=torch.bfloat16, use_fast_accum=True,"
        " splitk='auto')",
        result["reference"] + ".",
        "",
    ]


def _profile_line(name: str, r: dict, width: int, n_out: int) -> str:
    split = r["split"]
    split_text = f"S={split['S']} ({split['source']})" if split else "no split decision"
    if r.get("splitk_stated"):
        split_text += " stated by the demo: no split-K table for this profile"
    platform = r["gpu"] or f"preset {r['preset']} ({r.get('maturity')}, no recorded GPU)"
    d = r["vs_ieee"]
    return (f"{name:<{width}}  {platform}: split-K {split_text}; {d['differ']:,} of {n_out:,} outputs "
            f"({100 * d['differ'] / n_out:.2f}%) differ from the IEEE reference; max abs diff {_abs(d)}; "
            f"{r['seconds']:.2f} s"
            + (" (first call: includes Numba compilation or cache loading)" if r["first_call"] else ""))


def _abs(d: dict) -> str:
    return f"{d['max_abs_diff']:.6g} ({100 * d['max_abs_diff_of_largest']:.2g}% of the largest |output|)"


def _between_line(b: dict, n_out: int) -> str:
    return (f"{b['profiles'][0]} vs {b['profiles'][1]}: {b['differ']:,} of {n_out:,} outputs "
            f"({100 * b['differ'] / n_out:.2f}%) differ; max abs diff {_abs(b)}")


_READING = [
    "",
    "These differences are the point, not a failure: each GPU truncates and orders its sums its own way, so its",
    "bits differ from IEEE and from the other GPU's by about a bf16 rounding step of the larger outputs, and mmaemu",
    "returns each GPU's own bits. (Relative to each output the difference can exceed 100 % at outputs near zero,",
    "where such a step is large against the value; --json reports it as max_rel_diff.)",
    "",
    "Next: compute your own GEMMs with mmaemu.scaled_mm (README, 'A first GEMM'); `python -m mmaemu explain M N K`",
    "shows what the reference GPU decides for your shape; docs/guide.md covers models (mmaemu.nn) and testing.",
]


def format_demo(result: dict) -> str:
    """The text form of a :func:`~mmaemu.cli.demo_run.run_demo` result."""
    n_out = result["outputs"]
    width = max(len(name) for name in result["profiles"])
    lines = _intro(result) + [_profile_line(name, r, width, n_out) for name, r in result["profiles"].items()]
    for comparison in result.get("versus_first") or ([result["between"]] if result["between"] else []):
        lines.append(_between_line(comparison, n_out))
    return "\n".join(lines + _READING)


@click.command(short_help="FP8 GEMM of the Evo 2 1B shape: hopper vs ada vs IEEE.")
@click.option("--quick", is_flag=True, help="Smaller N (for tests).")
@click.option("--profile", "profiles", metavar="NAME", multiple=True,
              help="A profile to compare (repeat it; default: hopper and ada), e.g. --profile hopper "
                   "--profile tcgen05-f8f6f4-experimental for the H100 next to a B200's tensor cores.")
@json_option("Also write the results as JSON to PATH; '-' prints only the JSON.")
def demo(quick, profiles, json_path):
    """An FP8 GEMM of the Evo 2 1B projection shape under hopper and ada (or the --profile names), compared with
    IEEE accumulation."""
    from .demo_run import run_demo
    from ..platform import get_profile

    for name in profiles:
        try:
            get_profile(name)
        except KeyError as error:
            raise click.BadParameter(error.args[0], param_hint="--profile") from None
    emit(run_demo(quick=quick, profiles=profiles or ("hopper", "ada")), json_path, format_demo)
