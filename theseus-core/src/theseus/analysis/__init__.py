"""Analyses: inspections of the model computed over ``trace()`` (``ANALYSIS`` declaration)."""

from theseus.analysis.activations import ActivationStatistics
from theseus.analysis.base import Analysis

__all__ = ["ActivationStatistics", "Analysis"]
