"""GLM-5 (``glm_moe_dsa``): ``GlmMoeDsa`` and its presets (``model.py``), the ``hf/glm_moe_dsa`` Hugging Face
family (``hf.py``); DeepSeek-V3.2's model and sparse attention with GLM-5's indexer rotary layout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.glm_moe_dsa.model import GLM_MOE_DSA_PRESETS, GlmMoeDsa

#: Imported from ``model.py`` when first read: ``theseus.model.models.glm_moe_dsa:GlmMoeDsa``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"GLM_MOE_DSA_PRESETS": "model", "GlmMoeDsa": "model"})

__all__ = ["GLM_MOE_DSA_PRESETS", "GlmMoeDsa"]
