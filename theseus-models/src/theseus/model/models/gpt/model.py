"""``GPT``: the GPT-2 architecture (learned positions, LayerNorm, GELU MLP, tied embeddings)."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.stack.architecture import Preset
from theseus.model.stack.transformer import TransformerLM

GPT_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_embd=128,
        description="~0.88M parameters at vocab 257 (384 padded rows); tests and demos",
    ),
    "small": Preset(n_layers=6, n_heads=6, n_embd=384, description="~10.9M parameters at vocab 257 (padded to 384)"),
    "gpt2-124m": Preset(
        n_layers=12, n_heads=12, n_embd=768, description="GPT-2 small: 124.4M at vocab 50257, block 1024"
    ),
    "gpt2-350m": Preset(n_layers=24, n_heads=16, n_embd=1024, description="GPT-2 medium: 354.8M at vocab 50257"),
    "gpt2-774m": Preset(n_layers=36, n_heads=20, n_embd=1280, description="GPT-2 large: 774.0M at vocab 50257"),
    "gpt2-1558m": Preset(n_layers=48, n_heads=25, n_embd=1600, description="GPT-2 XL: 1557.6M at vocab 50257"),
}


class GPT(TransformerLM):
    """GPT-2: pre-norm blocks with LayerNorm (with biases), tanh-GELU MLP (4x), biased projections,
    learned absolute positions (``architecture/block_size`` of them) and an output head tied to
    the token embedding. Residual output projections start at ``0.02 / sqrt(2 * n_layers)``.

    Presets (``architecture/preset``): ``tiny`` (4 layers, 4 heads, 128 wide), ``small``
    (6, 6, 384), ``gpt2-124m`` (12, 12, 768), ``gpt2-350m`` (24, 16, 1024), ``gpt2-774m``
    (36, 20, 1280), ``gpt2-1558m`` (48, 25, 1600). The GPT-2 parameter counts hold at
    ``architecture/vocab_size=50257``, ``architecture/block_size=1024`` and
    ``architecture/vocab_multiple=1`` (the default multiple, 128, pads the head to 50304 rows). See
    :class:`TransformerLM` for the keys, the call contract and how presets and keys combine; its layer
    defaults (``ACTIVATION``, ``NORM``, ``USE_BIAS``, ``ROTARY``, ``TIED_EMBEDDINGS``,
    ``LEARNED_POSITIONS``) are GPT-2's, which this class keeps.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GPT_PRESETS
    FAMILY: ClassVar[str] = "GPT"
