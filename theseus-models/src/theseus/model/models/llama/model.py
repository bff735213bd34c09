"""``Llama``: a Llama-style model (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head)."""

from __future__ import annotations

from typing import ClassVar

from theseus.config import field
from theseus.model.layers._common import optional_key
from theseus.model.layers.rotary import RopeScaling
from theseus.model.stack.architecture import Preset
from theseus.model.stack.transformer import TransformerLM

_SWIGLU = 8.0 / 3.0


def _swiglu(n_layers: int, n_heads: int, n_kv_heads: int, n_embd: int, description: str) -> Preset:
    """A small Llama of this shape: the SwiGLU MLP 8/3 wide, rounded up to a multiple of 32."""
    return Preset(n_layers, n_heads, n_embd, n_kv_heads, mlp_ratio=_SWIGLU, ffn_multiple=32, description=description)


LLAMA_PRESETS: dict[str, Preset] = {
    "tiny": _swiglu(4, 4, 2, 128, "~0.84M parameters at vocab 257 (384 padded rows); tests and demos"),
    "small": _swiglu(6, 6, 2, 384, "~9.7M parameters at vocab 257 (padded to 384)"),
    "llama-124m": _swiglu(12, 12, 4, 768, "GPT-2-small class: 124.7M at vocab 32000"),
    "llama3-1b": Preset(
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        n_embd=2048,
        ffn_multiple=256,
        description="Llama 3.2 1B's shape: 1.24B at vocab 128256 with architecture/tied_embeddings=true",
    ),
    "llama3-8b": Preset(
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        n_embd=4096,
        mlp_ratio=3.5,
        ffn_multiple=1024,
        description="Llama 3 8B's shape: 8.03B at vocab 128256",
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
    query/key-value head ratio. ``architecture/rope_scaling`` (``none`` | ``linear`` | ``llama3``,
    with ``rope_factor``, ``rope_low_freq_factor``, ``rope_high_freq_factor``,
    ``rope_original_max_positions``) stretches the rotary frequencies as Llama 3.1 checkpoints do
    (``longrope``, with ``rope_short_factor``, ``rope_long_factor``, ``rope_attention_factor``: as
    Phi-3's 128k checkpoints do; ``yarn``, with ``rope_factor``, ``rope_original_max_positions``,
    ``rope_beta_fast``, ``rope_beta_slow``, ``rope_truncate``, ``rope_attention_factor``: as DeepSeek-V3
    and Qwen3's long-context settings do);
    ``architecture/sliding_window`` gives every layer a Mistral-style attention window (each token
    sees itself and the ``sliding_window - 1`` tokens before it, in training and generation).
    See :class:`TransformerLM` for the keys and the call contract.
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
    rope_scaling: str = field(
        "architecture/rope_scaling", default="none", help="none | linear | llama3 | longrope | yarn"
    )
    rope_factor: float = field(
        "architecture/rope_factor", default=1.0, help="frequency divisor of linear, llama3 and yarn rope scaling"
    )
    rope_low_freq_factor: float = field(
        "architecture/rope_low_freq_factor", default=1.0, help="llama3 rope scaling: low-frequency factor"
    )
    rope_high_freq_factor: float = field(
        "architecture/rope_high_freq_factor", default=4.0, help="llama3 rope scaling: high-frequency factor"
    )
    rope_original_max_positions: int = field(
        "architecture/rope_original_max_positions",
        default=8192,
        help="llama3, longrope and yarn scaling: context length the unscaled model was trained on",
    )
    rope_short_factor: tuple[float, ...] = field(
        "architecture/rope_short_factor",
        default=(),
        help="longrope: per-frequency divisors (head_dim / 2) while a sequence fits rope_original_max_positions",
    )
    rope_long_factor: tuple[float, ...] = field(
        "architecture/rope_long_factor",
        default=(),
        help="longrope: per-frequency divisors once a sequence is longer than rope_original_max_positions",
    )
    rope_attention_factor: float | None = field(
        "architecture/rope_attention_factor",
        default=None,
        help="longrope and yarn: the scale of rotated queries and keys (None: longrope 1, yarn 0.1 ln(factor) + 1)",
    )
    rope_beta_fast: float = field(
        "architecture/rope_beta_fast",
        default=32.0,
        help="yarn: frequencies turning more often than this over rope_original_max_positions are kept",
    )
    rope_beta_slow: float = field(
        "architecture/rope_beta_slow",
        default=1.0,
        help="yarn: frequencies turning less often than this over rope_original_max_positions are divided",
    )
    rope_truncate: bool = field(
        "architecture/rope_truncate", default=True, help="yarn: round the ramp's ends to whole frequencies"
    )
    sliding_window: int | None = optional_key(
        "architecture/sliding_window",
        "attention window of every layer: a token sees itself and the window - 1 before it",
        "no window",
    )

    def _rope_theta(self) -> float:
        return self.rope_theta

    def _rope_scaling(self) -> RopeScaling:
        return RopeScaling(
            kind=self.rope_scaling,
            factor=self.rope_factor,
            low_freq_factor=self.rope_low_freq_factor,
            high_freq_factor=self.rope_high_freq_factor,
            original_max_positions=self.rope_original_max_positions,
            short_factor=tuple(float(f) for f in self.rope_short_factor or ()),
            long_factor=tuple(float(f) for f in self.rope_long_factor or ()),
            attention_factor=None if self.rope_attention_factor is None else float(self.rope_attention_factor),
            beta_fast=float(self.rope_beta_fast),
            beta_slow=float(self.rope_beta_slow),
            truncate=bool(self.rope_truncate),
        )

    def _sliding_window(self) -> int | None:
        return self.sliding_window
