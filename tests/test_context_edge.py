"""Only the edge reads the environment: a decision, a planned call and the layers below take their facts from the
context they are given (issue 30 item 3).

While the environment readers of :mod:`mmaemu.environment` refuse (every reading goes through them:
``tests/test_environment.py`` scans the package for others), a call given its context plans and computes; the
public entry points still take the context of the moment when given none, once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu import backends, environment
from mmaemu.api import run_scaled_mm_plan
from mmaemu.context import Context
from mmaemu.cpu.engine import accumulate_codes, cpu_engine_choice
from mmaemu.model.presets import HOPPER
from mmaemu.plan import cache
from mmaemu.plan.planner import plan_accumulate, plan_scaled_mm
from mmaemu.platform.profiles import get_profile
from mmaemu.platform.splitk import check_splitk_argument

READERS = ("snapshot", "texts", "set_variables", "problems")
BLOCKWISE = "hopper-cublaslt-blockwise-experimental"


def context_of(**variables) -> Context:
    return Context(environment.snapshot(variables))


class EnvironmentRead(AssertionError):
    pass


@pytest.fixture
def no_environment(monkeypatch):
    """Every reader of the MMAEMU_* variables raises (built contexts are given before this fixture is used)."""

    def refuse(*args, **kwargs):
        raise EnvironmentRead("the environment was read below the edge")

    def install():
        for name in READERS:
            monkeypatch.setattr(environment, name, refuse)

    return install


def _tensorwise():
    a = torch.full((4, 64), 0.5).to(torch.float8_e4m3fn)
    b = torch.full((16, 64), -0.25).to(torch.float8_e4m3fn).t()
    return a, b, torch.tensor(1.0), torch.tensor(2.0)


def _rowwise():
    a, b, _, _ = _tensorwise()
    return a, b, torch.full((4, 1), 0.5), torch.full((1, 16), 2.0)


def _blockwise_e5m2():
    """A block-wise call with an E5M2 A (1x128 x 1x128): its chunks go to the CPU engine's accumulate_codes."""
    rng = np.random.default_rng(5)
    M, K, N = 16, 256, 16
    a = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(torch.float8_e5m2)
    b = torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)).to(torch.float8_e4m3fn)
    sa = torch.from_numpy(rng.uniform(0.25, 4.0, (M, K // 128)).astype(np.float32)).t().contiguous().t()
    sb = torch.from_numpy(rng.uniform(0.25, 4.0, (N, K // 128)).astype(np.float32)).t().contiguous()
    return a, b.t(), sa, sb


CALLS = {"tensorwise": (_tensorwise, {}), "rowwise": (_rowwise, {}),
         "blockwise-e5m2": (_blockwise_e5m2, {"profile": BLOCKWISE})}


@pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning", "ignore::mmaemu.AssumedUnsplitWarning")
@pytest.mark.parametrize("engine", ["tile", "auto"])
@pytest.mark.parametrize("recipe", list(CALLS))
def test_a_planned_call_given_its_context_reads_no_environment(no_environment, monkeypatch, recipe, engine):
    """Planned and computed with an explicit context (the profile, the split policy and the CPU engine from it,
    "auto" split and backend): no reading of the environment, and the same bits as the public call that reads
    the same variables at its edge."""
    operands, options = CALLS[recipe]
    args = operands()
    variables = dict(MMAEMU_CPU_ENGINE=engine, MMAEMU_SPLITK_POLICY="assume-unsplit")  # K = 64: no recording
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    want = mmaemu.scaled_mm(*args, out_dtype=torch.bfloat16, **options)  # compiled; the cache folder opened
    context = context_of(**variables)
    no_environment()
    plan = plan_scaled_mm(*args, out_dtype=torch.bfloat16, **options, context=context)
    got = run_scaled_mm_plan(plan)
    assert plan.context.environment is context.environment
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_an_accumulate_plan_given_its_context_reads_no_environment(no_environment):
    a, b, _, _ = _tensorwise()
    context = context_of(MMAEMU_PROFILE="ada", MMAEMU_BACKEND="reference")
    no_environment()
    plan = plan_accumulate(a, b.t(), use_fast_accum=False, splitk=1, context=context)
    assert (plan.profile.name, plan.backend) == ("ada", "reference")


def test_the_decisions_given_a_context_read_no_environment(no_environment):
    schedule = (64, 1, 0, 0, 0, 0)
    codes = np.full((2, 64), 0x38, np.uint8)
    tile = context_of(MMAEMU_CPU_ENGINE="tile", MMAEMU_BACKEND="reference", MMAEMU_DISABLE_CUDA="1",
                      MMAEMU_PROFILE="ada")
    want = accumulate_codes(codes, codes, "e4m3", "e4m3", HOPPER, True, cpu_engine="tile")
    no_environment()
    assert cpu_engine_choice(HOPPER, schedule, "e4m3", "e4m3", context=tile).engine == "tile"
    assert np.array_equal(accumulate_codes(codes, codes, "e4m3", "e4m3", HOPPER, True, context=tile), want)
    assert backends.requested_backend("auto", context=tile) == "reference"
    assert backends.cuda_disabled(context=tile) is True
    assert get_profile(None, context=tile).name == "ada"
    check_splitk_argument(1, None, context=tile)
    with pytest.raises(ValueError, match=r"splitk=2 needs a reduction scheme: .*\(profile ada,"):
        check_splitk_argument(2, None, context=tile)  # the hint names the context's profile
    for call in (lambda: backends.requested_backend("auto"), lambda: backends.cuda_disabled(),
                 lambda: check_splitk_argument(2), lambda: accumulate_codes(codes, codes, "e4m3", "e4m3", HOPPER,
                                                                            True)):
        with pytest.raises(EnvironmentRead):  # without a context, a public entry point reads it at its edge
            call()


def test_the_public_defaults_read_the_moment(monkeypatch):
    monkeypatch.setenv("MMAEMU_BACKEND", "reference")
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "yes")
    monkeypatch.setenv("MMAEMU_PROFILE", "ada")
    assert backends.requested_backend("auto") == "reference" and backends.cuda_disabled() is True
    with pytest.raises(ValueError, match=r"\(profile ada,"):
        check_splitk_argument(2)


def test_a_recorded_profile_name_is_resolved_in_the_calls_one_context(monkeypatch):
    """The plan cache resolves a profile that is no built-in name (here an unknown one, which raises as the
    planner does) in the call's context: one reading of the environment, not one per lookup."""
    readings = []
    real = environment.snapshot

    def counting(environ=None):
        readings.append(environ)
        return real(environ)

    a, b, one, two = _tensorwise()
    monkeypatch.setattr(environment, "snapshot", counting)
    cache.clear()
    with pytest.raises(KeyError, match="unknown profile 'no-such-profile'"):
        mmaemu.scaled_mm(a, b, one, two, out_dtype=torch.bfloat16, profile="no-such-profile")
    assert readings == [None]
