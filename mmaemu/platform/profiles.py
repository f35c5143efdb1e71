"""Profiles by name: the built-in reference platforms and the recorded ones (platform.md section 1).

``get_profile`` and ``list_profiles`` find the built-in profiles of :mod:`.definitions` and the recorded ones
that the recorded-profile source of their :class:`mmaemu.context.Context` offers for its ``MMAEMU_PROFILE_PATH``
(:func:`mmaemu.platform.bundles.recorded_of`; the process's: the bundles of :mod:`.bundles`, loaded when first
needed); ``profile_from_preset`` builds a profile for a prototyped preset;
maturity warnings. The profile type and the format/output vocabulary live in :mod:`.definitions` and are
re-exported here.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from ..context import Context, context_of
from ..errors import ExperimentalPresetWarning
from ..warn import Notice, report
from .definitions import (_BY_NAME, _PROFILES, CALLERS, DEFAULT_PROFILE, FORMATS, OUT_DTYPES, TE_ALIGN, Profile,
                          RejectRule, builtin_profile_names, builtin_profiles, out_dtype_name,
                          register_recorded_profile, splitk_maturity_note)

__all__ = [
    "get_profile",
    "list_profiles",
    "profile_from_preset",
    "PresetProfile",
    "profile_maturity_messages",
    "profile_maturity_notices",
    "warn_profile_maturity",
    # re-exported: the profile type and vocabulary, every name of definitions.__all__ (tests/test_profiles.py)
    "Profile", "RejectRule", "splitk_maturity_note", "out_dtype_name", "builtin_profiles", "builtin_profile_names",
    "register_recorded_profile", "FORMATS", "OUT_DTYPES", "CALLERS", "TE_ALIGN", "DEFAULT_PROFILE",
]



def list_profiles(*, context=None) -> list:
    """Profile names in the documented order: ada, ada-te, ada-ws0, hopper, hopper-te, hopper-ws0,
    hopper-experimental, b200-mma-sync-experimental, tcgen05-f8f6f4-experimental, sm120-mma-sync-experimental,
    b200-mx-experimental, hopper-cublaslt-blockwise-experimental; then the recorded profiles added by
    ``mmaemu.load_profile`` or found on ``$MMAEMU_PROFILE_PATH`` (of ``context``, a :class:`mmaemu.context.Context`, whose source offers them; without
    one, read now), in the order they were added."""
    return [p.name for p in _PROFILES] + list(_recorded_profiles(context_of(context)))


PROFILE_ENV = "MMAEMU_PROFILE"


def get_profile(name_or_profile=None, *, context=None) -> Profile:
    """A Profile as is; None → $MMAEMU_PROFILE (of ``context``, a :class:`mmaemu.context.Context`; without one, read
    now; empty = unset) or "hopper"; a name → its profile: a built-in one, else a recorded one of the context's
    source (:func:`list_profiles`).

    Unknown names raise KeyError listing the known ones (the peer's pre-rename names are not accepted; a name from
    $MMAEMU_PROFILE says so); anything else raises TypeError.
    """
    if isinstance(name_or_profile, Profile):
        return name_or_profile
    from_env = False
    if name_or_profile is None:
        context = context_of(context)  # the entry point's one reading, when it was given no context
        env = context.environment
        from_env = env.is_set(PROFILE_ENV)
        name_or_profile = env[PROFILE_ENV] or DEFAULT_PROFILE
    if not isinstance(name_or_profile, str):
        hint = ""
        if type(name_or_profile).__name__ == "Preset":
            hint = ("; a Preset is a tensor-core design, not a platform: build a profile from it with "
                    "mmaemu.profile_from_preset(preset, base='hopper')")
        raise TypeError(f"profile must be a name, a mmaemu.Profile or None, got {type(name_or_profile).__name__}"
                        + hint)
    builtin = _BY_NAME.get(name_or_profile)
    if builtin is not None:  # a built-in name reads nothing
        return builtin
    context = context_of(context)  # once: the recorded profiles and the error read the same context
    try:
        return _recorded_profiles(context)[name_or_profile]
    except KeyError:
        source = f" (from {PROFILE_ENV})" if from_env else ""
        raise KeyError(f"unknown profile {name_or_profile!r}{source}; known profiles: "
                       f"{list_profiles(context=context)}" + _bundle_refusals_text(context)) from None


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


def profile_from_preset(preset, base="hopper", *, name: Optional[str] = None) -> Profile:
    """A profile that computes with ``preset`` on the platform of ``base``: one call from a tensor-core design to
    ``scaled_mm`` / ``accumulate`` / ``explain`` / ``EmulatedFP8Linear`` / ``patch``.

    ``preset``: a :class:`mmaemu.Preset` (e.g. ``get_preset("hopper").variant("frac16", frac=16, frac_out=16)``)
    or a preset name. ``base``: a profile (name or Profile) whose GPU facts, cuBLASLt workspace, split-K table and
    rejections the new profile keeps — cuBLASLt's split decision depends on the shape and the platform, not on the
    tensor core's arithmetic, so "what if this GPU's tensor core were different" keeps the GPU's decisions. The
    preset's own rules still apply: a preset without GEMM level refuses slow accumulation and split-K, and a
    custom preset accepts every split scheme. A block-scaled instruction preset makes a profile that computes the
    MXFP8 (``kind::mxf8f6f4``) or NVFP4 (``kind::mxf4nvf4``) calls it takes, one chain per output, and refuses
    tensor-wise calls (:mod:`mmaemu.platform.block_scaled`). ``name`` defaults to ``"<preset>@<base>"``.

    The profile is "validated" only when ``preset`` is the base's own preset; otherwise it is "custom" (or the
    preset's "experimental"), and using it warns (ExperimentalPresetWarning) like the preset does.
    """
    base_profile = get_profile(base)
    design = _presets().get_preset(preset, warn=False)
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
# The preset key is the preset name, the key of mmaemu.model.presets' own warning, so that get_preset(warn=True)
# and a profile's warning never repeat each other; the profile key is "profile:<name>".

def _presets():
    # Imported on use: mmaemu.model's package import pulls in the numba arithmetic, which a profile lookup or a
    # table decision does not need.
    from ..model import presets

    return presets


def profile_maturity_notices(profile) -> tuple:
    """The warnings this profile's use calls for (platform.md section 1), as :class:`mmaemu.warn.Notice` data."""
    profile = get_profile(profile)
    presets = _presets()
    preset = presets.get_preset(profile.preset, warn=False)
    preset_notices = presets.maturity_notices(preset)
    if preset_notices:
        return preset_notices
    if profile.maturity != "validated":
        return (Notice(ExperimentalPresetWarning,
                       f"mmaemu profile {profile.name!r} is {profile.maturity}: {profile.description}",
                       (f"profile:{profile.name}",)),)
    return ()


