"""``Qwen35`` and ``Qwen35MoE``: Qwen3.5 (the language models of Qwen3.5-9B, Qwen3.5-35B-A3B, ...).

Qwen3.5's decoder is Qwen3-Next's: Gated DeltaNet linear-attention layers interleaved with gated full-attention
layers (partial RoPE), zero-centred RMSNorms, an untied head. The dense models have a SwiGLU MLP on every
layer (:class:`~theseus.model.models.qwen3_next.model.Qwen3NextHybrid`), the MoE models Qwen3-Next's mixture
with a gated shared expert on every layer (:class:`~theseus.model.models.qwen3_next.model.Qwen3Next`). Nothing
of the network differs from those classes: what differs is the checkpoint layout (``hf.py``: the split
projections of the linear layers, the vision-language wrapper, fused experts) and the RoPE of a vision
checkpoint's text positions (multimodal RoPE, which for text is plain RoPE).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from theseus.model.models.qwen3_next.model import (
    QWEN3_NEXT_PRESETS,
    HybridPreset,
    Qwen3Next,
    Qwen3NextHybrid,
    Qwen3NextPreset,
)
from theseus.model.stack.architecture import Preset, preset_as

QWEN3_5_PRESETS: dict[str, Preset] = {
    # Qwen3-Next's layers, with a dense MLP of 192
    "tiny": preset_as(
        QWEN3_NEXT_PRESETS["tiny"],
        HybridPreset,
        mlp_ratio=3.0,
        description="4 layers (full attention at 3), 64 wide, d_ff 192; tests",
    ),
    # Qwen/Qwen3.5-9B's config.json (text_config): 32 layers (every 4th full attention: 16 query and 4
    # key/value heads of 256, a quarter of each rotated; the others Gated DeltaNet: 16 query/key heads and
    # 32 value heads of 128, convolution of 4), 4096 wide, intermediate 12288, untied head; 8,953,803,264
    # parameters at vocab 248320 (transformers' count of the language model on the meta device; the
    # release's vision encoder and multi-token-prediction layer are not part of it).
    "qwen3.5-9b": HybridPreset(
        n_layers=32,
        n_heads=16,
        n_kv_heads=4,
        n_embd=4096,
        head_dim=256,
        mlp_ratio=3.0,
        description="Qwen3.5-9B's language model: 8.95B parameters at vocab 248320",
    ),
}

QWEN3_5_MOE_PRESETS: dict[str, Preset] = {
    # Qwen3-Next's, with d_ff the experts' width (no layer is dense)
    "tiny": dataclasses.replace(QWEN3_NEXT_PRESETS["tiny"], mlp_ratio=0.5),
    # Qwen/Qwen3.5-35B-A3B's config.json (text_config): 40 layers (every 4th full attention: 16 query and
    # 2 key/value heads of 256, a quarter of each rotated; the others Gated DeltaNet: 16 query/key heads and
    # 32 value heads of 128, convolution of 4), 2048 wide, every layer a mixture of 256 experts of 512
    # (top 8) with a gated shared expert of 512, untied head; 34,660,610,688 parameters (3.45B active) at vocab 248320
    # (transformers' count of the language model on the meta device). It has no dense layer, so d_ff
    # (mlp_ratio) is the experts' width. Qwen3-Next-80B-A3B's heads, width and experts, fewer and fewer per token:
    "qwen3.5-35b-a3b": preset_as(
        QWEN3_NEXT_PRESETS["qwen3-next-80b-a3b"],
        Qwen3NextPreset,
        n_layers=40,
        mlp_ratio=0.25,
        n_experts=256,
        top_k=8,
        description="Qwen3.5-35B-A3B's language model: 34.7B parameters (3.45B active) at vocab 248320",
    ),
}


class Qwen35(Qwen3NextHybrid):
    """Qwen3.5 (dense): :class:`~theseus.model.models.qwen3_next.model.Qwen3NextHybrid` as it is, Qwen3-Next's
    Gated DeltaNet and gated full-attention layers (``architecture/layer_types``, default every
    ``architecture/full_attention_interval``-th = 4th layer full; ``architecture/partial_rotary_factor``
    0.25) with a dense SwiGLU MLP on every layer. Presets: ``tiny`` and ``qwen3.5-9b`` (8.95B parameters at
    ``architecture/vocab_size=248320``; the release uses ``architecture/rope_theta=1e7``, which
    ``hf/import`` reads from ``config.json``). ``hf/import`` of ``model_type: qwen3_5_text`` or ``qwen3_5``
    (its language model) builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = QWEN3_5_PRESETS
    FAMILY: ClassVar[str] = "Qwen3.5"


class Qwen35MoE(Qwen3Next):
    """Qwen3.5 MoE: :class:`~theseus.model.models.qwen3_next.model.Qwen3Next` as it is (every layer a mixture
    with renormalised top-k weights and a gated shared expert). Presets: ``tiny`` and ``qwen3.5-35b-a3b``
    (34.7B parameters at ``architecture/vocab_size=248320``). ``hf/import`` of ``model_type:
    qwen3_5_moe_text`` or ``qwen3_5_moe`` (its language model) builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = QWEN3_5_MOE_PRESETS
    FAMILY: ClassVar[str] = "Qwen3.5-MoE"


__all__ = ["QWEN3_5_MOE_PRESETS", "QWEN3_5_PRESETS", "Qwen35", "Qwen35MoE"]
