"""``TransformerLM``: the decoder-only language model that GPT and Llama specialise."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.accelerator import accelerator
from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.base.logprobs import chunked_cross_entropy, chunked_nll, chunked_token_logps
from theseus.base.logprobs import cross_entropy as cross_entropy  # theseus.model.models.cross_entropy
from theseus.checkpoint.layers import LayerRun, StackEntry
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import (
    ACTIVATION_AXES,
    INIT_STD,
    architecture_field,
    cast,
    child,
    constrain,
    normal,
    optional_key,
    param,
)
from theseus.model.layers.attention import is_segment_ids, missing_cache_error
from theseus.model.layers.context_parallel import balanced_order, context_size, from_balanced, to_balanced
from theseus.model.layers.embedding import PositionEmbedding, TokenEmbedding
from theseus.model.layers.hyper_connections import hyper_class, widen
from theseus.model.layers.rotary import RopeScaling
from theseus.model.module import Module
from theseus.model.stack import one_f_one_b, pipeline
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset, preset_d_ff
from theseus.model.stack.block import Block, LayerCall, counting_child, make_norm
from theseus.model.stack.scan import LAYERS, REMAT_POLICIES, Position, alike, run_stack, with_remat


def mask_padded_vocab(logits: jax.Array, vocab_size: int) -> jax.Array:
    """``logits`` ``[..., padded]`` with every id ``>= vocab_size`` set to the lowest float (never chosen,
    ``exp`` = 0 in a softmax); the real ids' logits are unchanged."""
    real = jnp.arange(logits.shape[-1]) < vocab_size
    return jnp.where(real, logits, jnp.finfo(logits.dtype).min)


def token_positions(padding_mask: jax.Array, offset: jax.Array | None = None) -> jax.Array:
    """Position of each token = number of real tokens before it in its row (+ ``offset[b]``).

    Equal to ``0..T-1`` for unpadded or right-padded rows; a left-padded row starts at 0 at
    its first real token, so padding never shifts the positions of real tokens. With integer
    segment ids (packed examples) positions restart at 0 where each example begins.
    """
    if is_segment_ids(padding_mask):
        ids = jnp.asarray(padding_mask)
        index = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
        begins = jnp.concatenate([jnp.ones_like(ids[:, :1], jnp.bool_), ids[:, 1:] != ids[:, :-1]], axis=1)
        first = jax.lax.cummax(jnp.where(begins, index, 0), axis=1)
        restarted = index - first
        return restarted if offset is None else restarted + offset[:, None]
    counts = jnp.cumsum(padding_mask.astype(jnp.int32), axis=1) - 1
    if offset is not None:
        counts = counts + offset[:, None]
    return jnp.maximum(counts, 0)


class DecodePositions(nn.Module):
    """Keeps ``cache/length`` (real tokens seen per row) and returns the positions of a decode step."""

    @nn.compact
    def __call__(self, mask: jax.Array) -> jax.Array:
        exists = self.has_variable("cache", "length")
        if not exists and not self.is_initializing():
            raise missing_cache_error()
        length = self.variable("cache", "length", jnp.zeros, (mask.shape[0],), jnp.int32)
        positions = token_positions(mask, length.value)
        if exists:
            length.value = length.value + jnp.sum(mask, axis=1, dtype=jnp.int32)
        return positions


class StreamHead(Module):
    """The narrowing of hyper-connection streams ``[B, T, n * n_embd]`` to ``[B, T, n_embd]`` before the
    head: a read-only connection (``narrow``), then the final norm (``norm``) when the architecture's
    ``hyper.final_norm``."""

    architecture: Architecture | None = None

    def setup(self) -> None:
        arch = self.architecture
        assert arch is not None and arch.hyper is not None
        spec = arch.hyper
        self.narrow = child(self, hyper_class(spec), streams=spec.streams, rank=spec.rank, eps=spec.eps, combine=False)
        if spec.final_norm:
            self.norm = make_norm(self, arch.norm)

    def __call__(self, h: jax.Array) -> jax.Array:
        narrowed = self.narrow(h)
        return self.norm(narrowed) if hasattr(self, "norm") else narrowed


class Run(NamedTuple):
    """Layers ``first`` ... ``first + length - 1``, scanned as one stack under entry ``name``: ``unit``
    repeated (:func:`~theseus.model.stack.scan.run_stack`), the ``BLOCK`` fields ``options`` shared by
    all of them (a unit of one position without a static index: every layer alike)."""

    name: str
    first: int
    length: int
    options: dict[str, Any]
    unit: tuple[Position, ...] = (Position(),)

    @property
    def per_position(self) -> bool:
        """Whether each position of the unit is a layer of its own (several, or one with a static index)."""
        return len(self.unit) > 1 or self.unit[0].layer is not None


def shortest_period(items: list[Any]) -> int | None:
    """The shortest period ``p`` of ``items`` (``items[i] == items[i - p]`` for every ``i >= p``) when they
    hold at least two whole periods, else None."""
    n = len(items)
    period = next(p for p in range(1, n + 1) if all(items[i] == items[i - p] for i in range(p, n)))
    return period if 2 * period <= n else None


