"""Evaluations: measurements of a model during and after training (``EVALUATION`` declaration)."""

from theseus.evaluation.base import Evaluation
from theseus.evaluation.compression import Compression
from theseus.evaluation.multiple_choice import MultipleChoice
from theseus.evaluation.perplexity import Perplexity

__all__ = ["Compression", "Evaluation", "MultipleChoice", "Perplexity"]
