"""DeepSeek-V3: ``DeepseekV3`` and its presets (``model.py``), the ``hf/deepseek_v3`` Hugging Face family
(``hf.py``). ``mtp.py``: its multi-token prediction modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.deepseek_v3.model import DEEPSEEK_V3_PRESETS, DeepseekV3

#: Imported from ``model.py`` when first read: ``theseus.model.models.deepseek_v3:DeepseekV3``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"DEEPSEEK_V3_PRESETS": "model", "DeepseekV3": "model"})

__all__ = ["DEEPSEEK_V3_PRESETS", "DeepseekV3"]
