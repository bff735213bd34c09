"""Mixtral: ``Mixtral`` and its presets (``model.py``), the ``hf/mixtral`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.mixtral.model import MIXTRAL_PRESETS, Mixtral

#: Imported from ``model.py`` when first read: ``theseus.model.models.mixtral:Mixtral``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"MIXTRAL_PRESETS": "model", "Mixtral": "model"})

__all__ = ["MIXTRAL_PRESETS", "Mixtral"]
