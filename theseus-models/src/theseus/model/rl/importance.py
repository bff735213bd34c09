"""The importance-sampling correction for rollouts sampled by another policy than the one trained.

When completions come from a sampler whose log-probabilities differ from the trainer's (an inference
engine's numerics, or a policy some updates stale, as with asynchronous rollouts), each token's loss is
multiplied by the ratio of the trainer's probability at rollout time to the sampler's, bounded to
``[clip_min, clip_max]``. TRL 1.16 calls it ``vllm_importance_sampling_correction`` (its modes
``vllm_importance_sampling_mode``, its bounds ``vllm_importance_sampling_clip_min`` / ``_max``);
``tests/rl/test_losses.py`` checks this module against TRL's own code.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

#: How the ratio is formed and bounded (``rl/sampling_correction_mode``): per token or one per
#: sequence; out-of-bounds ratios clipped to the bounds (truncate) or set to 0 (mask).
SAMPLING_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
SamplingCorrection = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def sampling_ratio(
    old_logps: jax.Array,
    sampling_logps: jax.Array,
    mask: jax.Array,
    *,
    mode: SamplingCorrection = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The correction's ratio and its metrics (without gradient).

    ``old_logps``: ``[B, T]`` log-probabilities of the completion tokens under the trained policy when
    the rollout was made; ``sampling_logps``: the same under the policy that sampled them (NaN where the
    sampler gave none: such a token counts as agreeing, ratio 1); ``mask``: 1 on loss tokens.

    ``token_*`` modes: ``exp(old - sampling)`` per token, ``[B, T]`` (1 on padding); ``sequence_*``:
    the exponential of the sequence's summed log-ratio, ``[B, 1]``. ``*_truncate`` clips the ratio to
    ``[clip_min, clip_max]``; ``*_mask`` sets a ratio outside them to 0 (drops the token or sequence).
    A bound of ``None`` is absent.

    Metrics (TRL's names): ``sampling/sampling_logp_difference/mean`` and ``/max``, the absolute
    log-probability difference over loss tokens the sampler scored (0 without any), and
    ``sampling/importance_sampling_ratio/min``, ``/mean``, ``/max`` over loss tokens (``token_*``) or
    sequences (``sequence_*``), 0 without any.
    """
    if mode not in SAMPLING_CORRECTIONS:
        raise ValueError(f"mode must be one of {SAMPLING_CORRECTIONS}, got {mode!r}")
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(f"clip_min ({clip_min}) must be below clip_max ({clip_max})")
    if mode.endswith("_truncate") and clip_min is None and clip_max is None:
        raise ValueError(f"mode {mode!r} needs clip_min or clip_max")
    if old_logps.shape != sampling_logps.shape or old_logps.shape != mask.shape or old_logps.ndim != 2:
        raise ValueError(
            "old_logps, sampling_logps and mask must share one [B, T] shape: "
            f"{old_logps.shape}, {sampling_logps.shape}, {mask.shape}"
        )
    old_logps = jax.lax.stop_gradient(old_logps)
    sampling_logps = jax.lax.stop_gradient(sampling_logps).astype(old_logps.dtype)
    valid = mask.astype(bool)
    scored = valid & ~jnp.isnan(sampling_logps)
    diff = jnp.where(scored, old_logps - jnp.where(scored, sampling_logps, 0.0), 0.0)
    sequence = mode.startswith("sequence_")
    ratio = jnp.exp(diff.sum(axis=-1, keepdims=True) if sequence else diff)
    low = -jnp.inf if clip_min is None else clip_min
    high = jnp.inf if clip_max is None else clip_max
    if mode.endswith("_truncate"):
        ratio = jnp.clip(ratio, low, high)
    else:
        ratio = jnp.where((ratio < low) | (ratio > high), 0.0, ratio)

    gap = jnp.abs(diff)
    count = scored.sum()
    counted = jnp.broadcast_to(valid, ratio.shape) if not sequence else jnp.ones(ratio.shape, bool)
    any_counted = counted.any()
    metrics = {
        "sampling/sampling_logp_difference/mean": jnp.where(count > 0, gap.sum() / jnp.maximum(count, 1), 0.0),
        "sampling/sampling_logp_difference/max": jnp.where(count > 0, jnp.max(jnp.where(scored, gap, 0.0)), 0.0),
        "sampling/importance_sampling_ratio/min": jnp.where(
            any_counted, jnp.min(jnp.where(counted, ratio, jnp.inf)), 0.0
        ),
        "sampling/importance_sampling_ratio/mean": jnp.where(
            any_counted, jnp.sum(jnp.where(counted, ratio, 0.0)) / jnp.maximum(counted.sum(), 1), 0.0
        ),
        "sampling/importance_sampling_ratio/max": jnp.where(
            any_counted, jnp.max(jnp.where(counted, ratio, -jnp.inf)), 0.0
        ),
    }
    return ratio, metrics
