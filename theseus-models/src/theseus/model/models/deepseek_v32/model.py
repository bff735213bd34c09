"""``DeepseekV32``: DeepSeek-V3 with DeepSeek Sparse Attention (DeepSeek-V3.2)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.model.layers.latent_attention import LatentAttention
from theseus.model.layers.sparse_attention import DSAKeys, DSASpec, SparseLatentAttention
from theseus.model.models.deepseek_v3.model import (
    DEEPSEEK_V3_PRESETS,
    DeepseekV3,
    DeepseekV3Block,
    DeepseekV3Preset,
)
from theseus.model.models.deepseek_v3.mtp import DeepseekV3Architecture, MTPModule, latent
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset, preset_as
from theseus.model.stack.mixture import MoEBlock


@dataclass(frozen=True)
class DeepseekV32Preset(DeepseekV3Preset):
    """A :class:`DeepseekV3Preset` with the lightning indexer's sizes."""

    index_n_heads: int = 4
    index_head_dim: int = 16
    index_topk: int = 8


@dataclass(frozen=True)
class DeepseekV32Architecture(DeepseekV3Architecture):
    """DeepSeek-V3's architecture with DeepSeek Sparse Attention in every layer (``dsa``)."""

    dsa: DSASpec | None = None


def sparse_attention(arch: Architecture) -> DSASpec | None:
    """The DeepSeek Sparse Attention of ``arch`` (None: dense latent attention)."""
    return arch.dsa if isinstance(arch, DeepseekV32Architecture) else None


def with_sparse_attention(arch: Architecture, dsa: DSASpec) -> DeepseekV32Architecture:
    """``arch`` (a :class:`DeepseekV3Architecture`) with ``dsa``."""
    values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(arch) if f.name != "dsa"}
    return DeepseekV32Architecture(**values, dsa=dsa)


def with_indexer(
    base: Preset, description: str, *, index_n_heads: int, index_head_dim: int, index_topk: int
) -> DeepseekV32Preset:
    """DeepSeek-V3's preset ``base`` with a lightning indexer of these sizes in every layer."""
    indexer = {"index_n_heads": index_n_heads, "index_head_dim": index_head_dim, "index_topk": index_topk}
    return preset_as(base, DeepseekV32Preset, description=description, **indexer)


DEEPSEEK_V32_PRESETS: dict[str, Preset] = {
    "tiny": with_indexer(
        DEEPSEEK_V3_PRESETS["tiny"],
        "DeepSeek-V3's tiny preset with an indexer of 4 heads of 16 keeping 8 keys; tests and demos",
        index_n_heads=4,
        index_head_dim=16,
        index_topk=8,
    ),
    # deepseek-ai/DeepSeek-V3.2-Exp's config.json: DeepSeek-V3's shape (61 layers, the first 3 dense, 128 heads,
    # 7168 wide, 256 routed experts of 2048 (8 per token from 4 of 8 groups, scaled 2.5) and 1 shared, query
    # rank 1536, latent 512, heads of 128 + 64 rotated, values 128, untied head) and in every layer an indexer
    # of 64 heads of 128 keeping 2048 keys: 671,877,944,064 parameters at vocab 129280 (the routers' biases
    # counted, the multi-token-prediction module not).
    "deepseek-v3.2": with_indexer(
        DEEPSEEK_V3_PRESETS["deepseek-v3"],
        "DeepSeek-V3.2's shape: 671.88B parameters at vocab 129280",
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
    ),
}


class DeepseekV32Block(DeepseekV3Block):
    """:class:`DeepseekV3Block` whose attention is :class:`SparseLatentAttention`."""

    LATENT: ClassVar[type[LatentAttention]] = SparseLatentAttention

    def latent_options(self) -> dict[str, Any] | None:
        dsa = sparse_attention(self.arch)
        if dsa is None:
            return None
        return {
            "index_n_heads": dsa.index_n_heads,
            "index_head_dim": dsa.index_head_dim,
            "index_topk": dsa.index_topk,
            "index_rope_interleave": dsa.rope_interleave,
            "dsa_phase": dsa.phase,
            "indexer_loss_weight": dsa.indexer_loss_weight,
        }


class DeepseekV32MTP(MTPModule):
    """A multi-token-prediction depth of DeepSeek-V3.2: its layer is a :class:`DeepseekV32Block`."""

    BLOCK: ClassVar[type[Module]] = DeepseekV32Block


class DeepseekV32(DSAKeys, DeepseekV3):
    """DeepSeek-V3.2: :class:`~theseus.model.models.deepseek_v3.model.DeepseekV3` (latent attention,
    sigmoid-routed experts with a shared one, leading dense layers, multi-token prediction) with DeepSeek
    Sparse Attention in every layer (:mod:`theseus.model.layers.sparse_attention`): a lightning indexer of
    ``architecture/dsa/index_n_heads`` heads of ``index_head_dim`` scores the keys, and each query attends
    to its ``architecture/dsa/index_topk`` best. The indexer rotates halves (``architecture/dsa/rope_interleave``
    false), the latent attention interleaved pairs; the query bottleneck is required.

    Training follows the published recipe, chosen by ``architecture/dsa/phase``: ``dense_warmup`` (attention
    dense, the indexer trained toward its head-summed distribution) then ``sparse`` (top-k attention, the
    indexer trained toward it on the selected keys). The indexer reads detached inputs, so its KL loss
    (``model/dsa/indexer_loss_weight`` times it joins the training loss; ``indexer_kl`` is logged) trains only
    the indexer, and the language-modelling loss only the rest. The warm-up does not freeze the main model:
    it trains as usual with dense attention (freeze it with a learning rate of your choice elsewhere).

    Presets (``architecture/preset``): ``tiny`` (DeepSeek-V3's tiny, an indexer of 4 heads of 16 keeping 8
    keys) and ``deepseek-v3.2`` (the published shape, at ``architecture/vocab_size=129280``). ``hf/import``
    of a ``model_type: deepseek_v32`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = DEEPSEEK_V32_PRESETS
    FAMILY: ClassVar[str] = "DeepseekV32"
    BLOCK: ClassVar[type[MoEBlock]] = DeepseekV32Block
    MTP: ClassVar[type[MTPModule]] = DeepseekV32MTP
    #: The indexer's rotary layout when ``architecture/dsa/rope_interleave`` is None: halves.
    INDEXER_ROPE_INTERLEAVE: ClassVar[bool] = False

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        sizes: dict[str, int] = {}
        if isinstance(preset, DeepseekV32Preset):
            sizes = {name: getattr(preset, name) for name in ("index_n_heads", "index_head_dim", "index_topk")}
        dsa = self.dsa_spec(self.INDEXER_ROPE_INTERLEAVE, **sizes)
        mla = latent(arch)
        if mla is not None:
            dsa.validate(mla.qk_rope_head_dim)
            if not mla.q_lora_rank:
                from theseus.errors import ConfigError

                raise ConfigError(
                    "DeepSeek Sparse Attention reads the query bottleneck; set architecture/mla/q_lora_rank > 0"
                )
        return with_sparse_attention(arch, dsa).validate()


__all__ = [
    "DEEPSEEK_V32_PRESETS",
    "DeepseekV32",
    "DeepseekV32Architecture",
    "DeepseekV32Block",
    "DeepseekV32MTP",
    "DeepseekV32Preset",
    "sparse_attention",
    "with_sparse_attention",
]
