"""``Llama``: a Llama-style model (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head)."""

from __future__ import annotations

from typing import ClassVar

from theseus.config import field
from theseus.model.models.architecture import Preset
from theseus.model.models.transformer import TransformerLM

_SWIGLU = 8.0 / 3.0

LLAMA_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=128,
        mlp_ratio=_SWIGLU,
        ffn_multiple=32,
        description="~0.80M parameters at vocab 257; tests and demos",
    ),
    "small": Preset(
        n_layers=6,
        n_heads=6,
        n_kv_heads=2,
        n_embd=384,
        mlp_ratio=_SWIGLU,
        ffn_multiple=32,
        description="~9.6M parameters at vocab 257",
    ),
    "llama-124m": Preset(
        n_layers=12,
        n_heads=12,
        n_kv_heads=4,
        n_embd=768,
        mlp_ratio=_SWIGLU,
        ffn_multiple=32,
        description="GPT-2-small class: 124.7M at vocab 32000",
    ),
}


class Llama(TransformerLM):
    """Llama-style: pre-norm blocks with RMSNorm, SwiGLU MLP (``d_ff`` = 8/3 * n_embd rounded up
    to a multiple of 32), no biases, rotary position embeddings (half-split convention,
    ``architecture/rope_theta``), grouped-query attention (``architecture/n_kv_heads``) and a
    separate (untied) output head ``lm_head`` ``[embed, vocab]``.

    Presets (``architecture/preset``): ``tiny`` (4 layers, 4 heads, 2 kv heads, 128 wide, d_ff 352),
    ``small`` (6, 6, 2, 384, d_ff 1024), ``llama-124m`` (12, 12, 4, 768, d_ff 2048; 124.7M
    parameters at ``architecture/vocab_size=32000``). Changing ``n_heads`` alone keeps the preset's
    query/key-value head ratio. See :class:`TransformerLM` for the keys and the call contract.
    """

    PRESETS: ClassVar[dict[str, Preset]] = LLAMA_PRESETS
    FAMILY: ClassVar[str] = "Llama"
    ACTIVATION: ClassVar[str] = "swiglu"
    NORM: ClassVar[str] = "rmsnorm"
    USE_BIAS: ClassVar[bool] = False
    ROTARY: ClassVar[bool] = True
    TIED_EMBEDDINGS: ClassVar[bool] = False
    LEARNED_POSITIONS: ClassVar[bool] = False

    rope_theta: float = field("architecture/rope_theta", default=10000.0, help="rotary embedding base frequency")

    def _rope_theta(self) -> float:
        return self.rope_theta
