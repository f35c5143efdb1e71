"""The command line (platform.md section 7): ``python -m mmaemu {info, selftest, explain, demo}``.

Golden files live in ``tests/golden/``; regenerate them with ``MMAEMU_UPDATE_GOLDEN=1 python -m pytest
tests/test_cli.py`` after an intended change (and review the diff).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from mmaemu import cli, environment
from mmaemu.base import device_facts
from mmaemu.cli import diagnostics

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
REPO = pathlib.Path(__file__).resolve().parents[1]
UPDATE = os.environ.get("MMAEMU_UPDATE_GOLDEN") == "1"
HAS_CUDA = torch.cuda.is_available()
EXPLAIN_EVO2 = ["explain", "64", "5760", "1920", "--out", "bf16", "--fast", "--device", "cpu"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No MMAEMU_* setting of the caller leaks into the commands (the cache location is kept)."""
    for name in list(os.environ):
        if name.startswith("MMAEMU_") and name not in ("MMAEMU_CACHE_DIR", "MMAEMU_UPDATE_GOLDEN"):
            monkeypatch.delenv(name)


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli.cli, list(args), catch_exceptions=False, **kwargs)


def check_golden(name: str, text: str):
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path} (run with MMAEMU_UPDATE_GOLDEN=1 to create it)"
    assert text == path.read_text(encoding="utf-8"), f"output differs from {path}"


# ----------------------------------------------------------------------------------------------------------------
# info


def normalise_info(report: dict) -> dict:
    """The stable part of an info report: no paths, versions, environment, device or backend state."""
    profiles = [{k: v for k, v in p.items() if k not in ("match", "match_note")} for p in report["profiles"]]
    return {"format": report["format"], "profiles": profiles, "presets": report["presets"],
            "splitk_tables": report["splitk_tables"]}


def test_info_json_golden():
    result = invoke("info", "--json", "-")
    assert result.exit_code == 0
    report = json.loads(result.stdout)  # nothing but the JSON report on stdout
    assert report["format"] == "mmaemu-info/1"
    assert report["mmaemu"]["version"] == "0.1.0"
    assert pathlib.Path(report["mmaemu"]["location"]) == REPO / "mmaemu" or "site-packages" in \
        report["mmaemu"]["location"]
    assert set(report["versions"]) >= {"python", "torch", "numba", "numpy"}
    assert report["environment"] == {k: v for k, v in os.environ.items() if k in environment.NAMES}
    assert [p["name"] for p in report["profiles"]] == [
        "ada", "ada-te", "ada-ws0", "hopper", "hopper-te", "hopper-ws0", "hopper-experimental",
        "b200-mma-sync-experimental", "tcgen05-f8f6f4-experimental", "sm120-mma-sync-experimental",
        "b200-mx-experimental", "hopper-cublaslt-blockwise-experimental"]
    for p in report["profiles"]:
        assert p["match"] in (True, False, None)
        if p["gpu"] is None:
            assert p["match"] is None  # no reference GPU: match unknown
    check_golden("info.json", json.dumps(normalise_info(report), indent=2, sort_keys=True) + "\n")


def test_info_text_sections():
    result = invoke("info")
    assert result.exit_code == 0
    out = result.stdout
    assert re.match(r"mmaemu 0\.1\.0 \(.+\)\n", out)
    assert re.search(r"^python \S+, torch \S+, numba \S+", out, re.M)
    for section in ("Environment:", "Device:", "Profiles:", "Presets:", "Backends:", "Split-K tables:",
                    "Numba cache:", "Unavailable components:"):
        assert f"\n{section}\n" in out
    if not HAS_CUDA:
        assert "  none: no CUDA device visible to torch" in out
        assert "does not match this device" in out
    hopper = next(line for line in out.splitlines() if line.startswith("  hopper "))
    for part in ("preset hopper", "GPU NVIDIA H100 PCIe", "SMs 114", "cuBLASLt 12.8.3.14", "caller torch._scaled_mm",
                 "workspace 1 MiB", "table heur_h100pcie_lt12.8.3.14", "maturity validated",
                 "split-K maturity validated"):
        assert part in hopper
    assert re.search(r"^  b200-mma-sync-experimental .*match unknown \(no reference GPU\)$", out, re.M)
    assert "b200_mma_sync (alias: blackwell): experimental" in out
    assert re.search(r"heur_h100pcie_lt12\.8\.3\.14 \(profiles hopper, hopper-te, hopper-ws0\): 1,767,416 rows", out)
    assert re.search(r"heur_rtx4060_lt12\.8\.3\.14\.index\.npz  [\d,]+ bytes  sha256 [0-9a-f]{16}\n", out)


