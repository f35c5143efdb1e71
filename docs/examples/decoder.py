"""A Llama-architecture decoder of about 135 M parameters with every projection of its layers an FP8 GEMM, each FP8
recipe in turn, timed against the same model run natively in float32.

The model is built from a ``transformers`` configuration with random weights (no download): SmolLM-135M's shape,
30 layers, d_model 576, 9 query and 3 key/value heads, d_ff 1536, a vocabulary of 49,152 tied to the embedding.
The projections of every layer (q, k, v, o, gate, up, down: 210 linear layers) are converted with
``mmaemu.nn.convert_linears``; the LM head, attention, RMSNorm and SiLU stay native float32. Each run is a prefill
of 64 tokens (one forward with M = 64 rows per GEMM) and a greedy decoding of 8 tokens with the key/value cache
(M = 1 per GEMM), and prints per recipe the time of both against the native model, and whether its greedy tokens
are the native model's.

Recipes: ``tensorwise`` (``profile="hopper"``), ``rowwise`` (torch's row-wise scaled_mm on ``hopper``),
``blockwise`` (DeepGEMM), ``mxfp8`` and ``nvfp4`` (torchao's casts on ``b200-mx-experimental``). Most K here are 576
and 1536, below the H100's recorded split-K evidence, so the tensor-wise and row-wise layers take
``splitk="assume-unsplit"`` (S = 1 where the evidence does not decide; AssumedUnsplitWarning, silenced here). The
experimental recipes (mxfp8, nvfp4) say so once, when their layers are built.

Run:  python docs/examples/decoder.py                              (30 layers, every recipe: minutes)
      python docs/examples/decoder.py --layers 2 --prefill 8 --decode 2 --recipes tensorwise,mxfp8   (seconds)
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from typing import NamedTuple

import torch

import mmaemu
from mmaemu.nn import convert_linears

RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")
# The options of each recipe's layers (mmaemu.nn.EmulatedFP8Linear.from_linear, mmaemu.nn_recipes).
RECIPE_OPTIONS = {
    "tensorwise": dict(profile="hopper", splitk="assume-unsplit"),
    "rowwise": dict(profile="hopper", splitk="assume-unsplit"),
    "blockwise": dict(),
    "mxfp8": dict(),
    "nvfp4": dict(),
}


def build_model(layers: int, seed: int = 0):
    """SmolLM-135M's architecture with ``layers`` layers and random weights, float32, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def in_layers(name, linear) -> bool:
    """The projections of the decoder layers (the LM head stays native)."""
    return name.startswith("model.layers.")


class RunTimes(NamedTuple):
    prefill_s: float
    decode_s_per_token: float
    tokens: list


def generate(model, prompt, decode: int) -> RunTimes:
    """Prefill ``prompt`` [1, T], then ``decode`` greedy tokens with the key/value cache; wall times."""
    with torch.no_grad():
        start = time.perf_counter()
        out = model(prompt, use_cache=True)
        prefill = time.perf_counter() - start
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        tokens = [int(token)]
        start = time.perf_counter()
        for _ in range(decode - 1):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            tokens.append(int(token))
        per_token = (time.perf_counter() - start) / max(1, decode - 1)
    return RunTimes(prefill, per_token, tokens)


def best_runs(models, prompt, decode: int, repeats: int) -> list:
    """Per model, the fastest prefill and decoding of ``repeats`` runs after a warm-up run (compiled kernels
    loaded, weights prepared), with the tokens of the last run. The models' runs alternate, so that each sees the
    same moments of a shared machine."""
    for model in models:
        generate(model, prompt, decode)
    runs = [[] for _ in models]
    for _ in range(repeats):
        for model, own in zip(models, runs):
            own.append(generate(model, prompt, decode))
    return [RunTimes(min(r.prefill_s for r in own), min(r.decode_s_per_token for r in own), own[-1].tokens)
            for own in runs]


def emulated(model, recipe: str):
    """A copy of ``model`` whose layer projections are FP8 layers of ``recipe``."""
    return convert_linears(copy.deepcopy(model), include=in_layers, recipe=recipe, **RECIPE_OPTIONS[recipe])


def compare(layers: int, prefill: int, decode: int, recipes, repeats: int, seed: int = 0):
    """Rows (recipe, emulated RunTimes, native RunTimes) for every recipe, the native runs alternating with the
    emulated ones (:func:`best_runs`)."""
    model = build_model(layers, seed)
    prompt = torch.randint(0, model.config.vocab_size, (1, prefill), generator=torch.Generator().manual_seed(seed))
    rows = []
    for recipe in recipes:
        fp8 = emulated(model, recipe)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mmaemu.AssumedUnsplitWarning)
            warnings.filterwarnings("ignore", "`past_key_values` is deprecated", FutureWarning)  # transformers 5
            rows.append((recipe, *best_runs((fp8, model), prompt, decode, repeats)))
    return rows


def report(rows, layers: int, prefill: int, decode: int) -> str:
    lines = [f"Llama-architecture decoder, {layers} layers (SmolLM-135M shape, random weights), prefill {prefill} "
             f"tokens, greedy decoding {decode}; native = the same model in float32",
             "| recipe | prefill s | native s | ratio | decode ms/token | native ms | ratio | tokens as native |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for recipe, fp8, native in rows:
        lines.append(f"| {recipe} | {fp8.prefill_s:.3f} | {native.prefill_s:.3f} | "
                     f"{fp8.prefill_s / native.prefill_s:.2f} | {fp8.decode_s_per_token * 1e3:.1f} | "
                     f"{native.decode_s_per_token * 1e3:.1f} | "
                     f"{fp8.decode_s_per_token / native.decode_s_per_token:.2f} | {fp8.tokens == native.tokens} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--prefill", type=int, default=64)
    parser.add_argument("--decode", type=int, default=8)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = sorted(set(recipes) - set(RECIPES))
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; expected some of {', '.join(RECIPES)}")
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        raise SystemExit(f"{error}: python -m pip install transformers")
    rows = compare(args.layers, args.prefill, args.decode, recipes, args.repeats)
    print(report(rows, args.layers, args.prefill, args.decode))


if __name__ == "__main__":
    main()
