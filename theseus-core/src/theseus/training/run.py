"""Deprecated: the run directory moved to ``theseus.runs`` (``theseus.runs.directory`` and
``theseus.runs.layout``). This alias is kept for one minor version."""

from __future__ import annotations

import warnings

from theseus.runs.directory import RunDirectory, default_run_name, provenance, theseus_distributions
from theseus.runs.layout import ANALYSIS, CHECKPOINTS, CONFIG_FILE, LOSS_PLOT, METRICS_FILE, PROVENANCE_FILE

warnings.warn(
    "theseus.training.run is deprecated; import from theseus.runs.directory and theseus.runs.layout",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "ANALYSIS",
    "CHECKPOINTS",
    "CONFIG_FILE",
    "LOSS_PLOT",
    "METRICS_FILE",
    "PROVENANCE_FILE",
    "RunDirectory",
    "default_run_name",
    "provenance",
    "theseus_distributions",
]
