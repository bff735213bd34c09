"""DeepSeek-V3's multi-token prediction (MTP): ``architecture/mtp_depth`` modules after the main model.

Module ``k`` (1..D) reads, at position ``i``, the main model's token embedding of ``t_{i+k}`` and the
previous depth's hidden state ``h^{k-1}_i`` (``h^0``: the main model's last layer, before its final
norm), each RMS-normalised (``enorm``, ``hnorm``), concatenated embedding first and projected back to
the model width (``eh_proj``, ``[2 * n_embd, n_embd]``); one DeepSeek-V3 mixture layer (``block``:
latent attention and the mixture of experts) gives ``h^k_i``, whose logits are ``head_norm`` (the
checkpoints' ``shared_head.norm``) followed by the main model's output head. Module ``k`` predicts
``t_{i+k+1}``: its targets are the main targets ``y`` shifted left by ``k``; a position counts where
that target is not -1, both position ``i`` and ``i+k`` are real tokens (of the same packed example),
and ``i + k < T`` (the last ``k`` positions have no target). The embedding and the head are the main
model's (shared, as in the DeepSeek-V3 technical report).

The training objective adds ``model/mtp_weight / D * sum_k CE_k`` as an auxiliary loss
(:data:`theseus.base.sown.AUX_LOSSES`, name ``mtp``) and reports the mean of the ``CE_k`` as the
metric ``mtp_loss``; decoding and calls without targets skip the modules (initialisation runs them
once, to create their parameters).

The family's resolved :class:`DeepseekV3Architecture` (latent attention, MTP depth) is here too, where
both the model and its Hugging Face mapping read it.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.base.sown import AUX_LOSSES, AUX_METRICS
from theseus.model.layers._common import ACTIVATION_AXES, INIT_STD, cast, child, constrain, normal, param
from theseus.model.layers.attention import is_segment_ids
from theseus.model.layers.latent_attention import MLASpec
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture
from theseus.model.stack.block import LayerCall, counting_child, make_norm

if TYPE_CHECKING:
    from theseus.model.stack.transformer import TransformerLM

#: The name of the sown auxiliary loss and of the logged metric (the mean cross-entropy over depths).
MTP_AUX_LOSS = "mtp"
MTP_METRIC = "mtp_loss"


@dataclass(frozen=True)
class DeepseekV3Architecture(Architecture):
    """DeepSeek-V3's :class:`Architecture`: multi-head latent attention in every layer (``mla``; None:
    grouped-query attention of ``head_dim``) and ``mtp_depth`` multi-token-prediction modules (0: none;
    each counts its own FLOPs, :meth:`MTPModule.flops`)."""

    mla: MLASpec | None = None
    mtp_depth: int = 0

    def _validate_rotary(self) -> None:
        if self.mla is None:
            super()._validate_rotary()
        else:
            self.mla.validate()


def deepseek_architecture(arch: Architecture, mla: MLASpec | None, depth: int) -> DeepseekV3Architecture:
    """``arch`` with latent attention ``mla`` and ``mtp_depth=depth``."""
    own = {"mla", "mtp_depth"}
    values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(arch) if f.name not in own}
    return DeepseekV3Architecture(**values, mla=mla, mtp_depth=depth)


def latent(arch: Architecture) -> MLASpec | None:
    """The latent attention of ``arch`` (None: grouped-query attention)."""
    return arch.mla if isinstance(arch, DeepseekV3Architecture) else None


def mtp_depth(arch: Architecture) -> int:
    """The multi-token-prediction modules of ``arch`` (0 for a plain :class:`Architecture`)."""
    return arch.mtp_depth if isinstance(arch, DeepseekV3Architecture) else 0


class MTPModule(Module):
    """One multi-token-prediction depth: ``enorm`` / ``hnorm`` (RMSNorms), ``eh_proj`` (kernel
    ``[2 * n_embd, n_embd]``), ``block`` (a ``BLOCK`` mixture layer: DeepSeek-V3's, set by its model)
    and ``head_norm``. ``__call__(h, embedded, call)`` -> ``(h^k, head_norm(h^k))``, ``block`` called with
    ``call`` (a :class:`~theseus.model.stack.block.LayerCall`)."""

    #: The layer of each depth, a :class:`~theseus.model.stack.mixture.MoEBlock` (built with ``dense=False``).
    BLOCK: ClassVar[type[Module]] = Module

    architecture: Architecture | None = None
    out_std: float = INIT_STD

    @classmethod
    def components(cls) -> list[type]:
        return [cls.BLOCK]

    def setup(self) -> None:
        arch = self.architecture
        assert arch is not None, "MTPModule is built by DeepseekV3"
        self.enorm = make_norm(self, arch.norm)
        self.hnorm = make_norm(self, arch.norm)
        e = arch.n_embd
        self.eh_proj = param(self, "eh_proj", normal(INIT_STD), (2 * e, e), (Axis.MLP, Axis.EMBED))
        self.block = child(self, self.BLOCK, architecture=arch, out_std=self.out_std, dense=False)
        self.head_norm = make_norm(self, arch.norm)

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of one depth for ``seq`` tokens: ``eh_proj``, its layer's own count
        (a mixture layer) and the shared output head its logits pass through. Works unbound."""
        arch = self.architecture
        assert arch is not None, "MTPModule is built by DeepseekV3"
        block = counting_child(self, self.BLOCK, architecture=arch, dense=False)
        projections = 2 * arch.n_embd * arch.n_embd + arch.n_embd * arch.padded_vocab_size
        return 6 * seq * projections + int(block.flops(seq))

    def __call__(self, h: jax.Array, embedded: jax.Array, call: LayerCall) -> tuple[jax.Array, jax.Array]:
        dtype = self._activation_dtype
        joined = jnp.concatenate([self.enorm(cast(embedded, dtype)), self.hnorm(cast(h, dtype))], axis=-1)
        h = constrain(jnp.einsum("bti,io->bto", joined, cast(self.eh_proj, dtype)), ACTIVATION_AXES)
        h = self.block(h, *call)
        return h, self.head_norm(h)


def shift_left(a: jax.Array, k: int, fill: Any) -> jax.Array:
    """``a`` ``[B, T]`` moved ``k`` steps left (``out[:, i] = a[:, i + k]``), the last ``k`` columns ``fill``."""
    steps = a.shape[1]
    keep = max(steps - k, 0)
    tail = jnp.full((a.shape[0], steps - keep), fill, a.dtype)
    return jnp.concatenate([a[:, steps - keep :], tail], axis=1)


def mtp_scored(y: jax.Array, padding_mask: jax.Array | None, k: int) -> tuple[jax.Array, jax.Array]:
    """``(targets, scored)`` of depth ``k``: ``y`` shifted left by ``k`` (-1 past the end) and the bool
    positions that count (target not -1; positions ``i`` and ``i + k`` real and, with segment ids, of
    the same example)."""
    targets = shift_left(jnp.asarray(y), k, -1)
    scored = targets != -1
    if padding_mask is not None:
        mask = jnp.asarray(padding_mask)
        later = shift_left(mask, k, 0)
        if is_segment_ids(mask):
            scored = scored & (mask > 0) & (later == mask)
        else:
            scored = scored & mask.astype(jnp.bool_) & later.astype(jnp.bool_)
    return targets, scored


def multi_token_prediction(
    model: TransformerLM,
    modules: Any,
    h: jax.Array,
    x: jax.Array,
    y: jax.Array | None,
    call: LayerCall,
    weight: float,
) -> list[jax.Array]:
    """Run the ``modules`` (depth 1, 2, ...) of the bound ``model`` on the main model's last hidden
    state ``h``, their layers called with ``call`` (whose padding mask also masks the targets); with targets
    ``y``, sow ``weight / D * sum_k CE_k`` and the mean ``CE_k``. Returns the ``CE_k`` ([] without ``y``)."""
    x = jnp.asarray(x)
    losses = []
    for k, module in enumerate(modules, start=1):
        embedded = model.embed_tokens(shift_left(x, k, 0))
        h, normed = module(h, embedded, call)
        if y is None:
            continue
        targets, scored = mtp_scored(y, call.padding_mask, k)
        losses.append(model.cross_entropy(normed, targets, scored))
    if losses:
        total = sum(losses[1:], losses[0])
        model.sow(AUX_LOSSES, MTP_AUX_LOSS, weight / len(losses) * total, init_fn=lambda: 0.0, reduce_fn=operator.add)
        model.sow(AUX_METRICS, MTP_METRIC, total / len(losses), init_fn=lambda: 0.0, reduce_fn=operator.add)
    return losses


__all__ = [
    "MTP_AUX_LOSS",
    "MTP_METRIC",
    "DeepseekV3Architecture",
    "MTPModule",
    "deepseek_architecture",
    "latent",
    "mtp_depth",
    "mtp_scored",
    "multi_token_prediction",
    "shift_left",
]
