"""Train a tiny transformer in FP8 four ways on the CPU and plot the loss curves (docs/training.md).

The model (built here from a seed, no download) is a small causal language model: token and position embeddings,
pre-LayerNorm blocks with causal self-attention and a GELU MLP, a final LayerNorm and an LM head. The data is
synthetic: each sequence follows a fixed random successor table (token t is followed by ``table[t]`` with
probability 0.9, by a uniformly drawn token otherwise), so the loss can fall from ln(vocab) towards the noise
floor. Every way starts from the same weights and sees the same batches; the optimiser is AdamW. The ways' steps are
interleaved, so that the load of a shared machine weighs on each alike in the times per step.

The four ways:

* ``hopper`` - torchao 0.18.0's float8 training (recipe "tensorwise": ``convert_to_float8_training``), every
  ``torch._scaled_mm`` of the step (3 per linear layer: output, grad_input, grad_weight) computed by
  ``mmaemu.patch(profile="hopper")``: an H100's bits;
* ``ada``    - the same under ``mmaemu.patch(profile="ada")``: an RTX 4060's bits;
* ``cpu-fp8`` - the same torchao model without the patch: torch's own CPU ``_scaled_mm`` (not any GPU's bits);
* ``bf16``   - the plain model (``nn.Linear``) under ``torch.autocast("cpu", dtype=torch.bfloat16)``.

A fifth run, the plain model in fp32, is timed as a reference (not plotted): on a CPU without AVX-512 torch's bf16
GEMMs are slower than its fp32 ones, which would flatter a comparison with bf16 alone.

The model's dimensions are small, so most of its GEMM shapes are outside the recorded split-K evidence; the
example patches with ``splitk="assume-unsplit"`` (S = 1 where the evidence does not decide, with an
AssumedUnsplitWarning, shown once). ``mmaemu.audit_training.audit_step`` lists the evidence of every GEMM.

Run:  python docs/examples/train_tiny.py                      (200 steps; minutes on two idle cores)
      python docs/examples/train_tiny.py --steps 3 --no-plot  (seconds: what the test runs)
      python docs/examples/train_tiny.py --png docs/training_loss.png
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

import mmaemu

CONFIG = dict(layers=2, d_model=64, heads=4, d_ff=128, vocab=64, seq=32, batch=8, lr=3e-3, seed=0)
WAYS = ("hopper", "ada", "cpu-fp8", "bf16")
TIMING_REFERENCE = "fp32"  # the plain model in fp32: timed too (torch's CPU bf16 GEMMs are slow without AVX-512)


class Block(torch.nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc1 = torch.nn.Linear(d_model, d_ff)
        self.fc2 = torch.nn.Linear(d_ff, d_model)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, layers, d_model, heads, d_ff, vocab, seq, **_):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.position = torch.nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads, d_ff) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batches(steps, vocab, seq, batch, seed, **_):
    """The synthetic batches: [batch, seq + 1] token sequences following a random successor table."""
    generator = torch.Generator().manual_seed(seed + 1)
    table = torch.randperm(vocab, generator=generator)
    for _ in range(steps):
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (batch,), generator=generator)
        for t in range(seq):
            noise = torch.rand(batch, generator=generator) < 0.1
            drawn = torch.randint(vocab, (batch,), generator=generator)
            tokens[:, t + 1] = torch.where(noise, drawn, table[tokens[:, t]])
        yield tokens


def fp8_model(model):
    """The model with its linear layers converted by torchao's float8 training (recipe "tensorwise")."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(copy.deepcopy(model), config=Float8LinearConfig.from_recipe_name("tensorwise"))


def step_context(way):
    """What a step of ``way`` runs inside."""
    if way in ("hopper", "ada"):
        return mmaemu.patch(profile=way, splitk="assume-unsplit")
    if way == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)  # cpu-fp8 and fp32: torch's own kernels


class Run:
    """One way's model, optimiser and record: the loss, seconds and parameters after each step."""

    def __init__(self, way, base, lr):
        self.way = way
        self.model = copy.deepcopy(base) if way in ("bf16", TIMING_REFERENCE) else fp8_model(base)
        self.optimiser = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.losses, self.seconds, self.snapshots = [], [], []

    def step(self, tokens):
        start = time.perf_counter()
        with step_context(self.way):
            logits = self.model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            self.optimiser.zero_grad(set_to_none=True)
            loss.backward()
        self.optimiser.step()
        self.seconds.append(time.perf_counter() - start)
        self.losses.append(loss.item())
        self.snapshots.append(torch.cat([p.detach().reshape(-1).clone() for p in self.model.parameters()]))