def test_info_lists_environment_and_writes_json_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MMAEMU_PROFILE", "ada")
    target = tmp_path / "info.json"
    result = invoke("info", "--json", str(target))
    assert result.exit_code == 0
    assert "  MMAEMU_PROFILE=ada" in result.stdout
    assert "Profiles:" in result.stdout  # the text report is printed too
    assert json.loads(target.read_text())["environment"]["MMAEMU_PROFILE"] == "ada"


def test_info_prints_only_the_variables_mmaemu_reads_and_flags_bad_values(tmp_path, monkeypatch):
    monkeypatch.setenv("MMAEMU_SECRET_TOKEN", "hunter2-token")
    monkeypatch.setenv("MMAEMU_PROFILE", "h100-sxm")
    monkeypatch.setenv("MMAEMU_BACKEND", "tpu")
    monkeypatch.setenv("MMAEMU_SPLITK_STRICT", "1")
    target = tmp_path / "info.json"
    result = invoke("info", "--json", str(target))
    assert result.exit_code == 0
    text, report = result.stdout, json.loads(target.read_text())
    for shown in (text, target.read_text()):
        assert "hunter2" not in shown and "SECRET" not in shown
    assert "  MMAEMU_SPLITK_STRICT=1\n" in text
    assert re.search(r"^  MMAEMU_PROFILE=h100-sxm  INVALID: unknown profile 'h100-sxm'", text, re.M)
    assert re.search(r"^  MMAEMU_BACKEND=tpu  INVALID: unknown backend 'tpu'", text, re.M)
    assert "  (1 other MMAEMU_* variable is set; mmaemu does not read it)" in text
    assert set(report["environment"]) == {"MMAEMU_PROFILE", "MMAEMU_BACKEND", "MMAEMU_SPLITK_STRICT"} | (
        {"MMAEMU_CACHE_DIR"} if "MMAEMU_CACHE_DIR" in os.environ else set())
    assert set(report["environment_problems"]) == {"MMAEMU_PROFILE", "MMAEMU_BACKEND"}
    assert "raises KeyError" in report["defaults"]["profile"]
    assert "raises ValueError" in report["defaults"]["backend"]


def test_info_says_which_profile_and_backend_calls_use_by_default(monkeypatch):
    result = invoke("info")
    defaults = result.stdout.split("\nDefaults:\n")[1].split("\n\n")[0]
    assert "  profile: hopper (MMAEMU_PROFILE is not set)" in defaults
    assert "  backend: cpu for CPU tensors" in defaults
    if not HAS_CUDA:
        assert "no CUDA device visible to torch" in defaults
    monkeypatch.setenv("MMAEMU_PROFILE", "ada")
    monkeypatch.setenv("MMAEMU_BACKEND", "reference")
    defaults = invoke("info").stdout.split("\nDefaults:\n")[1].split("\n\n")[0]
    assert "  profile: ada (from MMAEMU_PROFILE)" in defaults
    assert "  backend: reference for every call with backend='auto' (from MMAEMU_BACKEND)" in defaults


def test_info_reports_a_failing_component_and_still_exits_0(monkeypatch):
    from mmaemu import backends

    def broken(device=None, *, context=None):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(backends, "backends_status", broken, raising=False)
    result = invoke("info")
    assert result.exit_code == 0
    assert "  backends: RuntimeError: probe exploded" in result.stdout


def test_info_shows_backends_status(monkeypatch):
    import dataclasses

    from mmaemu import backends

    @dataclasses.dataclass(frozen=True)
    class Status:
        name: str
        available: bool
        source: object
        validated_here: bool
        gates: list
        reason: str

    def fake(device=None, *, context=None):
        return {"cuda:h1": Status("cuda:h1", False, None, False, ["smoke"], "tensors on cpu"),
                "reference": Status("reference", True, "torch", True, [], "")}

    monkeypatch.setattr(backends, "backends_status", fake, raising=False)
    result = invoke("info", "--json", "-")
    assert result.exit_code == 0
    entries = {b["name"]: b for b in json.loads(result.stdout)["backends"]}
    assert entries["cuda:h1"]["reason"] == "tensors on cpu" and entries["reference"]["available"] is True
    text = invoke("info").stdout
    assert "  cuda:h1: unavailable: tensors on cpu [not validated here; gates smoke]" in text
    assert "  reference: available [source torch; validated here]" in text


