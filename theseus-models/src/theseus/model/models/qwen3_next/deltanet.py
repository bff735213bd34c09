"""The Gated DeltaNet, now a shared layer kind (:mod:`theseus.model.layers.deltanet`): this path is kept for
code that imported it from Qwen3-Next, its first family, and exports the same public names."""

from __future__ import annotations

from theseus.model.layers import deltanet as _shared
from theseus.model.layers.deltanet import *  # noqa: F403

__all__ = list(_shared.__all__)
