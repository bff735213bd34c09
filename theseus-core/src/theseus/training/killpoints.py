"""Deprecated: kill points moved to ``theseus.base.killpoints`` (they serve data preparation and
training alike). This alias is kept for one minor version."""

from __future__ import annotations

import warnings

from theseus.base.killpoints import ENV, PHASES, kill_point

warnings.warn(
    "theseus.training.killpoints is deprecated; import theseus.base.killpoints", DeprecationWarning, stacklevel=2
)

__all__ = ["ENV", "PHASES", "kill_point"]
