"""Presets: the parameters of the one block multiply-accumulate algorithm (semantics.md (b)).

A preset names a hypothetical or measured tensor-core accumulation step. Every preset runs through the same
arithmetic (:mod:`mmaemu.arith`); a new one is a :class:`Preset` instance, a few lines of Python.

Evidence: ``hopper`` was fitted and validated on H100 PCIe cuBLAS FP8 GEMMs, ``ada`` on RTX 4060 recordings
and the Khattak-Mikaitis Ada vectors, ``b200_mma_sync`` fits the Khattak-Mikaitis B200 ``mma.sync`` vectors
only (experimental). The Blackwell GEMM instructions ``tcgen05_f8f6f4`` (B200/GB200 ``tcgen05.mma
kind::f8f6f4``) and ``sm120_mma_sync`` (RTX 50-series FP8 ``mma.sync``) are experimental: their parameters are
those of MMA-Sim's instruction models (PyPI ``mmasim``, arXiv:2511.10909), which the test suite checks bit for
bit; no hardware recording of them is available to this project.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from ..errors import ExperimentalPresetWarning
from ..warn import Notice, report

__all__ = ["Preset", "get_preset", "list_presets", "HOPPER", "ADA", "B200_MMA_SYNC", "TCGEN05_F8F6F4",
           "SM120_MMA_SYNC", "TCGEN05_MXF8F6F4", "SM120_MXF8F6F4", "TCGEN05_MXF4NVF4", "SM120_MXF4NVF4", "MATURITIES",
           "SPLIT_SCHEMES", "split_schemes"]

MATURITIES = ("validated", "experimental", "custom")

# The block sum S of a preset must stay exact in a signed 64-bit integer: every term is below 2**(frac+2)
# (a product lies below 2**(E+2)), so nfma * 2**(frac+2) + 2**(frac+1) < 2**62 is required.
_INT64_HEADROOM_BITS = 62


@dataclasses.dataclass(frozen=True)
class Preset:
    """One tensor-core block algorithm (semantics.md b.1-b.3).

    * ``nfma``: products per block (the block length).
    * ``frac``: fraction bits kept below the block's alignment exponent E (grid 2**(E - frac)).
    * ``frac_out``: fraction bits of the block result (truncated to frac_out + 1 significant bits).
    * ``min_exp``: lower clamp of E (only reachable through :func:`mmaemu.model.dot`).
    * ``late_c``: False = the accumulator takes part in the alignment; True = it is added afterwards with one
      fp32 round-to-nearest-even add.
    * ``slow_chunk``: the unsplit slow-accumulation restart length in K elements, or None when the preset has no
      GEMM level (slow accumulation and split-K then raise :class:`~mmaemu.errors.UnsupportedFeatureError`).
    * ``scale_kinds``: for a block-scaled instruction (semantics.md b.5), the accepted (elements of K per scale,
      scale format) pairs; empty for an unscaled preset. A block-scaled preset is evaluated by
      :func:`mmaemu.model.dot` with ``scale_a``/``scale_b`` and computes GEMMs only as block-scaled ``scaled_mm``
      calls, one chain of the instruction per output (:mod:`mmaemu.platform.block_scaled`); ``nfma`` is then the
      instruction's K.
    * ``group``: 0 = every product aligned on its own (the block algorithm); g > 0 = groups of g products summed
      exactly, then scaled and aligned as one term each (``kind::mxf4nvf4``).
    * ``operand_formats``: the element formats the instruction takes.
    """

    name: str
    nfma: int
    frac: int
    frac_out: int
    min_exp: int
    late_c: bool
    slow_chunk: Optional[int]
    maturity: str = "custom"
    validated_scope: str = ""
    evidence: Tuple[str, ...] = ()
    scale_kinds: Tuple[Tuple[int, str], ...] = ()
    group: int = 0
    operand_formats: Tuple[str, ...] = ("e4m3", "e5m2")

    def __post_init__(self):
        _check_int("nfma", self.nfma, 1, None)
        _check_int("frac", self.frac, 1, 40)
        _check_int("frac_out", self.frac_out, 1, 23)
        _check_int("min_exp", self.min_exp, -1000, 1000)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Preset.name must be a non-empty string")
        if not isinstance(self.late_c, bool):
            raise TypeError(f"Preset.late_c must be a bool, got {self.late_c!r}")
        if self.slow_chunk is not None:
            if isinstance(self.slow_chunk, bool) or not isinstance(self.slow_chunk, int) or self.slow_chunk < 1:
                raise ValueError(
                    f"Preset.slow_chunk must be None (no GEMM level) or a positive int, got {self.slow_chunk!r}"
                )
        if self.maturity not in MATURITIES:
            raise ValueError(f"Preset.maturity must be one of {MATURITIES}, got {self.maturity!r}")
        if self.nfma * 2 ** (self.frac + 2) + 2 ** (self.frac + 1) >= 2**_INT64_HEADROOM_BITS:
            raise ValueError(
                f"Preset {self.name!r}: nfma * 2**(frac + 2) must stay below 2**{_INT64_HEADROOM_BITS} so that the "
                f"block sum is exact in 64-bit integers (nfma={self.nfma}, frac={self.frac}); use a shorter block "
                "or fewer fraction bits"
            )
        object.__setattr__(self, "evidence", tuple(self.evidence))
        object.__setattr__(self, "scale_kinds", tuple((int(b), str(f)) for b, f in self.scale_kinds))
        object.__setattr__(self, "operand_formats", tuple(self.operand_formats))
        _check_int("group", self.group, 0, None)
        if self.group and (not self.scale_kinds or self.nfma % self.group):
            raise ValueError(f"Preset {self.name!r}: group={self.group} needs scale_kinds and must divide nfma")

    @property
    def block_scaled(self) -> bool:
        """Whether the preset models a block-scaled instruction (no unscaled GEMM schedule)."""
        return bool(self.scale_kinds)

    @property
    def has_gemm_level(self) -> bool:
        """Whether slow accumulation and split-K are characterised for this preset."""
        return self.slow_chunk is not None

    def variant(self, name: str, **changes) -> "Preset":
        """A custom preset: this one with ``changes`` applied (any field but ``name``), for prototyping a design.

        The result is ``maturity="custom"`` with no validated scope or evidence unless ``changes`` give them: a
        changed parameter is no longer what the hardware recordings validated. ``name`` must not be a shipped
        preset's name, alias or refused name (the once-per-name warnings and the error messages go by name).
        """
        if isinstance(name, str) and _is_reserved(name):
            raise ValueError(f"Preset.variant: {name!r} names a shipped preset; pick a name of your own")
        fields = {"maturity": "custom", "validated_scope": "", "evidence": ()}
        fields.update(changes)
        return dataclasses.replace(self, name=name, **fields)


def _check_int(field, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Preset.{field} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"Preset.{field} must be {bound}, got {value}")


HOPPER = Preset(
    "hopper", nfma=32, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128,
    maturity="validated",
    validated_scope="H100 PCIe cuBLAS FP8 GEMMs (nvjet kernels, algo 66), cuBLASLt 12.8.3.14",
    evidence=("H100 PCIe torch._scaled_mm recordings", "Khattak-Mikaitis H100/H200 wgmma vectors"),
)
ADA = Preset(
    "ada", nfma=16, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128,
    maturity="validated",
    validated_scope="RTX 4060 cuBLAS FP8 GEMMs, cuBLASLt 12.8.3.14",
    evidence=("RTX 4060 torch._scaled_mm recordings", "Khattak-Mikaitis Ada mma.sync vectors"),
)
B200_MMA_SYNC = Preset(
    "b200_mma_sync", nfma=32, frac=25, frac_out=23, min_exp=-133, late_c=True, slow_chunk=None,
    maturity="experimental",
    validated_scope="fits the Khattak-Mikaitis B200 mma.sync vectors; not B200 cuBLAS, not sm_120",
    evidence=("Khattak-Mikaitis B200 mma.sync vectors",),
)

# The Blackwell GEMM instructions, as MMA-Sim models them (mmasim 2.1.1, nv_ptx/sim.py): the products and the
# accumulator are aligned together (c takes part, as in hopper/ada), truncated to 25 fraction bits below the
# block's exponent, summed exactly, and the sum is truncated to an fp32 (23 fraction bits); zero terms get the
# exponent -133. A K = 32 FP8 instruction is one block of 32 products. MMA-Sim gives tcgen05.mma kind::f8f6f4 and
# the sm_120 mma.sync (kind::f8f6f4 and the sm_89-style FP8 shapes) the same parameters; they stay two presets
# because they are two instructions, which a hardware recording may yet tell apart. No GEMM level: how cuBLAS
# combines the instructions (slow accumulation, split-K) on these GPUs was never recorded.
_BLACKWELL_BLOCK = dict(nfma=32, frac=25, frac_out=23, min_exp=-133, late_c=False, slow_chunk=None,
                        maturity="experimental")
TCGEN05_F8F6F4 = Preset(
    "tcgen05_f8f6f4", **_BLACKWELL_BLOCK,
    validated_scope="B200/GB200 tcgen05.mma kind::f8f6f4 with an fp32 accumulator, instruction level as MMA-Sim "
                    "models it; no hardware recording here; not B200 cuBLAS, not B200 mma.sync",
    evidence=("MMA-Sim 2.1.1 model of tcgen05.mma kind::f8f6f4 (arXiv:2511.10909), checked bit for bit by the "
              "test suite",),
)
SM120_MMA_SYNC = Preset(
    "sm120_mma_sync", **_BLACKWELL_BLOCK,
    validated_scope="RTX 50-series (sm_120) FP8 mma.sync (m16n8k32, also kind::f8f6f4) with an fp32 accumulator, "
                    "instruction level as MMA-Sim models it; no hardware recording here; not RTX 50 cuBLAS",
    evidence=("MMA-Sim 2.1.1 model of the RTX Blackwell (sm_120) FP8 mma.sync (arXiv:2511.10909), checked bit for "
              "bit by the test suite",),
)


# The block-scaled Blackwell instructions, as MMA-Sim 2.1.1 models them (``TCGen05MMABlockScale`` and the sm_120
# ``MMABlockScale`` in nv_ptx/sim.py, arithmetic in arithmetic/fdpa.py): kind::mxf8f6f4 is the f8f6f4 block step
# with each product's exponent raised by its two UE8M0 scale exponents (one scale per 32 elements of K);
# kind::mxf4nvf4 (and kind::mxf4, which MMA-Sim computes the same way: the block-32 UE8M0 case here) sums groups
# of 16 FP4 products exactly, scales each group and fuses the groups with c at 35 fraction bits, zero terms
# taking the exponent -139. No hardware recording of either is available to this project.
_F8F6F4_OPERANDS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
_MX_BLOCK = dict(nfma=32, frac=25, frac_out=23, min_exp=-133, late_c=False, slow_chunk=None, maturity="experimental",
                 scale_kinds=((32, "ue8m0"),), operand_formats=_F8F6F4_OPERANDS)
_MX_FP4 = dict(nfma=64, frac=35, frac_out=23, min_exp=-139, late_c=False, slow_chunk=None, maturity="experimental",
               scale_kinds=((32, "ue8m0"), (16, "ue8m0"), (16, "ue4m3")), group=16, operand_formats=("e2m1",))
_MX_NOTE = ("no hardware recording here; GEMMs (scaled_mm MXFP8/NVFP4, profile 'b200-mx-experimental') are "
            "modelled as one chain of the instruction per output")


def _mx_preset(name: str, instruction: dict, scope: str, model: str) -> Preset:
    """A block-scaled preset of ``instruction``'s parameters whose evidence is MMA-Sim's ``model`` alone: its scope
    is ``scope`` and the note that no hardware recording backs it."""
    return Preset(name, **instruction, validated_scope=f"{scope}; {_MX_NOTE}",
                  evidence=(f"MMA-Sim 2.1.1 model of {model}, checked bit for bit by the test suite",))


TCGEN05_MXF8F6F4 = _mx_preset(
    "tcgen05_mxf8f6f4", _MX_BLOCK,
    "B200/GB200 tcgen05.mma kind::mxf8f6f4 block32 (UE8M0 scales) with an fp32 accumulator, as MMA-Sim models it",
    "tcgen05.mma kind::mxf8f6f4 (TCGen05MMABlockScale)")
SM120_MXF8F6F4 = _mx_preset(
    "sm120_mxf8f6f4", _MX_BLOCK,
    "RTX 50-series (sm_120) mma.sync m16n8k32 kind::mxf8f6f4 block32 (UE8M0 scales) with an fp32 accumulator, as "
    "MMA-Sim models it",
    "the sm_120 mma.sync kind::mxf8f6f4 (MMABlockScale)")
TCGEN05_MXF4NVF4 = _mx_preset(
    "tcgen05_mxf4nvf4", _MX_FP4,
    "B200/GB200 tcgen05.mma kind::mxf4nvf4 (block16 UE4M3 or UE8M0, block32 UE8M0) and kind::mxf4 with an fp32 "
    "accumulator, as MMA-Sim models it (35 kept bits: weak evidence)",
    "tcgen05.mma kind::mxf4nvf4 / kind::mxf4 (TCGen05MMABlockScale)")
SM120_MXF4NVF4 = _mx_preset(
    "sm120_mxf4nvf4", _MX_FP4,
    "RTX 50-series (sm_120) mma.sync m16n8k64 kind::mxf4nvf4 (block16 UE4M3 or UE8M0, block32 UE8M0) and "
    "kind::mxf4 with an fp32 accumulator, as MMA-Sim models it (35 kept bits: weak evidence)",
    "the sm_120 mma.sync kind::mxf4nvf4 / kind::mxf4 (MMABlockScale)")


_REGISTRY = {p.name: p for p in (ADA, B200_MMA_SYNC, HOPPER, SM120_MMA_SYNC, SM120_MXF4NVF4, SM120_MXF8F6F4,
                                 TCGEN05_F8F6F4, TCGEN05_MXF4NVF4, TCGEN05_MXF8F6F4)}
_ALIASES = {"blackwell": "b200_mma_sync"}
# Names that do not say which instruction they mean (an RTX 50 GPU has several FP8 paths, and a name of a GPU or
# of an architecture is not a name of an arithmetic): refused, pointing to the instruction presets.
_REFUSED = {"sm_120", "sm120", "rtx_blackwell", "rtx-blackwell", "rtx5070ti", "rtx_5070_ti"}
_ALIAS_NOTE = ("; 'blackwell' names the B200's mma.sync instruction, not what Blackwell GEMMs run: B200/GB200 "
               "GEMMs use tcgen05.mma (preset 'tcgen05_f8f6f4'), RTX 50-series FP8 mma.sync is 'sm120_mma_sync'")
_REFUSED_MESSAGE = (
    "preset {name!r} is refused: it names a GPU, not a tensor-core instruction. RTX 50-series (sm_120) FP8 "
    "mma.sync is modelled, experimentally, by preset 'sm120_mma_sync' (profile 'sm120-mma-sync-experimental'); "
    "B200/GB200 tcgen05.mma by 'tcgen05_f8f6f4' (profile 'tcgen05-f8f6f4-experimental'); known presets: {known}"
)

def list_presets(*, with_maturity: bool = False):
    """Names of the registered presets, sorted, aliases excluded: ['ada', 'b200_mma_sync', 'hopper',
    'sm120_mma_sync', 'sm120_mxf4nvf4', 'sm120_mxf8f6f4', 'tcgen05_f8f6f4', 'tcgen05_mxf4nvf4', 'tcgen05_mxf8f6f4'];
    with ``with_maturity=True`` a dict {name: maturity} in that order."""
    names = sorted(_REGISTRY)
    if with_maturity:
        return {name: _REGISTRY[name].maturity for name in names}
    return names


def describe() -> List[dict]:
    """Every registered preset as ``{name, maturity, scope, aliases}``, sorted by name (``mmaemu info``)."""
    return [{"name": p.name, "maturity": p.maturity, "scope": p.validated_scope,
             "aliases": sorted(a for a, target in _ALIASES.items() if target == p.name)}
            for p in (_REGISTRY[name] for name in list_presets())]


def is_registered(preset: Preset) -> bool:
    """True for the shipped preset objects themselves (custom copies with the same name are not)."""
    return _REGISTRY.get(preset.name) is preset


# The split-K schemes of semantics.md (d), in the order the error messages list them.
SPLIT_SCHEMES = ("serial", "pairwise", "contiguous")
# semantics.md d.3: the schemes each shipped preset's GEMM level computes.
_SPLIT_SCHEMES_OF = {"hopper": ("contiguous",), "ada": ("serial", "pairwise")}


def split_schemes(preset: Preset) -> Tuple[str, ...]:
    """The split-K schemes ``preset`` computes (semantics.md d.3): hopper "contiguous", ada "serial" and
    "pairwise"; every scheme for a custom preset (not registered, or maturity "custom") and for a shipped preset
    without GEMM level, whose refusal of any split comes first (:func:`mmaemu.arith.params.require_gemm_level`)."""
    if not is_registered(preset) or preset.maturity == "custom":
        return SPLIT_SCHEMES
    return _SPLIT_SCHEMES_OF.get(preset.name, SPLIT_SCHEMES)


def _is_reserved(name: str) -> bool:
    key = name.strip().lower()
    return key in _REGISTRY or key in _ALIASES or key in _REFUSED


def get_preset(name_or_preset, *, warn=True) -> Preset:
    """The preset of a name (case-insensitive, alias ``blackwell``) or a :class:`Preset` returned as is.

    Non-validated presets warn once per process per name (:class:`~mmaemu.errors.ExperimentalPresetWarning`);
    the alias ``blackwell`` warns on every lookup. Unknown and refused names raise KeyError.
    """
    if isinstance(name_or_preset, Preset):
        preset = name_or_preset
        alias = False
    elif isinstance(name_or_preset, str):
        key = name_or_preset.strip().lower()
        if key in _REFUSED:
            raise KeyError(_REFUSED_MESSAGE.format(name=name_or_preset, known=list_presets()))
        alias = key in _ALIASES
        key = _ALIASES.get(key, key)
        if key not in _REGISTRY:
            raise KeyError(f"unknown preset {name_or_preset!r}; known presets: {list_presets()}")
        preset = _REGISTRY[key]
    else:
        raise TypeError(f"preset must be a name or a mmaemu.Preset, got {type(name_or_preset).__name__}")
    if warn:
        warn_if_not_validated(preset, every_time=alias, note=_ALIAS_NOTE if alias else "")
    return preset


def maturity_message(preset: Preset) -> Optional[str]:
    """The warning text for a non-validated preset, None for a validated one."""
    if preset.maturity == "validated":
        return None
    label = "experimental" if preset.maturity == "experimental" else "custom (not validated)"
    scope = f" ({preset.validated_scope})" if preset.validated_scope else ""
    evidence = f"; evidence: {'; '.join(preset.evidence)}" if preset.evidence else ""
    return (f"mmaemu preset {preset.name!r} is {label}{scope}: its bits are not validated against hardware GEMMs"
            f"{evidence}")


def maturity_notices(preset: Preset, *, every_time=False, note="") -> Tuple[Notice, ...]:
    """The ExperimentalPresetWarning of a non-validated preset, once per process per preset name (every time if
    asked; it still takes the name's slot), as data; ``note`` is appended to the message."""
    message = maturity_message(preset)
    if message is None:
        return ()
    return (Notice(ExperimentalPresetWarning, message + note, (preset.name,), repeat=every_time),)


def warn_if_not_validated(preset: Preset, *, every_time=False, note=""):
    """Report :func:`maturity_notices` (:func:`mmaemu.warn.report`: emitted at the caller's line)."""
    report(maturity_notices(preset, every_time=every_time, note=note))
