"""Profiles (platform.md section 1) and device matching (section 3.6)."""

import dataclasses
import subprocess
import sys
import warnings

import pytest

from mmaemu import warn
from mmaemu.errors import ExperimentalPresetWarning
from mmaemu.platform import cublaslt, heuristic
from mmaemu.platform.profiles import (
    Profile, RejectRule, get_profile, list_profiles, profile_maturity_messages, warn_profile_maturity)

MiB = 1 << 20
H100 = ("NVIDIA H100 PCIe", (9, 0), 114, "12.8.3.14", "2.7.1+cu128", "heur_h100pcie_lt12.8.3.14")
RTX = ("NVIDIA GeForce RTX 4060", (8, 9), 24, "12.8.3.14", "2.7.1+cu128", "heur_rtx4060_lt12.8.3.14")
NONE = (None, None, None, None, None, None)

# name: (preset, (gpu_name, capability, sm_count, cublaslt, torch, table), caller, workspace, align, maturity,
#        splitk_maturity) — the table of platform.md section 1
EXPECTED = {
    "hopper": ("hopper", H100, "torch._scaled_mm", 1 * MiB, None, "validated", "validated"),
    "hopper-te": ("hopper", H100, "transformer_engine", 32 * MiB, 256, "validated", "experimental"),
    "hopper-ws0": ("hopper", H100, "torch._scaled_mm", 0, None, "validated", "validated"),
    "ada": ("ada", RTX, "torch._scaled_mm", 1 * MiB, None, "validated", "validated"),
    "ada-te": ("ada", RTX, "transformer_engine", 4 * MiB, 256, "validated", "experimental"),
    "ada-ws0": ("ada", RTX, "torch._scaled_mm", 0, None, "validated", "validated"),
    "hopper-experimental": ("hopper", NONE, "torch._scaled_mm", None, None, "experimental", "none"),
    "b200-mma-sync-experimental": ("b200_mma_sync", NONE, "torch._scaled_mm", None, None, "experimental", "none"),
    "tcgen05-f8f6f4-experimental": ("tcgen05_f8f6f4", NONE, "torch._scaled_mm", None, None, "experimental", "none"),
    "sm120-mma-sync-experimental": ("sm120_mma_sync", NONE, "torch._scaled_mm", None, None, "experimental", "none"),
    "b200-mx-experimental": ("tcgen05_mxf8f6f4", NONE, "torch._scaled_mm", None, None, "experimental", "none"),
    "hopper-cublaslt-blockwise-experimental": ("hopper", NONE, "torch._scaled_mm", None, None, "experimental",
                                               "none"),
}
REFERENCE = ["ada", "ada-te", "ada-ws0", "hopper", "hopper-te", "hopper-ws0"]


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # tests/conftest.py


def test_listing_order():
    assert list_profiles() == ["ada", "ada-te", "ada-ws0", "hopper", "hopper-te", "hopper-ws0",
                               "hopper-experimental", "b200-mma-sync-experimental",
                               "tcgen05-f8f6f4-experimental", "sm120-mma-sync-experimental", "b200-mx-experimental",
                               "hopper-cublaslt-blockwise-experimental"]


def test_field_names():
    assert [f.name for f in dataclasses.fields(Profile)] == [
        "name", "preset", "gpu_name", "capability", "sm_count", "cublaslt_version", "caller", "torch_version",
        "workspace_bytes", "align", "splitk_table", "rejects", "maturity", "splitk_maturity"]
    assert [f.name for f in dataclasses.fields(RejectRule)] == ["fmt_a", "fmt_b", "out_dtype", "message"]


