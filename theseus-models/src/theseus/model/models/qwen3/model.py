"""``Qwen3``: Llama's blocks with each head's query and key RMS-normalised before RoPE."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Preset

QWEN3_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=128,
        head_dim=32,
        mlp_ratio=3.0,
        description="~0.84M parameters at vocab 257 (384 padded rows); tests and demos",
    ),
    # Qwen/Qwen3-0.6B's config.json: 28 layers, 16 query and 8 key/value heads of 128, 1024 wide,
    # intermediate 3072, tied head; 596.0M parameters at vocab 151936 (440.5M without the embedding).
    "qwen3-0.6b": Preset(
        n_layers=28,
        n_heads=16,
        n_kv_heads=8,
        n_embd=1024,
        head_dim=128,
        mlp_ratio=3.0,
        description="Qwen3-0.6B's shape: 596.0M parameters at vocab 151936",
    ),
}


class Qwen3(Llama):
    """Qwen3 (dense): :class:`Llama` with per-head query/key RMSNorm (``query_norm`` / ``key_norm``,
    ``scale`` ``[head_dim]``) before RoPE, an explicit head width and a tied head by default. The keys
    shared with Llama keep Llama's defaults; the Qwen3 releases set ``architecture/rope_theta=1e6``
    and ``architecture/norm_eps=1e-6`` (``hf/import`` reads both from ``config.json``).

    Presets (``architecture/preset``): ``tiny`` (4 layers, 4 heads of 32, 2 kv heads, 128 wide,
    d_ff 384) and ``qwen3-0.6b`` (the published Qwen3-0.6B shape; 596.0M parameters at
    ``architecture/vocab_size=151936``). ``hf/import`` of a ``model_type: qwen3`` checkpoint builds
    this model; see :class:`Llama` for the other keys.
    """

    PRESETS: ClassVar[dict[str, Preset]] = QWEN3_PRESETS
    FAMILY: ClassVar[str] = "Qwen3"
    TIED_EMBEDDINGS: ClassVar[bool] = True
    QK_NORM: ClassVar[bool] = True
