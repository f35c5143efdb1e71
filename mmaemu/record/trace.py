"""What torch._scaled_mm really asks cuBLASLt, read from cuBLASLt's own trace log.

torch is installed as compiled code, so its descriptor is not read from its source: the recorder runs a few
``torch._scaled_mm`` calls with cuBLASLt's logger on (``CUBLASLT_LOG_LEVEL=2``: every cublasLtMatmul logs its
layouts, the non-default attributes of its matmul descriptor, the algorithm it runs and the workspace size it is
given) and checks them against the query it will issue (:func:`mmaemu.platform.heuristic.build_query`):

* the layouts (types, rows, cols, ld) of A, B, C and D are the query's;
* the descriptor sets compute type COMPUTE_32F, scale type R_32F, TRANSA = T, the A and B scale pointers, and
  one attribute that appears exactly on the use_fast_accum=True calls (FAST_ACCUM) -- any other attribute is a
  descriptor the recorder does not reproduce, and the recording is refused;
* the workspace is the same on every call: that is torch's cuBLASLt workspace in this environment (it depends on
  the torch version and on CUBLASLT_WORKSPACE_SIZE / CUBLAS_WORKSPACE_CONFIG / TORCH_CUBLASLT_UNIFIED_WORKSPACE);
* the algorithm torch ran equals the first answer of the recorder's own heuristic query for the same key with
  that workspace (algorithm id always; customOption, tile, stages, split count and reduction scheme whenever
  this cuBLASLt's log shows them).

The trace format is cuBLASLt's, not a stable interface: anything unexpected is reported, never guessed.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional

__all__ = ["TracedMatmul", "ProbeCall", "DescriptorCheck", "parse_matmul_trace", "check_descriptor",
           "BASE_DESCRIPTOR"]

_LINE = re.compile(r"\[Trace\]\[cublasLtMatmul\]\s*(.*)$")
_GROUP = re.compile(r"(\w+)=\[([^\]]*)\]")
_PAIR = re.compile(r"(\w+)=(\S+)")
# The matmul descriptor attributes of the recorder's query, as the trace names them, with their required values
# (None: any value, e.g. a pointer).
BASE_DESCRIPTOR = {"computeType": "COMPUTE_32F", "scaleType": "R_32F", "transa": "OP_T", "aScalePointer": None,
                   "bScalePointer": None}
# Attributes the trace may show at their default value, which the query leaves unset.
_DEFAULT_VALUED = {"transb": "OP_N", "aScaleMode": "SCALAR_32F", "bScaleMode": "SCALAR_32F",
                   "epilogue": "EPILOGUE_DEFAULT"}


@dataclasses.dataclass(frozen=True)
class TracedMatmul:
    """One ``[Trace][cublasLtMatmul]`` line: layouts by name (Adesc ... Ddesc), descriptor, algorithm, workspace."""

    layouts: Dict[str, Dict[str, str]]
    descriptor: Dict[str, str]
    algo: Dict[str, str]
    workspace_bytes: Optional[int]


@dataclasses.dataclass(frozen=True)
class ProbeCall:
    """One torch._scaled_mm call of the probe: mat1 [M, K] (fa) x mat2 [K, N] (fb) -> out; ``error`` is torch's
    message when it refused the call."""

    M: int
    N: int
    K: int
    fa: str
    fb: str
    out: str
    fast: bool
    error: Optional[str] = None


@dataclasses.dataclass
class DescriptorCheck:
    """The outcome: the workspace torch uses, the fast-accumulation attribute's name, what was compared, and the
    problems found (an empty list means the recorder's query is torch's)."""

    workspace_bytes: Optional[int]
    fast_attribute: Optional[str]
    compared_algo_fields: List[str]
    calls: int
    split_calls: int
    problems: List[str]

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def parse_matmul_trace(text: str) -> List[TracedMatmul]:
    """The cublasLtMatmul trace lines of a cuBLASLt log, in order."""
    out = []
    for line in text.splitlines():
        match = _LINE.search(line)
        if not match:
            continue
        body = match.group(1)
        groups = {name: dict(_PAIR.findall(content)) for name, content in _GROUP.findall(body)}
        rest = dict(_PAIR.findall(_GROUP.sub("", body)))
        workspace = rest.get("workSpaceSizeInBytes") or rest.get("workspaceSizeInBytes")
        out.append(TracedMatmul({k: groups.get(k, {}) for k in ("Adesc", "Bdesc", "Cdesc", "Ddesc")},
                                groups.get("computeDesc", {}), groups.get("algo", {}),
                                int(workspace) if workspace and workspace.isdigit() else None))
    return out


def check_descriptor(calls: List[ProbeCall], traced: List[TracedMatmul], query_of, answer_of,
                     enum_names) -> DescriptorCheck:
    """Compare the probe's traced calls with the recorder's queries.

    ``calls``: the probe's calls in order (refused ones have ``error`` set and no trace line); ``query_of(call,
    workspace)`` -> HeuristicQuery; ``answer_of(query)`` -> HeuristicAnswer or None; ``enum_names(field, value)``
    -> the vendor's enum name of a tile/stages/reduction value (or None).
    """
    ran = [c for c in calls if c.error is None]
    problems: List[str] = []
    if len(ran) != len(traced):
        problems.append(f"{len(ran)} probe calls ran but the cuBLASLt log holds {len(traced)} cublasLtMatmul trace "
                        "lines (is CUBLASLT_LOG_LEVEL honoured by this cuBLASLt?)")
        return DescriptorCheck(None, None, [], len(ran), 0, problems)
    workspaces = sorted({t.workspace_bytes for t in traced}, key=lambda w: -1 if w is None else w)
    if len(workspaces) != 1 or workspaces[0] is None:
        problems.append(f"the traced calls do not show one workspace size: {workspaces}")
    workspace = workspaces[0] if len(workspaces) == 1 else None
    fast_attribute = _fast_attribute(ran, traced, problems)
    fields = _shown_algo_fields(traced)
    split_calls = 0
    for call, trace in zip(ran, traced):
        query = query_of(call, workspace or 0)
        problems += _layout_problems(call, trace, query)
        problems += _descriptor_problems(call, trace, fast_attribute)
        answer = answer_of(query) if workspace is not None else None
        problems += _algo_problems(call, trace, answer, fields, enum_names)
        split_calls += answer is not None and answer.splitK > 1
    return DescriptorCheck(workspace, fast_attribute, fields, len(ran), split_calls, problems[:50])


def _label(call: ProbeCall) -> str:
    return (f"M={call.M} N={call.N} K={call.K} {call.fa}x{call.fb}->{call.out} "
            f"{'fast' if call.fast else 'slow'}")


def _fast_attribute(ran, traced, problems) -> Optional[str]:
    """The one descriptor attribute that tells the fast calls from the slow ones: the same value on every fast
    call, and absent or one other value on every slow call."""
    candidates = []
    keys = set().union(*(t.descriptor for t in traced)) - set(BASE_DESCRIPTOR) - set(_DEFAULT_VALUED)
    for key in sorted(keys):
        fast = {t.descriptor.get(key) for c, t in zip(ran, traced) if c.fast}
        slow = {t.descriptor.get(key) for c, t in zip(ran, traced) if not c.fast}
        if len(fast) == 1 and None not in fast and len(slow) <= 1 and not fast & slow:
            candidates.append(key)
    if len(candidates) != 1:
        problems.append(f"no single descriptor attribute marks the use_fast_accum=True calls (candidates: "
                        f"{candidates})")
        return None
    return candidates[0]


def _layout_problems(call, trace: TracedMatmul, query) -> List[str]:
    out = []
    for name, layout in (("Adesc", query.a), ("Bdesc", query.b), ("Cdesc", query.c), ("Ddesc", query.d)):
        want = {"type": layout.dtype.replace("CUDA_", "", 1), "rows": str(layout.rows), "cols": str(layout.cols),
                "ld": str(layout.ld)}
        got = {k: trace.layouts[name].get(k) for k in want}
        if got != want:
            out.append(f"{_label(call)}: {name} is {got}, the recorder queries {want}")
    return out


def _descriptor_problems(call, trace: TracedMatmul, fast_attribute) -> List[str]:
    out = []
    for key, value in BASE_DESCRIPTOR.items():
        if key not in trace.descriptor or (value is not None and trace.descriptor[key] != value):
            out.append(f"{_label(call)}: descriptor {key}={trace.descriptor.get(key)} (expected {value or 'set'})")
    for key, value in trace.descriptor.items():
        if key in BASE_DESCRIPTOR or key == fast_attribute:
            continue
        if _DEFAULT_VALUED.get(key) != value:
            out.append(f"{_label(call)}: torch sets descriptor attribute {key}={value}, which the recorder's query "
                       "does not set")
    return out


_ALGO_FIELDS = (("algoId", "algo"), ("customOption", "custom"), ("tile", "tile"), ("stages", "stages"),
                ("split", "splitK"), ("reduction", "reduction"))


def _traced_key(algo: Dict[str, str], field: str) -> Optional[str]:
    if field in ("algoId", "customOption", "tile", "stages"):
        return field if field in algo else None
    pattern = "split" if field == "split" else "reduction"
    return next((k for k in algo if pattern in k.lower()), None)


def _shown_algo_fields(traced: List[TracedMatmul]) -> List[str]:
    """algoId, and every other field some trace line shows (a field never shown cannot be compared)."""
    return [field for field, _ in _ALGO_FIELDS
            if field == "algoId" or any(_traced_key(t.algo, field) for t in traced)]


def _algo_problems(call, trace: TracedMatmul, answer, fields, enum_names) -> List[str]:
    if answer is None:
        return [f"{_label(call)}: the recorder's heuristic query gave no algorithm, torch ran {trace.algo}"]
    out = []
    for field, attr in _ALGO_FIELDS:
        if field not in fields:
            continue
        key = _traced_key(trace.algo, field)
        traced = trace.algo.get(key) if key else None
        ours = getattr(answer, attr)
        if field in ("tile", "stages", "reduction"):
            ours, traced = enum_names(field, ours), _enum_suffix(traced)
        elif traced is None:  # a numeric field the log leaves out at its default
            traced = "1" if field == "split" else "0"
        if ours is not None and traced is not None and str(ours) != str(traced):
            out.append(f"{_label(call)}: torch ran {field} {traced}, the recorder's query answers {ours}")
    return out


def _enum_suffix(value: Optional[str]) -> Optional[str]:
    """"MATMUL_TILE_128x128" -> "TILE_128x128", "CUBLASLT_REDUCTION_SCHEME_NONE" -> "NONE" (vendor enum names)."""
    if value is None:
        return None
    for prefix in ("CUBLASLT_", "MATMUL_", "REDUCTION_SCHEME_"):
        if value.startswith(prefix):
            value = value[len(prefix):]
    return value
