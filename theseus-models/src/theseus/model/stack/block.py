"""``Block``: one transformer layer (attention + MLP, each on a residual branch, normalised before
or after the branch), and ``LayerCall``: what a layer is called with besides its input
(:mod:`theseus.model.layers.layer_call`)."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, TypeVar

import jax
import jax.numpy as jnp

from theseus.base.axis import ShardingPlan
from theseus.config import configuration, configure
from theseus.errors import ConfigError
from theseus.model.layers._common import ACTIVATION_AXES, INIT_STD, child, constrain
from theseus.model.layers.attention import CausalSelfAttention
from theseus.model.layers.hyper_connections import HyperConnection, hyper_class
from theseus.model.layers.layer_call import LayerCall, StackLayer
from theseus.model.layers.mlp import MLP
from theseus.model.layers.norms import LayerNorm, NormSpec, RMSNorm
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture

M = TypeVar("M", bound=Module)


#: Positions of ``deterministic`` and ``decode`` in a layer's call, the module being 0 and the input 1: the
#: Python values ``nn.remat`` keeps static (they choose the code path).
STATIC_ARGNUMS = tuple(2 + LayerCall._fields.index(name) for name in ("deterministic", "decode"))
#: Position of the layer index that follows a :class:`LayerCall`.
INDEX_ARGNUM = 2 + len(LayerCall._fields)


def detached_child(parent: Module, cls: type[M], **overrides: Any) -> M:
    """``child(parent, cls, **overrides)`` built apart from ``parent`` (which may be unbound: a module
    built in an unbound module's method would take it as its parent), under ``parent``'s configuration:
    an unbound module of its own, for counting (:meth:`~theseus.model.module.Module.flops`)."""
    own = parent.theseus_config
    with configuration(own) if own is not None else contextlib.nullcontext():
        return configure(
            cls,
            param_dtype=parent.param_dtype,
            activation_dtype=parent.activation_dtype,
            parent=None,
            **overrides,
        )


def counting_child(parent: Module, cls: type[M], **overrides: Any) -> M:
    """:func:`detached_child` bound to no variables: its ``setup()`` children exist (``setup`` must
    create no parameter itself, as :class:`Block`'s does not), so it counts its
    :meth:`~theseus.model.module.Module.flops` from its parts before any parameter exists. For counting
    only: calling it would find no parameters."""
    return detached_child(parent, cls, **overrides).bind({})


def make_norm(parent: Module, spec: NormSpec, name: str | None = None) -> LayerNorm | RMSNorm:
    """The family's normalisation layer, configured from ``spec`` (an architecture's ``norm_spec``)."""
    extra = {} if name is None else {"name": name}
    if spec.kind == "layernorm":
        return child(parent, LayerNorm, eps=spec.eps, use_bias=spec.bias, **extra)
    if spec.kind == "rmsnorm":
        return child(parent, RMSNorm, eps=spec.eps, zero_centred=spec.zero_centred, **extra)
    raise ConfigError(f"unknown norm {spec.kind!r}; use 'layernorm' or 'rmsnorm'")


class Block(StackLayer):
    """``x + attn(attn_norm(x))`` then ``x + mlp(mlp_norm(x))``; with the architecture's
    ``norm_placement="post"``: ``x + attn_norm(attn(x))`` then ``x + mlp_norm(mlp(x))``; with
    ``"sandwich"``: ``x + attn_out_norm(attn(attn_norm(x)))`` then ``x + mlp_out_norm(mlp(mlp_norm(x)))``
    (Gemma 2 and 3). Called as ``block(x, *call, layer)`` with a :class:`LayerCall`; ``layer`` (the layer's
    index, passed by the model only when the architecture has ``layer_types``) tells the attention which
    window and RoPE base it uses.

    The token-mixing branch may be several mixers in parallel: :meth:`parallel_mixers` adds mixers beside
    ``attn`` that read the same normed input, and their outputs, each scaled (:meth:`mixer_scales`), are
    summed into one residual (Falcon-H1's attention and Mamba-2).

    With the architecture's ``hyper`` (:mod:`~theseus.model.layers.hyper_connections`), ``x`` is the
    residual streams: each branch reads its input from them through its connection (``attn_hyper``,
    ``mlp_hyper``: :meth:`hyper_connection`) and writes its output back through it, in place of the sum.

    A layer may place its norms its own way (:meth:`placement`: OLMo Hybrid's attention layers post-norm,
    its linear-attention layers pre-norm). Either branch may be absent: a family whose layers are each one
    kind (Nemotron-H's mixer layers and MLP
    layers, each with its own norm and residual) says which in :meth:`branches`, and the block has neither
    the other branch nor its norms.

    Takes its sizes from ``architecture`` (the model resolves presets and keys once) and
    passes them to its children; ``out_std`` initialises the residual output projections.
    """

    #: The attention layer ``attention()`` builds; a family may set a subclass with the same fields.
    ATTENTION: ClassVar[type[CausalSelfAttention]] = CausalSelfAttention
    #: Token mixers a layer builds in place of ``attn`` or beside it (a hybrid's state-space, convolution or
    #: linear-attention layers), declared among its components.
    MIXERS: ClassVar[tuple[type, ...]] = ()

    architecture: Architecture | None = None
    out_std: float = INIT_STD

    @classmethod
    def components(cls) -> list[type]:
        return [LayerNorm, RMSNorm, cls.ATTENTION, MLP, *cls.MIXERS]

    @property
    def sharding(self) -> ShardingPlan:
        """The union of the attention's and the MLP's plans."""
        return ShardingPlan.union(CausalSelfAttention().sharding, MLP().sharding)

    @property
    def arch(self) -> Architecture:
        if self.architecture is None:
            raise ConfigError("Block needs an Architecture; it is built by GPT / Llama")
        return self.architecture

    def setup(self) -> None:
        norm = self.arch.norm
        mixes, feeds = self.branches()
        attn = self.attention() if mixes else None
        mlp = self.feed_forward() if feeds else None
        parallel = self.parallel_mixers() if attn is not None else {}
        normed = self.placement() != "none"
        if attn is not None:
            if normed:
                self.attn_norm = make_norm(self, norm)
            self.attn = attn
        for name, mixer in parallel.items():
            setattr(self, name, mixer)
        self.parallel_names = tuple(parallel)
        if mlp is not None and normed:
            self.mlp_norm = make_norm(self, norm)
        if self.arch.hyper is not None:
            if attn is not None:
                self.attn_hyper = self.hyper_connection()
            if mlp is not None:
                self.mlp_hyper = self.hyper_connection()
        if self.placement() == "sandwich":
            if attn is not None:
                self.attn_out_norm = make_norm(self, norm)
            if mlp is not None:
                self.mlp_out_norm = make_norm(self, norm)
        if mlp is not None:
            self.mlp = mlp

    @property
    def has_attention(self) -> bool:
        """Whether the block has its token-mixing branch (``attn``; bound blocks only)."""
        return hasattr(self, "attn")

    @property
    def has_feed_forward(self) -> bool:
        """Whether the block has its feed-forward branch (``mlp``; bound blocks only)."""
        return hasattr(self, "mlp")

    def hyper_connection(self) -> HyperConnection:
        """A branch's connection to the residual streams (the architecture's ``hyper``), which the
        branch reads its input from and writes its output to."""
        spec = self.arch.hyper
        assert spec is not None
        return child(self, hyper_class(spec), streams=spec.streams, rank=spec.rank, eps=spec.eps)

    def placement(self) -> str:
        """Where this layer's norms go (``pre``, ``post``, ``sandwich`` or ``none``; see :meth:`branch`): the
        architecture's ``norm_placement`` here; a family whose layer kinds differ chooses per layer."""
        return self.arch.norm.placement

    def branches(self) -> tuple[bool, bool]:
        """Whether the layer has its token-mixing branch (``attn``) and its feed-forward branch (``mlp``):
        both here; a family whose layers are each one kind leaves one out."""
        return True, True

    def parallel_mixers(self) -> dict[str, Module]:
        """Token mixers beside ``attn``, by attribute name: each reads the same normed input as ``attn`` and
        their outputs and its are summed into the one residual branch (Falcon-H1's Mamba-2 beside its
        attention); none here. Their inputs and outputs are scaled by :meth:`mixer_scales`."""
        return {}

    def mixer_scales(self, name: str) -> tuple[float, float]:
        """What the input and the output of mixer ``name`` (``attn`` or a parallel one) are multiplied by:
        1 and 1 here (Falcon-H1: its attention and SSM in and out multipliers)."""
        return 1.0, 1.0

    def attention(self) -> Module:
        """The layer's attention branch (``attn``): grouped-query attention here; a subclass may return
        another layer with the same call (multi-head latent attention, a state-space mixer)."""
        arch = self.arch
        return child(
            self,
            self.ATTENTION,
            n_embd=arch.n_embd,
            dropout=arch.dropout,
            spec=arch.attention,
            position=arch.position,
            layer_types=arch.layer_types,
            out_std=self.out_std,
            **self.attention_options(),
        )

    def attention_options(self) -> dict[str, Any]:
        """Fields of a family's :attr:`ATTENTION` beyond :class:`CausalSelfAttention`'s, which
        ``attention()`` passes on (none here; SmolLM3's NoPE layers)."""
        return {}

    def feed_forward(self) -> Module:
        """The layer's feed-forward branch (``mlp``): a dense MLP here; a subclass may return another
        layer with the same call, ``(x, deterministic) -> x`` (a mixture of experts)."""
        arch, spec = self.arch, self.arch.feed_forward
        return child(
            self,
            MLP,
            n_embd=arch.n_embd,
            d_ff=spec.d_ff,
            activation=spec.activation,
            dropout=arch.dropout,
            use_bias=spec.bias,
            out_std=self.out_std,
            **self.feed_forward_options(),
        )

    def feed_forward_options(self) -> dict[str, Any]:
        """Fields of the dense :class:`MLP` beyond those ``feed_forward()`` sets from the architecture (none
        here; Falcon-H1's gate and down multipliers)."""
        return {}

    def flops(self, seq: int, layer: int | None = None) -> int:
        """Forward + backward FLOPs of ``seq`` tokens: the sum of its parts' own counts, the attention
        branch's (``attn``: projections and scores, of layer ``layer``'s window when the architecture
        has ``layer_types``) and the feed-forward's (``mlp``: a dense MLP, or the weights a token passes
        through in a mixture), with the parallel mixers' beside ``attn``. Norms and residual sums are elementwise and
        not counted. Unbound, the
        parts are counted on a copy bound to no variables (:func:`counting_child`); a subclass that adds
        a branch adds its count: ``super().flops(seq, layer) + self.extra.flops(seq)`` (on the bound
        block the model counts with)."""
        if self.scope is None:
            return self.bind({}).flops(seq, layer)
        attention = mlp = 0
        if self.has_attention:
            attn: Any = self.attn  # an attention layer takes its index; Module.flops does not
            attention = attn.flops(seq) if layer is None else attn.flops(seq, layer=layer)
            attention += sum(int(getattr(self, name).flops(seq)) for name in self.parallel_names)
        if self.has_feed_forward:
            mlp = self.mlp.flops(seq)
        return int(attention) + int(mlp)

    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        placement = self.placement()
        if self.has_attention:
            x = self.residual(x, lambda h: self.mix(h, call, layer), "attn", placement)
        if self.has_feed_forward:
            x = self.residual(x, lambda h: self.mlp(h, call.deterministic), "mlp", placement)
        return constrain(x, ACTIVATION_AXES)

    def residual(self, x: jax.Array, apply: Any, name: str, placement: str) -> jax.Array:
        """``x`` after branch ``name``: ``x + branch(x)``, or with hyper-connections the streams ``x`` with
        the branch's output written back (its input read from them); the output times :meth:`scaled`."""
        hyper: HyperConnection | None = getattr(self, f"{name}_hyper", None)
        if hyper is None:
            return x + self.scaled(self.branch(x, apply, name, placement))
        h, weights = hyper.read(x)
        return hyper.write(x, self.scaled(self.branch(h, apply, name, placement)), weights)

    def scaled(self, out: jax.Array) -> jax.Array:
        """A branch's output as it joins the residual stream: times the architecture's
        ``residual_multiplier`` (Granite's; 1 elsewhere)."""
        scale = self.arch.residual_multiplier
        return out if scale == 1.0 else out * jnp.asarray(scale, out.dtype)

    def mix(self, h: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        """The token-mixing branch of ``h``: ``attn`` alone, or the sum of ``attn`` and the
        :meth:`parallel_mixers`, each with its input and output scaled (:meth:`mixer_scales`)."""
        total: jax.Array | None = None
        for name in ("attn", *self.parallel_names):
            scale_in, scale_out = self.mixer_scales(name)
            given = h if scale_in == 1.0 else h * jnp.asarray(scale_in, h.dtype)
            out = getattr(self, name)(given, *call, layer)
            out = out if scale_out == 1.0 else out * jnp.asarray(scale_out, out.dtype)
            total = out if total is None else total + out
        assert total is not None
        return total

    def branch(self, x: jax.Array, apply: Any, name: str, placement: str) -> jax.Array:
        """One residual branch's output (``name``: ``attn`` or ``mlp``) with its norms where ``placement``
        puts them: before it (``pre``), after it (``post``), both (``sandwich``) or none."""
        if placement == "none":
            return apply(x)
        before = getattr(self, f"{name}_norm")
        if placement == "sandwich":
            return getattr(self, f"{name}_out_norm")(apply(before(x)))
        if placement == "post":
            return before(apply(x))
        return apply(before(x))
