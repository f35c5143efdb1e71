"""The examples in docs/examples run (short mode) and print what they promise."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"


def run_example(name, *args, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == ["check_my_kernel.py", "tiny_lm.py"]


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
def test_check_my_kernel_short(tmp_path):
    golden = tmp_path / "golden.pt"
    out = run_example("check_my_kernel.py", "--short", "--golden", str(golden))
    assert golden.exists()
    assert "FAIL naive fp32 kernel vs hopper" in out and "bit patterns differ at" in out and "value=" in out
    assert "PASS  block kernel (32-product blocks) vs hopper" in out
    assert "PASS  block kernel (16-product blocks) vs ada" in out
    assert "FAIL  block kernel (16-product blocks) vs hopper" in out
