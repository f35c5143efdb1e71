"""What a profile is, and the built-in ones (platform.md section 1).

A profile names the GPU (model, SM count), the cuBLASLt version, the caller (torch._scaled_mm or Transformer
Engine) with its cuBLASLt workspace and alignment preference, the split-K table recorded there, the calls its
cuBLASLt rejects, and the numerics preset. The values below are the recorded facts listed in platform.md section 1
(drivers: RTX 4060 572.16 under WSL2, H100 PCIe 570.148.08). Recorded profiles (``mmaemu record`` bundles) are
registered here by :mod:`.bundles`; looking profiles up by name is :mod:`.profiles`' business.

This module also owns the output dtype names ("float32" ... "float8_e5m2") shared by profiles and split-K keys,
accepted as torch dtypes or strings without importing torch; format names are :func:`mmaemu.formats.fmt_of`'s.
It imports nothing of the platform layer, so that the table and bundle readers can depend on it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from .. import formats

__all__ = [
    "Profile",
    "RejectRule",
    "splitk_maturity_note",
    "out_dtype_name",
    "builtin_profiles",
    "builtin_profile_names",
    "register_recorded_profile",
    "FORMATS",
    "OUT_DTYPES",
    "CALLERS",
    "TE_ALIGN",
    "DEFAULT_PROFILE",
]

FORMATS = formats.FORMATS
OUT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
# Profile.caller: whose cuBLASLt calls a profile describes. Transformer Engine asks the heuristic for 256-byte
# alignment (MIN_ALIGNMENT_*_BYTES), torch for none.
CALLERS = ("torch._scaled_mm", "transformer_engine")
TE_ALIGN = 256
DEFAULT_PROFILE = "hopper"


# ----------------------------------------------------------------------------------------------------------------
# Names of output dtypes (torch dtypes are recognised by their type, so torch is never imported here)


def out_dtype_name(x) -> str:
    """The output dtype name (one of OUT_DTYPES) of a torch dtype or its name; anything else is a TypeError."""
    text = formats.dtype_text(x)
    if text in OUT_DTYPES:
        return text
    raise TypeError(f"output dtype must be one of {', '.join(OUT_DTYPES)} (a torch dtype or its name), got {x!r}")


# ----------------------------------------------------------------------------------------------------------------
# Rejections


@dataclasses.dataclass(frozen=True)
class RejectRule:
    """A call the profile's cuBLASLt refuses: None fields match anything (platform.md section 1).

    ``fmt_a``/``fmt_b`` are the formats of mat1/mat2 ("e4m3"/"e5m2"), ``out_dtype`` a torch dtype name such as
    "float8_e5m2".
    """

    fmt_a: Optional[str]
    fmt_b: Optional[str]
    out_dtype: Optional[str]
    message: str

    def matches(self, fmt_a: str, fmt_b: str, out_dtype: str) -> bool:
        return all(rule is None or rule == value
                   for rule, value in ((self.fmt_a, fmt_a), (self.fmt_b, fmt_b), (self.out_dtype, out_dtype)))


def _e4m3_e5m2_out_rule(platform: str) -> RejectRule:
    # Recorded on every queried shape (status 15) and every live H100 call (platform.md section 1, semantics.md f.5).
    return RejectRule(
        "e4m3", "e4m3", "float8_e5m2",
        f"cuBLASLt 12.8.3.14 on {platform} rejects E4M3 x E4M3 -> float8_e5m2 "
        "(CUBLAS_STATUS_NOT_SUPPORTED, status 15); mixed E4M3/E5M2 inputs may produce float8_e5m2",
    )


_H100_REJECTS = (_e4m3_e5m2_out_rule("the H100 (sm_90, NVIDIA H100 PCIe)"),)
_RTX4060_REJECTS = (_e4m3_e5m2_out_rule("sm_89 (NVIDIA GeForce RTX 4060)"),)


# ----------------------------------------------------------------------------------------------------------------
# Profile


@dataclasses.dataclass(frozen=True)
class Profile:
    """One reference platform (platform.md section 1). Fields as in the table there.

    ``workspace_bytes`` is the caller's cuBLASLt workspace (MAX_WORKSPACE_BYTES of the heuristic query), ``align``
    the MIN_ALIGNMENT_*_BYTES preference (Transformer Engine: 256; torch: None), ``splitk_table`` the table id of
    the recorded heuristic. ``maturity`` qualifies the profile, ``splitk_maturity`` its split decisions.
    """

    name: str
    preset: object  # a preset name (str) or a mmaemu.model.Preset
    gpu_name: Optional[str]
    capability: Tuple[int, int]
    sm_count: Optional[int]
    cublaslt_version: Optional[str]
    caller: str
    torch_version: Optional[str]
    workspace_bytes: Optional[int]
    align: Optional[int]
    splitk_table: Optional[str]
    rejects: Tuple[RejectRule, ...]
    maturity: str
    splitk_maturity: str

    def __post_init__(self):
        object.__setattr__(self, "capability", tuple(self.capability))
        object.__setattr__(self, "rejects", tuple(self.rejects))

    @property
    def preset_name(self) -> str:
        return self.preset if isinstance(self.preset, str) else self.preset.name

    @property
    def description(self) -> str:
        """Free text: the platform, the caller and its workspace, the table, and maturity remarks."""
        if self.gpu_name is None and self.name in _NO_PLATFORM_DESCRIPTIONS:
            return _NO_PLATFORM_DESCRIPTIONS[self.name]
        if self.gpu_name is None:
            major, minor = self.capability
            return (f"the {self.preset_name} preset on an unspecified GPU of compute capability {major}.{minor}: "
                    "no reference platform and no split-K table (state split-K explicitly); "
                    f"{self.maturity} profile")
        text = (f"{self.gpu_name} (sm_{self.capability[0]}{self.capability[1]}, {self.sm_count} SMs), "
                f"cuBLASLt {self.cublaslt_version}, torch {self.torch_version}, {self.caller} with "
                f"{_bytes_text(self.workspace_bytes)} cuBLASLt workspace"
                + (f" and {self.align}-byte alignment preference" if self.align is not None else "")
                + f"; split-K table {self.splitk_table}")
        note = _SPLITK_MATURITY_NOTES.get(self.name)
        if self.splitk_maturity != "validated" and note:
            text += f"; split-K decisions with S > 1 are {self.splitk_maturity}: {note}"
        return text

    def describe(self) -> dict:
        """What the profile is, as plain data (``mmaemu info``)."""
        return {
            "name": self.name, "preset": self.preset_name, "gpu": self.gpu_name,
            "capability": f"sm_{self.capability[0]}{self.capability[1]}", "sm_count": self.sm_count,
            "cublaslt": self.cublaslt_version, "caller": self.caller, "workspace_bytes": self.workspace_bytes,
            "align": self.align, "table": self.splitk_table, "maturity": self.maturity,
            "splitk_maturity": self.splitk_maturity, "description": self.description,
        }

    def rejection(self, fmt_a, fmt_b, out_dtype) -> Optional[RejectRule]:
        """The first RejectRule matching (mat1 format, mat2 format, output dtype), or None."""
        fa, fb, out = formats.fmt_of(fmt_a), formats.fmt_of(fmt_b), out_dtype_name(out_dtype)
        return next((rule for rule in self.rejects if rule.matches(fa, fb, out)), None)

    def matches_device(self, device=None, *, context=None) -> bool:
        """Whether ``device`` (default: the current CUDA device) is this profile's reference GPU (section 3.6).

        Never the compute capability alone: device name, SM count and the loaded cuBLASLt version must match.
        False on any probe error, and without touching CUDA when MMAEMU_DISABLE_CUDA=1 (in the environment of
        ``context``, a :class:`mmaemu.context.Context`; without one, read now).
        """
        from ..context import context_of
        from . import cublaslt  # lazy: ctypes probing is only needed here

        return cublaslt.profile_matches_device(self, device, context=context_of(context))


def _bytes_text(n: Optional[int]) -> str:
    if n is None:
        return "an unspecified"
    if n == 0:
        return "no (0-byte)"
    if n % (1 << 20) == 0:
        return f"a {n >> 20} MiB"
    return f"a {n}-byte"


# Why the Transformer Engine profiles' S > 1 decisions are experimental (platform.md section 1).
_SPLITK_MATURITY_NOTES = {
    "hopper-te": "no split call ran through Transformer Engine's own GEMM on the H100",
    "ada-te": "46 Transformer Engine split outputs had their reduction scheme filled from the table",
}

# Profiles without a reference platform whose calls are not "state split-K explicitly" (mmaemu.platform.block_scaled).
_NO_PLATFORM_DESCRIPTIONS = {
    "b200-mx-experimental": "MXFP8, MXFP4 and NVFP4 torch._scaled_mm on a B200 (sm_100; swizzled block scales): "
                            "tcgen05.mma kind::mxf8f6f4 / kind::mxf4 / kind::mxf4nvf4 as MMA-Sim models them, one "
                            "chain per output, no split-K (modelled, not recorded); block-scaled calls only; "
                            "experimental profile",
    "hopper-cublaslt-blockwise-experimental": "torch's block-wise F.scaled_mm / _scaled_mm (1x128 and 128x128 fp32 "
                                              "scales) through cuBLASLt >= 12.9 on an H100 (sm_90, torch 2.13): "
                                              "each 128-k block a fresh wgmma chain, entered by cuBLASLt's scaled "
                                              "FMA as Transformer Engine's zero-tolerance reference states it "
                                              "(modelled from a public zero-tolerance reference, not recorded); no "
                                              "split-K table recorded (assumes none); tensor-wise calls as "
                                              "hopper-experimental, row-wise refused; experimental profile",
}


def splitk_maturity_note(profile: Profile) -> str:
    """Why the profile's S > 1 decisions are not validated ("" when they are, or when no note is recorded)."""
    if profile.splitk_maturity == "validated":
        return ""
    return _SPLITK_MATURITY_NOTES.get(profile.name, "")


