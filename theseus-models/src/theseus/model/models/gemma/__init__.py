"""Gemma 2 and Gemma 3 (text): ``Gemma2``, ``Gemma3`` and their presets (``model.py``), the ``hf/gemma2`` and
``hf/gemma3_text`` Hugging Face families (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.gemma.model import GEMMA2_PRESETS, GEMMA3_PRESETS, Gemma2, Gemma3

#: Imported from ``model.py`` when first read: ``theseus.model.models.gemma:Gemma2``, as runs record it.
__getattr__, __dir__ = lazy_exports(
    __name__, {"GEMMA2_PRESETS": "model", "GEMMA3_PRESETS": "model", "Gemma2": "model", "Gemma3": "model"}
)

__all__ = ["GEMMA2_PRESETS", "GEMMA3_PRESETS", "Gemma2", "Gemma3"]
