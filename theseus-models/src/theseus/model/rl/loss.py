"""The GRPO family of policy losses, group-relative advantages and the distillation losses.

Pure ``jax.numpy`` functions: every string, float and ``None`` option is static (a Python value
read while tracing), every array may be traced, so each function jits with its options static.
The definitions follow TRL 1.16 (``GRPOTrainer`` and ``GKDTrainer.generalized_jsd_loss``) and are
tested against it in ``tests/rl/test_losses.py``.

Shapes: ``B`` completions of ``T`` (padded) tokens; per-token log-probabilities are those of the
completion tokens under the policy being trained (``logps``), under it when the rollout was made
(``old_logps``), under the reference (``ref_logps``) and, when another policy sampled the rollout,
under that one (``sampling_logps``, for the importance-sampling correction); ``mask`` is 1 on the
completion's tokens and 0 on padding (and on any token excluded from the loss, such as a tool's answer).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from theseus.model.rl.importance import SamplingCorrection, sampling_ratio
from theseus.model.rl.policy_losses import (
    BUILT_IN,
    Batch,
    ClippedSurrogate,
    LossOptions,
    PolicyLoss,
    loss_class,
    policy_loss_names,
)

#: The built-in policy losses (``rl/loss``): TRL 1.16's ``loss_type`` values, one class each
#: (:mod:`theseus.model.rl.policy_losses`; a plugin registers more as ``rl_loss/<name>``).
LOSS_TYPES = tuple(BUILT_IN)
#: The losses of the clipped surrogate (they differ in how the per-token terms are averaged).
CLIPPED = tuple(name for name, loss in BUILT_IN.items() if issubclass(loss, ClippedSurrogate))
#: Where the importance ratio lives (``rl/importance_sampling``): per token, or per sequence (GSPO).
IMPORTANCE_SAMPLING = ("token", "sequence")
#: How advantages are scaled: by each group's reward std, by the whole batch's, or not at all.
REWARD_SCALES = ("group", "batch", "none")
#: ``generalized_jsd``'s reductions.
REDUCTIONS = ("batchmean", "sum", "mean", "none")

LossType = str  # a built-in loss (LOSS_TYPES) or one a plugin registered
ImportanceSampling = Literal["token", "sequence"]
RewardScale = Literal["group", "batch", "none"]


def _nanstd(x: jax.Array, axis: int | None = None) -> jax.Array:
    """The unbiased (Bessel-corrected) standard deviation of the non-NaN values along ``axis``;
    NaN where fewer than two values are present."""
    count = jnp.sum(~jnp.isnan(x), axis=axis, keepdims=True)
    mean = jnp.nanmean(x, axis=axis, keepdims=True)
    variance = jnp.nanmean((x - mean) ** 2, axis=axis, keepdims=True)
    variance = jnp.where(count > 1, variance * count / jnp.maximum(count - 1, 1), jnp.nan)
    return jnp.squeeze(jnp.sqrt(variance), axis=axis)


def _reward_scale(scale: bool | str) -> str:
    if scale is True:
        return "group"
    if scale is False:
        return "none"
    if scale not in REWARD_SCALES:
        raise ValueError(f"scale must be a bool or one of {REWARD_SCALES}, got {scale!r}")
    return str(scale)


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    scale: bool | RewardScale = True,
    eps: float = 1e-4,
) -> jax.Array:
    """Group-relative advantages of ``N = prompts * group_size`` rewards, each prompt's completions
    consecutive.

    Each reward minus the mean reward of its group (the completions of the same prompt); then, with
    ``scale`` ``True`` or ``"group"``, divided by that group's standard deviation plus ``eps``, with
    ``"batch"`` by the standard deviation of all ``N`` rewards plus ``eps``, and with ``False`` or
    ``"none"`` (Dr. GRPO) not divided. Standard deviations are unbiased (divide by ``n - 1``); one
    of a single value counts as 0. A NaN reward marks an unscorable completion: it is left out of its
    group's mean and std and its advantage is 0 (as is every advantage of a group whose std is
    undefined). TRL 1.16's ``GRPOTrainer`` (``scale_rewards``, ``multi_objective_aggregation=
    "sum_then_normalize"``, eps ``1e-4``) computes the same.
    """
    mode = _reward_scale(scale)
    if rewards.ndim != 1 or group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards must be [prompts * group_size]; got shape {rewards.shape} for group_size {group_size}"
        )
    groups = rewards.reshape(-1, group_size)
    advantages = rewards - jnp.repeat(jnp.nanmean(groups, axis=1), group_size)
    if mode == "group":
        std = jnp.repeat(_nanstd(groups, axis=1), group_size) if group_size > 1 else jnp.zeros_like(rewards)
        advantages = advantages / (std + eps)
    elif mode == "batch":
        std = _nanstd(rewards) if rewards.shape[0] > 1 else jnp.zeros((), rewards.dtype)
        advantages = advantages / (std + eps)
    return jnp.nan_to_num(advantages, nan=0.0)


def policy_loss(
    logps: jax.Array,
    old_logps: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    loss_type: LossType = "grpo",
    importance_sampling: ImportanceSampling = "token",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_logps: jax.Array | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch: jax.Array | int | None = None,
    kl_ratio_correction: bool = True,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    sampling_logps: jax.Array | None = None,
    sampling_correction: SamplingCorrection | None = "sequence_mask",
    sampling_clip_min: float | None = None,
    sampling_clip_max: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The policy loss of the GRPO family and its metrics: ``loss_type`` names the loss class that gives the
    per-token terms and their averaging (:mod:`theseus.model.rl.policy_losses`: the built-in ones below, or
    one a plugin registered as ``rl_loss/<name>``); the ratios, the sampling correction and the KL penalty
    are computed here for every loss.

    ``logps``, ``old_logps``, ``ref_logps``, ``sampling_logps``, ``mask``: ``[B, T]``;
    ``advantages``: ``[B]``.

    Importance ratio ``r``: with ``importance_sampling="token"``, ``exp(logps - old_logps)`` per token;
    with ``"sequence"`` (GSPO), the exponential of the sequence's mean log-ratio over its masked
    tokens, one value shared by all its tokens. Per-token terms, with ``A`` the advantage:

    * the clipped surrogate (``grpo``, ``dr_grpo``, ``dapo``, ``bnpo``, ``luspo``):
      ``-min(r A, clip(r, 1 - epsilon_low, 1 + epsilon_high) A)`` (clip-higher when ``epsilon_high >
      epsilon_low``); ``delta`` (two-sided clipping) also caps the unclipped ``r`` at ``delta``;
    * ``cispo`` (MiniMax-M1): ``-sg(min(r, epsilon_high)) A logps``, the ratio capped at
      ``epsilon_high`` (ScaleRL recommends 5) and without gradient, so every token keeps its
      policy-gradient term;
    * ``sapo`` (soft adaptive): ``-(4 / tau) sigmoid(tau (r - 1)) A``, a smooth gate in place of the
      clip, ``tau`` ``sapo_temperature_pos`` where ``A > 0`` and ``sapo_temperature_neg`` elsewhere;
    * ``vespo``: ``-sg(phi(w)) A logps`` with ``w`` the sequence's importance weight (the exponential
      of its summed token log-ratios, each clamped to ``[-20, 20]``, the total to ``[log 1e-8, 20]``)
      and the Gamma weighting ``phi(w) = exp(lambda + k log w - lambda w)`` (``phi(1) = 1``): ``k``,
      ``lambda`` are ``vespo_k_pos``, ``vespo_lambda_pos`` where ``A >= 0``, the ``_neg`` ones
      elsewhere (lambda at least 1e-4). It uses the token-level log-ratios whatever
      ``importance_sampling`` is.

    Rollouts sampled by another policy (``sampling_logps``, the sampler's per-token log-probabilities,
    NaN where it gave none): with ``sampling_correction`` one of ``SAMPLING_CORRECTIONS``, each
    token's term is multiplied by ``theseus.model.rl.importance.sampling_ratio`` of ``old_logps``
    against them, bounded by ``sampling_clip_min`` / ``sampling_clip_max``; ``vespo`` instead adds
    the log of that ratio (a ``token_*`` mode) to its sequence weight. Without ``sampling_logps``, or
    with ``sampling_correction=None``, nothing is corrected.

    KL penalty (``beta > 0``, needs ``ref_logps``): the k3 estimator ``exp(d) - d - 1`` with ``d =
    ref_logps - logps``, multiplied by the (differentiable) ratio ``r`` when ``kl_ratio_correction``
    (TRL's ``use_bias_correction_kl``, on by default, makes its gradient that of the reverse KL under
    off-policy samples), times ``beta``, added to each token's term (after the sampling correction).

    Aggregation of the per-token terms over the masked tokens:

    * ``grpo``, ``sapo``: each sequence's mean over its own tokens, then the mean over the ``B``
      sequences (a short completion's tokens weigh more than a long one's);
    * ``luspo``: each sequence's sum over its tokens, then the mean over the sequences (GSPO's
      sequence loss scaled by the sequence's length; meant for ``importance_sampling="sequence"``);
    * ``bnpo``: the sum over every token of the batch divided by the batch's token count;
    * ``dr_grpo``: the sum divided by ``B * max_completion_length`` (a constant, so no length bias;
      ``max_completion_length`` defaults to ``T``);
    * ``dapo``, ``cispo``, ``vespo``: the sum divided by ``num_items_in_batch``, the number of loss
      tokens in the whole generation batch that this batch is part of (TRL counts it over all
      processes' completions of one generation, then rescales it to one accumulation window: divided
      by the process count, times accumulation steps over steps per generation); it defaults to this
      batch's token count, which makes ``dapo`` ``bnpo``.

    Padding never reaches a value or a gradient (log-ratios and log-probabilities there are replaced
    by 0). Metrics (TRL's names), of the clipped surrogate: ``clip_ratio/low_mean`` (the fraction of
    ratios below ``1 - epsilon_low`` with a negative advantage), ``clip_ratio/high_mean`` (above ``1 +
    epsilon_high`` with a positive advantage), ``clip_ratio/region_mean`` (either), averaged over
    masked tokens, or over sequences with ``"sequence"`` (the ratio capped at ``delta`` when given, as
    TRL counts them); ``clip_ratio/low_min`` and ``clip_ratio/high_max``, the least and largest
    per-sequence fractions; of ``cispo``: ``cispo_clip_ratio``, the fraction of ratios above
    ``epsilon_high`` with a positive advantage; of ``vespo``: ``vespo/phi_seq_mean``, the mean weight
    over sequences; of every loss: ``ratio_mean``, the mean ratio alike; ``kl``, the mean per-token KL
    term (ratio-corrected as in the loss, without ``beta``), present whenever ``ref_logps`` is given;
    with a sampling correction, ``sampling_ratio``'s metrics.
    """
    loss_class = BUILT_IN.get(loss_type) or _registered(loss_type)
    if importance_sampling not in IMPORTANCE_SAMPLING:
        raise ValueError(f"importance_sampling must be one of {IMPORTANCE_SAMPLING}, got {importance_sampling!r}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("a KL penalty (beta != 0) needs ref_logps")
    if logps.ndim != 2 or logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps, old_logps and mask must share one [B, T] shape: {logps.shape}, {old_logps.shape}, {mask.shape}"
        )
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be [B] = {logps.shape[:1]}, got {advantages.shape}")
    correcting = sampling_logps is not None and sampling_correction is not None
    options = LossOptions(
        epsilon_low,
        epsilon_high,
        delta,
        sapo_temperature_pos,
        sapo_temperature_neg,
        vespo_k_pos,
        vespo_lambda_pos,
        vespo_k_neg,
        vespo_lambda_neg,
        sampling_correction if correcting else None,
    )
    loss_fn = loss_class()
    loss_fn.check(options)

    dtype = logps.dtype
    rows, width = logps.shape
    valid = mask.astype(bool)
    weights = mask.astype(dtype)
    tokens = weights.sum(axis=-1)
    token_log_ratio = jnp.where(valid, logps - old_logps, 0.0)
    log_ratio = token_log_ratio
    if importance_sampling == "sequence":
        log_ratio = (token_log_ratio.sum(axis=-1) / jnp.maximum(tokens, 1.0))[:, None]  # [B, 1]
    correction: jax.Array | None = None
    sampling_metrics: dict[str, jax.Array] = {}
    if correcting:
        assert sampling_logps is not None and sampling_correction is not None
        correction, sampling_metrics = sampling_ratio(
            old_logps,
            sampling_logps,
            mask,
            mode=sampling_correction,
            clip_min=sampling_clip_min,
            clip_max=sampling_clip_max,
        )
    batch = Batch(
        jnp.where(valid, logps, 0.0),
        token_log_ratio,
        jnp.exp(log_ratio),
        advantages.astype(dtype)[:, None],
        valid,
        weights,
        tokens,
        weights.sum(),
        correction,
        max_completion_length,
        num_items_in_batch,
    )

    per_token, metrics = loss_fn.terms(batch, options)
    if correction is not None and loss_fn.CORRECTED:
        per_token = per_token * correction.astype(dtype)
    kl = None
    if ref_logps is not None:
        diff = jnp.where(valid, ref_logps.astype(dtype) - logps, 0.0)
        kl = jnp.exp(diff) - diff - 1.0
        if kl_ratio_correction:
            kl = kl * batch.ratio
        if beta != 0.0:
            per_token = per_token + beta * kl
    loss = loss_fn.reduce(jnp.broadcast_to(per_token, (rows, width)) * weights, batch)
    metrics = {**metrics, "ratio_mean": batch.mean(jax.lax.stop_gradient(batch.ratio))}
    if kl is not None:
        metrics["kl"] = batch.mean(jax.lax.stop_gradient(jnp.broadcast_to(kl, (rows, width))))
    return loss, {**metrics, **sampling_metrics}


