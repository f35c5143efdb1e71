"""Profiles by name: the built-in reference platforms and the recorded ones (platform.md section 1).

``get_profile`` and ``list_profiles`` find the built-in profiles of :mod:`.definitions` and the recorded bundles
of :mod:`.bundles` (loaded when first needed); ``profile_from_preset`` builds a profile for a prototyped preset;
maturity warnings. The profile type and the format/output vocabulary live in :mod:`.definitions` and are
re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Optional

from ..errors import ExperimentalPresetWarning, UnsupportedFeatureError
from . import definitions
from .definitions import (_BY_NAME, _PROFILES, _RECORDED, DEFAULT_PROFILE, FORMATS, OUT_DTYPES, Profile,
                          RejectRule, builtin_profile_names, fmt_name, out_dtype_name, register_recorded_profile,
                          splitk_maturity_note)

__all__ = [
    "get_profile",
    "list_profiles",
    "profile_from_preset",
    "PresetProfile",
    "profile_maturity_messages",
    "warn_profile_maturity",
    "reset_maturity_warnings",
    *definitions.__all__,  # re-exported: the profile type and vocabulary
]



def list_profiles() -> list:
    """Profile names in the documented order: ada, ada-te, ada-ws0, hopper, hopper-te, hopper-ws0,
    hopper-experimental, b200-mma-sync-experimental, tcgen05-f8f6f4-experimental, sm120-mma-sync-experimental;
    then the recorded profiles added by ``mmaemu.load_profile`` or found on ``$MMAEMU_PROFILE_PATH``, in the order
    they were added."""
    return [p.name for p in _PROFILES] + list(_recorded_profiles())


def get_profile(name_or_profile=None) -> Profile:
    """A Profile as is; None → $MMAEMU_PROFILE (read now; empty = unset) or "hopper"; a name → its profile.

    Unknown names raise KeyError listing the known ones (the peer's pre-rename names are not accepted); anything
    else raises TypeError.
    """
    if isinstance(name_or_profile, Profile):
        return name_or_profile
    if name_or_profile is None:
        name_or_profile = os.environ.get("MMAEMU_PROFILE") or DEFAULT_PROFILE
    if not isinstance(name_or_profile, str):
        hint = ""
        if type(name_or_profile).__name__ == "Preset":
            hint = ("; a Preset is a tensor-core design, not a platform: build a profile from it with "
                    "mmaemu.profile_from_preset(preset, base='hopper')")
        raise TypeError(f"profile must be a name, a mmaemu.Profile or None, got {type(name_or_profile).__name__}"
                        + hint)
    try:
        return _BY_NAME.get(name_or_profile) or _recorded_profiles()[name_or_profile]
    except KeyError:
        raise KeyError(f"unknown profile {name_or_profile!r}; known profiles: {list_profiles()}"
                       + _bundle_refusals_text()) from None


@dataclasses.dataclass(frozen=True)
class PresetProfile(Profile):
    """A profile made by :func:`profile_from_preset`: the platform of the profile ``base`` with another preset.

    ``base_description`` is the base profile's description, kept for this one's.
    """

    base: str = ""
    base_description: str = ""

    @property
    def description(self) -> str:
        return (f"preset {self.preset_name} on the platform of profile {self.base!r} ({self.base_description}); "
                f"{self.maturity} profile")


def block_scaled_gemm_refusal(preset) -> str:
    """Why a block-scaled instruction preset cannot compute a GEMM (yet)."""
    return (f"preset {preset.name!r} models a block-scaled instruction: it is instruction level only "
            "(mmaemu.model.dot with scale_a= and scale_b=); GEMMs with MXFP8/NVFP4 scales (scaled_mm, accumulate, "
            "profiles) are not modelled yet (docs/limitations.md)")


def profile_from_preset(preset, base="hopper", *, name: Optional[str] = None) -> Profile:
    """A profile that computes with ``preset`` on the platform of ``base``: one call from a tensor-core design to
    ``scaled_mm`` / ``accumulate`` / ``explain`` / ``EmulatedFP8Linear`` / ``patch``.

    ``preset``: a :class:`mmaemu.Preset` (e.g. ``get_preset("hopper").variant("frac16", frac=16, frac_out=16)``)
    or a preset name. ``base``: a profile (name or Profile) whose GPU facts, cuBLASLt workspace, split-K table and
    rejections the new profile keeps — cuBLASLt's split decision depends on the shape and the platform, not on the
    tensor core's arithmetic, so "what if this GPU's tensor core were different" keeps the GPU's decisions. The
    preset's own rules still apply: a preset without GEMM level refuses slow accumulation and split-K, and a
    custom preset accepts every split scheme. ``name`` defaults to ``"<preset>@<base>"``.

    The profile is "validated" only when ``preset`` is the base's own preset; otherwise it is "custom" (or the
    preset's "experimental"), and using it warns (ExperimentalPresetWarning) like the preset does.
    """
    base_profile = get_profile(base)
    design = _presets().get_preset(preset, warn=False)
    if design.block_scaled:
        raise UnsupportedFeatureError(block_scaled_gemm_refusal(design))
    own = design is _presets().get_preset(base_profile.preset, warn=False)
    if own:
        maturity = base_profile.maturity
    else:
        maturity = "experimental" if design.maturity == "experimental" else "custom"
    if name is None:
        name = f"{design.name}@{base_profile.name}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"profile_from_preset: name must be a non-empty string, got {name!r}")
    platform = {field.name: getattr(base_profile, field.name) for field in dataclasses.fields(Profile)}
    platform.update(name=name, preset=design, maturity=maturity)
    return PresetProfile(**platform, base=base_profile.name, base_description=base_profile.description)


# ----------------------------------------------------------------------------------------------------------------
# Maturity warnings (ExperimentalPresetWarning, once per process per key)
#
# The preset key is the preset name, shared with mmaemu.model.presets' own registry so that get_preset(warn=True)
# and a profile's warning never repeat each other; the profile key is "profile:<name>".

def _presets():
    # Imported on use: mmaemu.model's package import pulls in the numba arithmetic, which a profile lookup or a
    # table decision does not need.
    from ..model import presets

    return presets


def _maturity_items(profile: Profile):
    """[(key, message)] of the warnings this profile's use calls for (platform.md section 1)."""
    preset = _presets().get_preset(profile.preset, warn=False)
    preset_message = _presets().maturity_message(preset)
    if preset_message is not None:
        return [(preset.name, preset_message)]
    if profile.maturity != "validated":
        return [(f"profile:{profile.name}",
                 f"mmaemu profile {profile.name!r} is {profile.maturity}: {profile.description}")]
    return []


def profile_maturity_messages(profile) -> list:
    """The maturity warning texts of a profile (no warning emitted, no once-slot consumed)."""
    return [message for _, message in _maturity_items(get_profile(profile))]


def warn_profile_maturity(profile, *, dry: bool = False, stacklevel: int = 3) -> list:
    """Emit the profile's ExperimentalPresetWarning(s) and return their texts.

    Once per process per key; dry=True (explain) emits every time without consuming the slot. Returns every text
    that applies, whether or not its once-slot was free.
    """
    items = _maturity_items(get_profile(profile))
    for key, message in items:
        if dry or _claim_slot(key):
            warnings.warn(message, ExperimentalPresetWarning, stacklevel=stacklevel)
    return [message for _, message in items]


def _claim_slot(key: str) -> bool:
    presets = _presets()
    with presets._warned_lock:
        first = key not in presets._warned
        presets._warned.add(key)
    return first


def reset_maturity_warnings() -> None:
    """Forget which maturity warnings were emitted (tests only; also resets the preset registry's slots)."""
    presets = _presets()
    with presets._warned_lock:
        presets._warned.clear()


# ----------------------------------------------------------------------------------------------------------------
# Recorded profiles (``mmaemu record`` bundles), registered by mmaemu.platform.bundles

def _recorded_profiles() -> dict:
    from . import bundles  # on use: the bundles on $MMAEMU_PROFILE_PATH are loaded when first needed

    bundles.load_profile_path()
    return _RECORDED


def _bundle_refusals_text() -> str:
    from . import bundles

    refused = bundles.refused_bundles()
    return "".join(f"; refused bundle {path}: {reason}" for path, reason in refused.items())
