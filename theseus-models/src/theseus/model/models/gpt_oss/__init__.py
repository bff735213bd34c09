"""GPT-OSS: ``GptOss`` and its presets (``model.py``), the ``hf/gpt_oss`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.gpt_oss.model import GPT_OSS_PRESETS, GptOss

#: Imported from ``model.py`` when first read: ``theseus.model.models.gpt_oss:GptOss``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"GPT_OSS_PRESETS": "model", "GptOss": "model"})

__all__ = ["GPT_OSS_PRESETS", "GptOss"]
