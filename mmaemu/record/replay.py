"""Replays, the evidence of a recording: the real FP8 GEMM on the GPU against mmaemu's emulation of the recorded
decision, compared bit for bit on every output.

For every distinct (S, customOption, out, fast, format pair) among the recorded split rows at torch's workspace,
and for one unsplit row of every (out, fast, format pair), the smallest such shape is run on random and on
adversarial operands (the generators of the CUDA self-test, :func:`mmaemu.cuda.verdicts.selftest.gemm_operands`). The
GPU computes ``torch._scaled_mm``; mmaemu computes the same call with ``splitk=(S, scheme)`` for each scheme the
preset can compute, so the replays also tell which reduction scheme a customOption selects on this GPU:

* a customOption maps to the scheme that reproduced every one of its replays (ambiguity is reported);
* a (fast, S, scheme, out, pair) combination is verified when a replay of it passed and none failed;
* a replay that no scheme reproduces is a finding: its operands, scales and both outputs are kept.

The GPU side and the emulation are functions handed in (``gpu_gemm``, ``emulate``), so the comparison logic runs on
CPU tensors in the tests.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from ..formats import DTYPE_OF
from ..platform.profiles import FORMATS, OUT_DTYPES

__all__ = ["ReplayCase", "ReplayResult", "replay_cases", "case_operands", "run_replays", "summarise",
           "torch_gemm", "mmaemu_emulation", "DATA_KINDS"]

DATA_KINDS = ("random", "adversarial")
# Scales of the replays: random data with scales other than one (the epilogue multiplies them in), adversarial
# data with unit scales (its extremes would overflow otherwise).
_SCALES = {"random": (0.5, 1.25), "adversarial": (1.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class ReplayCase:
    """One recorded decision to replay: the key (mat1 [M, K] fa x mat2 [K, N] fb -> out, fast) and its S and
    customOption at workspace ``ws``, on operands of kind ``data``."""

    S: int
    custom: int
    out: str
    fast: bool
    fa: str
    fb: str
    M: int
    N: int
    K: int
    ws: int
    data: str
    seed: int

    @property
    def group(self) -> tuple:
        return (self.S, self.custom, self.out, self.fast, self.fa, self.fb)

    @property
    def macs(self) -> int:
        return self.M * self.N * self.K

    def label(self) -> str:
        return (f"S={self.S} custom {self.custom} {self.fa}x{self.fb}->{self.out} "
                f"{'fast' if self.fast else 'slow'} M={self.M} N={self.N} K={self.K} {self.data}")


@dataclasses.dataclass
class ReplayResult:
    """What a replay showed: mismatching outputs per candidate scheme (None: the emulation refused the call,
    with ``errors[scheme]``), the GPU's error if it failed, and the outputs when nothing matched."""

    case: ReplayCase
    mismatches: Dict[str, Optional[int]]
    errors: Dict[str, str]
    seconds: float
    gpu_error: Optional[str] = None
    kept: Optional[dict] = None  # operands, scales and outputs of a finding

    @property
    def matched(self) -> List[str]:
        return [scheme for scheme, count in self.mismatches.items() if count == 0]


def replay_cases(cols: dict, workspaces: List[int], ws: int, max_macs: int) -> List[ReplayCase]:
    """The cases of a recorded table at workspace ``ws``: every split group and one unsplit row per (out, fast,
    pair), each at its smallest M*N*K not above ``max_macs`` (if any), on every data kind; smallest first."""
    at_ws = cols["ws"] == workspaces.index(ws)
    macs = cols["M"].astype(np.int64) * cols["N"] * cols["K"]
    eligible = at_ws & (macs <= max_macs)
    chosen: Dict[tuple, int] = {}
    for r in np.flatnonzero(eligible)[np.argsort(macs[eligible], kind="stable")]:
        S = int(cols["splitK"][r])
        key = (S, int(cols["custom"][r]) if S > 1 else 0, int(cols["out"][r]), int(cols["fast"][r]),
               int(cols["fa"][r]), int(cols["fb"][r]))
        chosen.setdefault(key, int(r))
    cases = []
    for n, (key, r) in enumerate(sorted(chosen.items(), key=lambda item: (macs[item[1]], item[0]))):
        S, custom, out, fast, fa, fb = key
        for data in DATA_KINDS:
            cases.append(ReplayCase(S, custom, OUT_DTYPES[out], bool(fast), FORMATS[fa],
                                    FORMATS[fb], int(cols["M"][r]), int(cols["N"][r]), int(cols["K"][r]), ws, data,
                                    1000 + 2 * n + DATA_KINDS.index(data)))
    return cases


def case_operands(case: ReplayCase, preset: str):
    """(a_codes [M, K], b_codes [N, K]) uint8 of a replay, from the self-test's generators."""
    from ..cuda.verdicts.selftest import GemmCase, gemm_operands

    return gemm_operands(GemmCase(case.label(), preset, case.fa, case.fb, case.fast, 1, "none", case.M, case.N,
                                  case.K, case.data, case.seed))