# ----------------------------------------------------------------------------------------------------------------
# explain


def test_explain_evo2_shape_golden():
    # the cpu backend's engine depends on the CPU (AVX-512 or not): the golden output names the forced tile engine
    result = invoke(*EXPLAIN_EVO2, env={"MMAEMU_CPU_ENGINE": "tile"})
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == ("explain M=64 N=5760 K=1920 e4m3 x e4m3 -> bfloat16, use_fast_accum=True, device=cpu")
    assert "validation      ok" in lines
    split = next(line for line in lines if line.startswith("split "))
    assert "'S': 1" in split and "'source': 'table'" in split
    check_golden("explain_64_5760_1920_bf16_fast.txt", result.stdout)


def test_explain_keys_are_padded_to_16():
    lines = invoke(*EXPLAIN_EVO2).stdout.splitlines()[1:]
    keys = ["validation", "profile", "preset", "preset_maturity", "split", "backend", "fallbacks", "warnings",
            "cpu_engine", "kernel_family", "kernel_reason"]
    assert [line[:16].rstrip() for line in lines] == keys
    assert all(len(line) > 16 and line[15] == " " for line in lines if not line.startswith("backend"))


def test_explain_rejected_call_exits_1():
    result = invoke("explain", "64", "5760", "1920", "--out", "e5m2", "--fast", "--device", "cpu")
    assert result.exit_code == 1
    assert "-> float8_e5m2" in result.stdout.splitlines()[0]
    assert re.search(r"^validation      ReferenceRejectsError: .*CUBLAS_STATUS_NOT_SUPPORTED.*\[profile hopper\]$",
                     result.stdout, re.M)
    assert "\nsplit           None\n" in result.stdout


def test_explain_shape_missing_from_table_exits_1_with_ways_out():
    result = invoke("explain", "16", "256", "128", "--device", "cpu")
    assert result.exit_code == 1
    assert "-> default (input dtype), use_fast_accum=False" in result.stdout
    line = next(x for x in result.stdout.splitlines() if x.startswith("validation"))
    assert line.startswith("validation      SplitKUnknownError: cannot decide split-K for M=16, N=256, K=128")
    for way_out in ("Ways out", "splitk=1", "splitk=(S, 'contiguous')", "reference GPU"):
        assert way_out in line


def test_explain_explicit_splitk_1_exits_0():
    result = invoke("explain", "16", "256", "128", "--splitk", "1", "--device", "cpu")
    assert result.exit_code == 0
    assert "'S': 1, 'scheme': 'none', 'source': 'explicit'" in result.stdout


def test_explain_explicit_split_pair():
    result = invoke("explain", "48", "64", "5760", "--out", "fp32", "--splitk", "2,contiguous", "--device", "cpu")
    assert result.exit_code == 0
    assert "'S': 2, 'scheme': 'contiguous', 'source': 'explicit'" in result.stdout
    # a scheme the preset does not compute is the library's ValueError: the call would raise
    result = invoke("explain", "48", "64", "5760", "--out", "fp32", "--splitk", "2,serial", "--device", "cpu")
    assert result.exit_code == 1 and "validation      ValueError: " in result.stdout


@pytest.mark.parametrize("value", ["x", "2,", ",serial", "a,serial", "2,contiguous,x", "", "1.5"])
def test_explain_malformed_splitk_is_a_usage_error(value):
    result = invoke("explain", "16", "256", "128", "--splitk", value)
    assert result.exit_code == 2
    assert "--splitk" in result.output


@pytest.mark.parametrize("args", [["-1", "16", "16"], ["--", "16", "-16", "16"], ["16", "16", "x"], ["16", "16"]])
def test_explain_bad_sizes_are_usage_errors(args):
    assert invoke("explain", *args).exit_code == 2


@pytest.mark.parametrize("option", [["--device", "gpu"], ["--device", "cuda:x"], ["--out", "int8"], ["--a", "e3m4"]])
def test_explain_bad_options_are_usage_errors(option):
    assert invoke("explain", "16", "16", "16", *option).exit_code == 2