def _registered(name: str) -> type[PolicyLoss]:
    """A policy loss a plugin registered (``rl_loss/<name>``); a ValueError naming the choices otherwise."""
    from theseus.errors import ConfigError

    try:
        return loss_class(name)
    except ConfigError:
        raise ValueError(f"loss_type must be one of {tuple(policy_loss_names())}, got {name!r}") from None


def generalized_jsd(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    mask: jax.Array | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: Literal["batchmean", "sum", "mean", "none"] = "batchmean",
    num_items_in_batch: jax.Array | int | None = None,
) -> jax.Array:
    """The generalized Jensen-Shannon divergence between student and teacher token distributions
    (GKD, Agarwal et al. 2024, eq. 1), equal to TRL 1.16's ``GKDTrainer.generalized_jsd_loss``.

    Logits ``[B, T, V]`` are divided by ``temperature`` before the softmax. With ``S`` the student's
    and ``P`` the teacher's distribution at a position, and the mixture ``M = (1 - beta) S + beta P``,
    the per-vocabulary-entry terms are those of ``beta KL(P || M) + (1 - beta) KL(S || M)``; at the
    ends they are exact KLs instead: ``beta = 0`` gives the forward ``KL(P || S)`` and ``beta = 1``
    the reverse ``KL(S || P)``.

    ``mask`` ``[B, T]`` (true where a token counts, TRL's ``labels != -100``) drops positions.
    Reductions of the kept terms: ``batchmean``, the sum divided by the number of kept positions
    (at least 1), or by ``B`` without a mask; ``sum``; ``mean``, the mean over every kept
    ``(position, vocabulary entry)``; ``none``, the ``[B, T, V]`` terms with dropped positions 0
    (TRL returns only the kept rows). ``num_items_in_batch``, when given, replaces the reduction:
    the sum divided by it.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    student = jax.nn.log_softmax(student_logits / temperature, axis=-1)
    teacher = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
    if beta == 0.0:
        terms = jnp.exp(teacher) * (teacher - student)
    elif beta == 1.0:
        terms = jnp.exp(student) * (student - teacher)
    else:
        mixture = jnp.logaddexp(student + jnp.log1p(-beta), teacher + jnp.log(beta))
        terms = beta * jnp.exp(teacher) * (teacher - mixture) + (1.0 - beta) * jnp.exp(student) * (student - mixture)

    if mask is not None:
        keep = mask.astype(bool)
        terms = jnp.where(keep[..., None], terms, 0.0)
        kept = keep.sum().astype(terms.dtype)
    else:
        kept = jnp.asarray(terms.shape[0] * terms.shape[1], terms.dtype)
    if num_items_in_batch is not None:
        return terms.sum() / jnp.asarray(num_items_in_batch, terms.dtype)
    if reduction == "batchmean":
        denominator = jnp.maximum(kept, 1.0) if mask is not None else max(terms.shape[0], 1)
        return terms.sum() / denominator
    if reduction == "sum":
        return terms.sum()
    if reduction == "mean":
        return terms.sum() / (kept * terms.shape[-1])
    return terms


def forward_kl(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    mask: jax.Array | None = None,
    *,
    temperature: float = 1.0,
) -> jax.Array:
    """Offline logit distillation: ``KL(teacher || student)`` summed over the vocabulary, averaged
    over the kept positions, every position without a mask (``generalized_jsd`` with ``beta = 0``,
    ``batchmean``)."""
    if mask is None:
        mask = jnp.ones(student_logits.shape[:-1], bool)
    return generalized_jsd(student_logits, teacher_logits, mask, beta=0.0, temperature=temperature)
