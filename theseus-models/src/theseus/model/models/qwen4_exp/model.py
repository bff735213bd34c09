"""``Qwen4Exp``: Qwen4-Exp's language model (transformers' ``qwen4_exp``): Qwen3.5-MoE's layers on
hyper-connections, with hashed n-gram embeddings injected into some linear-attention layers and
block-selected full attention.

What differs from :class:`~theseus.model.models.qwen3_next.model.Qwen3Next` (Qwen3.5-MoE's network):

- the residual is ``architecture/hc_count`` streams (:mod:`~theseus.model.layers.hyper_connections`,
  :class:`~theseus.model.layers.hyper_connections.GatedHyperConnection`, a low-rank gate of
  ``architecture/hc_lowrank``): each branch reads its input from them and writes back to each with a
  learned weight; the blocks have no norms of their own (``norm_placement`` none) and the model no final
  norm: the streams' narrowing read before the head normalises them;
- the layers of ``architecture/ple_layer_ids`` (1-based, linear-attention layers only) add hashed n-gram
  embeddings to the streams before their token mixer (:class:`~theseus.model.layers.ngram_embedding.
  NGramInjection`); the n-grams of each step's tokens travel from layer to layer with the streams
  (:class:`Carry`), and in decoding the model keeps each row's last ids (:class:`~theseus.model.layers.
  ngram_embedding.NGramContext`);
- with ``architecture/indexer_n_heads`` set, every full-attention layer reads only the key blocks its
  indexer selects (:mod:`~theseus.model.layers.qsa`);
- the linear layers' output gate is ``architecture/output_gate_type`` (``silu``, or ``sigmoid``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import child, optional_key
from theseus.model.layers.attention import LINEAR_ATTENTION, CausalSelfAttention, rotary_fraction_field
from theseus.model.layers.context_parallel import to_balanced
from theseus.model.layers.hyper_connections import GatedHyperConnection, HyperSpec
from theseus.model.layers.layer_call import LayerCall
from theseus.model.layers.ngram_embedding import NGramContext, NGramInjection, NGramSpec
from theseus.model.layers.qsa import QSAIndexer, QSASpec
from theseus.model.models.qwen3_next.model import (
    Qwen3Next,
    Qwen3NextArchitecture,
    Qwen3NextAttention,
    Qwen3NextBlock,
    Qwen3NextPreset,
)
from theseus.model.stack import pipeline
from theseus.model.stack.architecture import Architecture, Preset, extend_architecture, lookup_preset_as

#: The linear layers' output gate activations.
GATE_ACTIVATIONS = ("silu", "sigmoid")


@dataclass(frozen=True)
class Qwen4ExpPreset(Qwen3NextPreset):
    """A :class:`Qwen3NextPreset` with the hyper-connections' streams and rank."""

    hc_count: int = 4
    hc_lowrank: int = 320


QWEN4_EXP_PRESETS: dict[str, Preset] = {
    "tiny": Qwen4ExpPreset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=16,
        mlp_ratio=0.5,
        n_experts=4,
        expert_hidden=32,
        linear_key_heads=2,
        linear_value_heads=4,
        linear_key_dim=16,
        linear_value_dim=16,
        hc_count=2,
        hc_lowrank=8,
        description="4 layers (full attention at 3), 2 streams, mixtures of 4 experts of 32 (top 2), 64 wide",
    ),
}


@dataclass(frozen=True)
class Qwen4ExpArchitecture(Qwen3NextArchitecture):
    """A :class:`Qwen3NextArchitecture` with the n-gram embeddings (None: none), the indexer of the full
    layers (None: dense attention) and the linear layers' output gate activation."""

    ngram: NGramSpec | None = None
    qsa: QSASpec | None = None
    gate_activation: str = "silu"


class Carry(NamedTuple):
    """What passes from layer to layer: the streams ``[B, T, n * n_embd]`` and the step's n-grams ``[B, T,
    ngram_size]`` (None without n-gram embeddings)."""

    hidden: jax.Array
    history: jax.Array | None


