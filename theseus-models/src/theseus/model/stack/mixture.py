"""Mixture-of-experts language models: ``MoEBlock`` (a layer whose feed-forward is :class:`MoE`) and
``MixtureLM``, the mixin that turns a dense family (Llama, Qwen3) into its mixture (Mixtral, Qwen3-MoE)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.base.axis import ShardingPlan
from theseus.model.layers._common import child
from theseus.model.layers.moe import PRESET_KEYS, MoE, MoEKeys, MoESpec
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset
from theseus.model.stack.block import Block


@dataclass(frozen=True)
class MoEPreset(Preset):
    """A :class:`Preset` with the mixture's shape (routed experts, experts per token and their width;
    None: ``d_ff``) and routing, filling the ``architecture/moe/*`` keys left None (:data:`PRESET_KEYS`)."""

    n_experts: int = 8
    top_k: int = 2
    expert_hidden: int | None = None
    n_shared: int = 0
    shared_hidden: int | None = None
    router: str = "softmax"
    first_k_dense: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0


@dataclass(frozen=True)
class SigmoidRoutingPreset(MoEPreset):
    """A :class:`MoEPreset` with DeepSeek-V3's routing as its defaults (GLM-4.5 routes the same way): the
    sigmoid router, one shared expert, the first layer dense."""

    router: str = "sigmoid"
    n_shared: int = 1
    first_k_dense: int = 1


class MoEBlock(Block):
    """:class:`Block` whose ``mlp`` is the architecture's mixture of experts (a dense MLP when ``dense``:
    the leading ``first_k_dense`` layers)."""

    #: The mixture layer ``feed_forward()`` builds; a family may set a subclass with the same fields.
    MOE: ClassVar[type[MoE]] = MoE

    dense: bool = False

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), cls.MOE]

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan.union(super().sharding, MoE().sharding)

    def feed_forward(self) -> Module:
        arch = self.arch
        if self.dense or arch.moe is None:
            return super().feed_forward()
        moe: MoE = child(
            self,
            self.MOE,
            **dataclasses.asdict(arch.moe),
            n_embd=arch.n_embd,
            d_ff=arch.feed_forward.d_ff,
            activation=arch.feed_forward.activation,
            out_std=self.out_std,
            loss_weight=1.0 / arch.moe_layers,
            **self.moe_options(),
        )
        return moe

    def moe_options(self) -> dict[str, Any]:
        """Fields of a family's :attr:`MOE` beyond :class:`MoE`'s, which ``feed_forward()`` passes on
        (none here)."""
        return {}


class MixtureLM(MoEKeys):
    """Mixin for a :class:`TransformerLM` family whose layers from ``architecture/moe/first_k_dense`` on
    route each token through ``top_k`` of ``n_experts`` experts (``class Mixtral(MixtureLM, Llama)``);
    ``n_experts`` 0 leaves every layer a dense MLP of ``architecture/d_ff`` (Granite's dense releases).

    The ``architecture/moe/*`` keys left None take the preset's values (:class:`MoEPreset`); the
    resolved mixture is ``architecture.moe``. FLOPs and MFU count the active weights (the chosen
    experts, shared experts and router), and :meth:`inactive_parameter_count` the experts a token
    skips (the start-up line prints total and active counts). With ``model/scan_layers`` the leading
    dense layers scan as their own run, ``dense_blocks``, and the mixture layers as ``blocks``
    (:attr:`~theseus.model.stack.transformer.TransformerLM.layer_runs`).
    """

    BLOCK: ClassVar[type[Block]] = MoEBlock

    def resolve_architecture(self) -> Architecture:
        arch: Architecture = super().resolve_architecture()  # type: ignore[misc]
        return arch.with_mixture(self.mixture(arch.feed_forward.d_ff)).validate()

    def mixture(self, d_ff: int) -> MoESpec | None:
        """The ``architecture/moe/*`` keys resolved, the preset's values where they are left None; None
        (every layer a dense MLP of ``architecture/d_ff``) where ``n_experts`` is 0."""
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)  # type: ignore[attr-defined]
        given = {key: getattr(preset, key) for key in PRESET_KEYS} if isinstance(preset, MoEPreset) else {}
        experts = given.get("n_experts") if self.n_experts is None else self.n_experts
        if experts == 0:
            return None
        return self.moe_spec(d_ff, given)

    def _layer_options(self, layer: int) -> dict[str, Any]:
        moe = self.architecture.moe
        return {"dense": moe is not None and layer < moe.first_k_dense}

    def inactive_parameter_count(self) -> int:
        """Parameters a token does not pass through (the routed experts it did not choose)."""
        return self.architecture.inactive_params()

    def active_parameter_count(self) -> int:
        """Parameters one token passes through: :meth:`parameter_count` less the experts it skips."""
        return int(self.parameter_count()) - self.inactive_parameter_count()  # type: ignore[attr-defined]


__all__ = ["MixtureLM", "MoEBlock", "MoEPreset", "SigmoidRoutingPreset"]