def test_profiles_reexports_the_vocabulary_of_definitions():
    """mmaemu.platform.profiles re-exports every name of definitions.__all__, and a star import of it works."""
    from mmaemu.platform import definitions, profiles

    assert set(definitions.__all__) <= set(profiles.__all__)
    names = {}
    exec("from mmaemu.platform.profiles import *", names)
    assert all(names[name] is getattr(definitions, name) for name in definitions.__all__)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_profile_fields(name):
    preset, (gpu, cap, sms, lt, torch_v, table), caller, ws, align, maturity, sk_maturity = EXPECTED[name]
    p = get_profile(name)
    assert (p.name, p.preset, p.caller, p.workspace_bytes, p.align) == (name, preset, caller, ws, align)
    assert (p.gpu_name, p.sm_count, p.cublaslt_version, p.torch_version, p.splitk_table) == (gpu, sms, lt, torch_v,
                                                                                            table)
    assert p.capability == (cap if cap is not None else {"hopper": (9, 0), "b200_mma_sync": (10, 0),
                                                          "tcgen05_f8f6f4": (10, 0), "sm120_mma_sync": (12, 0),
                                                          "tcgen05_mxf8f6f4": (10, 0)}[preset])
    assert (p.maturity, p.splitk_maturity) == (maturity, sk_maturity)
    assert isinstance(p.description, str) and p.description
    if gpu:
        assert gpu in p.description


def test_profiles_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_profile("hopper").workspace_bytes = 0


def test_get_profile_forms(monkeypatch):
    monkeypatch.delenv("MMAEMU_PROFILE", raising=False)
    assert get_profile(None).name == "hopper"
    assert get_profile().name == "hopper"
    monkeypatch.setenv("MMAEMU_PROFILE", "")
    assert get_profile(None).name == "hopper"
    monkeypatch.setenv("MMAEMU_PROFILE", "ada-te")
    assert get_profile(None).name == "ada-te"  # read at call time
    custom = dataclasses.replace(get_profile("ada"), name="mine")
    assert get_profile(custom) is custom


@pytest.mark.parametrize("name", ["nope", "Hopper", "hopper-h100pcie-torch", "ada-rtx4060-te", "hopper-h100pcie-te"])
def test_unknown_profile_names(name):
    with pytest.raises(KeyError) as info:
        get_profile(name)
    for known in list_profiles():
        assert known in str(info.value)


def test_unknown_profile_env(monkeypatch):
    monkeypatch.setenv("MMAEMU_PROFILE", "h100")
    with pytest.raises(KeyError):
        get_profile(None)


@pytest.mark.parametrize("value", [3, b"hopper", 1.5, ["hopper"]])
def test_non_string_profile(value):
    with pytest.raises(TypeError):
        get_profile(value)


@pytest.mark.parametrize("name", REFERENCE)
def test_reference_rejections(name):
    p = get_profile(name)
    assert len(p.rejects) == 1
    rule = p.rejects[0]
    assert (rule.fmt_a, rule.fmt_b, rule.out_dtype) == ("e4m3", "e4m3", "float8_e5m2")
    assert "CUBLAS_STATUS_NOT_SUPPORTED" in rule.message
    assert ("sm_89" if name.startswith("ada") else "H100 (sm_90") in rule.message
    assert p.rejection("e4m3", "e4m3", "float8_e5m2") is rule
    assert p.rejection("float8_e4m3fn", "e4m3", "torch.float8_e5m2") is rule
    assert p.rejection("e4m3", "e5m2", "float8_e5m2") is None
    assert p.rejection("e5m2", "e4m3", "float8_e5m2") is None
    assert p.rejection("e4m3", "e4m3", "float8_e4m3fn") is None


def test_rejection_with_torch_dtypes():
    torch = pytest.importorskip("torch")
    p = get_profile("hopper")
    assert p.rejection(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e5m2) is p.rejects[0]
    assert p.rejection(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16) is None
    with pytest.raises(TypeError):
        p.rejection(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.int8)


@pytest.mark.parametrize("name", ["hopper-experimental", "b200-mma-sync-experimental", "tcgen05-f8f6f4-experimental",
                                  "sm120-mma-sync-experimental", "b200-mx-experimental",
                                  "hopper-cublaslt-blockwise-experimental"])
