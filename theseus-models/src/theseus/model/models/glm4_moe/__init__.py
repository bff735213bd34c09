"""GLM-4.5 / 4.6 / 4.7: ``Glm4Moe`` and its presets (``model.py``), the ``hf/glm4_moe`` Hugging Face family
(``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.glm4_moe.model import GLM4_MOE_PRESETS, Glm4Moe

#: Imported from ``model.py`` when first read: ``theseus.model.models.glm4_moe:Glm4Moe``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"GLM4_MOE_PRESETS": "model", "Glm4Moe": "model"})

__all__ = ["GLM4_MOE_PRESETS", "Glm4Moe"]
