"""Errors and warnings of mmaemu (platform.md section 9).

Match the exact class when mapping: ``ReferenceRejectsError`` and ``BackendUnavailableError`` are both
``RuntimeError`` subclasses.
"""

__all__ = [
    "MmaemuError",
    "ReferenceRejectsError",
    "UnsupportedFeatureError",
    "SplitKUnknownError",
    "BackendUnavailableError",
    "ExperimentalPresetWarning",
    "UnverifiedSplitWarning",
    "UnvalidatedEnvelopeWarning",
    "AssumedUnsplitWarning",
    "BackendFallbackWarning",
    "CacheWarning",
]


class MmaemuError(Exception):
    """Base class; raised directly when the CPU flushes fp32 subnormals to zero."""


class ReferenceRejectsError(MmaemuError, RuntimeError):
    """The reference platform (torch 2.7.1 or the profile's cuBLASLt) would refuse the call."""


class UnsupportedFeatureError(MmaemuError, NotImplementedError):
    """Valid on the reference platform but outside what mmaemu models; never approximated."""


class SplitKUnknownError(MmaemuError, LookupError):
    """``splitk="auto"`` cannot be decided from the recorded evidence."""


class BackendUnavailableError(MmaemuError, RuntimeError):
    """An explicitly requested backend, or a library it needs, is unavailable."""


class ExperimentalPresetWarning(UserWarning):
    """An experimental or custom preset, or an experimental profile, is in use."""


class UnverifiedSplitWarning(UserWarning):
    """A split-K decision that was never replayed on hardware, or comes from an experimental profile."""


class UnvalidatedEnvelopeWarning(UnverifiedSplitWarning):
    """S = 1 inferred by an envelope whose held-out validation failed or is missing."""


class AssumedUnsplitWarning(UnverifiedSplitWarning):
    """S = 1 taken under ``splitk="assume-unsplit"`` for a call the evidence does not decide: an assumption of the
    caller's, backed only by what the table's setting recorded (the warning's note says what)."""


class BackendFallbackWarning(RuntimeWarning):
    """A faster backend failed its checks and a slower one computes instead."""


class CacheWarning(RuntimeWarning):
    """A cache folder or entry mmaemu does not use (damaged, not private, not writable): the code is compiled
    instead, the result is unchanged."""
