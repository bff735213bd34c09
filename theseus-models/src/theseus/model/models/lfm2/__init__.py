"""LFM2: ``Lfm2`` and its presets (``model.py``), the ``hf/lfm2`` Hugging Face family (``hf.py``). Its
short-convolution layer is shared: :mod:`theseus.model.layers.short_conv`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.lfm2.model import LFM2_PRESETS, Lfm2

#: Imported from ``model.py`` when first read: ``theseus.model.models.lfm2:Lfm2``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"LFM2_PRESETS": "model", "Lfm2": "model"})

__all__ = ["LFM2_PRESETS", "Lfm2"]
