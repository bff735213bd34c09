"""One class per policy loss of the GRPO family (``rl/loss``): its per-token terms, how they are averaged,
its checks and its metrics.

:func:`theseus.model.rl.loss.policy_loss` computes what every loss shares (importance ratios, the sampling
correction, the KL penalty) and hands the batch to the loss ``rl/loss`` names. The built-in losses follow
TRL 1.16's ``loss_type`` values and are registered as components ``rl_loss/<name>``; a plugin adds one by
subclassing :class:`PolicyLoss` and registering it the same way (``[project.entry-points."theseus.components"]
"rl_loss/mine" = "my_plugin.losses:Mine"``), then trains with ``rl/loss=mine``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from theseus.errors import ConfigError, PluginError


@dataclass(frozen=True)
class LossOptions:
    """The hyper-parameters a policy loss may read (TRL's names; each loss reads its own)."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    sampling_correction: str | None = None  # the correction's mode where rollouts carry a sampler's log-probs


@dataclass(frozen=True)
class Batch:
    """What a policy loss reads of ``B`` completions of ``T`` tokens: ``logps`` ``[B, T]`` (padding 0),
    the token log-ratios to the sampling policy, the importance ratio (``[B, T]``, or ``[B, 1]`` per
    sequence), the advantages ``[B, 1]``, the mask as booleans and weights, the tokens per completion and
    in all, the sampling correction ``[B, T]`` (None: none), and the normalisers some losses divide by."""

    logps: jax.Array
    token_log_ratio: jax.Array
    ratio: jax.Array
    advantages: jax.Array
    valid: jax.Array
    weights: jax.Array
    tokens: jax.Array
    all_tokens: jax.Array
    correction: jax.Array | None
    max_completion_length: int | None
    num_items_in_batch: jax.Array | int | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.logps.shape[0], self.logps.shape[1]

    def mean(self, x: jax.Array) -> jax.Array:
        """``x``'s mean over the masked tokens (over the sequences for one value per sequence)."""
        if x.shape[1] == 1:
            return x.mean()
        return (x * self.weights).sum() / jnp.maximum(self.all_tokens, 1.0)

    def sequence_means(self, x: jax.Array) -> jax.Array:
        """``x``'s mean over each sequence's masked tokens ``[B]`` (NaN for a sequence without one)."""
        if x.shape[1] == 1:
            return x[:, 0]
        return (x * self.weights).sum(axis=-1) / self.tokens


class PolicyLoss:
    """A policy loss: ``terms`` gives the per-token terms (the KL penalty is added after) and the loss's own
    metrics, ``reduce`` averages the masked terms ``[B, T]`` into the loss. ``CORRECTED``: whether the
    sampling correction multiplies the terms (a loss that weighs by it itself says False). ``DEFAULTS``: the
    values of ``rl/*`` keys the loss trains with when they are not set, where they differ from the others'."""

    name: ClassVar[str]
    CORRECTED: ClassVar[bool] = True
    DEFAULTS: ClassVar[Mapping[str, Any]] = {}

    def check(self, options: LossOptions) -> None:
        """A ValueError for options the loss cannot train with."""

    def terms(self, batch: Batch, options: LossOptions) -> tuple[jax.Array, dict[str, jax.Array]]:
        raise NotImplementedError(f"{type(self).__qualname__} does not define terms(batch, options)")

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        """Each sequence's mean over its own tokens, then the mean over the sequences (GRPO's)."""
        return (summed.sum(axis=-1) / jnp.maximum(batch.tokens, 1.0)).mean()


def per_item(summed: jax.Array, batch: Batch) -> jax.Array:
    """The sum over the batch divided by ``num_items_in_batch`` (the loss tokens of the whole generation
    batch; this batch's token count when not given)."""
    count = batch.all_tokens if batch.num_items_in_batch is None else jnp.asarray(batch.num_items_in_batch)
    return summed.sum() / jnp.maximum(count.astype(summed.dtype), 1.0)


class ClippedSurrogate(PolicyLoss):
    """``grpo``: ``-min(r A, clip(r, 1 - epsilon_low, 1 + epsilon_high) A)`` (``delta`` also caps the
    unclipped ratio), each sequence's mean, then the mean over sequences; metrics: the clip ratios."""

    name = "grpo"

    def terms(self, batch: Batch, options: LossOptions) -> tuple[jax.Array, dict[str, jax.Array]]:
        ratio, adv = batch.ratio, batch.advantages
        clipped = jnp.clip(ratio, 1.0 - options.epsilon_low, 1.0 + options.epsilon_high)
        unclipped = ratio if options.delta is None else jnp.minimum(ratio, options.delta)
        capped = jax.lax.stop_gradient(unclipped)
        low = ((capped < 1.0 - options.epsilon_low) & (adv < 0)).astype(ratio.dtype)
        high = ((capped > 1.0 + options.epsilon_high) & (adv > 0)).astype(ratio.dtype)
        metrics = {
            "clip_ratio/low_mean": batch.mean(low),
            "clip_ratio/high_mean": batch.mean(high),
            "clip_ratio/region_mean": batch.mean(jnp.maximum(low, high)),
            "clip_ratio/low_min": jnp.nanmin(batch.sequence_means(low)),
            "clip_ratio/high_max": jnp.nanmax(batch.sequence_means(high)),
        }
        return -jnp.minimum(unclipped * adv, clipped * adv), metrics


class DrGRPO(ClippedSurrogate):
    """``dr_grpo``: the clipped surrogate summed, divided by ``B * max_completion_length`` (a constant)."""

    name = "dr_grpo"

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        rows, width = batch.shape
        length = width if batch.max_completion_length is None else batch.max_completion_length
        return summed.sum() / (rows * length)


class DAPO(ClippedSurrogate):
    """``dapo``: the clipped surrogate summed, divided by the generation batch's loss tokens."""

    name = "dapo"

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        return per_item(summed, batch)


class BNPO(ClippedSurrogate):
    """``bnpo``: the clipped surrogate summed, divided by this batch's token count."""

    name = "bnpo"

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        return summed.sum() / jnp.maximum(batch.all_tokens, 1.0)


class LUSPO(ClippedSurrogate):
    """``luspo``: each sequence's sum, then the mean over sequences (GSPO's sequence loss times its length);
    it is GSPO's modification, so its ratio is per sequence unless ``rl/importance_sampling`` says otherwise."""

    name = "luspo"
    DEFAULTS: ClassVar[Mapping[str, Any]] = {"rl/importance_sampling": "sequence"}

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        return summed.sum(axis=-1).mean()


class CISPO(PolicyLoss):
    """``cispo`` (MiniMax-M1): ``-sg(min(r, epsilon_high)) A logps``, so every token keeps its policy
    gradient; summed over the generation batch's loss tokens. Its cap defaults to 5 (ScaleRL's value,
    which TRL recommends for it), since a cap below 1 scales every on-policy token down."""

    name = "cispo"
    DEFAULTS: ClassVar[Mapping[str, Any]] = {"rl/epsilon_high": 5.0}

    def terms(self, batch: Batch, options: LossOptions) -> tuple[jax.Array, dict[str, jax.Array]]:
        ratio, adv = batch.ratio, batch.advantages
        capped = jax.lax.stop_gradient(jnp.minimum(ratio, options.epsilon_high))
        above = (jax.lax.stop_gradient(ratio) > options.epsilon_high) & (adv > 0)
        return -capped * adv * batch.logps, {"cispo_clip_ratio": batch.mean(above.astype(ratio.dtype))}

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        return per_item(summed, batch)


class SAPO(PolicyLoss):
    """``sapo`` (soft adaptive): ``-(4 / tau) sigmoid(tau (r - 1)) A``, a smooth gate in place of the clip,
    ``tau`` ``sapo_temperature_pos`` where ``A > 0`` and ``sapo_temperature_neg`` elsewhere."""

    name = "sapo"

    def check(self, options: LossOptions) -> None:
        if min(options.sapo_temperature_pos, options.sapo_temperature_neg) <= 0:
            raise ValueError("sapo's temperatures must be positive")

    def terms(self, batch: Batch, options: LossOptions) -> tuple[jax.Array, dict[str, jax.Array]]:
        adv = batch.advantages
        temperature = jnp.where(adv > 0, options.sapo_temperature_pos, options.sapo_temperature_neg)
        temperature = temperature.astype(batch.ratio.dtype)
        return -jax.nn.sigmoid(temperature * (batch.ratio - 1.0)) * 4.0 / temperature * adv, {}


class VESPO(PolicyLoss):
    """``vespo``: ``-sg(phi(w)) A logps``, ``w`` the sequence's importance weight (its token log-ratios
    summed, the sampling correction's log added) and ``phi`` a Gamma weighting; summed over the generation
    batch's loss tokens. It weighs by the sampling correction itself, so takes a ``token_*`` mode
    (``token_mask`` unless ``rl/sampling_correction_mode`` is set)."""

    name = "vespo"
    CORRECTED = False
    DEFAULTS: ClassVar[Mapping[str, Any]] = {"rl/sampling_correction_mode": "token_mask"}

    def check(self, options: LossOptions) -> None:
        mode = options.sampling_correction
        if mode is not None and not mode.startswith("token_"):
            raise ValueError(
                f"vespo folds the sampling correction into its weight per token, so it takes a token_* mode, "
                f"got {mode!r}; set rl/sampling_correction_mode=token_mask or token_truncate"
            )

    def terms(self, batch: Batch, options: LossOptions) -> tuple[jax.Array, dict[str, jax.Array]]:
        phi = gamma_weights(batch, options)
        return -phi * batch.advantages * batch.logps, {"vespo/phi_seq_mean": batch.mean(phi)}

    def reduce(self, summed: jax.Array, batch: Batch) -> jax.Array:
        return per_item(summed, batch)


def gamma_weights(batch: Batch, options: LossOptions) -> jax.Array:
    """VESPO's per-sequence weights ``phi(w) = exp(lambda + k log w - lambda w)`` ``[B, 1]``, no gradient:
    ``k``, ``lambda`` the ``_pos`` options where ``A >= 0``, else the ``_neg`` ones (lambda at least 1e-4);
    each token log-ratio clamped to ``[-20, 20]``, the total to ``[log 1e-8, 20]``."""
    floor = math.log(1e-8)
    total = jnp.where(batch.valid, jnp.clip(batch.token_log_ratio, -20.0, 20.0), 0.0).sum(axis=-1, keepdims=True)
    if batch.correction is not None:  # a [B, T] token ratio: log(pi_old / pi_sampler), masked tokens' 0 -> floor
        logs = jnp.clip(jnp.log(batch.correction.astype(total.dtype)), floor, 20.0)
        total = total + jnp.where(batch.valid, logs, 0.0).sum(axis=-1, keepdims=True)
    log_w = jnp.clip(total, floor, 20.0)
    nonnegative = batch.advantages >= 0
    k = jnp.where(nonnegative, options.vespo_k_pos, options.vespo_k_neg).astype(total.dtype)
    lam = jnp.where(nonnegative, options.vespo_lambda_pos, options.vespo_lambda_neg)
    lam = jnp.maximum(lam, 1e-4).astype(total.dtype)
    phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
    return jax.lax.stop_gradient(jnp.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0))


