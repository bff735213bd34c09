"""SmolLM3: ``SmolLM3`` and its presets (``model.py``), the ``hf/smollm3`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.smollm3.model import SMOLLM3_PRESETS, SmolLM3

#: Imported from ``model.py`` when first read: ``theseus.model.models.smollm3:SmolLM3``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"SMOLLM3_PRESETS": "model", "SmolLM3": "model"})

__all__ = ["SMOLLM3_PRESETS", "SmolLM3"]
