"""``Gemma2`` and ``Gemma3`` (text): Llama's projections with GeGLU, zero-centred RMSNorms before and
after each branch, embeddings scaled by ``sqrt(n_embd)`` and sliding-window layers interleaved with
full-attention ones (``layer_types``)."""

from __future__ import annotations

from typing import Any, ClassVar

from theseus.model.layers._common import optional_key
from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Preset
from theseus.model.stack.windows import InterleavedWindows

GEMMA2_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=128,
        head_dim=32,
        description="~1.03M parameters at vocab 257 (384 padded rows); tests and demos",
    ),
    # google/gemma-2-2b's config.json: 26 layers, 8 query and 4 key/value heads of 256, 2304 wide,
    # intermediate 9216, tied head; 2.614B parameters at vocab 256000.
    "gemma2-2b": Preset(
        n_layers=26,
        n_heads=8,
        n_kv_heads=4,
        n_embd=2304,
        head_dim=256,
        description="Gemma-2-2B's shape: 2.614B parameters at vocab 256000",
    ),
}

GEMMA3_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=6,
        n_heads=4,
        n_kv_heads=1,
        n_embd=128,
        head_dim=32,
        mlp_ratio=6.0,
        description="~2.07M parameters at vocab 257 (384 padded rows); tests and demos",
    ),
    # google/gemma-3-1b-pt's config.json: 26 layers, 4 query heads and 1 key/value head of 256,
    # 1152 wide, intermediate 6912, tied head; 999.9M parameters at vocab 262144.
    "gemma3-1b": Preset(
        n_layers=26,
        n_heads=4,
        n_kv_heads=1,
        n_embd=1152,
        head_dim=256,
        mlp_ratio=6.0,
        description="Gemma-3-1B's shape: 999.9M parameters at vocab 262144",
    ),
}


def softcap(value: float | None, default: float | None) -> float | None:
    """A soft-capping key: ``None`` takes the family's ``default``, 0 switches capping off."""
    if value is None:
        return default
    return None if value == 0 else float(value)


class Gemma2(InterleavedWindows, Llama):
    """Gemma 2: :class:`Llama`'s attention with GeGLU (tanh-approximate GELU) MLPs, zero-centred
    RMSNorms (``1 + scale``) before and after both branches (``attn_norm`` / ``attn_out_norm``,
    ``mlp_norm`` / ``mlp_out_norm``), token embeddings times ``sqrt(n_embd)``, a tied head, scores
    scaled by ``architecture/query_pre_attn_scalar ** -0.5`` (None: ``head_dim``), attention scores
    and output logits soft-capped (``architecture/attn_softcap``, default 50, and
    ``architecture/final_softcap``, default 30; 0 switches one off), and ``architecture/layer_types``
    (None: sliding and full layers alternating, the first sliding) giving the
    ``architecture/sliding_window`` (None: 4096) to the sliding layers only.

    The keys shared with Llama keep Llama's defaults; the releases set ``architecture/norm_eps=1e-6``
    (``hf/import`` reads it from ``config.json``). Presets: ``tiny`` and ``gemma2-2b`` (Gemma-2-2B's
    published shape). ``hf/import`` of a ``model_type: gemma2`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GEMMA2_PRESETS
    FAMILY: ClassVar[str] = "Gemma2"
    ACTIVATION: ClassVar[str] = "geglu"
    TIED_EMBEDDINGS: ClassVar[bool] = True
    NORM_PLACEMENT: ClassVar[str] = "sandwich"
    DEFAULT_WINDOW: ClassVar[int] = 4096
    FULL_EVERY: ClassVar[int] = 2
    ATTN_SOFTCAP: ClassVar[float | None] = 50.0
    FINAL_SOFTCAP: ClassVar[float | None] = 30.0

    rope_local_theta: float | None = optional_key(
        "architecture/rope_local_theta", "rotary base of the sliding-window layers", "architecture/rope_theta"
    )
    query_pre_attn_scalar: float | None = optional_key(
        "architecture/query_pre_attn_scalar", "attention scores are scaled by this ** -0.5", "head_dim"
    )
    attn_softcap: float | None = optional_key(
        "architecture/attn_softcap", "cap attention scores as tanh(s / cap) * cap", "the family's; 0: off"
    )
    final_softcap: float | None = optional_key(
        "architecture/final_softcap", "cap output logits as tanh(x / cap) * cap", "the family's; 0: off"
    )

    def _extra_architecture(self) -> dict[str, Any]:
        return {
            **super()._extra_architecture(),
            "zero_centred_norm": True,
            "scale_embeddings": True,
            "query_pre_attn_scalar": self.query_pre_attn_scalar,
            "attn_softcap": softcap(self.attn_softcap, self.ATTN_SOFTCAP),
            "final_softcap": softcap(self.final_softcap, self.FINAL_SOFTCAP),
            "local_rope_theta": self.rope_local_theta,
        }


class Gemma3(Gemma2):
    """Gemma 3 (text): :class:`Gemma2` with per-head zero-centred query/key RMSNorm before RoPE
    (``query_norm`` / ``key_norm``), no soft-capping by default, every sixth layer full attention
    (``architecture/layer_types`` None) and a window of 512 (``architecture/sliding_window`` None).
    The releases rotate full layers with ``architecture/rope_theta=1e6`` and sliding ones with
    ``architecture/rope_local_theta=1e4`` (``hf/import`` reads both; ``architecture/rope_scaling`` scales
    the full layers only, as the 4B and larger releases' ``linear`` factor 8 does). Presets: ``tiny`` and
    ``gemma3-1b`` (Gemma-3-1B's published shape). ``hf/import`` of a ``model_type: gemma3_text``
    checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GEMMA3_PRESETS
    FAMILY: ClassVar[str] = "Gemma3"
    QK_NORM: ClassVar[bool] = True
    DEFAULT_WINDOW: ClassVar[int] = 512
    FULL_EVERY: ClassVar[int] = 6
    ATTN_SOFTCAP: ClassVar[float | None] = None
    FINAL_SOFTCAP: ClassVar[float | None] = None


__all__ = ["GEMMA2_PRESETS", "GEMMA3_PRESETS", "Gemma2", "Gemma3"]
