"""The package around the engine: import cost, presets, warnings, flush-to-zero refusal, cache, memory."""

import os
import subprocess
import sys
import tracemalloc
import warnings

import pytest
import torch

import mmaemu
from mmaemu.errors import ExperimentalPresetWarning, MmaemuError, UnsupportedFeatureError
from mmaemu.model import presets

ONE = torch.tensor(1.0)


def fp8(shape, seed, dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(dtype)


@pytest.mark.subprocess
def test_import_touches_neither_torch_nor_cuda():
    code = ("import sys; import mmaemu; "
            "print('torch' in sys.modules, 'numba' in sys.modules, 'numba.cuda' in sys.modules)")
    torch_loaded, numba_loaded, cuda_loaded = subprocess.check_output([sys.executable, "-c", code], text=True).split()
    assert (torch_loaded, numba_loaded, cuda_loaded) == ("False", "False", "False")


def test_public_names_resolve():
    for name in mmaemu.__all__:
        assert getattr(mmaemu, name) is not None, name
    assert mmaemu.list_presets() == ["ada", "b200_mma_sync", "hopper", "sm120_mma_sync", "sm120_mxf4nvf4", "sm120_mxf8f6f4", "tcgen05_f8f6f4",
            "tcgen05_mxf4nvf4", "tcgen05_mxf8f6f4"]


@pytest.mark.parametrize("field,value,error", [
    ("nfma", 0, ValueError), ("nfma", 2.0, TypeError), ("frac", 0, ValueError), ("frac", 41, ValueError),
    ("frac_out", 24, ValueError), ("slow_chunk", 0, ValueError), ("slow_chunk", True, ValueError),
    ("maturity", "beta", ValueError), ("late_c", 1, TypeError),
])
def test_preset_argument_checks_name_the_field(field, value, error):
    kwargs = dict(name="p", nfma=16, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128)
    kwargs[field] = value
    with pytest.raises(error, match=field):
        presets.Preset(**kwargs)


def test_preset_rejects_blocks_whose_sum_could_overflow_int64():
    with pytest.raises(ValueError, match="2\\*\\*62"):
        presets.Preset("huge", nfma=1 << 21, frac=40, frac_out=23, min_exp=-132, late_c=False, slow_chunk=128)


def test_refused_and_unknown_preset_names():
    for name in ("sm_120", "RTX-Blackwell", "rtx5070ti"):
        with pytest.raises(KeyError, match="sm_120"):
            mmaemu.get_preset(name)
    with pytest.raises(KeyError, match="known presets"):
        mmaemu.get_preset("volta")
    with pytest.raises(TypeError):
        mmaemu.get_preset(3)


def test_experimental_preset_warns_once_per_process_and_alias_every_time():
    mmaemu.warn.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            mmaemu.get_preset("b200_mma_sync")
    assert sum(issubclass(w.category, ExperimentalPresetWarning) for w in caught) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert mmaemu.get_preset("blackwell") is presets.B200_MMA_SYNC
    assert sum(issubclass(w.category, ExperimentalPresetWarning) for w in caught) == 2


def test_custom_preset_runs_through_dot_and_warns_custom():
    mmaemu.warn.reset()
    p = mmaemu.Preset("my-unit", nfma=8, frac=10, frac_out=10, min_exp=-132, late_c=False, slow_chunk=128)
    with pytest.warns(ExperimentalPresetWarning, match="custom"):
        r = mmaemu.model.dot(fp8((4, 64), 1), fp8((4, 64), 2), preset=p)
    assert r.shape == (4,) and r.dtype == torch.float32


def test_b200_has_no_gemm_level():
    a, b = fp8((2, 64), 3), fp8((2, 64), 4)
    with pytest.warns(ExperimentalPresetWarning):
        with pytest.raises(UnsupportedFeatureError, match="slow accumulation"):
            mmaemu.accumulate(a, b, use_fast_accum=False, profile="b200-mma-sync-experimental", splitk=1)


def test_flush_to_zero_refuses_instead_of_computing_wrong_bits():
    a, w = fp8((2, 32), 5), fp8((16, 32), 6)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        with pytest.raises(MmaemuError, match="set_flush_denormal") as info:
            mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
        assert type(info.value) is MmaemuError
        with pytest.raises(MmaemuError):
            mmaemu.accumulate(a, w, use_fast_accum=True, splitk=1)
    finally:
        torch.set_flush_denormal(False)
    mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)


def test_backend_reference_and_cpu_agree():
    a, w = fp8((5, 96), 7), fp8((32, 96), 8)
    fast = mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, profile="ada", splitk=(3, "serial"))
    ref = mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, profile="ada", splitk=(3, "serial"),
                           backend="reference")
    mmaemu.testing.assert_bitwise_equal(fast, ref)
    with pytest.raises(ValueError, match="unknown backend"):
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, splitk=1, backend="gpu")
    with pytest.raises(mmaemu.BackendUnavailableError, match="tensors on cpu"):
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, splitk=1, backend="cuda")


