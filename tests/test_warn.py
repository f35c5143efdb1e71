"""mmaemu.warn: notices as data, one once-per-process registry, the collecting context of explain, the edge of
the entry points, and the user's line as the warning's origin (issue 17.1)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import mmaemu
from mmaemu import warn
from mmaemu.errors import BackendUnavailableError, ExperimentalPresetWarning, UnverifiedSplitWarning

ONE = torch.tensor(1.0)


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # tests/conftest.py


def fp8(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)


def emitted(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args, **kwargs)
    return caught


class Demo(UserWarning):
    pass


def test_once_per_category_and_key():
    first = warn.Notice(Demo, "first", ("k",))
    assert len(emitted(warn.report, [first])) == 1
    assert emitted(warn.report, [first._replace(message="other text, same key")]) == []
    assert len(emitted(warn.report, [warn.Notice(UserWarning, "same key, other class", ("k",))])) == 1
    assert len(emitted(warn.report, [warn.Notice(Demo, "every time")] * 2)) == 2
    warn.reset()
    assert len(emitted(warn.report, [first])) == 1


def test_a_repeated_notice_warns_every_time_and_takes_the_slot():
    repeated = warn.Notice(Demo, "alias", ("name",), repeat=True)
    assert len(emitted(warn.report, [repeated, repeated])) == 2
    assert emitted(warn.report, [warn.Notice(Demo, "the name itself", ("name",))]) == []


def test_collecting_emits_nothing_and_uses_no_slot():
    notice = warn.Notice(Demo, "collected", ("c",))
    with warn.collecting() as collected:
        assert emitted(warn.report, [notice, notice]) == []
    assert collected == [notice, notice]
    assert len(emitted(warn.report, [notice])) == 1  # the slot was free


def test_collecting_inside_an_edge_wins_and_the_edge_emits_in_order():
    a, b, c = (warn.Notice(Demo, text) for text in "abc")

    def entry_point():
        with warn.edge():
            warn.report([a])
            with warn.collecting() as inner:
                warn.report([b])
            warn.report([c])
        return inner

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inner = entry_point()
    assert inner == [b] and [str(w.message) for w in caught] == ["a", "c"]


def test_an_edge_emits_what_was_reported_before_an_error():
    """A call refused late in its plan still gives the warnings found before (as before the registry)."""
    a = fp8((16, 32), 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BackendUnavailableError):
            mmaemu.scaled_mm(a, a.t(), ONE, ONE, out_dtype=torch.float32, splitk=1, profile="hopper-experimental",
                             backend="cuda:simple")
    assert [w.category for w in caught] == [ExperimentalPresetWarning]


def test_explain_emits_nothing_and_a_later_call_still_warns():
    a, w = fp8((1, 512), 3), fp8((16, 512), 4)
    call = dict(out_dtype=torch.float32, profile="hopper-experimental", splitk=(3, "contiguous"))
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan = mmaemu.explain(a, w.t(), ONE, ONE, **call)
        assert caught == [] and len(plan.warnings) == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, **call)
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, **call)  # once per process
    assert [w.category for w in caught] == [ExperimentalPresetWarning, UnverifiedSplitWarning]
    assert [str(w.message) for w in caught] == plan.warnings
    assert len(mmaemu.explain(a, w.t(), ONE, ONE, **call).warnings) == 2  # explain still lists them


def _line_of(marker: str) -> int:
    source, start = inspect.getsourcelines(inspect.currentframe().f_back.f_code)
    return start + next(i for i, line in enumerate(source) if marker in line)


def test_warnings_point_at_the_users_line():
    a, w = fp8((1, 512), 5), fp8((16, 512), 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mmaemu.scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32, splitk=(3, "contiguous"))  # line: call
        mmaemu.get_preset("b200_mma_sync")  # line: preset
        mmaemu.resolve_splitk(12, 512, 8192, a_dtype="e4m3", b_dtype="e4m3", out_dtype=torch.float32,  # line: split
                              use_fast_accum=True, profile="ada-te")
    lines = {str(w.category.__name__): (w.filename, w.lineno) for w in caught}
    assert [w.category for w in caught] == [UnverifiedSplitWarning, ExperimentalPresetWarning,
                                            UnverifiedSplitWarning]
    assert [(w.filename, w.lineno) for w in caught] == [
        (__file__, _line_of("# line: call")), (__file__, _line_of("# line: preset")),
        (__file__, _line_of("# line: split"))], lines


def test_a_patch_block_warns_at_the_torch_call():
    a, w = fp8((1, 512), 7), fp8((16, 512), 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mmaemu.patch(splitk=(3, "contiguous")):
            torch._scaled_mm(a, w.t(), ONE, ONE, out_dtype=torch.float32)  # line: torch
    split = [x for x in caught if issubclass(x.category, UnverifiedSplitWarning)]
    assert [(x.filename, x.lineno) for x in split] == [(__file__, _line_of("# line: torch"))]


def test_every_direct_warning_of_the_package_finds_the_users_line():
    """Outside mmaemu.warn, a module that calls warnings.warn itself (a loader that must warn at once, not as a
    notice of the call being planned) passes ``stacklevel=user_stacklevel()``: the one frame finder, never a
    counted stack level (issue 17.1)."""
    import ast
    import pathlib

    package = pathlib.Path(mmaemu.__file__).resolve().parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "warn.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings"):
                level = next((k.value for k in node.keywords if k.arg == "stacklevel"), None)
                if not (isinstance(level, ast.Call) and getattr(level.func, "id", None) == "user_stacklevel"):
                    offenders.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert offenders == [], "report a Notice, or warn with stacklevel=user_stacklevel(): " + "; ".join(offenders)
