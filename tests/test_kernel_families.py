"""The kernel-family table (mmaemu.platform.kernel_families): which kernel each recipe pair meets on a profile's
stack, and docs/recipes.md showing that table."""

import dataclasses
import pathlib

import pytest

from mmaemu.platform import kernel_families as kf
from mmaemu.platform.profiles import get_profile, list_profiles

RECIPES_MD = pathlib.Path(__file__).resolve().parent.parent / "docs" / "recipes.md"


def _versions(bounds) -> str:
    lo, hi = bounds
    text = lambda v: f"{v[0]}.{v[1]}"  # noqa: E731
    if bounds == (None, None):
        return "any"
    if lo is not None and lo == hi:
        return text(lo)
    if lo is not None and hi is not None:
        return f"{text(lo)}–{text(hi)}"
    return f"≥ {text(lo)}" if lo is not None else f"≤ {text(hi)}"


def table_rows() -> list:
    """The rows of docs/recipes.md's table, as the data says them."""
    return [f"| `{row.entry}` | {', '.join(f'`{pair}`' for pair in row.pairs)} | {_versions(row.torch)} | "
            f"{_versions(row.cublaslt)} | {f'sm_{row.cuda_major}x' if row.cuda_major else 'any'} | "
            f"{row.kernel.name} | {row.verdict} |" for row in kf.ROUTES]


def test_docs_recipes_shows_the_table_of_the_data():
    text = RECIPES_MD.read_text()
    for row in table_rows():
        assert row in text, row


def test_every_row_names_a_family_an_entry_point_a_pair_and_a_verdict():
    for row in kf.ROUTES:
        assert row.family in kf.FAMILIES and row.entry in kf.ENTRY_POINTS
        assert set(row.pairs) <= set(kf.RECIPE_PAIRS) and row.why
        assert row.verdict in (kf.COMPUTES, kf.REFERENCE_REJECTS, kf.UNSUPPORTED)
        assert row.computes == (row.verdict == kf.COMPUTES)
        if row.computes:
            assert row.kernel.model is not None, row  # a computed family has a model


def test_every_builtin_profile_routes_every_pair():
    for name in list_profiles():
        for entry in kf.ENTRY_POINTS:
            for pair in kf.RECIPE_PAIRS:
                assert kf.route(entry, pair, get_profile(name)).entry == entry


@pytest.mark.parametrize("pair, family, verdict", [
    ("tensorwise_tensorwise", "cublaslt-tensorwise", kf.COMPUTES),
    ("rowwise_rowwise", "cutlass-rowwise", kf.COMPUTES),
    ("block_1x128_128x128", "unknown", kf.REFERENCE_REJECTS),
    ("block_1x128_1x128", "unknown", kf.REFERENCE_REJECTS),
])
def test_hopper_torch_2_7_1_cublaslt_12_8(pair, family, verdict):
    row = kf.route("scaled_mm", pair, get_profile("hopper"))
    assert (row.family, row.verdict) == (family, verdict)


def _stack(torch_version, cublaslt_version, capability=(9, 0)):
    return dataclasses.replace(get_profile("hopper"), name="stack-test", torch_version=torch_version,
                               cublaslt_version=cublaslt_version, capability=capability)


@pytest.mark.parametrize("torch_version, cublaslt_version, family", [
    ("2.7.1+cu128", "12.8.3.14", "cutlass-rowwise"),
    ("2.7.1+cu129", "12.9.1.4", "cutlass-rowwise"),  # torch 2.7 has no cuBLASLt row-wise branch
    ("2.10.0+cu129", "12.9.1.4", "unknown"),  # whether 2.10 carries PR 166744 is not pinned
    ("2.11.0+cu129", "12.9.1.4", "cublaslt-rowwise"),
    ("2.11.0+cu128", "12.8.4.1", "cutlass-rowwise"),
])
def test_rowwise_goes_to_cublaslt_only_where_torch_and_cublas_send_it(torch_version, cublaslt_version, family):
    row = kf.route("scaled_mm", "rowwise_rowwise", _stack(torch_version, cublaslt_version))
    assert row.family == family
    assert row.computes == (family == "cutlass-rowwise")


def test_blockwise_runs_in_cublaslt_on_sm90_with_12_9_and_is_refused_as_torch_refuses_elsewhere():
    assert kf.route("scaled_mm", "block_128x128_1x128", _stack("2.11.0", "12.9.1.4")).family == "cublaslt-blockwise"
    no_lt = kf.route("scaled_mm", "block_128x128_1x128", _stack("2.11.0", "12.8.3.14"))
    assert no_lt.verdict == kf.REFERENCE_REJECTS and "requires cublasLt >= 12.9" in no_lt.why
    blackwell = kf.route("scaled_mm", "block_1x128_1x128", _stack("2.11.0", "12.9.1.4", (10, 0)))
    assert blackwell.verdict == kf.REFERENCE_REJECTS and "only supported in CUDA for SM90" in blackwell.why


def test_grouped_rowwise_is_the_cutlass_grouped_kernel_on_sm90_and_mxfp8_grouped_is_refused():
    assert kf.route("scaled_grouped_mm", "rowwise_rowwise", get_profile("hopper")).family == \
        "cutlass-grouped-rowwise"
    assert not kf.route("scaled_grouped_mm", "rowwise_rowwise", get_profile("ada")).computes
    assert kf.route("scaled_grouped_mm", "mxfp8_mxfp8", get_profile("b200-mx-experimental")).verdict == \
        kf.UNSUPPORTED


def test_release_and_bad_names():
    assert kf.release("2.7.1+cu128") == (2, 7) and kf.release("12.8.3.14") == (12, 8) and kf.release(None) is None
    with pytest.raises(ValueError, match="unknown recipe pair"):
        kf.route("scaled_mm", "tensorwise", get_profile("hopper"))
    with pytest.raises(ValueError, match="unknown entry point"):
        kf.route("mm", "tensorwise_tensorwise", get_profile("hopper"))