def train(base, data, lr):
    """The four runs, their steps interleaved (step 1 of every way, then step 2, ...): a varying machine load
    then weighs on every way alike."""
    runs = [Run(way, base, lr) for way in WAYS + (TIMING_REFERENCE,)]
    for tokens in data:
        for run in runs:
            run.step(tokens)
    return {run.way: run for run in runs}


def first_difference(left, right):
    """The first step (1-based) after which two runs' parameters differ in some bit, else None."""
    for step, (a, b) in enumerate(zip(left, right), 1):
        if not torch.equal(a.view(torch.int32), b.view(torch.int32)):
            return step
    return None


def plot(losses, path, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (axes, below) = plt.subplots(2, 1, figsize=(6.4, 5.2), dpi=100, sharex=True,
                                         gridspec_kw=dict(height_ratios=(3, 2)))
    steps_axis = range(1, steps + 1)
    for way, styles in zip(WAYS, ("-", "--", ":", "-.")):
        axes.plot(steps_axis, losses[way], styles, label=way, linewidth=1.2)
        if way != "hopper":
            below.plot(steps_axis, [x - h for x, h in zip(losses[way], losses["hopper"])], styles, linewidth=1.0,
                       label=way, color=axes.lines[-1].get_color())
    axes.set_ylabel("cross-entropy loss")
    axes.set_title("tiny transformer, torchao float8 tensorwise vs bf16")
    axes.legend()
    below.axhline(0.0, color="black", linewidth=0.6)
    below.set_xlabel("step")
    below.set_ylabel("loss - hopper's loss")
    below.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    print(f"loss curves written to {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--png", default="training_loss.png", help="where the loss curves go")
    parser.add_argument("--no-plot", action="store_true", help="skip the picture (no matplotlib needed)")
    args = parser.parse_args(argv)
    torch.manual_seed(CONFIG["seed"])
    base = TinyLM(**CONFIG)
    data = list(batches(args.steps, **CONFIG))
    print(f"model: {CONFIG}; {sum(p.numel() for p in base.parameters())} parameters; "
          f"{CONFIG['batch'] * CONFIG['seq']} tokens per step; {args.steps} steps; "
          f"{torch.get_num_threads()} torch threads")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", mmaemu.AssumedUnsplitWarning)
        runs = train(base, data, CONFIG["lr"])
    losses = {way: run.losses for way, run in runs.items()}
    snapshots = {way: run.snapshots for way, run in runs.items()}
    per_step = {way: statistics.median(run.seconds[1:] or run.seconds) for way, run in runs.items()}  # step 1
    for way in WAYS + (TIMING_REFERENCE,):  # (the first step compiles mmaemu's kernels) is left out of the median
        print(f"  {way:8s} loss {losses[way][0]:.4f} -> {losses[way][-1]:.4f}  "
              f"median {per_step[way] * 1e3:.1f} ms per step")
    assumed = {str(w.message).split(": ", 1)[1].split(":", 1)[0] for w in seen
               if issubclass(w.category, mmaemu.AssumedUnsplitWarning)}
    print(f"{len(assumed)} GEMM shapes computed with S = 1 assumed (outside the recorded split-K evidence; "
          "mmaemu.audit_training lists them)")
    for warning in seen:  # any other warning, as Python would have shown it
        if not issubclass(warning.category, mmaemu.AssumedUnsplitWarning):
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    for way in WAYS[:3]:
        print(f"{way} time per step: {per_step[way] / per_step['bf16']:.1f}x bf16, "
              f"{per_step[way] / per_step[TIMING_REFERENCE]:.1f}x fp32")
    differ = first_difference(snapshots["hopper"], snapshots["ada"])
    print("hopper vs ada: weights first differ after step", differ if differ else "never (within the run)")
    differ_cpu = first_difference(snapshots["hopper"], snapshots["cpu-fp8"])
    print("hopper vs cpu-fp8: weights first differ after step", differ_cpu if differ_cpu else "never")
    final = {way: losses[way][-1] for way in WAYS}
    print("final losses: " + ", ".join(f"{way} {value:.4f}" for way, value in final.items()))
    assert all(math.isfinite(value) for value in final.values())
    if not args.no_plot:
        plot(losses, args.png, args.steps)


if __name__ == "__main__":
    main()