def test_experimental_profiles_reject_nothing(name):
    p = get_profile(name)
    assert p.rejects == ()
    assert p.rejection("e4m3", "e4m3", "float8_e5m2") is None


def test_reject_rule_none_matches_anything():
    rule = RejectRule(None, "e5m2", None, "x")
    p = dataclasses.replace(get_profile("hopper"), rejects=(rule,))
    assert p.rejection("e4m3", "e5m2", "float32") is rule
    assert p.rejection("e4m3", "e4m3", "float32") is None


def test_rejection_argument_types():
    p = get_profile("hopper")
    with pytest.raises(TypeError):
        p.rejection("e4m3", "e4m3", "fp8")
    with pytest.raises(TypeError):
        p.rejection("float8_e4m3fnuz", "e4m3", "float32")


# -- maturity warnings ----------------------------------------------------------------------------------------------


def _caught(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [w for w in caught if issubclass(w.category, ExperimentalPresetWarning)]


@pytest.mark.parametrize("name", REFERENCE)
def test_validated_profiles_do_not_warn(name):
    messages, caught = _caught(warn_profile_maturity, name)
    assert messages == [] and caught == []


def test_experimental_profile_with_validated_preset_warns_once():
    messages, caught = _caught(warn_profile_maturity, "hopper-experimental")
    assert len(caught) == 1 and len(messages) == 1
    assert "hopper-experimental" in messages[0] and get_profile("hopper-experimental").description in messages[0]
    again, caught = _caught(warn_profile_maturity, "hopper-experimental")
    assert caught == [] and again == messages  # the texts are still returned


def test_collecting_records_every_time_without_consuming_the_slot():
    for _ in range(3):
        with warn.collecting() as collected:
            _, caught = _caught(warn_profile_maturity, "hopper-experimental")
        assert caught == [] and [n.category for n in collected] == [ExperimentalPresetWarning]
    _, caught = _caught(warn_profile_maturity, "hopper-experimental")
    assert len(caught) == 1  # the once-slot was still free


def test_experimental_preset_warns_under_the_preset_key():
    from mmaemu.model.presets import B200_MMA_SYNC, get_preset, maturity_message

    messages, caught = _caught(warn_profile_maturity, "b200-mma-sync-experimental")
    assert messages == [maturity_message(B200_MMA_SYNC)] and len(caught) == 1
    # Same key as get_preset's own warning: it is not repeated.
    _, caught = _caught(get_preset, "b200_mma_sync")
    assert caught == []


def test_custom_preset_profile_warns():
    from mmaemu.model.presets import HOPPER

    custom = dataclasses.replace(HOPPER, name="my_hopper", maturity="custom")
    profile = dataclasses.replace(get_profile("hopper"), name="mine", preset=custom)
    assert len(profile_maturity_messages(profile)) == 1
    _, caught = _caught(warn_profile_maturity, profile)
    assert len(caught) == 1 and "my_hopper" in str(caught[0].message)


# -- device matching (platform.md 3.6) ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(EXPECTED))
def test_matches_device_is_false_here(name):
    assert get_profile(name).matches_device() is False
    assert get_profile(name).matches_device("cpu") is False


def test_matches_device_does_not_initialise_torch_cuda():
    torch = pytest.importorskip("torch")
    get_profile("hopper").matches_device()
    assert not torch.cuda.is_initialized()


def test_disable_cuda_touches_nothing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("probed CUDA although MMAEMU_DISABLE_CUDA=1")

    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
    monkeypatch.setattr(cublaslt, "driver_device_info", boom)
    monkeypatch.setattr(cublaslt, "load_cublaslt", boom)
    assert get_profile("hopper").matches_device() is False
    assert get_profile("hopper").matches_device("cuda:0") is False


@pytest.fixture
def fake_gpu(monkeypatch):
    """A simulated device: (name, SM count) per ordinal and a loaded cuBLASLt version."""
    monkeypatch.delenv("MMAEMU_DISABLE_CUDA", raising=False)
    state = {"devices": {0: ("NVIDIA H100 PCIe", 114)}, "version": (12, 8, 3, 14)}

    def device_info(ordinal):
        if ordinal not in state["devices"]:
            raise cublaslt.CublasLtError("no such device")
        return state["devices"][ordinal]

    monkeypatch.setattr(cublaslt, "driver_device_info", device_info)
    monkeypatch.setattr(cublaslt, "loaded_cublaslt_version", lambda: state["version"])
    return state


def test_matching_device(fake_gpu):
    assert get_profile("hopper").matches_device() is True
    assert get_profile("hopper-te").matches_device("cuda:0") is True
    assert get_profile("hopper-ws0").matches_device(0) is True
    assert get_profile("ada").matches_device() is False
    assert get_profile("hopper-experimental").matches_device() is False  # no gpu_name: never
    assert get_profile("hopper").matches_device("cuda:1") is False  # probe error → False
    assert get_profile("hopper").matches_device("cpu") is False


def test_matching_needs_name_sm_count_and_version(fake_gpu):
    hopper = get_profile("hopper")
    fake_gpu["devices"][0] = ("NVIDIA H100 80GB HBM3", 132)  # same capability (9, 0): not enough
    assert hopper.matches_device() is False
    fake_gpu["devices"][0] = ("NVIDIA H100 PCIe", 132)
    assert hopper.matches_device() is False
    fake_gpu["devices"][0] = ("NVIDIA H100 PCIe", 114)
    for version, expected in [((12, 8, 3, 14), True), ((12, 8, 3), True), ((12, 8, 3, 15), False),
                              ((12, 8, 4, 1), False), ((12, 9, 0, 14), False)]:
        fake_gpu["version"] = version
        assert hopper.matches_device() is expected, version


def test_version_probe_error_means_no_match(fake_gpu, monkeypatch):
    def broken():
        raise OSError("libcublasLt missing")

    monkeypatch.setattr(cublaslt, "loaded_cublaslt_version", broken)
    assert get_profile("hopper").matches_device() is False


def test_torch_device_objects(fake_gpu):
    torch = pytest.importorskip("torch")
    assert get_profile("hopper").matches_device(torch.device("cuda", 0)) is True
    assert get_profile("hopper").matches_device(torch.device("cpu")) is False


def test_version_matches_rule():
    assert cublaslt.version_matches("12.8.3.14", (12, 8, 3, 14))
    assert cublaslt.version_matches("12.8.3.14", (12, 8, 3))
    assert cublaslt.version_matches("12.8.3", (12, 8, 3, 99))
    assert not cublaslt.version_matches("12.8.3.14", (12, 8, 3, 13))
    assert not cublaslt.version_matches("12.8.3.14", (12, 8, 2, 14))


@pytest.mark.subprocess
def test_importing_the_platform_package_is_light():
    code = ("import sys, mmaemu.platform, mmaemu.platform.profiles; "
            "print(sorted(m for m in ('torch', 'numpy', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "torch" not in out and "numba" not in out


def test_cuda_ordinal_forms():
    assert cublaslt.cuda_ordinal(None) == 0  # torch has not initialised CUDA here
    assert cublaslt.cuda_ordinal("cuda") == 0
    assert cublaslt.cuda_ordinal("cuda:3") == 3
    assert cublaslt.cuda_ordinal(2) == 2
    assert cublaslt.cuda_ordinal("cpu") is None
    assert cublaslt.cuda_ordinal(-1) is None


def test_no_driver_here_means_no_match(monkeypatch):
    monkeypatch.delenv("MMAEMU_DISABLE_CUDA", raising=False)
    monkeypatch.setenv("MMAEMU_LIBCUDA_PATH", "/nonexistent/libcuda.so.1")
    assert get_profile("ada").matches_device() is False


def test_live_heuristic_gives_no_answer_without_the_library():
    assert heuristic.live_heuristic(get_profile("hopper"), 16, 256, 4096, "e4m3", "e4m3", "float32", False) is None
