"""Nemotron-H: ``NemotronH`` and its presets (``model.py``), the ``hf/nemotron_h`` Hugging Face family
(``hf.py``). Its Mamba-2 mixer is shared: :mod:`theseus.model.layers.mamba2`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.nemotron_h.model import NEMOTRON_H_PRESETS, NemotronH

#: Imported from ``model.py`` when first read: ``theseus.model.models.nemotron_h:NemotronH``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"NEMOTRON_H_PRESETS": "model", "NemotronH": "model"})

__all__ = ["NEMOTRON_H_PRESETS", "NemotronH"]
