"""OLMo 2: ``OLMo2`` and its presets (``model.py``), the ``hf/olmo2`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.olmo2.model import OLMO2_PRESETS, OLMo2

#: Imported from ``model.py`` when first read: ``theseus.model.models.olmo2:OLMo2``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"OLMO2_PRESETS": "model", "OLMo2": "model"})

__all__ = ["OLMO2_PRESETS", "OLMo2"]
