"""Qwen3 (dense): ``Qwen3`` and its presets (``model.py``), the ``hf/qwen3`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.qwen3.model import QWEN3_PRESETS, Qwen3

#: Imported from ``model.py`` when first read: ``theseus.model.models.qwen3:Qwen3``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"QWEN3_PRESETS": "model", "Qwen3": "model"})

__all__ = ["QWEN3_PRESETS", "Qwen3"]
