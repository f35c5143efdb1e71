"""The context of the decisions (mmaemu.context) and the device facts it carries (mmaemu.base.device_facts).

The decisions read the environment of the context they are given, not the process environment; a device is read
once per process, and every consumer (info, verdict identity, the recorder) reads the same facts. No GPU here:
the device is a fake (torch's properties and the driver readers monkeypatched).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from mmaemu import backends, environment
from mmaemu.base import device_facts
from mmaemu.cli import diagnostics
from mmaemu.context import Context, environment_of, for_call
from mmaemu.errors import AssumedUnsplitWarning
from mmaemu.platform.profiles import get_profile
from mmaemu.platform.splitk import decide_splitk


def context_of(**variables) -> Context:
    return Context(environment.snapshot(variables))


@pytest.fixture
def clean_environment(monkeypatch):
    for name in environment.NAMES:
        monkeypatch.delenv(name, raising=False)


def test_a_context_is_immutable_and_read_once(clean_environment, monkeypatch):
    monkeypatch.setenv("MMAEMU_PROFILE", "ada")
    context = for_call()
    monkeypatch.setenv("MMAEMU_PROFILE", "hopper")
    assert context.environment["MMAEMU_PROFILE"] == "ada"  # the reading of the moment it was built
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.device = None
    assert environment_of(context) is context.environment
    assert environment_of(None)["MMAEMU_PROFILE"] == "hopper"


def test_the_profile_choice_reads_its_context(clean_environment):
    assert get_profile(None, context=context_of(MMAEMU_PROFILE="ada")).name == "ada"
    assert get_profile(None, context=context_of()).name == "hopper"
    with pytest.raises(KeyError, match=r"unknown profile 'nope' \(from MMAEMU_PROFILE\)"):
        get_profile(None, context=context_of(MMAEMU_PROFILE="nope"))


def test_the_split_decision_reads_its_context(clean_environment):
    """hopper, a shape outside the recordings: "auto" raises, the context's assume-unsplit policy gives S = 1 and
    the warning as data; strict from the context."""
    args = dict(a_dtype="e4m3", b_dtype="e4m3", out_dtype=torch.bfloat16, use_fast_accum=True, profile="hopper-ws0")
    plain = decide_splitk(5, 7, 3000, **args, context=context_of())
    assert plain.decision.S == 1 and plain.decision.source == "workspace0"
    args["profile"] = "hopper-experimental"  # no table: "auto" cannot decide
    with pytest.raises(Exception, match="no reference platform"):
        decide_splitk(5, 7, 3000, **args, context=context_of())
    outcome = decide_splitk(5, 7, 3000, **args, context=context_of(MMAEMU_SPLITK_POLICY="assume-unsplit"))
    assert outcome.decision.S == 1
    assert [n.category for n in outcome.warnings] == [AssumedUnsplitWarning]
    with pytest.raises(ValueError, match="MMAEMU_SPLITK_STRICT='maybe'"):
        decide_splitk(5, 7, 3000, **args, context=context_of(MMAEMU_SPLITK_STRICT="maybe"))


def test_the_backend_selection_reads_its_context(clean_environment):
    cuda = types.SimpleNamespace(type="cuda")
    selection = backends.select(cuda, "auto", "e4m3", "e4m3", None, context=context_of(MMAEMU_DISABLE_CUDA="yes"))
    assert selection.name == "cpu" and selection.fallbacks == ["cuda: disabled by MMAEMU_DISABLE_CUDA"]
    assert backends.select(torch.device("cpu"), "auto", "e4m3", "e4m3", None,
                           context=context_of(MMAEMU_BACKEND="reference")).name == "reference"
    with pytest.raises(ValueError, match=r"unknown backend 'gpu' \(from MMAEMU_BACKEND\)"):
        backends.requested_backend("auto", context=context_of(MMAEMU_BACKEND="gpu"))


def test_device_matching_reads_its_context(clean_environment, monkeypatch):
    from mmaemu.platform import cublaslt

    probed = []

    def device_info(ordinal):
        probed.append(ordinal)
        return "NVIDIA H100 PCIe", 114

    monkeypatch.setattr(cublaslt, "driver_device_info", device_info)
    monkeypatch.setattr(cublaslt, "loaded_cublaslt_version", lambda: (12, 8, 3, 14))
    hopper = get_profile("hopper")
    assert hopper.matches_device(0, context=context_of(MMAEMU_DISABLE_CUDA="1")) is False and probed == []
    assert hopper.matches_device(0, context=context_of()) is True and probed == [0]


def test_the_planner_takes_the_context_of_its_entry_point(clean_environment):
    from mmaemu.plan.planner import plan_accumulate

    a = torch.zeros(4, 32).to(torch.float8_e4m3fn)
    plan = plan_accumulate(a, a, use_fast_accum=True, splitk=1, context=context_of(MMAEMU_PROFILE="ada",
                                                                                   MMAEMU_BACKEND="reference"))
    assert (plan.profile.name, plan.backend) == ("ada", "reference")


# ----------------------------------------------------------------------------------------------------------------
# Device facts


@pytest.fixture
def fake_device(monkeypatch):
    """Device 0 as torch would describe an H100, the driver readers answering; reads counted."""
    reads = {"props": 0}
    props = types.SimpleNamespace(name="NVIDIA H100 PCIe", major=9, minor=0, multi_processor_count=114,
                                  total_memory=80 * 2**30, uuid="GPU-1234")

    def get_properties(index):
        reads["props"] += 1
        if index != 0:
            raise RuntimeError(f"invalid device ordinal {index}")
        return props

    def no_nvml():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_properties)
    monkeypatch.setattr(device_facts, "_FACTS", {})
    monkeypatch.setattr(device_facts, "display_driver", no_nvml)
    monkeypatch.setattr(device_facts, "cuda_driver_api", lambda: "12.8")
    return reads


def test_a_device_is_read_once(fake_device):
    facts = device_facts.read(0)
    assert device_facts.read(0) is facts and fake_device["props"] == 1
    assert (facts.name, facts.capability, facts.sm_count, facts.memory_bytes, facts.uuid) == \
        ("NVIDIA H100 PCIe", (9, 0), 114, 80 * 2**30, "GPU-1234")
    assert facts.cuda_driver_api == "12.8" and facts.display_driver is None
    assert isinstance(facts.error("display_driver"), OSError) and facts.error("cuda_driver_api") is None
    with pytest.raises(RuntimeError, match="invalid device ordinal 3"):
        device_facts.read(3)
    device_facts.forget()
    device_facts.read(0)
    assert fake_device["props"] == 3


def test_info_and_the_verdict_identity_read_the_same_facts(fake_device, monkeypatch):
    from mmaemu.cuda import device as cuda_device

    monkeypatch.setattr(diagnostics, "cuda_unusable", lambda ordinal, exact=False: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    context = diagnostics.report_context(0, environment.snapshot({}))
    assert context.device is device_facts.read(0) and context.device_problem is None
    section = diagnostics.device_section(context.device)
    assert (section["name"], section["capability"], section["sm_count"]) == ("NVIDIA H100 PCIe", "sm_90", 114)
    assert section["display_driver"] is None and section["errors"]["display_driver"].startswith("OSError: ")
    numba_cuda = pytest.importorskip("numba.cuda")
    monkeypatch.setattr(numba_cuda, "is_available", lambda: True)
    info = cuda_device._probe_index(0)
    assert info.identity()["name"] == "NVIDIA H100 PCIe" and info.identity()["capability"] == [9, 0]
    assert info.driver == "CUDA driver API 12.8" and info.uuid == "GPU-1234"
    assert fake_device["props"] == 1  # info and the kernels' probe shared one reading


def test_info_context_says_why_there_is_no_device(clean_environment, monkeypatch):
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "on")
    context = diagnostics.report_context(None)
    assert context.device is None and context.device_problem == "CUDA disabled by MMAEMU_DISABLE_CUDA=on"
    assert context.cuda_disabled

    def broken(ordinal):
        raise RuntimeError("driver crashed")

    monkeypatch.setattr(diagnostics, "cuda_unusable", broken)
    context = diagnostics.report_context(None)
    assert (context.device_problem, context.device_error) == ("probe failed", "RuntimeError: driver crashed")
    report = diagnostics.build_info()
    assert report["device"] == {"available": False, "reason": "probe failed"}
    assert {"component": "device", "reason": "RuntimeError: driver crashed"} in report["unavailable"]
