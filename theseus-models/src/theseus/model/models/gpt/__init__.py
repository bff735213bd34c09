"""GPT-2: ``GPT`` and its presets (``model.py``), the ``hf/gpt2`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.gpt.model import GPT, GPT_PRESETS

#: Imported from ``model.py`` when first read: ``theseus.model.models.gpt:GPT``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"GPT": "model", "GPT_PRESETS": "model"})

__all__ = ["GPT", "GPT_PRESETS"]
