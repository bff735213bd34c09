"""Qwen4-Exp checkpoints <-> theseus' ``Qwen4Exp``: the ``hf/qwen4_exp_text`` (``Qwen4ExpForCausalLM``) and
``hf/qwen4_exp`` (``Qwen4ExpForConditionalGeneration``, its language model) families.

The layout is Qwen3.5-MoE's (:mod:`theseus.model.models.qwen3_5.hf`) with these differences:

- no block norms and no ``model.norm``: each layer's ``attn_hyper_connection`` and ``mlp_hyper_connection``
  (``hc_norm``, ``input_mix_weight_down``, ``input_mix_weight_up``, ``block_inject_weight``) and the model's
  ``hyper_connection_mixer`` (the same without ``block_inject_weight``) before ``lm_head``;
- the layers of ``ple_layer_ids`` hold ``ple``: ``key_proj``, ``value_proj``, ``norm_key``, ``norm_query``,
  ``norm_conv``, ``conv1d`` and ``ple_embedding.ngram_embedding``, which ``save_pretrained`` writes as
  ``split_ngram_parts`` shards (``ngram_embedding.shard_<j>.weight``, joined on import); its buffers
  (``layer_multipliers``, ``ngram_heads_vocab_sizes``, ``ngram_heads_offsets``) follow from the config: import
  checks them, export writes them (int64);
- a full-attention layer (``layer_types`` ``indexed_attention``, or ``full_attention`` as the releases
  write it) holds its indexer: ``self_attn.indexer.index_qk_proj`` (the query heads, then the key head),
  ``q_layernorm`` and ``k_layernorm``.

LoRA: the attention, Gated DeltaNet and mixture adapters export as Qwen3.5-MoE's; the hyper-connections,
the n-gram branch and the indexer take no adapters.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.config_fields import partial_rotary_factor
from theseus.model.huggingface.family import Identity, cannot, unsupported
from theseus.model.huggingface.names import TensorMap, heads_in, same, transposed, vocab_head
from theseus.model.layers.attention import FULL_ATTENTION
from theseus.model.layers.ngram_embedding import hash_multipliers, head_primes
from theseus.model.models.qwen3_5.hf import Qwen35MoETextFamily, VisionLanguage
from theseus.model.stack.architecture import Architecture

QWEN4_EXP_CLASS = "theseus.model.models.qwen4_exp.model:Qwen4Exp"
#: transformers' name of the full-attention layers (which always have an indexer there).
INDEXED_ATTENTION = "indexed_attention"
#: ``config.json`` fields -> ``architecture/*`` keys, read as integers when present.
INTEGER_FIELDS = {
    "hc_count": "architecture/hc_count",
    "hc_lowrank": "architecture/hc_lowrank",
    "ple_conv_kernel_size": "architecture/ple_conv_kernel_size",
    "ngram_size": "architecture/ngram_size",
    "heads_per_ngram": "architecture/heads_per_ngram",
    "ngram_vocab_size_base": "architecture/ngram_vocab_size_base",
    "make_ngram_vocab_size_divisible_by": "architecture/make_ngram_vocab_size_divisible_by",
    "seed": "architecture/ngram_seed",
}
INDEXER_FIELDS = {
    "indexer_n_heads": "architecture/indexer_n_heads",
    "indexer_head_dim": "architecture/indexer_head_dim",
    "indexer_budget": "architecture/indexer_budget",
    "indexer_compress_ratio": "architecture/indexer_compress_ratio",
}
#: The n-gram embedding's buffers, which follow from the config.
NGRAM_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")


def hyper_maps(hf: str, ours: tuple[str, ...], width: int, streams: int, rank: int, combine: bool) -> list[TensorMap]:
    """A hyper-connection's tensors ``[streams * n_embd = width]`` <-> a
    :class:`~theseus.model.layers.hyper_connections.GatedHyperConnection`'s parameters."""
    maps = [
        same(hf + "hc_norm.weight", (*ours, "norm"), (width,)),
        transposed(hf + "input_mix_weight_down.weight", (*ours, "down"), rank, width),
        transposed(hf + "input_mix_weight_up.weight", (*ours, "up"), width, rank),
    ]
    if combine:
        maps.append(transposed(hf + "block_inject_weight.weight", (*ours, "inject"), streams, width))
    return maps


def _eos(config: Mapping[str, Any]) -> int | None:
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        return int(eos[0]) if eos else None
    return None if eos is None else int(eos)


