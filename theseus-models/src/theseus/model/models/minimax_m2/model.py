"""``MiniMaxM2``: Mixtral's layout with a sigmoid router and its balancing bias, query/key RMSNorm over the
whole projections and partial RoPE (MiniMax-M2).

The one mechanism of its own is :class:`MiniMaxM2Attention`, which rotates the leading
``architecture/partial_rotary_factor`` of each head (:class:`~theseus.model.layers.attention.PartialRotaryAttention`,
shared with Qwen3-Next); the router is the shared :class:`~theseus.model.layers.moe.MoE`'s ``sigmoid`` one
(DeepSeek-V3's, with one group and no scaling).
"""

from __future__ import annotations

from typing import ClassVar

from theseus.model.layers.attention import CausalSelfAttention, PartialRotaryAttention, rotary_fraction_field
from theseus.model.models.mixtral.model import Mixtral
from theseus.model.stack.architecture import Preset
from theseus.model.stack.mixture import MoEBlock, MoEPreset

MINIMAX_M2_PRESETS: dict[str, Preset] = {
    "tiny": MoEPreset(
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=32,
        mlp_ratio=0.5,
        router="sigmoid",
        description="2 layers of 8 experts (top 2, sigmoid-routed) of width 32, 64 wide; tests and demos",
    ),
    # MiniMaxAI/MiniMax-M2's config.json: 62 layers, 48 query and 8 key/value heads of 128 (half of each
    # rotated: rotary_dim 64), 3072 wide, 256 experts of intermediate 1536 with 8 per token chosen by a
    # biased sigmoid router, untied head; 228.7B parameters (11.0B active) at vocab 200064.
    "minimax-m2": MoEPreset(
        n_layers=62,
        n_heads=48,
        n_kv_heads=8,
        n_embd=3072,
        head_dim=128,
        mlp_ratio=0.5,
        n_experts=256,
        top_k=8,
        router="sigmoid",
        description="MiniMax-M2's shape: 228.7B parameters (11.0B active) at vocab 200064",
    ),
}


class MiniMaxM2Attention(PartialRotaryAttention):
    """:class:`CausalSelfAttention` whose RoPE turns the leading ``architecture/partial_rotary_factor``
    of each query/key head (MiniMax-M2's ``rotary_dim`` / ``head_dim``: 0.5); the rest pass unrotated."""

    partial_rotary_factor: float = rotary_fraction_field(0.5)


class MiniMaxM2Block(MoEBlock):
    """:class:`MoEBlock` whose attention is :class:`MiniMaxM2Attention`."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = MiniMaxM2Attention


class MiniMaxM2(Mixtral):
    """MiniMax-M2: :class:`Mixtral` (RMSNorm pre-norm layers, grouped-query attention, every feed-forward a
    mixture of SwiGLU experts, untied head) with query/key RMSNorm over the whole projections (``query_norm``
    / ``key_norm``, ``scale`` ``[heads * head_dim]``, as OLMo 2's) before RoPE, RoPE on the leading
    ``architecture/partial_rotary_factor`` of each head (:class:`MiniMaxM2Attention`), and a sigmoid router
    (``architecture/moe/router=sigmoid``): experts chosen by their sigmoid score plus a per-expert balancing
    bias (``router_bias``, moved towards balance in training as DeepSeek-V3's), weighted by their scores
    renormalised over the top k.

    Presets (``architecture/preset``): ``tiny`` (2 layers, 8 experts of 32, top 2) and ``minimax-m2`` (the
    published shape; 228.7B parameters, 11.0B active per token, at ``architecture/vocab_size=200064``; the
    release sets ``architecture/rope_theta=5e6``, which ``hf/import`` reads from ``config.json``). See
    :class:`Mixtral` for the other keys.
    """

    PRESETS: ClassVar[dict[str, Preset]] = MINIMAX_M2_PRESETS
    FAMILY: ClassVar[str] = "MiniMaxM2"
    BLOCK: ClassVar[type[MoEBlock]] = MiniMaxM2Block
    QK_NORM: ClassVar[bool] = True
    QK_NORM_SPAN: ClassVar[str] = "projection"


__all__ = ["MINIMAX_M2_PRESETS", "MiniMaxM2", "MiniMaxM2Attention", "MiniMaxM2Block"]
