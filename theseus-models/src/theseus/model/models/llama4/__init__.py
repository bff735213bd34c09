"""Llama 4 (text): ``Llama4`` and its presets (``model.py``), the ``hf/llama4_text`` Hugging Face family
(``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.llama4.model import LLAMA4_PRESETS, Llama4

#: Imported from ``model.py`` when first read: ``theseus.model.models.llama4:Llama4``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"LLAMA4_PRESETS": "model", "Llama4": "model"})

__all__ = ["LLAMA4_PRESETS", "Llama4"]
