"""Refusal to compute on a CPU thread that flushes fp32 subnormals to zero (semantics.md (e), last paragraph).

The probe is :func:`mmaemu.base.fpmode.fp32_subnormals_flushed` (a few microseconds); it runs once per computing call,
on CPU tensors only. The refusal itself lives in :mod:`mmaemu.base.fpmode` (the base layer), so that the kernels'
entry points (``mmaemu.model.dot``) apply it without importing the plan.
"""

from __future__ import annotations

from ..base.fpmode import check_no_flush_to_zero, fp32_subnormals_flushed

__all__ = ["check_no_flush_to_zero", "fp32_subnormals_flushed"]
