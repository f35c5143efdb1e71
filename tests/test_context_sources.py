"""The sources of a context (mmaemu.context): a split decision reads its split-K tables, and a profile lookup its
recorded profiles, from the context it is given, never from the process's own sources when the context names
others (no layer reads the environment itself: tests/test_environment.py).

The recorded bundles named by a context's MMAEMU_PROFILE_PATH are tested in tests/test_record.py, beside the
fixture that records one.
"""

from __future__ import annotations

import dataclasses

import pytest

from mmaemu import environment
from mmaemu.context import Context
from mmaemu.platform import bundles, tables
from mmaemu.platform.definitions import builtin_profile_names
from mmaemu.platform.profiles import get_profile, list_profiles
from mmaemu.platform.splitk import decide_splitk
from mmaemu.platform.tables import TableRow, get_table

H100_ID = "heur_h100pcie_lt12.8.3.14"
# A recorded split row of the H100 table (tests/test_splitk.py: test_example_hopper_split_row).
SPLIT_KEY = dict(a_dtype="e4m3", b_dtype="e4m3", out_dtype="float32", use_fast_accum=False)


def context_of(variables=None, **sources) -> Context:
    return Context(environment.snapshot(variables or {}), **sources)


class UnsplitRows:
    """A substitute for a recorded table: the real one's facts, but every row says numSplitsK 1."""

    def __init__(self, table):
        self._table = table

    def __getattr__(self, name):
        return getattr(self._table, name)

    def lookup(self, *key):
        return TableRow(1, 0, 0, 0)


def test_a_split_decision_reads_the_tables_of_its_context(monkeypatch):
    real = get_table(H100_ID)
    process = decide_splitk(48, 64, 5760, **SPLIT_KEY, profile="hopper").decision
    assert (process.S, process.source) == (2, "table")
    asked = []

    def substitute(table_id):
        asked.append(table_id)
        return UnsplitRows(real)

    def refuse(table_id):
        raise AssertionError(f"the process's table {table_id!r} was read")

    monkeypatch.setattr(tables, "get_table", refuse)
    context = context_of(tables=substitute)
    decision = decide_splitk(48, 64, 5760, **SPLIT_KEY, profile="hopper", context=context).decision
    assert (decision.S, decision.source) == (1, "table") and "numSplitsK 1" in decision.note
    # the explicit split's bound R and the workspace-0 note come from the same source
    explicit = decide_splitk(16, 256, 384, **SPLIT_KEY, profile="hopper", splitk=(4, "contiguous"),
                             context=context).decision
    assert (explicit.S, explicit.source) == (4, "explicit")
    ws0 = decide_splitk(48, 64, 5760, **SPLIT_KEY, profile="hopper-ws0", context=context).decision
    assert ws0.source == "workspace0" and ws0.note == real.workspace0_note
    assert asked and set(asked) == {H100_ID}
    with pytest.raises(AssertionError, match="the process's table"):
        decide_splitk(48, 64, 5760, **SPLIT_KEY, profile="hopper", context=context_of())


def test_a_profile_lookup_reads_the_recorded_profiles_of_its_context(monkeypatch):
    offered = dataclasses.replace(get_profile("hopper"), name="offered-h100")
    asked = []

    def recorded(value):
        asked.append(value)
        return {offered.name: offered}

    def refuse(value):
        raise AssertionError(f"the process's bundles were loaded for {value!r}")

    monkeypatch.setattr(bundles, "load_profile_path", refuse)
    context = context_of({"MMAEMU_PROFILE_PATH": "/no/such/shelf", "MMAEMU_PROFILE": "offered-h100"},
                         recorded=recorded)
    assert get_profile("offered-h100", context=context) is offered
    assert get_profile(None, context=context) is offered
    assert get_profile("hopper", context=context).name == "hopper"  # the built-in ones stay first
    assert list_profiles(context=context)[-1] == "offered-h100"
    with pytest.raises(KeyError, match=r"unknown profile 'nope'; known profiles: \[") as unknown:
        get_profile("nope", context=context)
    assert unknown.value.args[0].endswith("'offered-h100']")  # no refused bundles: the process's were not read
    assert decide_splitk(48, 64, 5760, **SPLIT_KEY, profile="offered-h100", context=context).decision.S == 2
    assert asked and set(asked) == {"/no/such/shelf"}  # the context's value of the variable
    with pytest.raises(AssertionError, match="bundles were loaded for ''"):
        list_profiles(context=context_of())  # no source named: the process's, which loads its bundles


def test_the_process_source_offers_a_read_only_view_in_the_order_added(monkeypatch):
    monkeypatch.delenv("MMAEMU_PROFILE_PATH", raising=False)
    view = bundles.recorded_of(None)("")
    assert list_profiles()[len(builtin_profile_names()):] == list(view)
    with pytest.raises(TypeError):
        view["x"] = get_profile("hopper")
    assert bundles.recorded_of(context_of()) is bundles.recorded_profiles
    assert tables.tables_of(None) is get_table and tables.tables_of(context_of()) is get_table