def test_explain_huge_shape_needs_no_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = invoke("explain", "65536", "65536", "65536", "--device", "cpu")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.exit_code == 0
    assert "'S': 1, 'scheme': 'none', 'source': 'envelope'" in result.stdout
    assert grown_mib < 512, f"explain grew the peak RSS by {grown_mib:.0f} MiB"


def test_large_zero_operands_are_zero_and_row_major():
    from mmaemu.cli.operands import zero_rows

    t = zero_rows(70_000, 1024, torch.float8_e4m3fn, torch.device("cpu"))
    assert t.shape == (70_000, 1024) and t.stride() == (1024, 1) and t.is_contiguous()
    assert t.dtype == torch.float8_e4m3fn and t.storage_offset() == 0 and t.data_ptr() % 16 == 0
    assert float(t[0, 0]) == 0.0 and float(t[-1, -1]) == 0.0 and float(t[35_000, 512]) == 0.0


def test_explain_json(tmp_path):
    result = invoke(*EXPLAIN_EVO2, "--json", "-")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["format"] == "mmaemu-explain/1" and report["exit_code"] == 0
    assert report["call"]["out_dtype"] == "bfloat16" and report["call"]["use_fast_accum"] is True
    assert report["plan"]["split"]["source"] == "table" and report["plan"]["validation"] == "ok"
    target = tmp_path / "plan.json"
    result = invoke("explain", "64", "5760", "1920", "--out", "e5m2", "--fast", "--device", "cpu", "--json",
                    str(target))
    assert result.exit_code == 1 and result.stdout.startswith("explain M=64")
    report = json.loads(target.read_text())
    assert report["plan"]["validation"]["error"] == "ReferenceRejectsError" and report["exit_code"] == 1


def test_explain_options_reach_the_plan():
    result = invoke("explain", "64", "5760", "1920", "--a", "e5m2", "--out", "bfloat16", "--fast", "--profile",
                    "ada", "--scale-a", "0.5", "--scale-result", "2", "--backend", "cpu", "--device", "cpu")
    assert result.exit_code == 0
    assert result.stdout.startswith("explain M=64 N=5760 K=1920 e5m2 x e4m3 -> bfloat16, use_fast_accum=True")
    assert "\nprofile         ada\n" in result.stdout and "\nbackend         cpu\n" in result.stdout


def test_explain_zero_size_and_unknown_profile():
    result = invoke("explain", "0", "16", "16", "--device", "cpu")
    assert result.exit_code == 0 and "backend         none (zero-size result)" in result.stdout
    result = invoke("explain", "16", "16", "16", "--profile", "nope", "--device", "cpu")
    assert result.exit_code == 1 and "validation      KeyError: unknown profile 'nope'" in result.stdout


def test_explain_unusable_cuda_device_exits_4(monkeypatch):
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
    result = invoke("explain", "16", "16", "16", "--device", "cuda")
    assert result.exit_code == 4
    assert "error: device cuda is unusable: CUDA disabled by MMAEMU_DISABLE_CUDA=1" in result.stdout
    result = invoke("explain", "16", "16", "16", "--splitk", "1")  # auto falls back to the CPU
    assert result.exit_code == 0 and "device=cpu" in result.stdout


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without CUDA")
def test_explain_cuda_without_cuda_exits_4():
    result = invoke("explain", "16", "16", "16", "--device", "cuda:0")
    assert result.exit_code == 4 and "no CUDA device visible to torch" in result.stdout


# ----------------------------------------------------------------------------------------------------------------
# selftest


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without CUDA")
def test_selftest_without_cuda_is_unavailable(tmp_path):
    target = tmp_path / "selftest.json"
    result = invoke("selftest", "--json", str(target))
    assert result.exit_code == 4
    assert result.stdout == "verdict: UNAVAILABLE - no CUDA device visible to torch: the CPU backend is used\n"
    report = json.loads(target.read_text())
    assert report["format"] == "mmaemu-selftest/1" and report["verdict"] == "UNAVAILABLE"


def test_selftest_with_cuda_disabled_is_unavailable(monkeypatch):
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "yes")
    result = invoke("selftest", "--kernels", "offset,simple", "--force")
    assert result.exit_code == 4
    assert result.stdout.startswith("verdict: UNAVAILABLE - CUDA disabled by MMAEMU_DISABLE_CUDA=yes")