#: The built-in losses by name (each also registered as component ``rl_loss/<name>``).
BUILT_IN: dict[str, type[PolicyLoss]] = {
    loss.name: loss for loss in (ClippedSurrogate, DrGRPO, DAPO, BNPO, CISPO, SAPO, LUSPO, VESPO)
}


def loss_class(name: str) -> type[PolicyLoss]:
    """The policy loss ``rl/loss`` names: a built-in one, else one a plugin registered as ``rl_loss/<name>``;
    an unknown name is one ConfigError line naming the installed ones."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    from theseus.plugins.discovery import plugins

    try:
        found = plugins().registry.load_component("rl_loss", name)
    except PluginError as error:
        raise ConfigError(f"rl/loss={name!r}: {error}") from None
    if not (isinstance(found, type) and issubclass(found, PolicyLoss)):
        raise ConfigError(f"rl/loss={name!r} names {found!r}, not a theseus.model.rl.policy_losses.PolicyLoss subclass")
    return found


def loss_default(name: str, key: str, general: Any) -> Any:
    """The value the loss ``name`` trains with for ``key`` when the key is not set (its ``DEFAULTS``), else
    ``general``; an unknown loss takes ``general`` (``rl/loss`` is checked on its own)."""
    try:
        return loss_class(name).DEFAULTS.get(key, general)
    except ConfigError:
        return general


def policy_loss_names() -> list[str]:
    """Every policy loss ``rl/loss`` may name: the built-in ones, then those plugins registered."""
    from theseus.plugins.discovery import plugins

    registered = [entry.name for entry in plugins().registry.components_of("rl_loss")]
    return list(dict.fromkeys([*BUILT_IN, *registered]))


def as_options(values: dict[str, Any]) -> LossOptions:
    """:class:`LossOptions` from ``policy_loss``'s keywords (those it does not name are ignored)."""
    fields = LossOptions.__dataclass_fields__
    return LossOptions(**{name: value for name, value in values.items() if name in fields})


__all__ = [
    "BNPO",
    "BUILT_IN",
    "CISPO",
    "DAPO",
    "LUSPO",
    "SAPO",
    "VESPO",
    "Batch",
    "ClippedSurrogate",
    "DrGRPO",
    "LossOptions",
    "PolicyLoss",
    "gamma_weights",
    "loss_class",
    "loss_default",
    "policy_loss_names",
]
