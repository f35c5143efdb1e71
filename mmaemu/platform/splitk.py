"""Split-K decisions: which numSplitsK S and reduction scheme the reference cuBLASLt uses (platform.md section 3).

``resolve_splitk`` applies the steps of platform.md 3.1-3.10 in order; the first step that decides wins:

1. explicit ``splitk`` (3.1; S bounded by :func:`check_split_count`);  2. workspace 0 never splits (3.2);
3. no table → error, zero size → S = 1 (3.3);  4. the recorded table row (3.4);
5. the live cuBLASLt query on the reference GPU itself (3.5);
6. the envelope inference of S = 1 for large outputs, unless strict (3.9);  7. SplitKUnknownError (3.10), or,
   under the policy ``splitk="assume-unsplit"`` (not strict), S = 1 with source "assumed-unsplit", never verified,
   an AssumedUnsplitWarning and a note with the table's evidence about unsplit calls of the setting.

``splitk="auto"`` follows ``$MMAEMU_SPLITK_POLICY`` when that is set ("auto" or "assume-unsplit").

Evidence: the tables and their json (``codes["custom -> scheme"]``, ``settings``, ``envelope``,
``split_layouts``, ``workspace0_note``) and the verified-combos files, see :mod:`mmaemu.platform.tables` and the
data README. Warnings (3.8, 3.9): UnverifiedSplitWarning / UnvalidatedEnvelopeWarning once per process per key;
:func:`decide_splitk` returns them as data, :func:`resolve_splitk` reports them (:mod:`mmaemu.warn`).

The scheme/preset compatibility (semantics.md d.3) is not checked here but by the planner, through
:func:`check_scheme_for_preset`.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import List, NamedTuple, Optional, Tuple

from .. import formats
from ..context import Context, context_of
from ..arith.params import CONTIGUOUS_TILE, INTERLEAVED_TILE, require_gemm_level
from ..errors import AssumedUnsplitWarning, SplitKUnknownError, UnvalidatedEnvelopeWarning, UnverifiedSplitWarning
from ..model.presets import SPLIT_SCHEMES, split_schemes
from ..warn import Notice, report
from .definitions import builtin_profiles
from .profiles import Profile, get_profile, out_dtype_name, splitk_maturity_note

__all__ = [
    "SplitK",
    "SplitDecision",
    "SplitOutcome",
    "decide_splitk",
    "resolve_splitk",
    "check_scheme_for_preset",
    "check_splitk_argument",
    "check_split_count",
    "layout_caveats",
    "SCHEMES",
    "SPLIT_SCHEMES",
    "SOURCES",
    "ASSUME_UNSPLIT",
    "POLICIES",
    "POLICY_ENV",
    "asks_one_split",
    "ENVELOPE_MARGIN",
]

SCHEMES = ("none",) + SPLIT_SCHEMES
SOURCES = ("explicit", "workspace0", "table", "live-query", "envelope", "assumed-unsplit", "kernel")
# The string values of ``splitk``: both decide from the evidence where it decides; where it does not, "auto" raises
# and "assume-unsplit" takes S = 1 with a warning (an explicit user choice, never the default).
ASSUME_UNSPLIT = "assume-unsplit"
POLICIES = ("auto", ASSUME_UNSPLIT)
POLICY_ENV = "MMAEMU_SPLITK_POLICY"  # replaces splitk="auto" (mmaemu.environment)


def asks_one_split(splitk) -> bool:
    """True for the ``splitk`` values a kernel without split-K accepts: the policies (the kernel decides, and it
    never splits), 1, ``(1, "none")`` and a decision with S = 1. The one rule for torch's row-wise kernel, its
    layer and the block-wise layer."""
    if isinstance(splitk, str):
        return splitk in POLICIES
    if isinstance(splitk, bool):
        return False
    if isinstance(splitk, (tuple, list)):
        return len(splitk) == 2 and splitk[0] == 1 and splitk[1] == "none"
    return getattr(splitk, "S", splitk) == 1
# platform.md 3.9 (RTX 4060): S = 1 only above 2x the largest recorded split M*N (peer choice; the RTX 4060 was
# seen splitting up to 1.27x the largest recorded split M*N).
ENVELOPE_MARGIN = 2
# The k-tile width of each split scheme (semantics.md d.1, d.2): the unit a split owns.
SCHEME_K_TILE = {"contiguous": CONTIGUOUS_TILE, "serial": INTERLEAVED_TILE, "pairwise": INTERLEAVED_TILE}
EXPLICIT_NOTE = "given by the caller"
ZERO_SIZE_NOTE = "zero-size GEMM: nothing is accumulated"
RECORD_COMMAND = "python -m mmaemu record"  # docs/recording.md
DEFAULT_WORKSPACE0_NOTE = ("cuBLASLt never splits without a workspace (0 split rows among the 209,712 "
                           "workspace-0 queries recorded on the RTX 4060)")


# ----------------------------------------------------------------------------------------------------------------
# Values


@dataclasses.dataclass(frozen=True)
class SplitK:
    """A split configuration: S partial accumulators combined by ``scheme`` (semantics.md d).

    S is an int >= 1 (numpy integers accepted, bool refused); S = 1 requires "none", S > 1 one of "serial",
    "pairwise", "contiguous". Anything else raises ValueError.
    """

    S: int = 1
    scheme: str = "none"

    def __post_init__(self):
        S = self.S
        if isinstance(S, bool) or not isinstance(S, numbers.Integral):
            raise ValueError(f"SplitK.S must be an int >= 1, got {S!r}")
        S = int(S)
        if S < 1:
            raise ValueError(f"SplitK.S must be an int >= 1, got {S}")
        if S == 1 and self.scheme != "none":
            raise ValueError(f"SplitK(S=1) has no reduction: scheme must be 'none', got {self.scheme!r}")
        if S > 1 and self.scheme not in SPLIT_SCHEMES:
            raise ValueError(f"SplitK(S={S}) needs a scheme among {SPLIT_SCHEMES}, got {self.scheme!r}")
        object.__setattr__(self, "S", S)


@dataclasses.dataclass(frozen=True)
class SplitDecision:
    """The outcome of :func:`resolve_splitk` (platform.md section 3).

    ``verified``: the (fast, S, scheme, out, format pair) was replayed on hardware and nothing about this split lies
    outside what was replayed. ``source``: the step that decided (see SOURCES). ``table_id``: the table consulted
    (None for explicit and live-query decisions). ``note``: human-readable evidence.
    """

    S: int
    scheme: str
    source: str
    verified: bool
    table_id: Optional[str]
    note: str

    @property
    def splitk(self) -> SplitK:
        return SplitK(self.S, self.scheme)


@dataclasses.dataclass(frozen=True)
class _Call:
    """The normalised split-K key of one call (platform.md section 2) and its profile."""

    M: int
    N: int
    K: int
    fa: str
    fb: str
    out: str
    fast: bool
    profile: Profile
    # the mmaemu.context.Context of the decision (None: the environment now); not part of the call's key
    context: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def pair(self) -> str:
        return f"{self.fa}x{self.fb}"

    @property
    def ws(self) -> Optional[int]:
        return self.profile.workspace_bytes

    @property
    def setting_text(self) -> str:
        return f"ws {self.ws}, out {self.out}, {'fast' if self.fast else 'slow'}, {self.pair}"


class SplitOutcome(NamedTuple):
    """A split decision and the warnings it calls for (:class:`mmaemu.warn.Notice`, once per process per key)."""

    decision: SplitDecision
    warnings: Tuple[Notice, ...]


_Pending = List[Notice]
STRICT_ENV = "MMAEMU_SPLITK_STRICT"


# ----------------------------------------------------------------------------------------------------------------
# Entry point


def resolve_splitk(M, N, K, *, a_dtype, b_dtype, out_dtype, use_fast_accum, profile=None, splitk="auto",
                   layout_std=True, strict=None, context=None) -> SplitDecision:
    """Decide S and the reduction scheme of a call (platform.md 3.1-3.10, in that order): :func:`decide_splitk`,
    whose warnings are reported (:func:`mmaemu.warn.report`: once per process per key, at the caller's line;
    recorded instead inside :func:`mmaemu.warn.collecting`)."""
    outcome = decide_splitk(M, N, K, a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype,
                            use_fast_accum=use_fast_accum, profile=profile, splitk=splitk, layout_std=layout_std,
                            strict=strict, context=context)
    report(outcome.warnings)
    return outcome.decision


def decide_splitk(M, N, K, *, a_dtype, b_dtype, out_dtype, use_fast_accum, profile=None, splitk="auto",
                  layout_std=True, strict=None, context=None) -> SplitOutcome:
    """The split decision of a call and its warnings, as data (nothing is emitted).

    ``splitk``: "auto" (``$MMAEMU_SPLITK_POLICY`` when set), "assume-unsplit" (S = 1 where the evidence does not
    decide, warning AssumedUnsplitWarning), 1, (S, scheme) or a SplitK.
    ``a_dtype``/``b_dtype``: float8 dtypes or "e4m3"/"e5m2" (mat1, mat2); ``out_dtype`` None means a_dtype;
    ``layout_std`` False skips the table and the live query (padded leading dimensions, section 2); ``strict``
    None reads MMAEMU_SPLITK_STRICT (a boolean: 1/true/yes/on). The variables are those of ``context`` (a
    :class:`mmaemu.context.Context`; without one, the environment as it is now), the profile and the tables come
    from its sources (without one, the process's).
    Raises SplitKUnknownError when the evidence cannot decide, ValueError/TypeError for a bad ``splitk``.
    """
    context = context_of(context)  # the public entry point: every step below is given this one context
    call = _normalise_call(M, N, K, a_dtype, b_dtype, out_dtype, use_fast_accum, profile, context)
    env = context.environment
    pending: _Pending = []
    if isinstance(splitk, str) and splitk == "auto":
        splitk = policy_from_environment(env)
    if not (isinstance(splitk, str) and splitk in POLICIES):
        decision = _explicit(call, splitk, pending)
    else:
        if strict is None:
            strict = strict_from_environment(env)
        decision = _auto(call, layout_std, bool(strict), pending, assume_unsplit=splitk == ASSUME_UNSPLIT)
    return SplitOutcome(decision, tuple(pending))


def strict_from_environment(env) -> bool:
    """``$MMAEMU_SPLITK_STRICT`` of the snapshot ``env`` (a decision's :attr:`mmaemu.context.Context.environment`)
    as a boolean (1/true/yes/on, 0/false/no/off; unset: False). Another value raises ValueError: a strict mode that
    a typo turned off would be a silent guess."""
    if STRICT_ENV in env.invalid:
        raise ValueError(f"{STRICT_ENV}={env.raw[STRICT_ENV]!r}: {env.invalid[STRICT_ENV]} (or unset it)")
    return bool(env[STRICT_ENV])


def policy_from_environment(env) -> str:
    """The policy that ``splitk="auto"`` stands for: ``$MMAEMU_SPLITK_POLICY`` of the snapshot ``env`` (a decision's
    :attr:`mmaemu.context.Context.environment`; one of POLICIES), unset or empty: "auto". ValueError for another
    value."""
    value = env[POLICY_ENV] or "auto"
    if value not in POLICIES:
        raise ValueError(f"{POLICY_ENV}={value!r} is not a split-K policy: use one of "
                         + ", ".join(repr(p) for p in POLICIES) + " (or unset it)")
    return value


def _auto(call: _Call, layout_std: bool, strict: bool, pending: _Pending,
          assume_unsplit: bool = False) -> SplitDecision:
    """Steps 3.2-3.10 for splitk="auto"; with ``assume_unsplit``, S = 1 instead of 3.10's error."""
    profile = call.profile
    if profile.workspace_bytes == 0:
        return _workspace0(call)
    if profile.workspace_bytes is None or profile.splitk_table is None:
        return _undecided(call, None, "no reference platform and no split-K table", strict, assume_unsplit,
                          pending)
    if min(call.M, call.N, call.K) == 0:
        return SplitDecision(1, "none", "envelope", True, profile.splitk_table, ZERO_SIZE_NOTE)
    table = _table(call.context, profile.splitk_table)
    if layout_std:  # the recordings were made with ld = K (section 2)
        decision = _table_row(call, table, pending) or _live_answer(call, table, pending)
        if decision is not None:
            return decision
    decision, envelope_reason = _envelope(call, table, strict, pending)
    if decision is not None:
        return decision
    return _undecided(call, table, _not_recorded_reason(layout_std) + envelope_reason, strict, assume_unsplit,
                      pending)


def _not_recorded_reason(layout_std: bool) -> str:
    if layout_std:
        return "the key is not in the recorded table, no live cuBLASLt query answered on this machine, and "
    return "non-standard layout (padded leading dimension): the table and the live query do not apply, and "


# ----------------------------------------------------------------------------------------------------------------
# 3.1 Explicit


def _explicit(call: _Call, splitk, pending: _Pending) -> SplitDecision:
    sk = _as_splitk(splitk, call.profile)
    check_split_count(sk, call.K, call.profile, context=call.context)
    caveats: List[str] = []
    verified = True
    table_id = call.profile.splitk_table
    if sk.S > 1:
        table = _table(call.context, table_id) if table_id is not None else None
        caveats = layout_caveats(sk.S, sk.scheme, call.K, table.ragged_k_verified if table else False)
        in_set = table is not None and table.is_verified(call.fast, sk.S, sk.scheme, call.out, call.fa, call.fb)
        verified = in_set and not caveats
        # Peer exception (3.1): an explicit H100 contiguous split with K > 262,144 gets no extra caveat.
        _queue_unverified(call, sk.S, sk.scheme, "explicit", verified, in_set, caveats, table is not None,
                          pending)
    note = "; ".join([EXPLICIT_NOTE] + caveats)
    return SplitDecision(sk.S, sk.scheme, "explicit", verified, None, note)


def _as_splitk(splitk, profile: Profile) -> SplitK:
    """The SplitK of an explicit argument: SplitK, int (1 only), or (S, scheme); TypeError otherwise."""
    if isinstance(splitk, SplitK):
        return splitk
    if isinstance(splitk, numbers.Integral) and not isinstance(splitk, bool):
        S = int(splitk)
        if S == 1:
            return SplitK(1, "none")
        if S > 1:
            raise ValueError(f"splitk={S} needs a reduction scheme: pass splitk={_scheme_hint(profile, S)} "
                             f"(profile {profile.name}, preset {profile.preset_name})")
        raise ValueError(f"splitk must be >= 1, got {S}")
    if isinstance(splitk, tuple) and len(splitk) == 2:
        return SplitK(*splitk)
    raise TypeError(f"splitk must be 'auto', {ASSUME_UNSPLIT!r}, 1, a (S, scheme) tuple or a mmaemu.SplitK, "
                    f"got {splitk!r}")


def check_splitk_argument(splitk, profile=None, *, context=None) -> None:
    """Refuse a ``splitk`` argument that every call would refuse, before any call (``mmaemu.patch`` and the ``nn``
    layers use it, with the context of their edge).

    "auto" and "assume-unsplit" pass; otherwise the form of 3.1 (TypeError / ValueError as at call time) and,
    when ``profile`` is given (a name or Profile; None: not known yet), the scheme its preset computes (semantics.md
    d.3). Bounds that depend on the call's K are checked per call. The profile (for None, ``$MMAEMU_PROFILE``'s,
    named in the error's hint) is resolved in ``context`` (a :class:`mmaemu.context.Context`; None, a caller
    outside the edge: the context of this moment, :func:`mmaemu.platform.profiles.get_profile`'s).
    """
    if isinstance(splitk, str) and splitk in POLICIES:
        return
    resolved = get_profile(profile, context=context)
    sk = _as_splitk(splitk, resolved)
    if profile is not None:
        check_scheme_for_preset(sk, resolved.preset)


def check_split_count(splitk: SplitK, K: int, profile: Profile, *, context=None) -> None:
    """Refuse an explicit S that no reference could use: S must be at most max(T, R) (mmaemu's bound, not in 3.1).

    T = ceil(K / w) is the number of k-tiles of the scheme's width w (128 contiguous, 64 serial/pairwise,
    semantics.md d.1/d.2): beyond T, every further split owns no k-tile (contiguous) or only zero padding
    (serial/pairwise) and adds a +0 partial, which no recorded cuBLASLt call ever did. R is the largest numSplitsK
    the profile's cuBLASLt was recorded using (table rows and replayed live calls: 24 on the H100 PCIe, 32 on the
    RTX 4060; for a profile without recordings, the largest of any shipped table), so that the small-K splits
    with empty splits that the contract describes (K = 384 with S = 4 or 7) stay computable, with their warning.
    Without a bound, S = 2**40 would run for ever and S = 2**63 overflow the compiled loops. R is read from the
    tables of ``context`` (a :class:`mmaemu.context.Context`; without one, the process's).
    """
    S = splitk.S
    if S == 1:
        return
    width = SCHEME_K_TILE[splitk.scheme]
    tiles = -(-K // width)
    if S <= tiles:
        return
    recorded, where = _recorded_max_splits(profile, context)
    bound = max(tiles, recorded)
    if S > bound:
        raise ValueError(
            f"splitk=({S}, {splitk.scheme!r}) asks for more splits than a reference GPU can use with K = {K}: S must "
            f"be at most {bound} = max(T, R), with T = {tiles} the {width}-wide k-tiles of the {splitk.scheme} "
            f"scheme (one per split) and R = {recorded} the largest numSplitsK cuBLASLt was recorded using "
            f"({where}); pass a smaller S (splits beyond T own no k-tile and only add +0)")


def _recorded_max_splits(profile: Profile, context=None) -> Tuple[int, str]:
    """(R, where it was recorded) of :func:`check_split_count`."""
    if profile.splitk_table is not None:
        return (_table(context, profile.splitk_table).max_recorded_splits,
                f"{profile.gpu_name}, profile {profile.name}")
    # The built-in profiles' tables only: a bundle a user loads must not move the bound of other profiles.
    table_ids = sorted({p.splitk_table for p in builtin_profiles() if p.splitk_table})
    recorded = max(_table(context, t).max_recorded_splits for t in table_ids)
    return recorded, f"the largest in any shipped table; profile {profile.name} has none"


# ----------------------------------------------------------------------------------------------------------------
# 3.2 Workspace 0


def _workspace0(call: _Call) -> SplitDecision:
    table_id = call.profile.splitk_table
    note = _table(call.context, table_id).workspace0_note if table_id is not None else None
    return SplitDecision(1, "none", "workspace0", True, table_id, note or DEFAULT_WORKSPACE0_NOTE)


# ----------------------------------------------------------------------------------------------------------------
# 3.4 / 3.5 Heuristic answers (table row or live query)


def _table_row(call: _Call, table, pending: _Pending) -> Optional[SplitDecision]:
    """3.4: the recorded row of the exact key, if any."""
    row = table.lookup(call.M, call.N, call.K, call.fa, call.fb, call.out, call.fast, call.ws)
    if row is None:
        return None
    note = f"table row: algo {row.algo}, tile {row.tile}, numSplitsK {row.splitK}, customOption {row.custom}"
    return _heuristic_decision(call, table, row.splitK, row.custom, "table", table.table_id, note, pending)


def _live_answer(call: _Call, table, pending: _Pending) -> Optional[SplitDecision]:
    """3.5: ask the loaded cuBLASLt, only when the current device is the profile's reference GPU (3.6)."""
    if not call.profile.matches_device(context=call.context):
        return None
    from . import heuristic  # lazy: numpy and NVIDIA's bindings are only needed on the reference GPU

    answer = heuristic.live_heuristic(call.profile, call.M, call.N, call.K, call.fa, call.fb, call.out, call.fast)
    if answer is None:
        return None
    note = (f"live cuBLASLt query on {call.profile.gpu_name}: algo {answer.algo}, tile {answer.tile}, "
            f"numSplitsK {answer.splitK}, customOption {answer.custom}")
    return _heuristic_decision(call, table, answer.splitK, answer.custom, "live-query", None, note, pending)


def _heuristic_decision(call: _Call, table, split_k: int, custom: int, source: str, table_id: Optional[str],
                        note: str, pending: _Pending) -> SplitDecision:
    """S = numSplitsK; scheme from customOption via the json's map; caveats and verification as 3.4/3.7."""
    S = max(int(split_k), 1)  # numSplitsK 1 (never 0 in the recordings) means "not split"
    if S == 1:
        return SplitDecision(1, "none", source, True, table_id, note)
    scheme, caveats = _scheme_of_custom(table, custom)
    caveats += layout_caveats(S, scheme, call.K, table.ragged_k_verified)
    in_set = table.is_verified(call.fast, S, scheme, call.out, call.fa, call.fb)
    verified = in_set and not caveats
    _queue_unverified(call, S, scheme, source, verified, in_set, caveats, True, pending)
    return SplitDecision(S, scheme, source, verified, table_id, "; ".join([note] + caveats))


def _scheme_of_custom(table, custom: int) -> Tuple[str, List[str]]:
    """codes["custom -> scheme"]; a missing customOption takes "custom -> scheme, unlisted" with a caveat
    (H100: 4 and 5 → contiguous), or "serial" without caveat when the json has no such key (RTX 4060)."""
    mapped = table.custom_to_scheme.get(str(custom))
    if mapped is not None:
        return mapped, []
    if table.unlisted_scheme is not None:
        recorded = ", ".join(sorted(table.custom_to_scheme, key=int))
        return table.unlisted_scheme, [f"customOption {custom} was never recorded on a split call "
                                       f"(recorded: {recorded})"]
    return "serial", []


# ----------------------------------------------------------------------------------------------------------------
# 3.7 Layout caveats


def layout_caveats(S: int, scheme: str, K: int, ragged_k_verified: bool) -> List[str]:
    """Caveats of a contiguous split (platform.md 3.7); each forces verified = False.

    * K % 128 != 0 unless the json's ``split_layouts.ragged_K.verified`` (H100: true, 1,040 live calls);
    * (S - 1) * ceil(T / S) >= T with T = ceil(K / 128): some split owns no k-tile (never recorded).
    """
    if scheme != "contiguous" or S <= 1:
        return []
    caveats = []
    tiles = -(-K // CONTIGUOUS_TILE)
    if K % CONTIGUOUS_TILE and not ragged_k_verified:
        caveats.append(f"K = {K} is not a multiple of {CONTIGUOUS_TILE} (ragged last k-tile; never recorded)")
    if (S - 1) * -(-tiles // S) >= tiles:
        caveats.append(f"S = {S} leaves a split without k-tiles (K = {K}, {tiles} k-tiles; never recorded)")
    return caveats


# ----------------------------------------------------------------------------------------------------------------
# 3.9 Envelopes


def _envelope(call: _Call, table, strict: bool, pending: _Pending) -> Tuple[Optional[SplitDecision], str]:
    """(decision, "") when the envelope infers S = 1, else (None, reason)."""
    envelope = table.envelope
    if envelope.get("inference", True) is False:
        return None, "the table disables envelope inference"
    if envelope.get("kind", "max_split_MN") == "k_grid":
        return _k_grid_envelope(call, table, strict, pending)
    return _max_split_mn_envelope(call, table, strict)


def _k_grid_envelope(call: _Call, table, strict: bool, pending: _Pending):
    """H100: S = 1 if M*N > B(setting, K), B taken at the smallest grid K >= K (``envelope.bounds``)."""
    env = table.envelope
    K_min, K_max = env["K_min"], env["K_max"]
    if not K_min <= call.K <= K_max:
        return None, f"K = {call.K} is outside the envelope's K range [{K_min:,}, {K_max:,}]"
    bounds = table.envelope_bounds(call.ws, call.out, call.fast, call.fa, call.fb)
    if bounds is None:
        return None, f"the envelope has no bound for the setting ({call.setting_text})"
    i = _smallest_at_least(env["K_grid"], call.K)
    bound, grid_K = bounds[i], env["K_grid"][i]
    if bound is None:
        return None, f"the envelope has no bound at grid K = {grid_K} for the setting ({call.setting_text})"
    MN = call.M * call.N
    if MN <= bound:
        return None, (f"M*N = {MN:,} is not above the envelope bound B = {bound:,} of the setting "
                      f"({call.setting_text}) at grid K = {grid_K}")
    if strict:
        return None, _strict_reason(MN, f"the envelope bound B = {bound:,}")
    validation = env.get("validation", {}).get(str(call.ws), {})
    validated = validation.get("status") == "validated"
    note = (f"inference: M*N = {MN:,} is above the envelope bound B = {bound:,} of setting ({call.setting_text}) "
            f"at grid K = {grid_K}; {_validation_text(call.ws, validation)}")
    decision = SplitDecision(1, "none", "envelope", validated, table.table_id, note)
    if not validated:
        reason = ("S = 1 inferred by an envelope without a passed held-out test: "
                  + _validation_text(call.ws, validation))
        message = _warning_text(call, 1, "none", "envelope", reason)
        pending.append(Notice(UnvalidatedEnvelopeWarning, message,
                              (call.profile.name, call.ws, call.out, call.fast, call.pair)))
    return decision, ""


def _smallest_at_least(grid, K) -> int:
    return next(i for i, value in enumerate(grid) if value >= K)


def _validation_text(ws, validation: dict) -> str:
    status = validation.get("status", "without held-out validation")
    text = f"envelope {status} at ws {ws}"
    if "tested" in validation:
        text += (f" ({validation['tested']:,} held-out shapes above the bound, "
                 f"{validation.get('split_above_bound', 0)} split")
        failures = validation.get("failures") or []
        text += "".join(f"; M={f['M']}, N={f['N']}, K={f['K']}, {f['fmt_a']}x{f['fmt_b']} -> {f['out']}, "
                        f"{'fast' if f['fast'] else 'slow'}: S={f['splitK']}, customOption {f['custom']}"
                        for f in failures)
        text += ")"
    return text


def _max_split_mn_envelope(call: _Call, table, strict: bool):
    """RTX 4060: S = 1 iff M*N > ENVELOPE_MARGIN x max_split_MN of the setting (or of the union over outputs)."""
    entry = table.setting(call.ws, call.out, call.fast, call.fa, call.fb)
    if entry is not None:
        entries, label = [entry], f"setting entry: {entry['split_rows']} split rows of {entry['rows']}"
    else:
        entries = table.settings_over_outputs(call.ws, call.fast, call.fa, call.fb)
        label = ("union over output dtypes " + ", ".join(e["out"] for e in entries)
                 + f": {sum(e['split_rows'] for e in entries)} split rows of {sum(e['rows'] for e in entries)}")
    if not entries:
        return None, f"the table has no rows for this setting ({call.setting_text})"
    MN = call.M * call.N
    split_entries = [e for e in entries if e["split_rows"]]
    if not split_entries:
        if strict:
            return None, _strict_reason(MN, "the setting's absence of split rows")
        note = f"inference: setting ({call.setting_text}) has no split rows [{label}]"
        return SplitDecision(1, "none", "envelope", True, table.table_id, note), ""
    largest = max(e["max_split_MN"] for e in split_entries)
    bound = ENVELOPE_MARGIN * largest
    if MN <= bound:
        return None, (f"M*N = {MN:,} is not above the inference bound {ENVELOPE_MARGIN} x {largest:,} = {bound:,} "
                      f"of the setting ({call.setting_text})")
    if strict:
        return None, _strict_reason(MN, f"the inference bound {ENVELOPE_MARGIN} x {largest:,} = {bound:,}")
    note = (f"inference: M*N = {MN:,} is above the inference bound {ENVELOPE_MARGIN} x {largest:,} = {bound:,} "
            f"of setting ({call.setting_text}) [{label}]")
    return SplitDecision(1, "none", "envelope", True, table.table_id, note), ""


def _strict_reason(MN: int, basis: str) -> str:
    return (f"strict mode (MMAEMU_SPLITK_STRICT=1 or strict=True) refuses the envelope inference of S = 1 "
            f"(M*N = {MN:,}, from {basis})")


# ----------------------------------------------------------------------------------------------------------------
# 3.10 Undecided: SplitKUnknownError, or S = 1 under splitk="assume-unsplit"


def _undecided(call: _Call, table, reason: str, strict: bool, assume_unsplit: bool,
               pending: _Pending) -> SplitDecision:
    """What is left when no step decides: the error of 3.10 ("auto", or strict mode), else the assumption."""
    if not assume_unsplit:
        raise _unknown(call, reason)
    if strict:
        raise _unknown(call, f"{reason}; strict mode (MMAEMU_SPLITK_STRICT=1 or strict=True) refuses "
                             f"splitk={ASSUME_UNSPLIT!r}")
    note = (f"assumed (splitk={ASSUME_UNSPLIT!r}), not recorded: {reason}; evidence: "
            + _unsplit_evidence_text(call, table))
    _queue_assumed(call, note, pending)
    return SplitDecision(1, "none", "assumed-unsplit", False, call.profile.splitk_table, note)


def _unsplit_evidence_text(call: _Call, table) -> str:
    """What the table's rows of the call's setting say about unsplit calls, and where this call lies."""
    if table is None:
        return f"profile {call.profile.name} has no split-K table, nothing was recorded"
    facts = table.unsplit_evidence(call.ws, call.out, call.fast, call.fa, call.fb)
    where = f"table {table.table_id}, setting ({call.setting_text})"
    if facts is None:
        return f"{where} has no recorded rows"
    head = f"{where}: {facts.rows:,} rows with K {facts.K_min:,} to {facts.K_max:,}"
    K, MN = call.K, call.M * call.N
    below_range = " and below the recorded K range" if K < facts.K_min else ""
    if facts.K_split_min is None:
        return f"{head}, none split; this call's K = {K:,}{below_range}, M*N = {MN:,}"
    K_text = (f"no row with K <= {facts.K_unsplit_max:,} splits (the first split is at K = {facts.K_split_min:,})"
              if facts.K_unsplit_max is not None else f"rows split already at the smallest K = {facts.K_min:,}")
    MN_text = (f"no row with M*N >= {facts.MN_unsplit_min:,} splits (the largest split M*N is "
               f"{facts.MN_split_max:,})" if facts.MN_unsplit_min is not None
               else f"the row of the largest M*N ({facts.MN_split_max:,}) splits")
    where_call = []
    if K < facts.K_split_min:
        where_call.append(f"this call's K = {K:,} is below every split K{below_range}")
    if MN > facts.MN_split_max:
        where_call.append(f"this call's M*N = {MN:,} is above every split M*N")
    if not where_call:
        where_call.append(f"this call (K = {K:,}, M*N = {MN:,}) lies where rows of the setting split: the table "
                          "does not support the assumption there")
    return f"{head}; {K_text}; {MN_text}; " + "; ".join(where_call)


# 3.10 Unknown


def _unknown(call: _Call, reason: str) -> SplitKUnknownError:
    profile = call.profile
    hint = _scheme_hint(profile)
    state = (f"pass splitk={hint} to state the split" if hint is not None
             else f"splitk=(S, scheme) is unavailable: preset {profile.preset_name} has no split-K")
    if profile.gpu_name is not None:
        record = (f"run the call on the reference GPU ({profile.gpu_name}, {profile.sm_count} SMs, cuBLASLt "
                  f"{profile.cublaslt_version}), where mmaemu asks cuBLASLt directly (pip install 'mmaemu[record]'), "
                  f"or record more shapes there with `{RECORD_COMMAND} --shapes FILE` and load the bundle "
                  "(mmaemu.load_profile(PATH) or MMAEMU_PROFILE_PATH)")
    else:
        record = (f"record the GPU you emulate with `{RECORD_COMMAND}` on it (pip install 'mmaemu[record]') and load "
                  "the bundle with mmaemu.load_profile(PATH) or MMAEMU_PROFILE_PATH")
    return SplitKUnknownError(
        f"cannot decide split-K for M={call.M}, N={call.N}, K={call.K} ({call.fa} x {call.fb} -> {call.out}, "
        f"{'fast' if call.fast else 'slow'} accumulation, workspace {call.ws}) on profile {profile.name!r}: "
        f"{reason}. Ways out: pass splitk=1 if you know cuBLASLt does not split this call; {state}; or {record}."
    )


def _scheme_hint(profile: Profile, S=None) -> Optional[str]:
    """"(S, 'contiguous')" etc. for the profile's preset; None when the preset has no split-K at all."""
    preset = _get_preset(profile.preset)
    if not preset.has_gemm_level:
        return None
    schemes = split_schemes(preset)
    first = "S" if S is None else str(S)
    return f"({first}, " + "|".join(f"'{s}'" for s in schemes) + ")"


# ----------------------------------------------------------------------------------------------------------------
# Scheme / preset compatibility (semantics.md d.3), for the planner


def _get_preset(name_or_preset):
    # Imported on use: mmaemu.model's package import pulls in the numba arithmetic, which a table decision does
    # not need (the first decision of a process stays well under 0.5 s).
    from ..model.presets import get_preset

    return get_preset(name_or_preset, warn=False)


def check_scheme_for_preset(splitk, preset) -> None:
    """Refuse a split the preset does not compute (semantics.md d.3).

    ``splitk``: SplitK or SplitDecision; ``preset``: a name or Preset. S = 1 always passes. A preset without GEMM
    level (b200_mma_sync) refuses any split with UnsupportedFeatureError; hopper accepts only "contiguous", ada only
    "serial"/"pairwise" (ValueError otherwise); a custom preset (not registered, or maturity "custom") any scheme.
    """
    sk = splitk.splitk if isinstance(splitk, SplitDecision) else splitk
    if not isinstance(sk, SplitK):
        raise TypeError(f"expected a SplitK or SplitDecision, got {splitk!r}")
    if sk.S == 1:
        return
    p = _get_preset(preset)
    require_gemm_level(p, True, sk.S)
    accepted = split_schemes(p)
    if sk.scheme not in accepted:
        raise ValueError(f"preset {p.name!r} computes split-K only with scheme "
                         + " or ".join(repr(s) for s in accepted)
                         + f", not {sk.scheme!r}: pass splitk=({sk.S}, {accepted[0]!r})")


# ----------------------------------------------------------------------------------------------------------------
# 3.8 Warnings (once per process per key)

def _queue_unverified(call: _Call, S: int, scheme: str, source: str, verified: bool, in_set: bool,
                      caveats: List[str], has_table: bool, pending: _Pending) -> None:
    """UnverifiedSplitWarning for S > 1 when unverified, or on a profile whose splitk_maturity is experimental."""
    experimental = call.profile.splitk_maturity == "experimental"
    if S <= 1 or (verified and not experimental):
        return
    reasons = list(caveats)
    if not in_set:
        reasons.append("this (fast, S, scheme, out, format pair) combination was never replayed on hardware"
                       if has_table else f"profile {call.profile.name} has no split-K evidence (no table)")
    if experimental:
        note = splitk_maturity_note(call.profile)
        reasons.append(f"split-K decisions with S > 1 of profile {call.profile.name} are experimental"
                       + (f" ({note})" if note else ""))
    key = (call.profile.name, call.fast, S, scheme, call.out, call.pair, tuple(caveats))
    pending.append(Notice(UnverifiedSplitWarning, _warning_text(call, S, scheme, source, "; ".join(reasons)), key))


def _warning_text(call: _Call, S: int, scheme: str, source: str, reason: str) -> str:
    return (f"mmaemu split-K S={S} scheme={scheme} ({'fast' if call.fast else 'slow'} accumulation, out {call.out}, "
            f"{call.pair}, source {source}, profile {call.profile.name}): {reason}")


def _queue_assumed(call: _Call, note: str, pending: _Pending) -> None:
    """AssumedUnsplitWarning of an assumed S = 1: once per process per shape and setting."""
    key = (call.profile.name, call.ws, call.M, call.N, call.K, call.out, call.fast, call.pair)
    message = _warning_text(call, 1, "none", "assumed-unsplit", f"M={call.M}, N={call.N}, K={call.K}: {note}")
    pending.append(Notice(AssumedUnsplitWarning, message, key))


# ----------------------------------------------------------------------------------------------------------------
# Argument normalisation


def _normalise_call(M, N, K, a_dtype, b_dtype, out_dtype, use_fast_accum, profile, context: Context) -> _Call:
    sizes = [_size(name, value) for name, value in (("M", M), ("N", N), ("K", K))]
    fa, fb = formats.fmt_of(a_dtype), formats.fmt_of(b_dtype)
    out = out_dtype_name(out_dtype) if out_dtype is not None else formats.TORCH_NAMES[fa]
    if not (isinstance(use_fast_accum, bool) or _is_numpy_bool(use_fast_accum)):
        raise TypeError(f"use_fast_accum must be a bool, got {use_fast_accum!r}")
    return _Call(*sizes, fa, fb, out, bool(use_fast_accum), get_profile(profile, context=context), context)


def _is_numpy_bool(value) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")


def _size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _table(context, table_id: str):
    """The split-K table ``table_id`` from the table source of ``context`` (:func:`mmaemu.platform.tables.tables_of`:
    the context's, or the process's package data and loaded bundles)."""
    from .tables import tables_of  # lazy: numpy and the package data load on the first table decision

    return tables_of(context)(table_id)