@pytest.mark.parametrize("entry", ["scaled_mm", "accumulate", "explain"])
def test_an_unknown_backend_is_refused_before_the_split_k_decision(entry):
    """The backend's name is an argument: refused as such, not after a split-K decision refuses the call for
    another reason (issue 28 item 10; profile hopper-experimental has no split-K table, so "auto" splitk is
    undecided)."""
    a, w = fp8((16, 256), 11), fp8((256, 256), 12)
    with pytest.raises(mmaemu.SplitKUnknownError):
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, profile="hopper-experimental")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        if entry == "explain":
            plan = mmaemu.explain(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, profile="hopper-experimental",
                                  backend="gpu-please")
            assert plan.validation[0] == "ValueError" and "unknown backend 'gpu-please'" in plan.validation[1]
            return
        with pytest.raises(ValueError, match="unknown backend 'gpu-please'"):
            if entry == "scaled_mm":
                mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.bfloat16, profile="hopper-experimental",
                                 backend="gpu-please")
            else:
                mmaemu.accumulate(a, w, use_fast_accum=True, profile="hopper-experimental", backend="gpu-please")


def test_out_argument_receives_the_result_and_column_major_out_is_kept():
    a, w = fp8((4, 64), 9), fp8((16, 64), 10)
    expected = mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, use_fast_accum=True, splitk=1)
    out = torch.empty(16, 4).t()  # column-major [4, 16]
    got = mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, use_fast_accum=True, splitk=1, out=out)
    assert got is out and out.stride() == (1, 4)
    mmaemu.testing.assert_bitwise_equal(out.contiguous(), expected)
    small = torch.empty(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # resizing an empty out does not warn
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, use_fast_accum=True, splitk=1, out=small)
    mmaemu.testing.assert_bitwise_equal(small, expected)


def test_extra_memory_is_linear_in_inputs_and_outputs():
    """No O(M*N*K) temporary: peak numpy allocation stays within a small multiple of inputs + output."""
    M, N, K = 32, 64, 1024
    a, w = fp8((M, K), 11), fp8((N, K), 12)
    mmaemu.accumulate(a, w, use_fast_accum=True, splitk=1)  # compile outside the measurement
    tracemalloc.start()
    mmaemu.accumulate(a, w, use_fast_accum=True, splitk=1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    linear = (M + N) * K + 4 * M * N
    assert peak < 8 * linear + (1 << 20), (peak, linear)
    assert peak < M * N * K  # far below one byte per product


@pytest.mark.subprocess
def test_cache_directory_is_keyed_and_unusable_location_falls_back_to_the_per_user_folder(tmp_path):
    code = ("import mmaemu, torch; from mmaemu.base import _cache; a = torch.ones(2, 32).to(torch.float8_e4m3fn); "
            "print(float(mmaemu.accumulate(a, a, use_fast_accum=True, splitk=1)[0, 0]), "
            "_cache.numba_location().root)")
    per_user = tmp_path / "xdg" / "mmaemu"
    env = dict(os.environ, MMAEMU_CACHE_DIR=str(per_user), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert subprocess.check_output([sys.executable, "-c", code], env=env, text=True).split() == [
        "32.0", str(per_user.resolve())]
    from mmaemu.base import _cache

    keyed = per_user / "numba" / _cache.cache_key()
    assert keyed.is_dir() and any(keyed.rglob("*.nbi"))
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    env["MMAEMU_CACHE_DIR"] = str(blocked)
    proc = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, check=True)
    assert proc.stdout.split() == ["32.0", str(per_user.resolve())]  # the per-user folder, already warm
    assert f"does not use the cache folder {blocked}" in proc.stderr and "is not a directory" in proc.stderr


def test_planning_warnings_point_at_the_callers_line():
    a = fp8((1, 512), 13)
    mmaemu.warn.reset()  # the warning of this split is once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mmaemu.scaled_mm(a, fp8((16, 512), 14).t(), ONE, ONE, out_dtype=torch.float32, splitk=(3, "contiguous"))
    assert caught and all(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]


def test_explain_collects_warnings_instead_of_emitting_them():
    """A dry run: every warning the call would give is in CallPlan.warnings, none is emitted; the call warns."""
    a, w = fp8((1, 512), 15), fp8((16, 512), 16)
    call = dict(out_dtype=torch.float32, profile="hopper-experimental", splitk=(3, "contiguous"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = mmaemu.explain(a, w.t(), ONE, ONE, out=torch.empty(3), **call)
    assert caught == []
    assert plan.validation == "ok" and len(plan.warnings) == 3, plan.warnings
    assert "experimental" in plan.warnings[0] and "resized" in plan.warnings[1] and "split-K S=3" in plan.warnings[2]
    mmaemu.warn.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, out=torch.empty(3), **call)
    assert [str(w.message) for w in caught] == plan.warnings


def test_assert_bitwise_equal_reports_plain_numbers():
    actual = torch.tensor([[1.0, 0.5], [2.0, -0.0]], dtype=torch.bfloat16)
    expected = torch.tensor([[1.0, 0.75], [2.0, 0.0]], dtype=torch.bfloat16)
    with pytest.raises(AssertionError) as caught:
        mmaemu.testing.assert_bitwise_equal(actual, expected)
    text = str(caught.value)
    assert "bit patterns differ at 2 of 4 elements (zero_sign=1, nan_payload=0, value=1)" in text
    assert "at (0, 1): actual 0.5 (0x3F00), expected 0.75 (0x3F40)" in text
    assert "at (1, 1): actual -0.0 (0x8000), expected 0.0 (0x0000)" in text
    assert "np." not in text
