"""DeepSeek-V3.2: ``DeepseekV32`` and its presets (``model.py``), the ``hf/deepseek_v32`` Hugging Face family
(``hf.py``). DeepSeek Sparse Attention itself is :mod:`theseus.model.layers.sparse_attention`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.deepseek_v32.model import DEEPSEEK_V32_PRESETS, DeepseekV32

#: Imported from ``model.py`` when first read: ``theseus.model.models.deepseek_v32:DeepseekV32``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"DEEPSEEK_V32_PRESETS": "model", "DeepseekV32": "model"})

__all__ = ["DEEPSEEK_V32_PRESETS", "DeepseekV32"]