_H100 = dict(gpu_name="NVIDIA H100 PCIe", capability=(9, 0), sm_count=114, cublaslt_version="12.8.3.14",
             torch_version="2.7.1+cu128", splitk_table="heur_h100pcie_lt12.8.3.14", rejects=_H100_REJECTS)
_RTX4060 = dict(gpu_name="NVIDIA GeForce RTX 4060", capability=(8, 9), sm_count=24, cublaslt_version="12.8.3.14",
                torch_version="2.7.1+cu128", splitk_table="heur_rtx4060_lt12.8.3.14", rejects=_RTX4060_REJECTS)
_NO_PLATFORM = dict(gpu_name=None, sm_count=None, cublaslt_version=None, torch_version=None, workspace_bytes=None,
                    align=None, splitk_table=None, rejects=(), maturity="experimental", splitk_maturity="none")
_TORCH, _TE = CALLERS
_MiB = 1 << 20

def _recorded_platform(name: str, platform: dict, te_workspace_bytes: int) -> tuple:
    """The three validated profiles of a recorded GPU platform, ``name`` being also its preset: torch with its 1 MiB
    cuBLASLt workspace, TransformerEngine with its workspace (``te_workspace_bytes``) and TE_ALIGN, and torch with no
    workspace (``-ws0``). The TE profile's split decisions are experimental (_SPLITK_MATURITY_NOTES says why)."""
    return (
        Profile(name, name, caller=_TORCH, workspace_bytes=1 * _MiB, align=None, maturity="validated",
                splitk_maturity="validated", **platform),
        Profile(f"{name}-te", name, caller=_TE, workspace_bytes=te_workspace_bytes, align=TE_ALIGN,
                maturity="validated", splitk_maturity="experimental", **platform),
        Profile(f"{name}-ws0", name, caller=_TORCH, workspace_bytes=0, align=None, maturity="validated",
                splitk_maturity="validated", **platform),
    )


