"""Qwen3-MoE: ``Qwen3MoE`` and its presets (``model.py``), the ``hf/qwen3_moe`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.qwen3_moe.model import QWEN3_MOE_PRESETS, Qwen3MoE

#: Imported from ``model.py`` when first read: ``theseus.model.models.qwen3_moe:Qwen3MoE``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"QWEN3_MOE_PRESETS": "model", "Qwen3MoE": "model"})

__all__ = ["QWEN3_MOE_PRESETS", "Qwen3MoE"]
