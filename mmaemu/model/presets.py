"""Presets: the parameters of the one block multiply-accumulate algorithm (semantics.md (b)).

A preset names a hypothetical or measured tensor-core accumulation step. Every preset runs through the same
arithmetic (:mod:`mmaemu.arith`); a new one is a :class:`Preset` instance, a few lines of Python.

Evidence: ``hopper`` was fitted and validated on H100 PCIe cuBLAS FP8 GEMMs, ``ada`` on RTX 4060 recordings
and the Khattak-Mikaitis Ada vectors, ``b200_mma_sync`` fits the Khattak-Mikaitis B200 ``mma.sync`` vectors
only (experimental).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Optional, Tuple

from ..errors import ExperimentalPresetWarning

__all__ = ["Preset", "get_preset", "list_presets", "HOPPER", "ADA", "B200_MMA_SYNC", "MATURITIES"]

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

    @property
    def has_gemm_level(self) -> bool:
        """Whether slow accumulation and split-K are characterised for this preset."""
        return self.slow_chunk is not None


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

_REGISTRY = {p.name: p for p in (ADA, B200_MMA_SYNC, HOPPER)}
_ALIASES = {"blackwell": "b200_mma_sync"}
# RTX 50-series (sm_120) tensor cores are not modelled: refusing their names beats a plausible wrong answer.
_REFUSED = {"sm_120", "sm120", "rtx_blackwell", "rtx-blackwell", "rtx5070ti", "rtx_5070_ti"}

_warned_lock = threading.Lock()
_warned = set()


def list_presets():
    """Names of the registered presets, aliases excluded: ['ada', 'b200_mma_sync', 'hopper']."""
    return sorted(_REGISTRY)


def is_registered(preset: Preset) -> bool:
    """True for the three shipped preset objects themselves (custom copies with the same name are not)."""
    return _REGISTRY.get(preset.name) is preset


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
            raise KeyError(
                f"preset {name_or_preset!r} is refused: RTX 50-series (sm_120) tensor cores are not modelled; "
                f"known presets: {list_presets()}"
            )
        alias = key in _ALIASES
        key = _ALIASES.get(key, key)
        if key not in _REGISTRY:
            raise KeyError(f"unknown preset {name_or_preset!r}; known presets: {list_presets()}")
        preset = _REGISTRY[key]
    else:
        raise TypeError(f"preset must be a name or a mmaemu.Preset, got {type(name_or_preset).__name__}")
    if warn:
        warn_if_not_validated(preset, every_time=alias)
    return preset


def maturity_message(preset: Preset) -> Optional[str]:
    """The warning text for a non-validated preset, None for a validated one."""
    if preset.maturity == "validated":
        return None
    label = "experimental" if preset.maturity == "experimental" else "custom (not validated)"
    scope = f" ({preset.validated_scope})" if preset.validated_scope else ""
    return f"mmaemu preset {preset.name!r} is {label}{scope}: its bits are not validated against hardware GEMMs"


def warn_if_not_validated(preset: Preset, *, every_time=False, stacklevel=3):
    """Emit ExperimentalPresetWarning once per process per preset name (every time if asked)."""
    message = maturity_message(preset)
    if message is None:
        return
    with _warned_lock:
        first = preset.name not in _warned
        _warned.add(preset.name)
    if first or every_time:
        warnings.warn(message, ExperimentalPresetWarning, stacklevel=stacklevel)