# In the listing order of list_profiles() (platform.md section 1).
_PROFILES = (
    *_recorded_platform("ada", _RTX4060, te_workspace_bytes=4 * _MiB),
    *_recorded_platform("hopper", _H100, te_workspace_bytes=32 * _MiB),
    Profile("hopper-experimental", "hopper", capability=(9, 0), caller=_TORCH, **_NO_PLATFORM),
    Profile("b200-mma-sync-experimental", "b200_mma_sync", capability=(10, 0), caller=_TORCH, **_NO_PLATFORM),
    # Blackwell GEMM instructions as MMA-Sim models them (mmaemu.model.presets): no recorded platform yet.
    Profile("tcgen05-f8f6f4-experimental", "tcgen05_f8f6f4", capability=(10, 0), caller=_TORCH, **_NO_PLATFORM),
    Profile("sm120-mma-sync-experimental", "sm120_mma_sync", capability=(12, 0), caller=_TORCH, **_NO_PLATFORM),
    # B200 MXFP8/NVFP4 _scaled_mm (mmaemu.platform.block_scaled): tcgen05_mxf8f6f4, and tcgen05_mxf4nvf4 for NVFP4.
    Profile("b200-mx-experimental", "tcgen05_mxf8f6f4", capability=(10, 0), caller=_TORCH, **_NO_PLATFORM),
    # torch 2.13's block-wise scales through cuBLASLt >= 12.9 on an H100 (mmaemu.platform.blockwise).
    Profile("hopper-cublaslt-blockwise-experimental", "hopper", capability=(9, 0), caller=_TORCH, **_NO_PLATFORM),
)
_BY_NAME = {p.name: p for p in _PROFILES}


# ----------------------------------------------------------------------------------------------------------------
# Recorded profiles (``mmaemu record`` bundles), registered by mmaemu.platform.bundles

_RECORDED = {}  # name -> Profile, in the order they were added


def builtin_profiles() -> list:
    """The profiles defined in this module, in listing order."""
    return list(_PROFILES)


def builtin_profile_names() -> list:
    """The names of the profiles defined in this module (a recorded bundle may not reuse them)."""
    return [p.name for p in _PROFILES]


def register_recorded_profile(profile: Profile, splitk_note: str = "") -> None:
    """Add a recorded profile (called by :mod:`mmaemu.platform.bundles`, which checks the names first)."""
    if profile.name in _BY_NAME:
        raise ValueError(f"profile name {profile.name!r} is a built-in profile")
    _RECORDED[profile.name] = profile
    if splitk_note:
        _SPLITK_MATURITY_NOTES[profile.name] = splitk_note
