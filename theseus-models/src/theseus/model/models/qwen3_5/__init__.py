"""Qwen3.5: ``Qwen35`` (dense) and ``Qwen35MoE`` and their presets (``model.py``), the ``hf/qwen3_5_text``,
``hf/qwen3_5``, ``hf/qwen3_5_moe_text`` and ``hf/qwen3_5_moe`` Hugging Face families (``hf.py``). The layers
are Qwen3-Next's (:mod:`theseus.model.models.qwen3_next`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.qwen3_5.model import QWEN3_5_MOE_PRESETS, QWEN3_5_PRESETS, Qwen35, Qwen35MoE

#: Imported from ``model.py`` when first read: ``theseus.model.models.qwen3_5:Qwen35``, as runs record it.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {"QWEN3_5_PRESETS": "model", "QWEN3_5_MOE_PRESETS": "model", "Qwen35": "model", "Qwen35MoE": "model"},
)

__all__ = ["QWEN3_5_MOE_PRESETS", "QWEN3_5_PRESETS", "Qwen35", "Qwen35MoE"]
