"""Gemma 4 (text): ``Gemma4`` and its presets (``model.py``), the ``hf/gemma4_text`` and ``hf/gemma4``
Hugging Face families (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.gemma4.model import GEMMA4_PRESETS, Gemma4

#: Imported from ``model.py`` when first read: ``theseus.model.models.gemma4:Gemma4``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"GEMMA4_PRESETS": "model", "Gemma4": "model"})

__all__ = ["GEMMA4_PRESETS", "Gemma4"]
