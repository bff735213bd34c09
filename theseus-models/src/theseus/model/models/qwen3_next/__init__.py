"""Qwen3-Next: ``Qwen3Next`` and its presets (``model.py``), the ``hf/qwen3_next`` Hugging Face family (``hf.py``).
``deltanet.py``: the old import path of its Gated DeltaNet (:mod:`theseus.model.layers.deltanet`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.qwen3_next.model import QWEN3_NEXT_PRESETS, Qwen3Next

#: Imported from ``model.py`` when first read: ``theseus.model.models.qwen3_next:Qwen3Next``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"QWEN3_NEXT_PRESETS": "model", "Qwen3Next": "model"})

__all__ = ["QWEN3_NEXT_PRESETS", "Qwen3Next"]