@pytest.mark.parametrize("kernels", [",", "h1,,h4", "", "nope", "offset,nope"])
def test_selftest_malformed_kernels_is_a_usage_error(kernels):
    result = invoke("selftest", "--kernels", kernels)  # also on a machine without CUDA: checked first
    assert result.exit_code == 2 and "--kernels" in result.stderr


@pytest.mark.parametrize("command", [EXPLAIN_EVO2, ["info"], ["selftest"], ["demo", "--quick"]],
                         ids=["explain", "info", "selftest", "demo"])
def test_unwritable_json_path_is_a_one_line_usage_error(command, tmp_path):
    for target in (tmp_path / "missing-folder" / "report.json", tmp_path):
        result = invoke(*command, "--json", str(target))
        assert result.exit_code == 2
        assert result.stdout == ""  # nothing ran
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"Error: --json {target}: ")


# ----------------------------------------------------------------------------------------------------------------
# demo


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    target = tmp_path_factory.mktemp("demo") / "demo.json"
    result = CliRunner().invoke(cli.cli, ["demo", "--quick", "--json", str(target)], catch_exceptions=False)
    return result, json.loads(target.read_text())


def test_demo_quick_prints_the_counts(quick_demo):
    result, data = quick_demo
    assert result.exit_code == 0
    out = result.stdout
    assert "M=64, N=256, K=1920" in out
    assert "IEEE reference: float64 matmul of the decoded FP8 values rounded once to fp32" in out
    assert "per-tensor amax scaling to 448" in out
    for name in ("hopper", "ada"):
        assert re.search(rf"^{name} +\S.*: split-K S=1 \(table\); [\d,]+ of 16,384 outputs \([\d.]+%\) differ from "
                         r"the IEEE reference; max abs diff \S+ \([\d.e+-]+% of the largest \|output\|\); [\d.]+ s", out, re.M)
    assert "(first call: includes Numba compilation or cache loading)" in out
    assert re.search(r"^hopper vs ada: [\d,]+ of 16,384 outputs", out, re.M)
    assert out.rstrip().splitlines()[-2].startswith("Next: ")  # it ends with the next step
    assert "max_rel_diff" in out  # and says where the relative difference went, and why it is large


def test_demo_returns_plain_data(quick_demo):
    _, data = quick_demo
    assert data["shape"] == {"M": 64, "N": 256, "K": 1920} and data["outputs"] == 64 * 256
    for name in ("hopper", "ada"):
        r = data["profiles"][name]
        assert r["split"] == {"S": 1, "scheme": "none", "source": "table", "verified": True}
        assert 0 < r["vs_ieee"]["differ"] < data["outputs"]
        d = r["vs_ieee"]
        assert 0 < d["max_abs_diff_of_largest"] < 0.01 and d["max_rel_diff"] > d["max_abs_diff_of_largest"]
        assert r["seconds"] > 0
    assert data["profiles"]["hopper"]["first_call"] and not data["profiles"]["ada"]["first_call"]
    assert 0 < data["between"]["differ"] < data["outputs"]
    assert data["inputs"]["scale_inv_a"] > 0


def test_demo_reference_is_ieee_accumulation():
    """The reference of the demo: exact products summed in float64, one rounding to fp32, mmaemu's epilogue."""
    from mmaemu.cli import demo_run as demo

    g = torch.Generator().manual_seed(3)
    a, sa, _ = demo._quantise_e4m3(torch.randn(4, 32, generator=g))
    b, sb, _ = demo._quantise_e4m3(torch.randn(8, 32, generator=g))
    assert a.abs().float().max() == 448 and b.abs().float().max() == 448
    ref = demo._ieee_reference(a, b, sa, sb)
    expected = ((a.double() @ b.double().t()).float() * (sa * sb)).to(torch.bfloat16)
    assert torch.equal(ref.view(torch.int16), expected.view(torch.int16))