class Qwen4ExpAttention(Qwen3NextAttention):
    """:class:`Qwen3NextAttention` whose queries read only the key blocks its ``indexer`` selects
    (:class:`~theseus.model.layers.qsa.QSAIndexer`) when ``qsa`` is set."""

    qsa: QSASpec | None = None

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), QSAIndexer]

    def _selection(
        self, x: jax.Array, positions: jax.Array | None, padding_mask: jax.Array | None, decode: bool
    ) -> jax.Array | None:
        if self.qsa is None:
            return None
        spec, position = self.attention_spec, self.position_spec
        indexer = child(
            self,
            QSAIndexer,
            spec=self.qsa,
            rotary_dim=self._rotary_dim(self._heads(x.shape[-1])[2]),
            theta=position.theta,
            scaling=position.scaled,
            eps=spec.norm_eps,
            name="indexer",
        )
        return indexer(x, positions, padding_mask, decode)


class Qwen4ExpBlock(Qwen3NextBlock):
    """:class:`Qwen3NextBlock` on hyper-connection streams, called with a :class:`Carry`: with ``ngram``
    (its index among the layers with n-gram embeddings) the streams first gain the layer's
    :class:`~theseus.model.layers.ngram_embedding.NGramInjection` (``ngram``)."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = Qwen4ExpAttention

    ngram: int | None = None

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), GatedHyperConnection, NGramInjection]

    @property
    def qwen4(self) -> Qwen4ExpArchitecture:
        arch = self.arch
        if not isinstance(arch, Qwen4ExpArchitecture):
            raise ConfigError("Qwen4ExpBlock needs a Qwen4ExpArchitecture (model/qwen4_exp)")
        return arch

    def setup(self) -> None:
        super().setup()
        arch = self.qwen4
        if self.ngram is not None:
            assert arch.ngram is not None and arch.hyper is not None
            self.ngram_injection = child(
                self,
                NGramInjection,
                spec=arch.ngram,
                index=self.ngram,
                streams=arch.hyper.streams,
                eps=arch.norm.eps,
                n_embd=arch.n_embd,
            )

    def attention_options(self) -> dict[str, Any]:
        return {**super().attention_options(), "qsa": self.qwen4.qsa}

    def linear_options(self) -> dict[str, Any]:
        return {**super().linear_options(), "gate_activation": self.qwen4.gate_activation}

    def flops(self, seq: int, layer: int | None = None) -> int:
        if self.scope is None:
            return self.bind({}).flops(seq, layer)
        extra = self.ngram_injection.flops(seq) if self.ngram is not None else 0
        return super().flops(seq, layer) + extra

    def forward(self, x: Carry, call: LayerCall, layer: int | jax.Array | None) -> Carry:  # type: ignore[override]
        h = x.hidden
        if self.ngram is not None:
            assert x.history is not None
            h = h + self.ngram_injection(h, x.history, call.padding_mask, call.decode)
        return Carry(super().forward(h, call, layer), x.history)


class Qwen4Exp(Qwen3Next):
    """Qwen4-Exp (the module docstring): Qwen3.5-MoE's Gated DeltaNet and gated full-attention layers
    (``architecture/layer_types``; transformers' ``indexed_attention`` is ``full_attention`` here), every
    feed-forward a mixture with renormalised top-k weights and a gated shared expert, on
    ``architecture/hc_count`` hyper-connection streams, with n-gram embeddings on ``architecture/
    ple_layer_ids`` and the full layers' block selection from ``architecture/indexer_*``. Presets:
    ``tiny``. ``hf/import`` of ``model_type: qwen4_exp_text`` or ``qwen4_exp`` (its language model) builds it.

    The layers with n-gram embeddings have tables of their own sizes: a scanned model runs them as runs
    of their own, which a model whose such layers do not form consecutive runs cannot (set
    ``model/scan_layers=false``).
    """

    PRESETS: ClassVar[dict[str, Preset]] = QWEN4_EXP_PRESETS
    FAMILY: ClassVar[str] = "Qwen4-Exp"
    BLOCK = Qwen4ExpBlock  # type: ignore[assignment]
    NORM_PLACEMENT: ClassVar[str] = "none"

    hc_count: int | None = optional_key("architecture/hc_count", "Qwen4-Exp: residual streams")
    hc_lowrank: int | None = optional_key("architecture/hc_lowrank", "Qwen4-Exp: rank of the streams' input gate")
    ple_layer_ids: tuple[int, ...] = field(
        "architecture/ple_layer_ids",
        default=(),
        help="Qwen4-Exp: the (1-based) linear-attention layers with hashed n-gram embeddings",
    )
    ple_embed_dim: int | None = optional_key(
        "architecture/ple_embed_dim", "Qwen4-Exp: width of a layer's n-gram embedding", "n_embd"
    )
    ple_conv_kernel: int = field(
        "architecture/ple_conv_kernel_size", default=4, min=2, help="Qwen4-Exp: taps of the n-gram convolution"
    )
    ngram_size: int = field("architecture/ngram_size", default=3, min=2, help="Qwen4-Exp: the longest n-gram")
    heads_per_ngram: int = field(
        "architecture/heads_per_ngram", default=8, min=1, help="Qwen4-Exp: hashed tables per n-gram order"
    )
    ngram_vocab_base: int = field(
        "architecture/ngram_vocab_size_base",
        default=20_000_000,
        min=2,
        help="Qwen4-Exp: each n-gram table has the next prime rows from this on",
    )
    ngram_vocab_multiple: int = field(
        "architecture/make_ngram_vocab_size_divisible_by",
        default=128,
        min=1,
        help="Qwen4-Exp: pad a layer's n-gram rows to a multiple of this",
    )
    ngram_seed: int = field("architecture/ngram_seed", default=1234, help="Qwen4-Exp: seed of the n-gram hashes")
    ngram_eos: int | None = optional_key(
        "architecture/ngram_eos_id", "Qwen4-Exp: the id that ends a document for the n-grams", "none: no n-grams"
    )
    indexer_heads: int | None = optional_key(
        "architecture/indexer_n_heads", "Qwen4-Exp: query heads of the full layers' indexer", "no indexer"
    )
    indexer_head_dim: int | None = optional_key(
        "architecture/indexer_head_dim", "Qwen4-Exp: indexer head width", "no indexer"
    )
    indexer_budget: int | None = optional_key(
        "architecture/indexer_budget", "Qwen4-Exp: tokens a query selects", "no indexer"
    )
    indexer_ratio: int | None = optional_key(
        "architecture/indexer_compress_ratio", "Qwen4-Exp: tokens per indexer block", "no indexer"
    )
    partial_rotary_factor: float = rotary_fraction_field(0.25)
    output_gate: str = field(
        "architecture/output_gate_type",
        default="silu",
        help="Qwen4-Exp: the linear layers' output gate: silu | sigmoid",
    )

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), NGramContext]

    def _preset(self) -> Qwen4ExpPreset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, Qwen4ExpPreset)

    def _ngram_spec(self, arch: Architecture) -> NGramSpec | None:
        if not self.ple_layer_ids:
            return None
        if self.ngram_eos is None:
            raise ConfigError("architecture/ple_layer_ids needs architecture/ngram_eos_id (the end-of-text id)")
        layers = tuple(int(i) - 1 for i in self.ple_layer_ids)
        types = arch.layer_types or ()
        wrong = [i + 1 for i in layers if not 0 <= i < arch.n_layers or types[i] != LINEAR_ATTENTION]
        if wrong:
            raise ConfigError(
                f"architecture/ple_layer_ids has {wrong}: n-gram embeddings go on linear-attention layers "
                f"(1 to {arch.n_layers})"
            )
        return NGramSpec(
            order=self.ngram_size,
            heads_per_ngram=self.heads_per_ngram,
            vocab_base=self.ngram_vocab_base,
            vocab_multiple=self.ngram_vocab_multiple,
            seed=self.ngram_seed,
            dim=arch.n_embd if self.ple_embed_dim is None else int(self.ple_embed_dim),
            conv_kernel=self.ple_conv_kernel,
            token_vocab=arch.vocab_size,
            eos=int(self.ngram_eos),
            layers=tuple(sorted(set(layers))),
        ).validate()

    def _qsa_spec(self, arch: Architecture) -> QSASpec | None:
        fields = {
            "indexer_n_heads": self.indexer_heads,
            "indexer_head_dim": self.indexer_head_dim,
            "indexer_budget": self.indexer_budget,
            "indexer_compress_ratio": self.indexer_ratio,
        }
        if all(value is None for value in fields.values()):
            return None
        missing = [f"architecture/{key}" for key, value in fields.items() if value is None]
        if missing:
            raise ConfigError(f"the indexer needs {', '.join(missing)} as well; set them or none of the four")
        heads, width, budget, ratio = (int(value) for value in fields.values() if value is not None)
        spec = QSASpec(heads, width, budget, ratio)
        rotary = int(arch.head_dim * self.partial_rotary_factor)
        return spec.validate(rotary)

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        preset = self._preset()
        if self.output_gate not in GATE_ACTIVATIONS:
            raise ConfigError(f"architecture/output_gate_type={self.output_gate!r}: use silu or sigmoid")
        hyper = HyperSpec(
            streams=preset.hc_count if self.hc_count is None else int(self.hc_count),
            rank=preset.hc_lowrank if self.hc_lowrank is None else int(self.hc_lowrank),
            eps=arch.norm.eps,
        )
        arch = dataclasses.replace(arch, hyper=hyper)
        extra = {f.name: getattr(arch, f.name) for f in dataclasses.fields(Qwen3NextArchitecture)}
        base = {f.name for f in dataclasses.fields(Architecture)}
        return extend_architecture(
            arch,
            Qwen4ExpArchitecture,
            **{k: v for k, v in extra.items() if k not in base},
            ngram=self._ngram_spec(arch),
            qsa=self._qsa_spec(arch),
            gate_activation=self.output_gate,
        )

    def _layer_options(self, layer: int) -> dict[str, Any]:
        arch = self.architecture
        ngram = getattr(arch, "ngram", None)
        index = ngram.layers.index(layer) if ngram is not None and layer in ngram.layers else None
        return {**super()._layer_options(layer), "ngram": index}

    def _run_kind(self, options: dict[str, Any]) -> str:
        kind = super()._run_kind(options)
        return kind if options.get("ngram") is None else f"{kind}_ngram{options['ngram']}"

    # ----------------------------------------------------------------- n-grams along the layers

    def setup(self) -> None:
        super().setup()
        ngram = getattr(self.architecture, "ngram", None)
        if ngram is not None:
            self.ngram_context = NGramContext(order=ngram.order, eos=ngram.eos)

    def _embedded(
        self, x: jax.Array, padding_mask: jax.Array | None, deterministic: bool, decode: bool
    ) -> tuple[Any, LayerCall, Any, tuple[jax.Array | None, jax.Array | None]]:
        """The streams as a :class:`Carry` with the step's n-grams (in the layers' order of the tokens)."""
        h, call, order, given = super()._embedded(x, padding_mask, deterministic, decode)
        history = None
        if getattr(self.architecture, "ngram", None) is not None:
            history = self.ngram_context(jnp.asarray(x), given[0], decode)
            history = history if order is None else to_balanced(history, order)
        return Carry(h, history), call, order, given

    def _layers(self, h: Any, call: LayerCall) -> jax.Array:
        if pipeline.pipeline_size() > 1:
            raise ConfigError("Qwen4-Exp's layers pass n-grams along; mesh/pipeline is not supported for it")
        carried: Any = super()._layers(h, call)
        return carried.hidden


__all__ = [
    "QWEN4_EXP_PRESETS",
    "Carry",
    "Qwen4Exp",
    "Qwen4ExpArchitecture",
    "Qwen4ExpAttention",
    "Qwen4ExpBlock",
    "Qwen4ExpPreset",
]
