"""Qwen4-Exp: ``Qwen4Exp`` and its presets (``model.py``), the ``hf/qwen4_exp_text`` and ``hf/qwen4_exp``
Hugging Face families (``hf.py``). Its layers are Qwen3-Next's on hyper-connections
(:mod:`theseus.model.layers.hyper_connections`), with hashed n-gram embeddings
(:mod:`theseus.model.layers.ngram_embedding`) and block-selected attention (:mod:`theseus.model.layers.qsa`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.qwen4_exp.model import QWEN4_EXP_PRESETS, Qwen4Exp

#: Imported from ``model.py`` when first read: ``theseus.model.models.qwen4_exp:Qwen4Exp``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"QWEN4_EXP_PRESETS": "model", "Qwen4Exp": "model"})

__all__ = ["QWEN4_EXP_PRESETS", "Qwen4Exp"]