#: ``model/scan_layers=None`` scans models of at least this many layers. On CPU a scanned 4-layer
#: model of width 128-256 steps 17-24% slower than unrolled (the loop's slicing and lost fusion
#: weigh on small layers) while a 12-layer gpt2-124m steps equally fast (benchmarks/scan_layers.py);
#: unrolled compile time only hurts deep models.
SCAN_FROM_LAYERS = 8
#: On a TPU, ``model/scan_layers=None`` unrolls models of up to this many layers. On a v5e the unrolled
#: gpt2-124m step ran at 141 ms against 207 ms scanned (16 x 1024 tokens, no remat) and peaked at 6.55 GB
#: against 16.82 GB: the scan writes each layer's saved activations into stacked buffers, one slice a layer.
#: Unrolling costs compile time instead (48 s against 16 s at 12 layers; benchmarks/tpu_fit.py), which the
#: persistent compilation cache pays once per shape; deeper stacks, whose unrolled compile (and remat=auto's
#: compile of each candidate) grows with depth, stay scanned until they are measured.
UNROLL_ON_TPU_UP_TO = 12


class TransformerLM(Module):
    """A pre-norm decoder-only transformer language model.

    **Presets and explicit keys.** ``architecture/preset`` names a shape (layers, heads, width,
    key/value heads, MLP ratio) from the class's ``PRESETS``. Each explicit shape key
    (``architecture/n_layers``, ``n_heads``, ``n_kv_heads``, ``n_embd``, ``d_ff``, ``mlp_ratio``,
    ``activation``) defaults to ``None`` = "take the preset's value"; a value you set overrides
    the preset for that key only (``d_ff`` then follows from ``n_embd`` unless set too, and
    changing ``n_heads`` without ``n_kv_heads`` keeps the preset's query/key-value head ratio).
    ``architecture/vocab_size`` (default 257: the byte tokenizer's 256 bytes + end-of-text) and
    ``architecture/block_size`` (default 256, maximum sequence length) follow the data, never the preset.
    The token embedding and the output head have ``architecture/vocab_multiple`` padding
    (default 128: 257 -> 384 rows, so every power-of-two model axis divides them); the padded ids'
    logits are masked out of the loss and cut from the returned logits, and FLOPs count the padded
    head (:attr:`Architecture.padded_vocab_size`).
    ``model.architecture`` is the resolved :class:`Architecture`, resolved once per module instance (a
    family that resolves more overrides :meth:`resolve_architecture`).

    **Switches.** ``architecture/attention_bias`` (query/key/value biases),
    ``architecture/attention_out_bias`` (attention output bias; ``None``: as ``attention_bias``),
    ``architecture/mlp_bias``, ``architecture/tied_embeddings`` (output head = token embedding)
    and ``architecture/head_dim`` (``None``: ``n_embd / n_heads``) default to ``None`` = the
    family's own choice, so every preset keeps its shape; set them to express checkpoints such as
    Qwen2 (query/key/value biases, no output bias) or a Llama with a tied head.

    **Call.** ``model.apply(variables, x, y=None, padding_mask=None, deterministic=False,
    decode=False, rngs={"dropout": key})`` -> ``(logits, loss)``: ``x``/``y`` int ``[B, T]``,
    ``padding_mask`` bool ``[B, T]`` (True = real token); logits float32 ``[B, T, vocab]``;
    ``loss`` = mean cross-entropy over positions where ``y != -1`` and the mask is True
    (float32), ``None`` without ``y``. Token positions count real tokens only (see
    :func:`token_positions`). The loss reads the normalised hidden states, not the returned logits:
    the logits of ``model/loss_chunk`` tokens per device (default 2048) at a time, each chunk's gradient
    taken while its logits exist, so a step that uses only the loss never holds ``[B, T, vocab]`` logits
    (XLA drops the unused ones); :meth:`target_scores` gives the targets' log-probabilities the same way.
    ``decode=True`` runs incrementally against a KV cache (see :mod:`theseus.model.stack.decoding`).

    **Custom layers.** ``BLOCK`` is the layer class the model repeats; a subclass that sets it to a
    ``Block`` subclass (same call signature, extra children declared in its ``components()``)
    changes every layer while keeping the rest of the model and its configuration.

    **Layer layout.** With ``model/scan_layers`` (default: from ``SCAN_FROM_LAYERS`` = 8 layers on, when
    the layers scan; on a TPU above ``UNROLL_ON_TPU_UP_TO`` = 12 layers) the layers run as a list of runs
    (:attr:`layer_runs`), each repeating a unit of
    layer specs (the ``BLOCK`` fields of :meth:`_layer_options` and the ``layer_types`` entry) under one
    ``nn.scan``, one unit per step (:func:`~theseus.model.stack.scan.run_stack`): compile time does
    not grow with depth. Alike layers form a unit of one, and every layer variable (parameters, KV cache,
    recorded outputs) is stacked under ``blocks`` with a leading ``[n_layers]`` axis; otherwise the layers
    are unrolled as ``blocks_0``, ``blocks_1``, ... (:attr:`stacked_layers` says which). Specs that repeat
    (Gemma's sliding and full layers, Qwen3-Next's linear and full attention, Llama 4's dense and mixture
    layers) form one run whose unit is their period (:attr:`scan_period`): each position is a layer of
    its own with a static index (its window, RoPE base and a KV cache of its window: a ring buffer for a
    sliding layer), the ``n_layers % period`` last layers run unrolled, and ``model/scan_unroll`` rounds
    up to whole units. Positions of one shape keep the parameters stacked per layer (``blocks``
    ``[n_layers]``) and the cache per position; positions that differ in shape keep every variable per
    position (``blocks/periods/layers_<i>``, ``blocks/rest_<j>``). Specs that do not repeat form runs of
    consecutive alike layers (DeepSeek-V3's leading dense layers), each its own stack: the last under
    ``blocks``, the others under ``<kind>_blocks`` named by their options (``dense_blocks``); layer ``i``
    of the unrolled model is entry ``i - first`` of the run holding it
    (:class:`~theseus.checkpoint.layers.LayerRun`, which converts every layout to per-layer entries).
    ``model/remat`` recomputes each layer's activations in the backward pass (:data:`REMAT_POLICIES`).
    """

    PRESETS: ClassVar[dict[str, Preset]] = {}
    FAMILY: ClassVar[str] = "transformer"
    #: The layer defaults below are GPT-2's (``GPT`` keeps them); a family sets its own.
    ACTIVATION: ClassVar[str] = "gelu"
    NORM: ClassVar[str] = "layernorm"
    USE_BIAS: ClassVar[bool] = True
    ROTARY: ClassVar[bool] = False
    TIED_EMBEDDINGS: ClassVar[bool] = True
    LEARNED_POSITIONS: ClassVar[bool] = True
    #: Whether each head's query and key are RMS-normalised before RoPE (Qwen3).
    QK_NORM: ClassVar[bool] = False
    #: What one query/key norm spans: "head" (Qwen3) or the whole "projection" (OLMo 2).
    QK_NORM_SPAN: ClassVar[str] = "head"
    #: "pre": each branch's input is normalised; "post": its output, before the residual sum (OLMo 2).
    NORM_PLACEMENT: ClassVar[str] = "pre"
    #: The layer class repeated ``n_layers`` times; subclasses may set a ``Block`` subclass.
    BLOCK: ClassVar[type[Block]] = Block

    preset: str = field("architecture/preset", default="tiny", help="named model size (see the model's PRESETS)")
    vocab_size: int = architecture_field("vocab_size")
    block_size: int = architecture_field("block_size")
    n_layers: int | None = optional_key("architecture/n_layers", "transformer layers", "preset")
    n_heads: int | None = architecture_field("n_heads")
    n_kv_heads: int | None = architecture_field("n_kv_heads")
    n_embd: int | None = architecture_field("n_embd")
    d_ff: int | None = architecture_field("d_ff")
    mlp_ratio: float | None = architecture_field("mlp_ratio")
    activation: str | None = architecture_field("activation")
    head_dim: int | None = optional_key("architecture/head_dim", "width of one attention head", "n_embd / n_heads")
    attention_bias: bool | None = optional_key(
        "architecture/attention_bias", "biases on query/key/value projections", "family's"
    )
    attention_out_bias: bool | None = optional_key(
        "architecture/attention_out_bias", "bias on the attention output projection", "as attention_bias"
    )
    mlp_bias: bool | None = optional_key("architecture/mlp_bias", "biases on MLP projections", "family's")
    tied_embeddings: bool | None = optional_key(
        "architecture/tied_embeddings", "output head shares the token embedding table", "the family's own"
    )
    dropout: float = architecture_field("dropout")
    norm_eps: float = architecture_field("norm_eps")
    attention_impl: str = architecture_field("attention_impl")
    vocab_multiple: int = field(
        "architecture/vocab_multiple",
        default=128,
        min=1,
        help="pad the embedding and output head to a multiple of this (sharding, matmul speed); 1: no padding",
    )
    scan_layers: bool | None = field(
        "model/scan_layers",
        default=None,
        help="run the layers as one scanned layer: compile time flat in depth, parameters stacked per layer "
        "(None: from 8 layers on, when they scan; on a TPU from 13 layers on)",
    )
    scan_unroll: int = field(
        "model/scan_unroll",
        default=1,
        min=1,
        help="layers per scan iteration: 1 = smallest program; n_layers = no loop (stacked parameters only)",
    )
    loss_chunk: int | None = field(
        "model/loss_chunk",
        default=2048,
        min=0,
        help="tokens per device whose logits the loss computes at a time (the full logits never exist at "
        "once); 0 or null: all at once",
    )
    remat: str | bool = field(
        "model/remat",
        default="auto",
        help="recompute in the backward pass: none | full (whole layers) | dots (keep matmul and splash attention "
        "outputs) | auto (the trainer compiles its step and picks the fastest that fits the device, micro-batches "
        "too; none on a device that reports no memory limit, a CPU); true = full, false = none",
    )

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):  # a run's saved configuration reads tuples back as lists: hashable
            value = getattr(self, spec.name, None)
            if isinstance(value, list):
                object.__setattr__(self, spec.name, tuple(value))
        super().__post_init__()

    @classmethod
    def components(cls) -> list[type]:
        block = cls.BLOCK
        return [TokenEmbedding, PositionEmbedding, block] if cls.LEARNED_POSITIONS else [TokenEmbedding, block]

    # ----------------------------------------------------------------- configuration

    def _rope_theta(self) -> float:
        return 10000.0

    def _rope_scaling(self) -> RopeScaling:
        return RopeScaling()

    def _sliding_window(self) -> int | None:
        return None

    def _layer_options(self, layer: int) -> dict[str, Any]:
        """Extra ``BLOCK`` fields of layer ``layer`` (e.g. a mixture model's leading dense layers);
        consecutive layers with equal options form one run of a scanned model (:attr:`layer_runs`)."""
        return {}

    def _run_kind(self, options: dict[str, Any]) -> str:
        """What names the stack of a run that is not the last (``dense`` of ``dense_blocks``): its
        options set to True."""
        return "_".join(key for key, value in options.items() if value is True)

    def _extra_architecture(self) -> dict[str, Any]:
        """More :class:`Architecture` fields of the family (norm style, caps, ``layer_types``...)."""
        return {}

    @property
    def architecture(self) -> Architecture:
        """The resolved sizes (:meth:`resolve_architecture`), resolved once per module instance and kept
        on it; a copy (``clone``, or the bound copy ``init`` / ``apply`` work on) resolves its own."""
        resolved: Architecture | None = self.__dict__.get("_resolved_architecture")
        if resolved is None:
            resolved = self.resolve_architecture()
            object.__setattr__(self, "_resolved_architecture", resolved)  # a frozen dataclass: not a field
        return resolved

    def resolve_architecture(self) -> Architecture:
        """The resolved sizes: preset values overridden by explicit keys, validated. A family with more
        to resolve overrides this, starting from ``super().resolve_architecture()``; everything else
        reads :attr:`architecture`, which calls it once."""
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        n_embd = preset.n_embd if self.n_embd is None else self.n_embd
        n_heads = preset.n_heads if self.n_heads is None else self.n_heads
        if self.n_kv_heads is not None:
            n_kv_heads = self.n_kv_heads
        elif preset.n_kv_heads is not None and self.n_heads is None:
            n_kv_heads = preset.n_kv_heads
        elif preset.n_kv_heads is not None:  # heads changed: keep the preset's query/key-value ratio
            n_kv_heads = max(1, n_heads * preset.n_kv_heads // preset.n_heads)
        else:
            n_kv_heads = n_heads
        d_ff = self.d_ff if self.d_ff is not None else preset_d_ff(preset, n_embd, self.mlp_ratio)
        return Architecture.from_keys(
            n_layers=preset.n_layers if self.n_layers is None else self.n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            n_embd=n_embd,
            d_ff=d_ff,
            activation=self.activation or self.ACTIVATION,
            vocab_size=self.vocab_size,
            block_size=self.block_size,
            norm=self.NORM,
            norm_eps=self.norm_eps,
            use_bias=self.USE_BIAS,
            rotary=self.ROTARY,
            rope_theta=self._rope_theta(),
            tied_embeddings=self.TIED_EMBEDDINGS if self.tied_embeddings is None else self.tied_embeddings,
            learned_positions=self.LEARNED_POSITIONS,
            dropout=self.dropout,
            attention_impl=self.attention_impl,
            attention_bias=self.attention_bias,
            attention_out_bias=self.attention_out_bias,
            mlp_bias=self.mlp_bias,
            explicit_head_dim=self.head_dim if self.head_dim is not None else preset.head_dim,
            rope_scaling=self._rope_scaling(),
            sliding_window=self._sliding_window(),
            vocab_multiple=self.vocab_multiple,
            qk_norm=self.QK_NORM,
            qk_norm_span=self.QK_NORM_SPAN,
            norm_placement=self.NORM_PLACEMENT,
            **self._extra_architecture(),
        ).validate()

    @property
    def sharding(self) -> ShardingPlan:
        """embed -> data (FSDP); mlp, heads, kv_heads, vocab -> model (tensor parallel): the union of
        the layers' plans; the stacked layer axis of a scanned model is split only into pipeline stages
        (``mesh/pipeline``, :mod:`theseus.model.stack.pipeline`)."""
        return ShardingPlan.union(TokenEmbedding().sharding, self.BLOCK().sharding, ShardingPlan({Axis.LAYERS: None}))

    @property
    def stacked_layers(self) -> tuple[StackEntry, ...]:
        """``("blocks",)`` when the layers are scanned: every layer parameter is ``blocks/...`` with a
        leading ``[n_layers]`` axis; one :class:`LayerRun` per run of a scanned model of several runs;
        otherwise ``()`` (``blocks_0``, ``blocks_1``, ...)."""
        if not self.scans_layers:
            return ()
        runs = self.layer_runs
        if len(runs) == 1 and alike(runs[0].unit):
            return (LAYERS,)
        return tuple(LayerRun(run.name, LAYERS, run.first, run.length, len(run.unit)) for run in runs)

    @property
    def layer_runs(self) -> list[Run]:
        """The layers as runs, each scanned as one stack. Layers whose :meth:`_layer_options` and
        ``layer_types`` repeat (at least twice, the last period possibly cut short) form one run of that
        period as its unit, each position told its static layer index when there are ``layer_types``
        (every layer alike, without ``layer_types``: a unit of one). Otherwise consecutive layers with equal
        options form runs of one-layer units, the last run named ``blocks`` and the others
        ``<kind>_blocks`` (:meth:`_run_kind`; these names must be distinct and in name order, as
        :mod:`theseus.checkpoint.layers` reads runs back)."""
        options = [self._layer_options(layer) for layer in range(self.architecture.n_layers)]
        unit = self._repeated_unit(options)
        if unit is not None:
            shared = options[0] if all(opts == options[0] for opts in options) else {}
            return [Run(LAYERS, 0, len(options), shared, unit)]
        runs: list[Run] = []
        for layer, opts in enumerate(options):
            if runs and runs[-1].options == opts:
                runs[-1] = runs[-1]._replace(length=runs[-1].length + 1)
            else:
                runs.append(Run(LAYERS, layer, 1, opts))
        names = [f"{self._run_kind(run.options)}_{LAYERS}" for run in runs[:-1]]
        if len(set(names)) != len(names) or names != sorted(names) or f"_{LAYERS}" in names:
            raise ConfigError(
                f"{type(self).__name__}'s layers form runs that cannot be scanned apart ({names}); "
                "set model/scan_layers=false"
            )
        return [run._replace(name=name) for run, name in zip(runs, [*names, LAYERS], strict=True)]

    def _repeated_unit(self, options: list[dict[str, Any]]) -> tuple[Position, ...] | None:
        """The unit that the layers' ``options`` and ``layer_types`` repeat (:attr:`layer_runs`), or None."""
        types = self.architecture.layer_types
        specs = [(tuple(opts.items()), None if types is None else types[i]) for i, opts in enumerate(options)]
        period = shortest_period(specs)
        if period is None or (period == 1 and types is None):
            return None
        return tuple(Position(specs[i][0], None if types is None else i) for i in range(period))

    @property
    def scans_layers(self) -> bool:
        """``model/scan_layers``, or for ``None`` whether the model has ``SCAN_FROM_LAYERS`` layers or more
        and its layers form runs that scan (:attr:`layer_runs`)."""
        if self.scan_layers is not None:
            return self.scan_layers
        if self.architecture.n_layers < SCAN_FROM_LAYERS:
            return False
        if self.architecture.n_layers <= UNROLL_ON_TPU_UP_TO and accelerator().platform == "tpu":
            return False
        try:
            self.layer_runs  # noqa: B018 (raises for layers that cannot be scanned)
        except ConfigError:
            return False
        return True

    @property
    def scan_period(self) -> int | None:
        """The layers per scan step of a stack whose unit gives each position its own layer (repeating
        ``layer_types``, or positions that differ in shape; :attr:`layer_runs`); None: one layer per step."""
        unit = self._repeated_unit([self._layer_options(layer) for layer in range(self.architecture.n_layers)])
        return None if unit is None else len(unit)

    @property
    def remat_policy(self) -> str:
        """``model/remat`` as one of :data:`REMAT_POLICIES` (booleans read as full / none). ``auto`` is
        resolved by the trainer before it builds the model it trains (:mod:`theseus.training.memory`); a
        model built with it anywhere else (generation, a forward pass) keeps everything, as ``none``."""
        value = self.remat
        if isinstance(value, bool):
            return "full" if value else "none"
        if value == "auto":
            return "none"
        if value not in REMAT_POLICIES:
            raise ConfigError(
                f"model/remat={value!r} is not one of {', '.join(REMAT_POLICIES)}, auto; pick one of them"
            )
        return value

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of one sequence of ``seq`` tokens: the output head,
        ``6 * seq * n_embd * padded_vocab_size`` (2 per multiply-add forward, twice that backward; the
        tied embedding counts once, as the head; lookups are free), plus every layer's own count
        (:meth:`layer_flops`). Attention scores count the full square (the usual MFU convention;
        for ``seq >= 256`` the XLA attention path skips the blocks above the diagonal, so it executes
        somewhat fewer), or a windowed layer's window. Elementwise work (norms, activations, softmax,
        the loss) is not counted. Works unbound."""
        arch = self.architecture
        return 6 * seq * arch.n_embd * arch.padded_vocab_size + sum(self.layer_flops(seq))

    def layer_flops(self, seq: int) -> list[int]:
        """Each layer's :meth:`Block.flops` for ``seq`` tokens, the layer as the model builds it: its
        ``BLOCK`` with :meth:`_layer_options` (a dense or a mixture layer, ...) and, with ``layer_types``,
        its index (the window it attends within). Works unbound: one block per distinct options is built
        apart from the model (:func:`~theseus.model.stack.block.counting_child`)."""
        arch = self.architecture
        indexed = arch.layer_types is not None
        blocks: dict[str, Block] = {}
        counts = []
        for layer in range(arch.n_layers):
            options = self._layer_options(layer)
            key = repr(sorted(options.items()))
            if key not in blocks:
                blocks[key] = counting_child(self, self.BLOCK, architecture=arch, **options)
            block = blocks[key]
            counts.append(int(block.flops(seq, layer) if indexed else block.flops(seq)))
        return counts

    def parameter_count(self) -> int:
        """Number of parameters, from shapes only (nothing is allocated)."""
        shapes = jax.eval_shape(lambda: self.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
        return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nn.unbox(shapes["params"])))

    def read_params(self, read: Any, abstract: Any, shardings: Any) -> Any:
        """The parameters ``abstract`` names from a checkpoint ``read`` reads; with ``model/quantize``, its
        float kernels are quantized one by one as they are read (:mod:`theseus.model.layers.quantization`)."""
        from theseus.model.layers.quantized_base import read_quantized

        return read_quantized(self, read, abstract, shardings)

    # ----------------------------------------------------------------- layers

    def setup(self) -> None:
        arch = self.architecture
        self.token_embedding = child(self, TokenEmbedding, vocab_size=arch.padded_vocab_size, n_embd=arch.n_embd)
        if arch.position.kind == "learned":
            self.position_embedding = child(self, PositionEmbedding, block_size=arch.block_size, n_embd=arch.n_embd)
        out_std = INIT_STD / math.sqrt(2 * arch.n_layers)
        block: Any = self.BLOCK  # a class: hashable, as the cached stacks need
        if self.scans_layers:  # one stack per run ("blocks" alone for most models)
            indexed = arch.layer_types is not None  # a unit of one layer picks its window at run time
            for run in self.layer_runs:
                unroll = min(-(-self.scan_unroll // len(run.unit)), run.length // len(run.unit))  # whole units
                stack: Any = run_stack(block, run.unit, run.length, self.remat_policy, unroll, indexed)
                options = {} if run.per_position else run.options  # a unit's positions hold their own
                setattr(self, run.name, child(self, stack, architecture=arch, out_std=out_std, **options))
        else:
            static_layer = arch.layer_types is not None
            block_cls = with_remat(self.BLOCK, self.remat_policy, prevent_cse=True, static_layer=static_layer)
            self.blocks: Any = [
                child(self, block_cls, architecture=arch, out_std=out_std, **self._layer_options(i))
                for i in range(arch.n_layers)
            ]
        self.final_norm = self.make_final_norm()
        if not arch.tied_embeddings:
            self.lm_head = param(
                self, "lm_head", normal(INIT_STD), (arch.n_embd, arch.padded_vocab_size), (Axis.EMBED, Axis.VOCAB)
            )
        self.embedding_dropout = nn.Dropout(rate=arch.dropout)
        self.decode_positions = DecodePositions()

    def make_final_norm(self) -> Module:
        """What the last layer's output passes through before the head: the final norm; with
        hyper-connections, the streams' narrowing read (:class:`StreamHead`) and then, when the
        architecture's ``hyper.final_norm`` says so, the final norm."""
        arch = self.architecture
        if arch.hyper is None:
            return make_norm(self, arch.norm)
        return child(self, StreamHead, architecture=arch)

    def _positions(
        self, x: jax.Array, padding_mask: jax.Array | None, decode: bool
    ) -> tuple[jax.Array | None, jax.Array | None]:
        """(positions or None for ``0..T-1``, the step's padding mask)."""
        if not decode:
            return (None if padding_mask is None else token_positions(padding_mask)), padding_mask
        mask = jnp.ones(x.shape, jnp.bool_) if padding_mask is None else padding_mask.astype(jnp.bool_)
        return self.decode_positions(mask), mask

    def __call__(
        self,
        x: jax.Array,
        y: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
    ) -> tuple[jax.Array, jax.Array | None]:
        if y is not None and one_f_one_b.loss_in_pipeline(self, decode):
            return self._pipelined_loss(x, y, padding_mask, deterministic)
        h, _mask, _positions = self.hidden(x, padding_mask, deterministic, decode)
        return self.logits_and_loss(self.final_norm(h), y, padding_mask)

    def target_scores(
        self,
        x: jax.Array,
        y: jax.Array,
        padding_mask: jax.Array | None = None,
        deterministic: bool = False,
        entropy: bool = False,
    ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """``(logits, log p(y), entropy or None)``: the logits as :meth:`__call__` returns them, and per
        position ``[B, T]`` (float32) the target's log-probability (0 where ``y == -1`` or the mask is
        False) and, with ``entropy``, the entropy of the next-token distribution, both computed
        ``model/loss_chunk`` tokens per device at a time (:func:`~theseus.base.logprobs.chunked_token_logps`)."""
        normed = self.final_norm(self.hidden(x, padding_mask, deterministic, False)[0])
        weights, chunk = self.gathered_head_weights(), self.loss_chunk_tokens()
        logps, entropies = chunked_token_logps(
            self.scored_head, weights, normed, y, padding_mask, chunk_tokens=chunk, entropy=entropy
        )
        return self.logits(normed), logps, entropies

    def _pipelined_loss(
        self, x: jax.Array, y: jax.Array, padding_mask: jax.Array | None, deterministic: bool
    ) -> tuple[jax.Array, jax.Array]:
        """``__call__`` with ``mesh/pipeline_schedule=1f1b``: the loss and its gradient from the schedule that
        runs the head and the loss inside the pipeline; the logits from the plain pipelined forward (dropped
        from a training step that only needs the loss)."""
        h, call, _order, _given = self._embedded(x, padding_mask, deterministic, False)
        logits = self.logits(self.final_norm(self._layers(h, call)))
        loss = one_f_one_b.loss(self, h, y, call)
        return logits, loss

    def hidden(
        self, x: jax.Array, padding_mask: jax.Array | None, deterministic: bool, decode: bool
    ) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
        """The last layer's output before the final norm ``[B, T, n_embd]``, with the padding mask and
        the token positions the layers saw (None: ``0..T-1``); the first half of :meth:`__call__`."""
        h, call, order, given = self._embedded(x, padding_mask, deterministic, decode)
        h = self._layers(h, call)
        if order is not None:
            return from_balanced(h, order), *given
        return h, call.padding_mask, call.positions

    def _embedded(
        self, x: jax.Array, padding_mask: jax.Array | None, deterministic: bool, decode: bool
    ) -> tuple[jax.Array, LayerCall, Any, tuple[jax.Array | None, jax.Array | None]]:
        """``(h, call, order, given)``: the embedded tokens and the :class:`LayerCall` of the layers (the mask
        and positions as they see them), the context axis's balanced order (or None) and the mask and
        positions as given."""
        arch = self.architecture
        x = jnp.asarray(x)
        if x.ndim != 2:
            raise ConfigError(f"{type(self).__name__} expects token ids of shape [batch, seq], got {x.shape}")
        steps = x.shape[1]
        if steps > arch.block_size:
            raise ConfigError(
                f"sequence length {steps} exceeds architecture/block_size={arch.block_size}; "
                "raise architecture/block_size or feed shorter sequences"
            )
        positions, mask = self._positions(x, padding_mask, decode)
        given = mask, positions
        x, positions, mask, order = self._split_sequence(x, positions, mask, decode)
        h = self.embed_tokens(x)
        if arch.position.kind == "learned":
            h = h + self.position_embedding(steps if positions is None else positions)
        if arch.dropout > 0.0 and not deterministic:
            h = self.embedding_dropout(h, deterministic=False)
        if arch.hyper is not None:  # the residual streams, each a copy (the final norm narrows them)
            h = widen(h, arch.hyper.streams)
        call = LayerCall(mask, positions, deterministic, decode)
        return constrain(cast(h, self._activation_dtype), ACTIVATION_AXES), call, order, given

    def embed_tokens(self, x: jax.Array) -> jax.Array:
        """The token embeddings of ids ``x``, times ``sqrt(n_embd)`` with ``scale_embeddings`` (the
        normaliser rounded to the activation dtype, as transformers does) and times the architecture's
        ``embedding_multiplier``."""
        h = self.token_embedding(x)
        arch = self.architecture
        h = h * jnp.asarray(math.sqrt(arch.n_embd), h.dtype) if arch.scale_embeddings else h
        return h if arch.embedding_multiplier == 1.0 else h * jnp.asarray(arch.embedding_multiplier, h.dtype)

    def _layers(self, h: jax.Array, call: LayerCall) -> jax.Array:
        """``h`` through every layer, each called with ``call``: pipelined, scanned (one stack per run, or per
        period of ``layer_types``) or unrolled."""
        indexed = self.architecture.layer_types is not None  # each layer is told its index: its window and base
        piped = None if call.decode else pipeline.run(self, h, call)  # mesh/pipeline
        if piped is not None:
            return piped
        if self.scans_layers:
            for run in self.layer_runs:
                dynamic = indexed and not run.per_position  # a unit of one told each layer's index
                layers = (jnp.arange(run.first, run.first + run.length),) if dynamic else ()
                h, _ = getattr(self, run.name)(h, *call, *layers)
        else:
            for i, block in enumerate(self.blocks):
                h = block(h, *call, i) if indexed else block(h, *call)
        return h

    @staticmethod
    def _split_sequence(
        x: jax.Array, positions: jax.Array | None, mask: jax.Array | None, decode: bool
    ) -> tuple[jax.Array, jax.Array | None, jax.Array | None, Any]:
        """``(x, positions, mask, order)`` as the layers see them: with the sequence split over the
        ``context`` mesh axis, in the balanced order (:mod:`~theseus.model.layers.context_parallel`),
        positions made explicit, and that order (to take the last layer's output back out of it);
        otherwise unchanged and None."""
        parts = context_size()
        if decode or parts == 1:
            return x, positions, mask, None
        steps = x.shape[1]
        order = balanced_order(steps, parts)
        natural = jnp.broadcast_to(jnp.arange(steps, dtype=jnp.int32), x.shape) if positions is None else positions
        return (
            to_balanced(x, order),
            to_balanced(natural, order),
            None if mask is None else to_balanced(mask, order),
            order,
        )

    def head(self, h: jax.Array) -> jax.Array:
        """Logits ``[B, T, padded vocab]`` (float32) of normalised hidden states: the output head (or the
        tied embedding) and the final softcap."""
        return self.project(self.head_weights(), h)

    def head_weights(self) -> jax.Array:
        """The output head in the activation dtype: the token embedding ``[padded vocab, n_embd]`` when
        tied, else ``lm_head`` ``[n_embd, padded vocab]``."""
        table = self.token_embedding.embedding if self.architecture.tied_embeddings else self.lm_head
        return cast(table, self._activation_dtype)

    def gathered_head_weights(self) -> jax.Array:
        """:meth:`head_weights` split over the vocabulary alone (gathered over ``n_embd``, which fsdp
        splits): the loss's chunks then share one gather, and one reduction of the head's gradient."""
        tied = self.architecture.tied_embeddings
        return constrain(self.head_weights(), (Axis.VOCAB, None) if tied else (None, Axis.VOCAB))

    def loss_chunk_tokens(self) -> int | None:
        """``model/loss_chunk`` as tokens of the whole micro-batch: times the devices its rows and its
        sequence are split over (the mesh's ``expert``, ``data`` and ``context`` axes); None when off."""
        if not self.loss_chunk:
            return None
        mesh = jax.sharding.get_abstract_mesh()
        shape = {} if mesh.empty else dict(mesh.shape)
        axes = (MeshAxis.EXPERT, MeshAxis.DATA, MeshAxis.CONTEXT)
        return self.loss_chunk * math.prod(int(shape.get(axis, 1)) for axis in axes)

    def project(self, weights: jax.Array, h: jax.Array) -> jax.Array:
        """:meth:`head` with the head's ``weights`` given (:meth:`head_weights`): a pure function of its
        arguments, which the loss applies to one chunk of positions at a time. The logits are times the
        architecture's ``logits_multiplier``, then capped (``final_softcap``)."""
        arch = self.architecture
        spec = "bte,ve->btv" if arch.tied_embeddings else "bte,ev->btv"
        logits = jnp.einsum(spec, cast(h, weights.dtype), weights, preferred_element_type=jnp.float32)
        if arch.logits_multiplier != 1.0:
            logits = logits * arch.logits_multiplier
        if arch.final_softcap is not None:
            logits = jnp.tanh(logits / arch.final_softcap) * arch.final_softcap
        return constrain(logits, (Axis.BATCH, Axis.SEQUENCE, Axis.VOCAB))

    def scored_head(self, weights: jax.Array, h: jax.Array) -> jax.Array:
        """:meth:`project` as a loss reads it (:meth:`scored_logits`)."""
        return self.scored_logits(self.project(weights, h))

    def logits(self, normed: jax.Array) -> jax.Array:
        """The logits a call returns: the head's, cut to ``vocab_size``."""
        return self.head(normed)[..., : self.architecture.vocab_size]

    def logits_and_loss(
        self, normed: jax.Array, y: jax.Array | None, padding_mask: jax.Array | None
    ) -> tuple[jax.Array, jax.Array | None]:
        """``(logits cut to vocab_size, cross-entropy or None without y)`` of normalised hidden states
        ``[B, T, n_embd]``; the loss by chunks (:meth:`cross_entropy`)."""
        return self.logits(normed), None if y is None else self.cross_entropy(normed, y, padding_mask)

    def cross_entropy(self, normed: jax.Array, y: jax.Array, mask: jax.Array | None) -> jax.Array:
        """The mean ``-log p(y)`` over the scored positions of normalised hidden states, computed
        ``model/loss_chunk`` tokens per device at a time (:func:`~theseus.base.logprobs.chunked_cross_entropy`)."""
        weights, chunk = self.gathered_head_weights(), self.loss_chunk_tokens()
        return chunked_cross_entropy(self.scored_head, weights, normed, y, mask, chunk_tokens=chunk)

    def scored_logits(self, logits: jax.Array) -> jax.Array:
        """The head's padded logits as a loss reads them: the ids past ``vocab_size`` masked out
        (:func:`mask_padded_vocab`), unchanged when the vocabulary is not padded."""
        arch = self.architecture
        return logits if arch.padded_vocab_size == arch.vocab_size else mask_padded_vocab(logits, arch.vocab_size)

    def head_parameters(self) -> tuple[str, ...]:
        """Names of the top-level parameters :meth:`summed_loss` reads: the final norm and the output head
        (the token embedding when tied)."""
        return ("final_norm", "token_embedding" if self.architecture.tied_embeddings else "lm_head")

    def summed_loss(self, h: jax.Array, y: jax.Array, padding_mask: jax.Array | None) -> jax.Array:
        """The sum of ``-log p(target)`` over the scored positions of the last layer's output ``h``: the final
        norm, the head and the loss of one pipeline micro-batch (the mean loss is this over the batch's count)."""
        weights, chunk = self.gathered_head_weights(), self.loss_chunk_tokens()
        return chunked_nll(self.scored_head, weights, self.final_norm(h), y, padding_mask, chunk_tokens=chunk)
