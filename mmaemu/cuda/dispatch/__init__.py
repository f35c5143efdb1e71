"""Handing a call to a kernel: :mod:`.gating` (verdicts, the choice of a kernel, the fallback of a call),
:mod:`.launch` (grids, work arrays), :mod:`.engine` (torch and numpy in and out).

Importing this package imports nothing.
"""