# ----------------------------------------------------------------------------------------------------------------
# The real entry points


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.mark.subprocess
def test_python_dash_m_smoke():
    proc = subprocess.run([sys.executable, "-m", "mmaemu", *EXPLAIN_EVO2], capture_output=True, text=True,
                          env=dict(_env(), MMAEMU_CPU_ENGINE="tile"), cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (GOLDEN / "explain_64_5760_1920_bf16_fast.txt").read_text(encoding="utf-8")


@pytest.mark.subprocess
def test_cli_import_is_light():
    code = "import sys, mmaemu.cli; assert 'torch' not in sys.modules and 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(), cwd=REPO, timeout=60)


def test_main_returns_exit_codes():
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", "16", "16", "16", "--splitk", "bad"])
    assert exc.value.code == 2


# ----------------------------------------------------------------------------------------------------------------
# selftest on a (simulated) CUDA device: formatting, required/optional kernels and the verdict


class Gate:
    """Duck-typed like mmaemu.backends.GateResult (not a dataclass: the CLI reads the attributes)."""

    def __init__(self, name, passed, reason="", seconds=0.5, cached=False, ran=True):
        self.name, self.passed, self.reason, self.details = name, passed, reason, {}
        self.seconds, self.cached, self.ran = seconds, cached, ran


def fake_gpu(monkeypatch, name, capability):
    """torch describes CUDA device 0 as ``name`` of ``capability`` (read afresh by mmaemu.base.device_facts)."""
    import types

    props = types.SimpleNamespace(name=name, major=capability[0], minor=capability[1], multi_processor_count=24,
                                  total_memory=8 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    monkeypatch.setattr(device_facts, "_FACTS", {})
    monkeypatch.setattr(device_facts, "display_driver", lambda: "570.148.08")
    monkeypatch.setattr(device_facts, "cuda_driver_api", lambda: "12.8")


@pytest.fixture
def fake_device(monkeypatch):
    """A pretend sm_89 device 0 and kernel metadata: v1 not gated (min_cc 7.5), v9 gated on sm_89, h4 gated
    on sm_90 only, v4 not gated with min_cc 9.0."""
    import types

    from mmaemu import backends

    monkeypatch.setattr(diagnostics, "cuda_unusable", lambda ordinal, exact=False: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fake_gpu(monkeypatch, "Fake GPU", (8, 9))
    meta = {"v1": types.SimpleNamespace(gated=False, validated_on=("sm_89",), min_cc=(7, 5)),
            "v9": {"gated": True, "validated_on": ["sm_89"], "min_cc": "8.0"},
            "h4": {"gated": True, "validated_on": [(9, 0)], "min_cc": 80},
            "v4": {"gated": False, "validated_on": [], "min_cc": "sm_90"}}
    monkeypatch.setattr(backends, "KERNELS", meta, raising=False)
    return monkeypatch


def _set_selftest(monkeypatch, fn):
    from mmaemu import backends

    monkeypatch.setattr(backends, "selftest", fn, raising=False)


def test_selftest_pass_with_rejected_optional_kernel(fake_device, tmp_path):
    calls = []

    def fake(device=None, *, kernels="all", force=False):
        calls.append((device, kernels, force))
        return {"v1": [Gate("smoke", True, cached=True)], "v9": [Gate("smoke", True), Gate("window", True)],
                "h4": [Gate("smoke", False, "bits differ")], "v4": [Gate("smoke", False, "too old")]}

    _set_selftest(fake_device, fake)
    target = tmp_path / "st.json"
    result = invoke("selftest", "--force", "--json", str(target))
    assert calls == [(torch.device("cuda", 0), "all", True)]
    assert result.exit_code == 0, result.stdout
    out = result.stdout.splitlines()
    assert out[0] == "v1: PASS (required: not gated, sm_89 meets min_cc 7.5)"
    assert out[1] == "  smoke: passed; 0.50 s; cached"
    assert "v9: PASS (required: gated, validated on sm_89)" in out
    assert "h4: REJECTED (optional: gated, sm_89 is not among validated_on (sm_90))" in out
    assert "  smoke: FAILED; 0.50 s; bits differ" in out
    assert "v4: REJECTED (optional: sm_89 is below min_cc 9.0)" in out
    assert out[-1] == "verdict: PASS - every required kernel passed on Fake GPU"
    report = json.loads(target.read_text())
    assert report["verdict"] == "PASS" and [k["status"] for k in report["kernels"]] == [
        "PASS", "PASS", "REJECTED", "REJECTED"]
    assert report["kernels"][0]["gates"][0] == {"name": "smoke", "passed": True, "reason": "", "details": {},
                                                "seconds": 0.5, "cached": True, "ran": True}


def test_selftest_required_failure_is_fail(fake_device):
    _set_selftest(fake_device, lambda device=None, *, kernels="all", force=False: {
        "v1": [Gate("smoke", False, "mismatch at (3, 4)")]})
    result = invoke("selftest", "--kernels", "v1", "--device", "0")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == "verdict: FAIL - required kernel(s) failed on Fake GPU: v1"


def test_selftest_kernel_list_is_passed_on(fake_device):
    seen = []
    _set_selftest(fake_device, lambda device=None, *, kernels="all", force=False: seen.append(kernels) or {})
    result = invoke("selftest", "--kernels", "v1, v4")
    assert seen == [["v1", "v4"]]
    assert result.exit_code == 4 and "verdict: UNAVAILABLE - no CUDA kernel to test on Fake GPU" in result.stdout


def test_selftest_library_errors(fake_device):
    from mmaemu.errors import BackendUnavailableError

    def unavailable(device=None, *, kernels="all", force=False):
        raise BackendUnavailableError("numba-cuda is not installed")

    _set_selftest(fake_device, unavailable)
    result = invoke("selftest")
    assert result.exit_code == 4
    assert result.stdout == "verdict: UNAVAILABLE - numba-cuda is not installed: the CPU backend is used\n"

    def unknown(device=None, *, kernels="all", force=False):
        raise ValueError("unknown kernel 'zz'")

    _set_selftest(fake_device, unknown)
    assert invoke("selftest", "--kernels", "zz").exit_code == 2

    def crash(device=None, *, kernels="all", force=False):
        raise RuntimeError("illegal address")

    _set_selftest(fake_device, crash)
    result = invoke("selftest")
    assert result.exit_code == 1 and "verdict: FAIL - the self-test raised RuntimeError: illegal address" in \
        result.stdout


def test_selftest_without_library_selftest(fake_device):
    from mmaemu import backends

    fake_device.delattr(backends, "selftest", raising=False)
    result = invoke("selftest")
    assert result.exit_code == 4 and "mmaemu.backends.selftest is missing" in result.stdout


def test_selftest_without_kernel_metadata(fake_device):
    import mmaemu.cuda
    from mmaemu import backends

    fake_device.delattr(backends, "KERNELS", raising=False)
    fake_device.delattr(mmaemu.cuda, "KERNELS", raising=False)
    _set_selftest(fake_device, lambda device=None, *, kernels="all", force=False: {"h1": [Gate("smoke", True)]})
    result = invoke("selftest")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "h1: PASS (required: no kernel metadata, every kernel counts)"


def test_info_device_section_on_a_simulated_gpu(monkeypatch):
    import types

    monkeypatch.setattr(diagnostics, "cuda_unusable", lambda ordinal, exact=False: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = types.SimpleNamespace(name="Fake GPU", major=9, minor=0, multi_processor_count=132,
                                  total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(device_facts, "_FACTS", {})  # the fake device is read afresh and forgotten afterwards
    monkeypatch.setattr(device_facts, "display_driver", lambda: "570.148.08")
    monkeypatch.setattr(device_facts, "cuda_driver_api", lambda: "12.8")
    monkeypatch.setattr(diagnostics, "_cublaslt_version", lambda: "12.8.3.14 (/x/libcublasLt.so.12)")

    def no_nvrtc():
        raise RuntimeError("libnvrtc not found")

    monkeypatch.setattr(diagnostics, "_nvrtc_version", no_nvrtc)
    result = invoke("info", "--device", "0")
    assert result.exit_code == 0
    out = result.stdout
    assert "Device:\n  cuda:0 Fake GPU, sm_90, 132 SMs, 80.0 GiB\n  display driver: 570.148.08\n" in out
    assert "  CUDA driver API: 12.8\n" in out and "  cuBLASLt: 12.8.3.14 (/x/libcublasLt.so.12)\n" in out
    assert "  NVRTC: unavailable (RuntimeError: libnvrtc not found)\n" in out
    assert "hopper-experimental" in out and \
        "does not match this device (this device: Fake GPU, 132 SMs, cuBLASLt 12.8.3.14)" in out
    report = json.loads(invoke("info", "--json", "-").stdout)
    assert report["device"]["sm_count"] == 132 and report["device"]["nvrtc"] is None


def test_selftest_kernels_that_did_not_run(fake_device):
    _set_selftest(fake_device, lambda device=None, *, kernels="all", force=False: {
        "cuda:offset": [Gate("selftest", False, "not run: the device is busy", ran=False)],
        "cuda:simple": [Gate("selftest", False, "not run: the device is busy", ran=False)]})
    result = invoke("selftest")
    assert result.exit_code == 4
    assert "cuda:offset: NOT RUN (required: no kernel metadata, every kernel counts)" in result.stdout or \
        "cuda:offset: NOT RUN (required: not gated" in result.stdout
    assert "  selftest: not run; the device is busy" in result.stdout
    assert result.stdout.endswith("verdict: UNAVAILABLE - the device is busy: the CPU backend is used\n")
    _set_selftest(fake_device, lambda device=None, *, kernels="all", force=False: {
        "cuda:offset": [Gate("selftest", True)],
        "cuda:simple": [Gate("selftest", False, "not run: no memory", ran=False)]})
    result = invoke("selftest")
    assert result.exit_code == 0
    assert result.stdout.endswith("verdict: PASS - every required kernel passed on Fake GPU (not run: cuda:simple)\n")


def test_selftest_with_the_library_on_a_disabled_device(fake_device):
    """The real mmaemu.backends.selftest (CUDA disabled, so nothing runs) through the CLI's formatting."""
    from mmaemu import backends

    if not hasattr(backends, "selftest"):
        pytest.skip("mmaemu.backends.selftest is not available")
    fake_device.undo()  # the real kernel metadata and selftest; keep a pretend device visible
    fake_device.setattr(diagnostics, "cuda_unusable", lambda ordinal, exact=False: None)
    fake_device.setattr(torch.cuda, "current_device", lambda: 0)
    fake_gpu(fake_device, "Fake GPU", (9, 0))
    fake_device.setenv("MMAEMU_DISABLE_CUDA", "1")
    result = invoke("selftest", "--json", "-")
    assert result.exit_code == 4
    report = json.loads(result.stdout)
    assert report["verdict"] == "UNAVAILABLE" and report["kernels"]
    assert all(k["status"] == "NOT RUN" for k in report["kernels"])
    result = invoke("selftest")
    assert result.exit_code == 4
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("verdict: UNAVAILABLE - ") and lines[-1].endswith(": the CPU backend is used")
    assert any(" NOT RUN " in line for line in lines)


@pytest.mark.parametrize("value", ["1", "true", "YES", "On"])
def test_info_reads_disable_cuda_as_every_part_of_mmaemu_does(monkeypatch, value):
    """One boolean parser: every true value keeps info off CUDA too, as it keeps the kernels off (issue 23.14)."""
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", value)
    report = json.loads(invoke("info", "--json", "-").stdout)
    assert report["device"] == {"available": False, "reason": f"CUDA disabled by MMAEMU_DISABLE_CUDA={value}"}
    assert {p["match_note"] for p in report["profiles"] if p["gpu"]} == {f"MMAEMU_DISABLE_CUDA={value}"}
    assert all(not b["available"] for b in report["backends"] if b["name"].startswith("cuda"))
    assert "MMAEMU_DISABLE_CUDA" not in report["environment_problems"]


def _strict_json(text):
    """json.loads that refuses the NaN / Infinity / -Infinity tokens (not JSON, RFC 8259)."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_reports_are_strict_json_with_non_finite_values_as_strings(tmp_path):
    result = invoke("explain", "16", "32", "64", "--scale-a", "inf", "--scale-b", "nan", "--scale-result", "-inf",
                    "--splitk", "1", "--device", "cpu", "--json", "-")
    report = _strict_json(result.stdout)
    assert (report["call"]["scale_a"], report["call"]["scale_b"], report["call"]["scale_result"]) == \
        ("inf", "nan", "-inf")
    target = tmp_path / "plan.json"
    invoke("explain", "16", "32", "64", "--scale-a", "nan", "--splitk", "1", "--device", "cpu", "--json", str(target))
    assert _strict_json(target.read_text())["call"]["scale_a"] == "nan"


def test_json_encoding_of_non_finite_values():
    from mmaemu.cli.output import json_text

    report = {"a": [float("nan"), float("inf"), -float("inf"), 1.5, -0.0], "b": {"c": torch.tensor(float("nan"))}}
    data = _strict_json(json_text(report))
    assert data == {"a": ["nan", "inf", "-inf", 1.5, -0.0], "b": {"c": "nan"}}
    assert str(data["a"][4]) == "-0.0"  # finite values, also -0.0, are numbers as before


def test_help_says_where_mmaemu_runs_as_the_readme_does():
    readme = (REPO / "README.md").read_text()
    assert "on any CPU or CUDA GPU" in " ".join(readme.split())
    assert "on any CPU or CUDA GPU" in " ".join(invoke("--help").stdout.split())
