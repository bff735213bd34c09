"""Llama-style models: ``Llama`` and its presets (``model.py``), the ``hf/llama``, ``hf/mistral`` and ``hf/qwen2``
Hugging Face families (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.llama.model import LLAMA_PRESETS, Llama

#: Imported from ``model.py`` when first read: ``theseus.model.models.llama:Llama``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"LLAMA_PRESETS": "model", "Llama": "model"})

__all__ = ["LLAMA_PRESETS", "Llama"]