class Qwen4ExpTextFamily(Qwen35MoETextFamily):
    """``model_type: qwen4_exp_text``: Qwen4-Exp's language model (the module docstring)."""

    identity: ClassVar[Identity] = Identity("qwen4_exp_text", "Qwen4ExpForCausalLM", QWEN4_EXP_CLASS)

    #: ``split_ngram_parts`` of the checkpoint being imported or exported (its tables' shards).
    parts: int = 1

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        types = config.get("layer_types")
        if types:
            types = [FULL_ATTENTION if t == INDEXED_ATTENTION else t for t in types]
        gate = config.get("output_gate_type") or config.get("hidden_act", "silu")
        if gate not in ("silu", "sigmoid"):
            raise unsupported("output_gate_type", gate, "Qwen4-Exp's output gate is silu or sigmoid")
        if config.get("indexer_kv_heads") not in (None, 1):
            raise unsupported("indexer_kv_heads", config["indexer_kv_heads"], "the indexer has one key head")
        keys = super().keys({**config, "layer_types": types, "hidden_act": "silu"})
        keys.update({key: int(config[name]) for name, key in INTEGER_FIELDS.items() if config.get(name) is not None})
        keys.update({key: int(config[name]) for name, key in INDEXER_FIELDS.items() if config.get(name) is not None})
        ple = sorted({int(i) for i in config.get("ple_layer_ids") or ()})
        keys["architecture/ple_layer_ids"] = ple
        if config.get("ple_embed_dim") is not None:
            keys["architecture/ple_embed_dim"] = int(config["ple_embed_dim"])
        if ple:
            keys["architecture/ngram_eos_id"] = _eos(config)
        keys["architecture/output_gate_type"] = gate
        self.parts = int(config.get("split_ngram_parts", 512))
        return keys

    def partial_rotary_factor(self, config: Mapping[str, Any]) -> float:
        """transformers' Qwen4-Exp rotates whole heads unless ``rope_parameters`` says otherwise (its
        configuration, unlike Qwen3.5's, sets no default of 0.25)."""
        return partial_rotary_factor(config, 1.0)

    def checkpoint_keys(self, keys: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
        """Notes how many shards each n-gram table is stored in (``ngram_embedding.shard_<j>``)."""
        shards = {name for name in names if ".ngram_embedding.shard_" in name}
        layers = {name.split(".ple.")[0] for name in shards}
        if shards:
            self.parts = len(shards) // max(1, len(layers))
        elif any(name.endswith("ngram_embedding.weight") for name in names):
            self.parts = 1
        return super().checkpoint_keys(keys, names)

    def constant_tensors(self, arch: Architecture) -> dict[str, np.ndarray]:
        """Each n-gram layer's buffers: its hash multipliers, its heads' primes and their offsets (int64)."""
        ngram, constants = getattr(arch, "ngram", None), {}
        for index, layer in enumerate(() if ngram is None else ngram.layers):
            assert ngram is not None
            primes = head_primes(ngram.vocab_base, ngram.heads, index)
            values = {
                "layer_multipliers": hash_multipliers(ngram.token_vocab, ngram.order, index, ngram.seed),
                "ngram_heads_vocab_sizes": primes,
                "ngram_heads_offsets": tuple(sum(primes[:h]) for h in range(len(primes))),
            }
            for name in NGRAM_BUFFERS:
                constants[f"model.layers.{layer}.ple.ple_embedding.{name}"] = np.asarray(values[name], np.int64)
        return constants

    # -- both ways ---------------------------------------------------------------------------------
    def layer_norm_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """Layer ``layer``'s hyper-connections, n-gram branch and indexer (it has no norms of its own)."""
        spec = arch.hyper
        if spec is None:
            raise cannot(self.model_type, "a model without hyper-connections")
        hf, ours = f"model.layers.{layer}.", f"blocks_{layer}"
        width = spec.streams * arch.n_embd
        maps = []
        for branch, name in (("attn", "attn_hyper_connection"), ("mlp", "mlp_hyper_connection")):
            maps += hyper_maps(hf + name + ".", (ours, f"{branch}_hyper"), width, spec.streams, spec.rank, True)
        ngram = getattr(arch, "ngram", None)
        if ngram is not None and layer in ngram.layers:
            maps += self.ngram_maps(arch, layer, ngram.layers.index(layer))
        qsa = getattr(arch, "qsa", None)
        if qsa is not None and (arch.layer_types or ())[layer] == FULL_ATTENTION:
            e, h, d = arch.n_embd, qsa.heads, qsa.head_dim
            path = (ours, "attn", "indexer")
            maps += [
                heads_in(hf + "self_attn.indexer.index_qk_proj.weight", (*path, "query_key"), e, h + 1, d),
                same(hf + "self_attn.indexer.q_layernorm.weight", (*path, "query_norm"), (d,)),
                same(hf + "self_attn.indexer.k_layernorm.weight", (*path, "key_norm"), (d,)),
            ]
        return maps

    def ngram_maps(self, arch: Architecture, layer: int, index: int) -> list[TensorMap]:
        """Layer ``layer``'s ``ple`` tensors, the ``index``-th n-gram branch."""
        ngram, spec = getattr(arch, "ngram", None), arch.hyper
        assert ngram is not None
        assert spec is not None
        hf, ours = f"model.layers.{layer}.ple.", (f"blocks_{layer}", "ngram_injection")
        width, dim, taps = spec.streams * arch.n_embd, ngram.dim, ngram.conv_kernel
        rows = ngram.table_rows(index)
        table = hf + "ple_embedding.ngram_embedding."
        parts = self.parts if self.parts > 1 and rows % self.parts == 0 else 1
        pieces = tuple((f"{table}shard_{j}.weight", rows // parts) for j in range(parts)) if parts > 1 else ()
        return [
            TensorMap(
                table + "weight",
                (rows, ngram.head_dim),
                ((*ours, "table"),),
                lambda w: [w],
                lambda a: a[0],
                pieces=pieces,
            ),
            transposed(hf + "key_proj.weight", (*ours, "key"), width, dim),
            transposed(hf + "value_proj.weight", (*ours, "value"), arch.n_embd, dim),
            *(same(hf + f"norm_{n}.weight", (*ours, f"norm_{n}"), (width,)) for n in ("key", "query", "conv")),
            TensorMap(
                hf + "conv1d.weight",
                (width, 1, taps),
                ((*ours, "conv"),),
                lambda w: [w[:, 0, :].T],
                lambda a: np.ascontiguousarray(a[0].T[:, None, :]),
            ),
        ]

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        """Qwen3.5-MoE's tensors with this family's head: the streams' ``hyper_connection_mixer`` (no
        ``model.norm``) and ``lm_head``."""
        spec = arch.hyper
        if spec is None:
            raise cannot(self.model_type, "a model without hyper-connections")
        maps = [m for m in super().tensor_maps(arch) if m.hf not in ("model.norm.weight", "lm_head.weight")]
        width = spec.streams * arch.n_embd
        maps += hyper_maps(
            "model.hyper_connection_mixer.", ("final_norm", "narrow"), width, spec.streams, spec.rank, False
        )
        if arch.tied_embeddings:
            raise cannot(self.model_type, "a tied head")
        return [*maps, vocab_head("lm_head.weight", ("lm_head",), arch)]

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        spec, ngram, qsa = arch.hyper, getattr(arch, "ngram", None), getattr(arch, "qsa", None)
        if spec is None:
            raise cannot(self.model_type, "a model without hyper-connections")
        types = list(arch.layer_types or ())
        if FULL_ATTENTION in types and qsa is None:
            raise cannot(self.model_type, "full attention without an indexer (set architecture/indexer_n_heads)")
        config = super().config(arch, settings)
        config.pop("attn_output_gate", None)
        config.update(
            {
                "hc_count": spec.streams,
                "hc_lowrank": spec.rank,
                "layer_types": [INDEXED_ATTENTION if t == FULL_ATTENTION else t for t in types],
                "output_gate_type": getattr(arch, "gate_activation", "silu"),
                "split_ngram_parts": 1,
            }
        )
        self.parts = 1
        if ngram is not None:
            config.update(
                {
                    "ple_layer_ids": [i + 1 for i in ngram.layers],
                    "ple_embed_dim": ngram.dim,
                    "ple_conv_kernel_size": ngram.conv_kernel,
                    "ngram_size": ngram.order,
                    "heads_per_ngram": ngram.heads_per_ngram,
                    "ngram_vocab_size_base": ngram.vocab_base,
                    "make_ngram_vocab_size_divisible_by": ngram.vocab_multiple,
                    "seed": ngram.seed,
                }
            )
        if qsa is not None:
            config.update(
                {
                    "indexer_n_heads": qsa.heads,
                    "indexer_kv_heads": 1,
                    "indexer_head_dim": qsa.head_dim,
                    "indexer_budget": qsa.budget,
                    "indexer_compress_ratio": qsa.ratio,
                }
            )
        return config


class Qwen4ExpFamily(VisionLanguage, Qwen4ExpTextFamily):
    """``model_type: qwen4_exp``: the language model of a Qwen4-Exp vision-language checkpoint."""

    identity: ClassVar[Identity] = Identity("qwen4_exp", "Qwen4ExpForConditionalGeneration")
    text: ClassVar[Identity] = Qwen4ExpTextFamily.identity


__all__ = ["QWEN4_EXP_CLASS", "Qwen4ExpFamily", "Qwen4ExpTextFamily", "hyper_maps"]
