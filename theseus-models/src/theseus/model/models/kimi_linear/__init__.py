"""Kimi Linear: ``KimiLinear`` and its presets (``model.py``), the ``hf/kimi_linear`` Hugging Face family
(``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.kimi_linear.model import KIMI_LINEAR_PRESETS, KimiLinear

#: Imported from ``model.py`` when first read: ``theseus.model.models.kimi_linear:KimiLinear``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"KIMI_LINEAR_PRESETS": "model", "KimiLinear": "model"})

__all__ = ["KIMI_LINEAR_PRESETS", "KimiLinear"]