def profile_maturity_messages(profile) -> list:
    """The maturity warning texts of a profile (no warning emitted, no once-slot consumed)."""
    return [notice.message for notice in profile_maturity_notices(profile)]


def warn_profile_maturity(profile) -> list:
    """Report the profile's ExperimentalPresetWarning(s) (:func:`mmaemu.warn.report`: once per process per key, at
    the caller's line) and return every text that applies, whether or not its once-slot was free."""
    notices = profile_maturity_notices(profile)
    report(notices)
    return [notice.message for notice in notices]


# ----------------------------------------------------------------------------------------------------------------
# Recorded profiles (``mmaemu record`` bundles), registered by mmaemu.platform.bundles

def _recorded_profiles(context: Context) -> Mapping[str, Profile]:
    """The recorded profiles {name: Profile} that the source of ``context`` offers for its profile path (the
    public entry points, :func:`list_profiles` and :func:`get_profile`, give the context of their call)."""
    from . import bundles  # on use: the bundles on $MMAEMU_PROFILE_PATH are loaded when first needed

    return bundles.recorded_of(context)(context.profile_path)


def _bundle_refusals_text(context) -> str:
    """The bundles the process's source refused, as the end of an unknown-profile error ("" when a context names
    another source: the process's refusals are not about the profiles it offers)."""
    from . import bundles

    if context is not None and context.recorded is not None:
        return ""
    refused = bundles.refused_bundles()
    return "".join(f"; refused bundle {path}: {reason}" for path, reason in refused.items())
