"""Layers of the theseus language models.

Every layer is a :class:`theseus.model.module.Module`: its sizes come from ``architecture/*``
configuration keys (``field()``), its parameters carry logical axis names from
:class:`theseus.base.axis.Axis` (``nn.with_logical_partitioning``), parameters are stored in
``model/param_dtype`` and computed in ``model/activation_dtype``, and ``flops(seq)`` counts
forward + backward matmul FLOPs of one sequence.
"""

from theseus.model.layers.attention import AttentionSpec, CausalSelfAttention, attention_mask, dot_product_attention
from theseus.model.layers.dense import Dense
from theseus.model.layers.embedding import PositionEmbedding, TokenEmbedding
from theseus.model.layers.latent_attention import LatentAttention, MLASpec
from theseus.model.layers.mlp import MLP, FeedForwardSpec, hidden_size
from theseus.model.layers.moe import MoE, MoESpec
from theseus.model.layers.norms import LayerNorm, NormSpec, RMSNorm
from theseus.model.layers.rotary import ROPE_SCALINGS, PositionSpec, RopeScaling, RotaryEmbedding, rotary_angles
from theseus.model.layers.sparse_attention import LightningIndexer, SparseLatentAttention

__all__ = [
    "MLP",
    "ROPE_SCALINGS",
    "AttentionSpec",
    "CausalSelfAttention",
    "Dense",
    "FeedForwardSpec",
    "LatentAttention",
    "LayerNorm",
    "LightningIndexer",
    "MLASpec",
    "MoE",
    "MoESpec",
    "NormSpec",
    "PositionEmbedding",
    "PositionSpec",
    "RMSNorm",
    "RopeScaling",
    "RotaryEmbedding",
    "SparseLatentAttention",
    "TokenEmbedding",
    "attention_mask",
    "dot_product_attention",
    "hidden_size",
    "rotary_angles",
]