def run_replays(cases: List[ReplayCase], preset: str, schemes_of: Callable[[int], List[str]], gpu_gemm: Callable,
                emulate: Callable, deadline: Optional[float] = None, progress=None) -> List[ReplayResult]:
    """Replay ``cases`` until done or ``deadline``; ``gpu_gemm(case, a, b, scale_a, scale_b)`` and
    ``emulate(case, a, b, scale_a, scale_b, splitk)`` return the output's bits as integer numpy arrays [M, N]."""
    from ..cuda.verdicts.selftest import compare_bits

    results = []
    for n, case in enumerate(cases):
        if deadline is not None and time.monotonic() >= deadline:
            break
        start = time.monotonic()
        a, b = case_operands(case, preset)
        scale_a, scale_b = _SCALES[case.data]
        mismatches, errors, outputs = {}, {}, {}
        try:
            gpu = gpu_gemm(case, a, b, scale_a, scale_b)
        except Exception as exc:  # recorded: the combination stays unverified
            results.append(ReplayResult(case, {}, {}, time.monotonic() - start, f"{type(exc).__name__}: {exc}"))
            continue
        for scheme in schemes_of(case.S):
            try:
                outputs[scheme] = emulate(case, a, b, scale_a, scale_b, 1 if case.S == 1 else (case.S, scheme))
                mismatches[scheme] = compare_bits(gpu, outputs[scheme])[0]
            except Exception as exc:
                mismatches[scheme], errors[scheme] = None, f"{type(exc).__name__}: {exc}"
        result = ReplayResult(case, mismatches, errors, time.monotonic() - start)
        if not result.matched:
            result.kept = {"a": a, "b": b, "scale_a": np.float32(scale_a), "scale_b": np.float32(scale_b),
                           "gpu": gpu, **{f"emulated_{s}": o for s, o in outputs.items()}}
        results.append(result)
        if progress is not None:
            progress.update(n + 1, n + 1)
    return results


def summarise(results: List[ReplayResult], preset_schemes: List[str]) -> dict:
    """The customOption -> scheme map, the verified combinations, pass/fail counts and the findings."""
    by_custom: Dict[int, set] = {}
    for r in results:
        if r.case.S > 1 and r.gpu_error is None:
            matched = set(r.matched)
            by_custom[r.case.custom] = by_custom.get(r.case.custom, matched) & matched
    custom_map, ambiguous = {}, {}
    for custom, schemes in sorted(by_custom.items()):
        ordered = [s for s in preset_schemes if s in schemes]
        if ordered:
            custom_map[str(custom)] = ordered[0]
            if len(ordered) > 1:
                ambiguous[str(custom)] = ordered
    passed = failed = 0
    groups: Dict[tuple, bool] = {}
    for r in results:
        want = "none" if r.case.S == 1 else custom_map.get(str(r.case.custom))
        ok = r.gpu_error is None and want in r.matched
        passed, failed = passed + ok, failed + (not ok)
        groups[r.case.group] = groups.get(r.case.group, True) and ok
    return {"custom_to_scheme": custom_map, "ambiguous": ambiguous, "passed": passed, "failed": failed,
            "groups": groups}


# ----------------------------------------------------------------------------------------------------------------
# The two sides on a real machine


def _bits(torch, t) -> np.ndarray:
    from ..testing import bits

    return bits(t.detach().cpu()).numpy()


def torch_gemm(device):
    """``gpu_gemm`` running torch._scaled_mm on ``device`` (mat2 column-major, as the recorded key assumes)."""
    import torch

    def run(case, a, b, scale_a, scale_b):
        mat1 = torch.from_numpy(a).view(DTYPE_OF[case.fa]).to(device)
        mat2 = torch.from_numpy(b).view(DTYPE_OF[case.fb]).to(device).t()
        sa = torch.tensor(scale_a, dtype=torch.float32, device=device)
        sb = torch.tensor(scale_b, dtype=torch.float32, device=device)
        out = torch._scaled_mm(mat1, mat2, sa, sb, out_dtype=getattr(torch, case.out), use_fast_accum=case.fast)
        return _bits(torch, out)

    return run


def mmaemu_emulation(preset: str, capability):
    """``emulate`` computing mmaemu.scaled_mm on CPU tensors with the recording's ``preset`` and the explicit
    split, through a profile of the preset alone (GPU of compute ``capability``, no platform facts: a replay always
    states its split); the unverified-split warnings of that profile are not shown."""
    import warnings

    import torch

    from .. import api
    from ..platform.profiles import Profile

    profile = Profile("record-replay", preset, gpu_name=None, capability=tuple(capability), sm_count=None,
                      cublaslt_version=None, caller="torch._scaled_mm", torch_version=None, workspace_bytes=None,
                      align=None, splitk_table=None, rejects=(), maturity="validated", splitk_maturity="none")

    def run(case, a, b, scale_a, scale_b, splitk):
        mat1 = torch.from_numpy(a).view(DTYPE_OF[case.fa])
        mat2 = torch.from_numpy(b).view(DTYPE_OF[case.fb]).t()
        sa, sb = torch.tensor(scale_a, dtype=torch.float32), torch.tensor(scale_b, dtype=torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = api.scaled_mm(mat1, mat2, sa, sb, out_dtype=getattr(torch, case.out), use_fast_accum=case.fast,
                                profile=profile, splitk=splitk)
        return _bits(torch, out)

    return run
