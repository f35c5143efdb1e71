"""A tiny transformer language model whose projections run as FP8 GEMMs, as an H100 and an RTX 4060 compute them.

The model is built here from a seed (no download): token embedding, pre-LayerNorm blocks with causal
self-attention and a GELU MLP, a final LayerNorm and an LM head. The same weights run four ways:

* ``fp32``        - plain torch, everything in float32;
* ``bf16``        - plain torch, everything in bfloat16;
* ``fp8-hopper``  - every nn.Linear replaced by ``mmaemu.nn.EmulatedFP8Linear`` (E4M3 weights and inputs,
                    per-tensor scaling as Transformer Engine does, bf16 GEMM output), ``profile="hopper"``;
* ``fp8-ada``     - the same with ``profile="ada"``.

Only the projections are FP8; attention scores, softmax, LayerNorm, GELU and the residual stream stay in float32
in the FP8 variants, so every difference between ``fp8-hopper`` and ``fp8-ada`` comes from the tensor-core
accumulation (32- versus 16-product blocks, and the split-K decisions of each GPU's cuBLASLt).

Shapes: the sequence has 30 tokens (14 with --short); like Evo 2's vortex, each FP8 projection pads M to a
multiple of 16, so the GEMMs are M = 32 (16) by N x K with N, K in {512, 1024, 4096}. These keys are all in the
recorded split-K tables of both profiles (printed below), so ``splitk="auto"`` decides from evidence.

Run:  python docs/examples/tiny_lm.py            (2 layers, d_model 1024, d_ff 4096, vocab 512; about a minute)
      python docs/examples/tiny_lm.py --short    (1 layer, d_ff 1024, 14 tokens; seconds)
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
import torch.nn.functional as F

import mmaemu
from mmaemu.nn import EmulatedFP8Linear, convert_linears

FULL = dict(layers=2, d_model=1024, heads=8, d_ff=4096, vocab=512, tokens=30)
SHORT = dict(layers=1, d_model=1024, heads=8, d_ff=1024, vocab=512, tokens=14)
PROFILES = ("hopper", "ada")
PAD_M_TO = 16


class Block(torch.nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.q = torch.nn.Linear(d_model, d_model)
        self.k = torch.nn.Linear(d_model, d_model)
        self.v = torch.nn.Linear(d_model, d_model)
        self.o = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc1 = torch.nn.Linear(d_model, d_ff)
        self.fc2 = torch.nn.Linear(d_ff, d_model)

    def forward(self, x):
        # x: [tokens, d_model] in the activation dtype. Linear outputs are brought back to it: the FP8 layers
        # return bfloat16, which the float32 residual stream of the FP8 variants takes as exact values.
        dtype = x.dtype
        T, D = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).to(dtype).reshape(T, self.heads, D // self.heads).transpose(0, 1)
                   for proj in (self.q, self.k, self.v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attention.transpose(0, 1).reshape(T, D)).to(dtype)
        h = self.ln2(x)
        return x + self.fc2(F.gelu(self.fc1(h).to(dtype))).to(dtype)


class TinyLM(torch.nn.Module):
    def __init__(self, layers, d_model, heads, d_ff, vocab, **_):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads, d_ff) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens, dtype=torch.float32):
        """(hidden state after each block, logits), all as float32 tensors for comparison."""
        x = self.embed(tokens).to(dtype)
        hidden = []
        for block in self.blocks:
            x = block(x)
            hidden.append(x.float())
        return hidden, self.head(self.ln_f(x)).float()


def build(config, seed=0):
    torch.manual_seed(seed)
    model = TinyLM(**config)
    with torch.no_grad():  # LayerNorms with some spread, so that the activations are not all alike
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
    tokens = torch.randint(0, config["vocab"], (config["tokens"],), generator=torch.Generator().manual_seed(seed))
    return model.eval(), tokens


def fp8_variant(model, profile):
    # TE-style FP8 projections: weights quantised once (448 / amax), inputs per call (current scaling), fast
    # accumulation (TE's forward GEMM), bf16 output, bias added after the GEMM, M padded to a multiple of 16.
    return convert_linears(copy.deepcopy(model), profile=profile, pad_m_to=PAD_M_TO, out_dtype=torch.bfloat16)


def split_decisions(variants, config):
    """{(M, N, K): {profile: "S=1 none (table)"}} of every FP8 projection, asked without computing."""
    rows = {}
    tokens = config["tokens"]
    for profile in PROFILES:
        for module in variants[f"fp8-{profile}"].modules():
            if isinstance(module, EmulatedFP8Linear):
                plan = module.explain(torch.zeros(tokens, module.in_features))
                M = -(-tokens // PAD_M_TO) * PAD_M_TO
                key = (M, module.out_features, module.in_features)
                if plan.split is None:
                    text = f"cannot decide: {plan.validation[0]}"
                else:
                    text = f"S={plan.split.S} {plan.split.scheme} ({plan.split.source})"
                rows.setdefault(key, {})[profile] = text
    return rows


def differing(a, b):
    """Number of elements whose float32 bit patterns differ."""
    return int((mmaemu.testing.bits(a) != mmaemu.testing.bits(b)).sum())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="1 layer, d_ff 1024, 14 tokens (CI)")
    args = parser.parse_args(argv)
    config = SHORT if args.short else FULL
    model, tokens = build(config)
    M = -(-config["tokens"] // PAD_M_TO) * PAD_M_TO
    print(f"tiny LM: {config['layers']} layer(s), d_model {config['d_model']}, {config['heads']} heads, "
          f"d_ff {config['d_ff']}, vocab {config['vocab']}; {config['tokens']} tokens "
          f"(the FP8 GEMMs see M = {M} after padding to a multiple of {PAD_M_TO})")

    variants = {"fp32": model, "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    for profile in PROFILES:
        variants[f"fp8-{profile}"] = fp8_variant(model, profile)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8-hopper": torch.float32, "fp8-ada": torch.float32}

    print("\nsplit-K decisions of the FP8 projections (M x N x K):")
    for (m, n, k), by_profile in sorted(split_decisions(variants, config).items()):
        print(f"  {m:>3} x {n:>4} x {k:>4}   " + "   ".join(f"{p}: {t}" for p, t in by_profile.items()))

    results, seconds = {}, {}
    with torch.inference_mode():
        for name, variant in variants.items():
            start = time.perf_counter()
            results[name] = variant(tokens, dtypes[name])
            seconds[name] = time.perf_counter() - start
    print("\ntimings: " + ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
          + "  (FP8 variants: mmaemu's CPU engine; the first run in a fresh cache also compiles it)")

    reference_hidden, reference_logits = results["fp32"]
    header = f"{'':>14}" + "".join(f"{name:>13}" for name in ("bf16", "fp8-hopper", "fp8-ada"))
    print("\nmax |difference| from fp32, and fp8-hopper vs fp8-ada:")
    print(header + "   hopper vs ada")
    for i in range(config["layers"] + 1):
        label = f"block {i} out" if i < config["layers"] else "final logits"
        pick = (lambda r: r[0][i]) if i < config["layers"] else (lambda r: r[1])
        ref = pick(results["fp32"])
        cells = "".join(f"{(pick(results[name]) - ref).abs().max().item():>13.3e}"
                        for name in ("bf16", "fp8-hopper", "fp8-ada"))
        hopper, ada = pick(results["fp8-hopper"]), pick(results["fp8-ada"])
        gap = f"{(hopper - ada).abs().max().item():.3e} ({differing(hopper, ada)} of {hopper.numel()} differ)"
        print(f"{label:>14}{cells}   {gap}")

    targets = tokens[1:]
    print("\nnext-token cross-entropy on the sequence (random weights, so near log(vocab) = "
          f"{math.log(config['vocab']):.4f}) and argmax agreement with fp32:")
    for name, (_, logits) in results.items():
        loss = F.cross_entropy(logits[:-1], targets).item()
        agree = (logits.argmax(-1) == reference_logits.argmax(-1)).float().mean().item()
        print(f"  {name:<11} loss {loss:.6f}   argmax agreement {agree:.0%}")
    same = differing(results["fp8-hopper"][1], results["fp8-ada"][1]) == 0
    print("\nfp8-hopper and fp8-ada logits are " + ("bit-identical" if same else "NOT bit-identical")
          + ": the same FP8 model gives different bits on the two GPUs.")
    return results


if __name__ == "__main__":
    main()
