"""Deprecated: the plots moved to ``theseus.tracking.plots``. This alias is kept for one minor version."""

from __future__ import annotations

import warnings

from theseus.tracking.plots import CurvePlotter as LossPlotter
from theseus.tracking.plots import figure
from theseus.tracking.plots import plot_curves as plot_loss

warnings.warn("theseus.training.plots is deprecated; import theseus.tracking.plots", DeprecationWarning, stacklevel=2)

__all__ = ["LossPlotter", "figure", "plot_loss"]
