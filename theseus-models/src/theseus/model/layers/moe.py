"""``MoE``: a mixture-of-experts feed-forward layer (router, top-k experts, optional shared experts).

Each token's router logits pick ``top_k`` of ``n_experts`` gated feed-forward experts; their outputs
are summed with the routing weights. Experts are stacked on a leading logical axis ``expert``
(``gate`` / ``up`` ``[expert, embed, mlp]``, ``down`` ``[expert, mlp, embed]``), which a layout with
``ep`` shards over the ``expert`` mesh axis. This module holds the keys, the router and the losses;
the expert computation is the pure functions of :mod:`theseus.model.layers.experts`, run under
``shard_map`` with all-to-all dispatch by :mod:`theseus.model.layers.expert_parallel` when the mesh
has an ``expert`` axis.

Routers: ``softmax`` (Mixtral, Qwen3-MoE: softmax over all experts, the top-k probabilities,
renormalised to sum 1 when ``norm_topk_prob``) and ``sigmoid`` (DeepSeek-V3: sigmoid scores, a
per-expert selection bias, group-limited choice of ``topk_group`` of ``n_group`` groups, weights
renormalised when ``norm_topk_prob`` and scaled by ``routed_scaling_factor``). The sigmoid router's
bias is a parameter the loss never trains: each training step moves it by ``bias_update_rate``
towards balance (``+rate`` for experts below the mean load, ``-rate`` above; DeepSeek-V3's
auxiliary-loss-free balancing), sown as a parameter update the train step applies
(:data:`theseus.base.sown.PARAM_UPDATES`).

Dispatch: dropless (``capacity_factor`` null) sorts the token copies by expert and runs the three
projections as grouped matmuls (the megablox Pallas kernels, the ``auto`` choice on TPU, or
``jax.lax.ragged_dot``), or on CPU and
GPU (XLA's ``ragged_dot`` there does every group's work over all rows) as one matmul per block of one
expert's copies (:func:`blocked_experts`). Under data parallelism each device dispatches its own
rows with the experts' weights gathered once per layer; with a capacity factor each expert takes
at most ``ceil(capacity_factor * tokens * top_k / n_experts)`` copies (first choices before second
ones, then in token order) and the rest are dropped (their share of the output is zero). The backward
pass keeps the dispatch's products and exchanges and redoes the rest, the weights' gathers and
slices among them (:func:`~theseus.model.layers.experts.recomputed`): what a scanned model keeps per
mixture layer is its experts' activations, as a dense layer's.

The layer sows into the trainer's collections: the load-balancing loss (Switch Transformer /
Mixtral form, ``n_experts * sum_e f_e * P_e`` with ``f_e`` the fraction of tokens that chose expert
``e`` and ``P_e`` its mean router probability; transformers' ``load_balancing_loss_func`` of one
layer) times ``aux_loss`` and the router z-loss (mean squared logsumexp of the logits) times
``z_loss`` (each also times ``loss_weight``: a model adds the mean over its mixture layers), and
the metrics ``moe_tokens_max`` / ``moe_tokens_mean`` (token copies per expert), ``moe_drop_rate``,
``moe_load_balancing_loss`` and ``moe_z_loss`` (unweighted).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.accelerator import accelerator
from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.base.sown import AUX_LOSSES, AUX_METRICS, PARAM_UPDATES
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers import lora
from theseus.model.layers._common import (
    ACTIVATIONS,
    GATED,
    INIT_STD,
    architecture_field,
    cast,
    check_activation,
    child,
    constrain,
    layer_width,
    normal,
    optional_key,
    param,
)
from theseus.model.layers.expert_parallel import (
    data_parallel_size,
    expert_axis_size,
    hidden_axis,
    local_dropless_experts,
    parallel_capacity_experts,
    parallel_dropless_experts,
    width_axes,
)
from theseus.model.layers.experts import (
    PATHS,
    Kernels,
    Routing,
    blocked_experts,
    capacity_experts,
    capacity_slots,
    dense_experts,
    dropless_experts,
    expert_counts,
    loop_over_experts,
    recomputed,
)
from theseus.model.layers.mlp import MLP
from theseus.model.module import Module

ROUTERS = ("softmax", "sigmoid")
#: The dropless path ``dispatch=auto`` takes on each platform (others: ``blocks``). On a v5e the megablox
#: kernels ran the Mixtral shape of ``benchmarks/tpu_mfu.py`` 4 % faster than ``ragged_dot`` (238.2 against
#: 248.5 ms a step; the layer's products alone 1.35x). XLA:CPU and XLA:GPU (jax
#: 0.10) compute every group of ``jax.lax.ragged_dot`` over all rows, E/k times the routed work (a
#: Qwen3-30B-A3B-shaped layer pair compiled for H100: 22.7x its active FLOPs), so there ``auto`` takes the
#: blocked path.
AUTO_PATHS = {"tpu": "gmm"}


def auto_path() -> str:
    """The dropless path ``dispatch=auto`` takes for the accelerator the program targets."""
    return AUTO_PATHS.get(accelerator().platform, "blocks")


#: The path a dispatch split over devices (expert parallelism, or each device's own rows) takes instead: the
#: megablox kernels are not typed for ``shard_map``'s varying mesh axes (jax 0.10 refuses their call there),
#: so there the grouped products are ``ragged_dot``'s.
SHARDED_PATHS = {"gmm": "ragged_dot"}
#: Dropless dispatches (:data:`~theseus.model.layers.experts.PATHS`); ``auto``: see :func:`auto_path`.
DISPATCHES = ("auto", *PATHS)
#: LoRA targets the routed experts would need (refused: PEFT has no per-expert adapters to export).
EXPERT_TARGETS = frozenset({"up", "gate", "down"})


#: The ``architecture/moe/*`` keys a mixture family's preset may fill in where they are left None.
PRESET_KEYS = (
    "n_experts",
    "top_k",
    "expert_hidden",
    "n_shared",
    "shared_hidden",
    "router",
    "first_k_dense",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
)


@dataclass(frozen=True)
class MoESpec:
    """The resolved mixture of one model (``Architecture.moe``); see :class:`MoE` for the keys."""

    n_experts: int
    top_k: int
    expert_hidden: int
    n_shared: int = 0
    shared_hidden: int | None = None
    router: str = "softmax"
    norm_topk_prob: bool = True
    capacity_factor: float | None = None
    aux_loss: float = 0.01
    z_loss: float = 0.001
    first_k_dense: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    bias_update_rate: float = 0.001
    dispatch: str = "auto"

    def validate(self, n_layers: int | None = None) -> MoESpec:
        for key, value in (
            ("n_experts", self.n_experts),
            ("top_k", self.top_k),
            ("expert_hidden", self.expert_hidden),
            ("n_group", self.n_group),
            ("topk_group", self.topk_group),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"architecture/moe/{key} must be a positive integer, got {value!r}")
        if self.top_k > self.n_experts:
            raise ConfigError(
                f"architecture/moe/top_k={self.top_k} exceeds architecture/moe/n_experts={self.n_experts}; "
                "a token cannot choose more experts than there are"
            )
        if self.dispatch not in DISPATCHES:
            raise ConfigError(f"architecture/moe/dispatch={self.dispatch!r}; choose one of {', '.join(DISPATCHES)}")
        if self.router not in ROUTERS:
            raise ConfigError(f"architecture/moe/router={self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError(
                f"architecture/moe/capacity_factor={self.capacity_factor} must be positive "
                "(e.g. 1.25), or null for dropless routing"
            )
        if self.shared_hidden is not None and (not isinstance(self.shared_hidden, int) or self.shared_hidden < 1):
            raise ConfigError(
                f"architecture/moe/shared_hidden={self.shared_hidden!r} must be a positive integer, or null for "
                "n_shared * expert_hidden"
            )
        if self.n_shared < 0 or self.first_k_dense < 0:
            raise ConfigError(
                f"architecture/moe/n_shared={self.n_shared} and first_k_dense={self.first_k_dense} must be zero or more"
            )
        if n_layers is not None and self.first_k_dense >= n_layers:
            raise ConfigError(
                f"architecture/moe/first_k_dense={self.first_k_dense} leaves no mixture layer of "
                f"architecture/n_layers={n_layers}; lower it"
            )
        if self.n_group > 1 and self.router != "sigmoid":
            raise ConfigError(
                "architecture/moe/n_group > 1 (group-limited routing) needs architecture/moe/router=sigmoid"
            )
        if self.n_experts % self.n_group or self.topk_group > self.n_group:
            raise ConfigError(
                f"architecture/moe/n_group={self.n_group} must divide n_experts={self.n_experts} and be at "
                f"least topk_group={self.topk_group}"
            )
        if self.n_group > 1 and self.top_k > self.topk_group * (self.n_experts // self.n_group):
            raise ConfigError(
                f"architecture/moe/top_k={self.top_k} exceeds the experts of topk_group={self.topk_group} groups"
            )
        if min(self.aux_loss, self.z_loss, self.bias_update_rate) < 0:
            raise ConfigError("architecture/moe/aux_loss, z_loss and bias_update_rate must be zero or more")
        return self

    @property
    def shared_width(self) -> int:
        """Hidden width of the one MLP the shared experts form: ``shared_hidden``, else ``n_shared *
        expert_hidden`` (0: none)."""
        if self.n_shared == 0:
            return 0
        return self.n_shared * self.expert_hidden if self.shared_hidden is None else self.shared_hidden

    def expert_params(self, n_embd: int, gated: bool) -> int:
        """Weights of one routed expert."""
        return (3 if gated else 2) * n_embd * self.expert_hidden

    def active_matmul_params(self, n_embd: int, gated: bool) -> int:
        """Matmul weights one token passes through in a mixture layer: its ``top_k`` experts, the
        shared experts and the router."""
        shared = (3 if gated else 2) * n_embd * self.shared_width
        return self.top_k * self.expert_params(n_embd, gated) + shared + n_embd * self.n_experts

    def inactive_params(self, n_embd: int, gated: bool) -> int:
        """Weights of one mixture layer a token does not pass through (the experts it did not choose)."""
        return (self.n_experts - self.top_k) * self.expert_params(n_embd, gated)


def whole_width(kernels: Kernels) -> Kernels:
    """The experts' weights with the model width gathered (FSDP's gather before use), still split over
    ``expert`` and ``mlp``: XLA's partitioner fails on weights split over ``data`` and ``model`` at once
    inside the expert ``shard_map``."""
    gate, up, down = kernels
    axes_in, axes_out = (Axis.EXPERT, None, Axis.MLP), (Axis.EXPERT, Axis.MLP, None)
    return (None if gate is None else constrain(gate, axes_in), constrain(up, axes_in), constrain(down, axes_out))


def route(logits: jax.Array, spec: MoESpec, bias: jax.Array | None = None) -> Routing:
    """Top-``k`` experts of each row of ``logits`` ``[N, E]`` (float32) under ``spec``'s router."""
    k = spec.top_k
    if spec.router == "softmax":
        probs = jax.nn.softmax(logits, axis=-1)
        weights, experts = jax.lax.top_k(probs, k)
    else:
        scores = jax.nn.sigmoid(logits)
        choice = scores if bias is None else scores + jax.lax.stop_gradient(bias)
        if spec.n_group > 1:
            n, e = choice.shape
            grouped = choice.reshape(n, spec.n_group, e // spec.n_group)
            group_scores = jnp.sum(jax.lax.top_k(grouped, min(2, e // spec.n_group))[0], axis=-1)
            groups = jax.lax.top_k(group_scores, spec.topk_group)[1]
            keep = jnp.sum(jax.nn.one_hot(groups, spec.n_group, dtype=jnp.bool_), axis=1, dtype=jnp.bool_)
            choice = jnp.where(jnp.repeat(keep, e // spec.n_group, axis=1), choice, -jnp.inf)
        experts = jax.lax.top_k(choice, k)[1]
        weights = jnp.take_along_axis(scores, experts, axis=-1)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    if spec.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + (1e-20 if spec.router == "sigmoid" else 0.0))
    weights = weights * spec.routed_scaling_factor
    return Routing(weights, experts.astype(jnp.int32), probs)


def expert_capacity(n_tokens: int, spec: MoESpec) -> int:
    """Token copies one expert takes under ``spec.capacity_factor`` (at least 1)."""
    assert spec.capacity_factor is not None
    return max(1, math.ceil(spec.capacity_factor * n_tokens * spec.top_k / spec.n_experts))


def load_balancing_loss(routing: Routing, n_experts: int) -> jax.Array:
    """``n_experts * sum_e f_e * P_e``: ``f_e`` the fraction of tokens with ``e`` among their top-k
    (summing to ``k``), ``P_e`` the mean probability of ``e``. 1 x ``k`` when balanced."""
    n = routing.experts.shape[0]
    counts = expert_counts(routing.experts, n_experts).astype(jnp.float32)
    return n_experts * jnp.sum(counts / n * jnp.mean(routing.probs, axis=0))


def router_z_loss(logits: jax.Array) -> jax.Array:
    """Mean over tokens of ``logsumexp(logits)^2`` (ST-MoE)."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1)))


def _dispatch(
    tokens: jax.Array, routing: Routing, kernels: Kernels, *, act: Any, spec: MoESpec, ep: int
) -> tuple[jax.Array, jax.Array | None]:
    """The routed experts' output ``[N, D]`` and, with a capacity, which copies were kept, by the path
    ``spec`` and the mesh choose (``ep``: devices on the ``expert`` axis)."""
    if ep > 1 and (spec.capacity_factor is not None or not width_axes(kernels, exclude=(MeshAxis.EXPERT,))):
        kernels = whole_width(kernels)
    if spec.capacity_factor is not None:
        capacity = expert_capacity(tokens.shape[0], spec)
        if ep > 1:
            return parallel_capacity_experts(tokens, routing, kernels, act, capacity, ep)
        return capacity_experts(tokens, routing, kernels, act, capacity)
    path = auto_path() if spec.dispatch == "auto" else spec.dispatch
    split = data_parallel_size() > 1 or hidden_axis() is not None
    local = split and tokens.shape[0] % data_parallel_size() == 0
    if path == "gmm" and (ep > 1 or local):  # per-device dispatch runs inside shard_map (see SHARDED_PATHS)
        path = SHARDED_PATHS[path]
    if ep > 1:
        return parallel_dropless_experts(tokens, routing, kernels, act, ep, path), None
    if local:
        whole = kernels if width_axes(kernels) else whole_width(kernels)  # else gathered inside, in bf16
        return local_dropless_experts(tokens, routing, whole, act, path), None
    return dropless_experts(tokens, routing, kernels, act, path), None


def _sow_scalar(module: nn.Module, collection: str, name: str, value: jax.Array) -> None:
    module.sow(collection, name, value, init_fn=lambda: 0.0, reduce_fn=operator.add)


class MoEKeys(Module):
    """The ``architecture/moe/*`` keys, shared by the :class:`MoE` layer and the mixture models (which
    resolve them once into ``Architecture.moe``)."""

    n_experts: int | None = optional_key("architecture/moe/n_experts", "routed experts per mixture layer")
    top_k: int | None = optional_key("architecture/moe/top_k", "experts each token is routed to")
    expert_hidden: int | None = optional_key(
        "architecture/moe/expert_hidden", "hidden width of one expert", "architecture/d_ff"
    )
    n_shared: int | None = optional_key(
        "architecture/moe/n_shared", "shared experts every token passes through", "the preset's, else 0"
    )
    shared_hidden: int | None = optional_key(
        "architecture/moe/shared_hidden",
        "hidden width of the one MLP the shared experts form (Granite's shared_mlp)",
        "the preset's, else n_shared * expert_hidden",
    )
    router: str | None = optional_key(
        "architecture/moe/router", "softmax | sigmoid (DeepSeek-V3)", "the preset's, else softmax"
    )
    norm_topk_prob: bool = field(
        "architecture/moe/norm_topk_prob", default=True, help="renormalise the top-k routing weights to sum 1"
    )
    capacity_factor: float | None = optional_key(
        "architecture/moe/capacity_factor",
        "token copies per expert = factor * tokens * top_k / n_experts, overflow dropped",
        "dropless",
    )
    aux_loss: float = field(
        "architecture/moe/aux_loss", default=0.01, help="coefficient of the load-balancing loss (0: off)"
    )
    z_loss: float = field("architecture/moe/z_loss", default=0.001, help="coefficient of the router z-loss (0: off)")
    first_k_dense: int | None = optional_key(
        "architecture/moe/first_k_dense", "leading layers with a dense MLP, as DeepSeek-V3", "the preset's, else 0"
    )
    n_group: int | None = optional_key(
        "architecture/moe/n_group", "expert groups of the sigmoid router", "the preset's, else 1"
    )
    topk_group: int | None = optional_key(
        "architecture/moe/topk_group",
        "groups a token's experts are chosen from, sigmoid router",
        "the preset's, else 1",
    )
    routed_scaling_factor: float | None = optional_key(
        "architecture/moe/routed_scaling_factor", "factor on the routed experts' weights", "the preset's, else 1.0"
    )
    bias_update_rate: float = field(
        "architecture/moe/bias_update_rate",
        default=0.001,
        help="per-step move of the sigmoid router's balancing bias (0: fixed bias)",
    )
    dispatch: str = field(
        "architecture/moe/dispatch",
        default="auto",
        help="dropless dispatch: ragged_dot | gmm (the megablox TPU kernels; ragged_dot where the dispatch is split "
        "over devices) | blocks | auto (gmm on TPU; blocks on CPU and GPU, whose ragged_dot does every group's work)",
    )

    def moe_spec(self, d_ff: int | None, preset: Mapping[str, Any] | None = None) -> MoESpec:
        """The keys as a validated :class:`MoESpec`. A key of :data:`PRESET_KEYS` left None takes the
        ``preset``'s value (a mixture family's :class:`~theseus.model.stack.mixture.MoEPreset`), else
        :class:`MoESpec`'s default; ``d_ff`` is the expert width when neither sets ``expert_hidden``."""
        given = preset or {}
        values: dict[str, Any] = {}
        for spec_field in dataclasses.fields(MoESpec):
            value = getattr(self, spec_field.name)
            if value is None and spec_field.name in PRESET_KEYS:
                value = given.get(spec_field.name)
                if value is None and spec_field.default is not dataclasses.MISSING:
                    value = spec_field.default
            values[spec_field.name] = value
        if values["expert_hidden"] is None:
            values["expert_hidden"] = d_ff
        for key in ("n_experts", "top_k", "expert_hidden"):
            if values[key] is None:
                raise ConfigError(f"a mixture of experts needs architecture/moe/{key}; set it")
        return MoESpec(**values).validate()


class MoE(MoEKeys):
    """Mixture-of-experts feed-forward layer; see the module docstring for routing and dispatch.

    Config keys (``architecture/moe/*``): ``n_experts``, ``top_k``, ``expert_hidden`` (each expert's
    hidden width; None: ``architecture/d_ff``), ``n_shared`` (shared experts every token passes
    through, one MLP of ``n_shared * expert_hidden``, or of ``shared_hidden``), ``router`` (softmax | sigmoid),
    ``norm_topk_prob``, ``capacity_factor`` (null: dropless), ``aux_loss`` / ``z_loss`` (loss
    coefficients), ``first_k_dense`` (leading layers with a dense MLP instead, read by the model),
    ``n_group`` / ``topk_group`` / ``routed_scaling_factor`` / ``bias_update_rate`` (sigmoid router),
    ``dispatch`` (dropless: ragged_dot | gmm | blocks | auto).

    Parameters: ``router`` ``[embed, n_experts]``, ``router_bias`` ``[expert]`` (sigmoid router),
    ``gate`` / ``up`` ``[expert, embed, mlp]``, ``down`` ``[expert, mlp, embed]``, and the ``shared``
    MLP. LoRA adapters on the routed experts are refused (``model/lora/targets`` may name the
    attention projections).
    """

    n_embd: int | None = architecture_field("n_embd")
    d_ff: int | None = architecture_field("d_ff")
    activation: str | None = architecture_field("activation")
    lora_rank: int = lora.rank_field()
    lora_targets: tuple[str, ...] = lora.targets_field()
    init_std: float = INIT_STD
    out_std: float | None = None
    #: Factor on the sown auxiliary losses (a model with ``L`` mixture layers passes ``1 / L``, so
    #: its loss adds the coefficients times the losses' mean over layers).
    loss_weight: float = 1.0

    @classmethod
    def components(cls) -> list[type]:
        return [MLP]

    @property
    def sharding(self) -> ShardingPlan:
        """Experts over the ``expert`` mesh axis (layouts with ``ep``), their widths as a dense MLP's."""
        return ShardingPlan({Axis.EXPERT: MeshAxis.EXPERT, Axis.EMBED: MeshAxis.DATA, Axis.MLP: MeshAxis.MODEL})

    @property
    def spec(self) -> MoESpec:
        return self.moe_spec(self.d_ff)

    @property
    def resolved_activation(self) -> str:
        return check_activation(self.activation or "swiglu")

    def _width(self) -> int:
        return layer_width(self, lambda params: nn.unbox(params["router"]).shape[0] if "router" in params else None)

    def active_matmul_params(self) -> int:
        """Matmul weights one token passes through: its ``top_k`` experts, the shared experts and the
        router (:meth:`MoESpec.active_matmul_params`)."""
        return self.spec.active_matmul_params(self._width(), self.resolved_activation in GATED)

    def flops(self, seq: int) -> int:
        """Forward + backward matmul FLOPs of ``seq`` tokens through the active weights,
        ``6 * seq * active_matmul_params`` (the experts a token skips cost nothing)."""
        return 6 * seq * self.active_matmul_params()

    def _kernels(self, n_embd: int, spec: MoESpec, gated: bool) -> Kernels:
        e, f = spec.n_experts, spec.expert_hidden
        out_std = self.init_std if self.out_std is None else self.out_std
        axes_in, axes_out = (Axis.EXPERT, Axis.EMBED, Axis.MLP), (Axis.EXPERT, Axis.MLP, Axis.EMBED)
        dtype = self._activation_dtype
        gate = cast(param(self, "gate", normal(self.init_std), (e, n_embd, f), axes_in), dtype) if gated else None
        up = cast(param(self, "up", normal(self.init_std), (e, n_embd, f), axes_in), dtype)
        down = cast(param(self, "down", normal(out_std), (e, f, n_embd), axes_out), dtype)
        return gate, up, down

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = False) -> jax.Array:
        spec = self.spec
        if self.lora_rank > 0 and EXPERT_TARGETS & set(lora.check_targets(self.lora_targets)):
            raise ConfigError(
                "LoRA on a mixture's experts is not supported (PEFT cannot export per-expert adapters); "
                "set model/lora/targets to attention projections, e.g. query,key,value,out"
            )
        n_embd = x.shape[-1]
        if self.n_embd is not None and self.n_embd != n_embd:
            raise ConfigError(f"MoE input width {n_embd} does not match architecture/n_embd={self.n_embd}")
        activation = self.resolved_activation
        gated, act = activation in GATED, self._expert_activation(activation)
        tokens = cast(x, self._activation_dtype).reshape(-1, n_embd)
        logits = self._router_logits(tokens, spec)
        routing, bias = self._route(logits, spec)
        kernels = self._kernels(n_embd, spec, gated)
        out, kept = self._experts(tokens, routing, kernels, act, spec)
        out = out.reshape(x.shape).astype(self._activation_dtype)
        if spec.shared_width > 0:
            shared = child(
                self,
                MLP,
                n_embd=n_embd,
                d_ff=spec.shared_width,
                activation=activation,
                use_bias=False,
                lora_rank=0,
                init_std=self.init_std,
                out_std=self.out_std,
                name="shared",
            )
            out = out + shared(x, deterministic)
        if not self.is_initializing():
            self._record(spec, logits, routing, kept, bias, deterministic)
        return out

    def _expert_activation(self, activation: str) -> Any:
        """The experts' activation function (a :class:`~theseus.model.layers.experts.GatedActivation`
        for one that reads gate and up together)."""
        return ACTIVATIONS[activation]

    def _route(self, logits: jax.Array, spec: MoESpec) -> tuple[Routing, jax.Array | None]:
        """Each token's experts and weights from the router's ``logits`` (:func:`route`), with the sigmoid
        router's balancing bias ``router_bias`` (None for the softmax router)."""
        bias = None
        if spec.router == "sigmoid":
            zeros = nn.initializers.zeros_init()
            bias = param(self, "router_bias", zeros, (spec.n_experts,), (Axis.EXPERT,)).astype(jnp.float32)
        return route(logits, spec, bias), bias

    def _router_logits(self, tokens: jax.Array, spec: MoESpec) -> jax.Array:
        """The router's float32 logits ``[N, n_experts]`` of ``tokens`` ``[N, D]`` (``router`` ``[D, E]``)."""
        shape = (tokens.shape[-1], spec.n_experts)
        router = param(self, "router", normal(self.init_std), shape, (Axis.EMBED, None))
        return jnp.dot(tokens.astype(jnp.float32), router.astype(jnp.float32))

    def _experts(
        self, tokens: jax.Array, routing: Routing, kernels: Kernels, act: Any, spec: MoESpec
    ) -> tuple[jax.Array, jax.Array | None]:
        """The routed experts' output ``[N, D]`` and, with a capacity, which copies were kept; split over
        the ``expert`` mesh axis when the mesh has one (expert parallelism)."""
        ep = expert_axis_size()
        if spec.n_experts % ep:
            raise ConfigError(
                f"architecture/moe/n_experts={spec.n_experts} cannot be split over mesh/expert={ep}; "
                f"set mesh/expert to a divisor of {spec.n_experts} or architecture/moe/n_experts to a multiple of {ep}"
            )
        if tokens.shape[0] % ep:
            raise ConfigError(
                f"{tokens.shape[0]} token rows cannot be split over mesh/expert={ep}; "
                f"make the batch a multiple of {ep} rows"
            )
        # the backward pass gathers the weights again (as FSDP does a dense layer's) rather than keeping
        # them, or their per-block slices, for every layer of a scanned stack
        dispatch = functools.partial(_dispatch, act=act, spec=spec, ep=ep)
        return recomputed(dispatch)(tokens, routing, kernels)

    def _record(
        self,
        spec: MoESpec,
        logits: jax.Array,
        routing: Routing,
        kept: jax.Array | None,
        bias: jax.Array | None,
        deterministic: bool,
    ) -> None:
        """Sow the auxiliary losses, the load metrics and (training, sigmoid router) the bias update."""
        balance = load_balancing_loss(routing, spec.n_experts)
        z = router_z_loss(logits)
        if spec.aux_loss > 0:
            _sow_scalar(self, AUX_LOSSES, "load_balancing", self.loss_weight * spec.aux_loss * balance)
        if spec.z_loss > 0:
            _sow_scalar(self, AUX_LOSSES, "router_z", self.loss_weight * spec.z_loss * z)
        counts = expert_counts(routing.experts, spec.n_experts).astype(jnp.float32)
        dropped = jnp.zeros((), jnp.float32) if kept is None else 1.0 - jnp.mean(kept.astype(jnp.float32))
        metrics: dict[str, Any] = {
            "moe_tokens_max": jnp.max(counts),
            "moe_tokens_mean": jnp.mean(counts),
            "moe_drop_rate": dropped,
            "moe_load_balancing_loss": jax.lax.stop_gradient(balance),
            "moe_z_loss": jax.lax.stop_gradient(z),
        }
        for name, value in metrics.items():
            _sow_scalar(self, AUX_METRICS, name, jax.lax.stop_gradient(value))
        if bias is not None and spec.bias_update_rate > 0 and not deterministic:
            update = spec.bias_update_rate * jnp.sign(jnp.mean(counts) - counts)
            _sow_scalar(self, PARAM_UPDATES, "router_bias", jax.lax.stop_gradient(update))


__all__ = [
    "PRESET_KEYS",
    "MoE",
    "MoEKeys",
    "MoESpec",
    "Routing",
    "blocked_experts",
    "capacity_experts",
    "capacity_slots",
    "dense_experts",
    "dropless_experts",
    "expert_capacity",
    "load_balancing_loss",
    "loop_over_experts",
    "route",
    "router_z_loss",
]
