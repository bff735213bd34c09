"""Sampling continuations of token prompts with the KV cache, stopping at end-of-text.

The whole generation (prefill of the left-padded prompts, then one cached step per token) is one
jitted function with a ``lax.while_loop`` over tokens: it compiles once per (batch, prompt length,
``max_new_tokens``, sampling settings) and stops as soon as every row has produced end-of-text.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.errors import ConfigError
from theseus.model.generation.sampling import SamplingParams, sample_logits
from theseus.model.stack.decoding import cached_step, init_cache
from theseus.model.stack.transformer import TransformerLM

if TYPE_CHECKING:
    from theseus.training.sharding import TrainerSharding


@dataclass(frozen=True)
class Completion:
    """What was generated after one prompt: ``tokens`` (without the end-of-text token) and
    ``stopped`` (True when the row ended with end-of-text, False when it hit ``max_new_tokens``)."""

    tokens: list[int]
    stopped: bool


def left_pad(prompts: Sequence[Sequence[int]], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token prompts as int32 ``[B, P]`` padded on the left, and the bool mask of real tokens;
    ``P`` is the longest prompt, or ``width`` when that is longer (fewer shapes to compile)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token (an empty text can start with end-of-text)")
    width = max(max(len(p) for p in prompts), width or 0)
    ids = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros((len(prompts), width), bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = np.asarray(prompt, np.int32)
        mask[row, width - len(prompt) :] = True
    return ids, mask


def check_fits(model: TransformerLM, prompt_length: int, max_new_tokens: int) -> None:
    """Raise ConfigError unless a prompt of ``prompt_length`` plus the new tokens fit the model."""
    block = model.architecture.block_size
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if prompt_length + max_new_tokens - 1 > block:
        raise ConfigError(
            f"a prompt of {prompt_length} tokens plus {max_new_tokens} new tokens exceeds the model's "
            f"architecture/block_size={block}; shorten the prompt or lower max_new_tokens"
        )


def check_rope_switch(model: TransformerLM, longest: int, max_new_tokens: int) -> None:
    """Raise ConfigError when LongRoPE would switch factors during generation: transformers re-encodes the
    whole sequence with the long factors at the switch, and a KV cache of short-factor keys cannot."""
    scaling = model.architecture.position.scaling
    original = scaling.original_max_positions
    if scaling.kind == "longrope" and longest <= original < longest + max_new_tokens - 1:
        raise ConfigError(
            f"a prompt of {longest} tokens plus {max_new_tokens} new tokens crosses "
            f"architecture/rope_original_max_positions={original}, where longrope switches to its long factors; "
            f"keep prompt + max_new_tokens within {original + 1} tokens or give a prompt longer than {original}"
        )


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "sampling"))
def _sample(
    params: Any,
    ids: jax.Array,
    mask: jax.Array,
    seed: jax.Array,
    eot: jax.Array,
    *,
    model: TransformerLM,
    max_new_tokens: int,
    sampling: SamplingParams,
) -> tuple[jax.Array, jax.Array]:
    """``(tokens [B, N], stopped [B])``; rows that stopped are filled with ``eot`` after it."""
    batch, prompt_length = ids.shape
    key = jax.random.key(seed)
    fill = jnp.maximum(eot, 0).astype(jnp.int32)

    def run(tokens: jax.Array, step_mask: jax.Array | None, cache: Any) -> tuple[jax.Array, Any]:
        logits, cache = cached_step(model, params, cache, tokens, step_mask)
        return logits[:, -1].astype(jnp.float32), cache

    cache = init_cache(model, batch, prompt_length + max_new_tokens - 1)
    logits, cache = run(ids, mask, cache)
    first = sample_logits(logits, jax.random.fold_in(key, 0), sampling)
    out = jnp.full((batch, max_new_tokens), fill, jnp.int32).at[:, 0].set(first)

    def more(state: tuple[Any, ...]) -> jax.Array:
        step, _, _, _, done = state
        return (step < max_new_tokens) & ~jnp.all(done)

    def advance(state: tuple[Any, ...]) -> tuple[Any, ...]:
        step, token, cache, out, done = state
        logits, cache = run(token[:, None], None, cache)
        token = sample_logits(logits, jax.random.fold_in(key, step), sampling)
        token = jnp.where(done, fill, token)
        out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
        return step + 1, token, cache, out, done | (token == eot)

    state = (jnp.int32(1), first, cache, out, first == eot)
    _, _, _, out, done = jax.lax.while_loop(more, advance, state)
    return out, done


def generate_tokens(
    model: TransformerLM,
    params: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eot_id: int | None = None,
    width: int | None = None,
    sharding: TrainerSharding | None = None,
) -> list[Completion]:
    """Continue each token prompt by up to ``max_new_tokens`` tokens drawn with ``sampling``
    (default: temperature 1, no filtering), using the KV cache.

    A row stops at ``eot_id`` (not included in its tokens); generation ends when every row has
    stopped. The result is a pure function of (params, prompts, sampling, seed). ``width`` pads the
    prompts to at least that many positions, so that batches of different lengths share a compile.

    ``sharding``: the mesh ``params`` live on (rows are split over its data axis, every process
    passing the same prompts); None: the arrays go to the default device.
    """
    sampling = sampling or SamplingParams()
    ids, mask = left_pad(prompts, width)
    check_fits(model, ids.shape[1], max_new_tokens)
    check_rope_switch(model, max(len(p) for p in prompts), max_new_tokens)
    scalars = {"seed": np.int32(seed), "eot": np.int32(-1 if eot_id is None else eot_id)}
    real = len(ids)
    if sharding is None:
        rows = {"ids": jnp.asarray(ids), "mask": jnp.asarray(mask)}
        placed = {name: jnp.asarray(value) for name, value in scalars.items()}
        context: Any = contextlib.nullcontext()
    else:  # whole rows per data shard: the last prompt repeated, its copies dropped below
        extra = -real % sharding.data_size
        ids, mask = np.concatenate([ids, ids[-1:].repeat(extra, 0)]), np.concatenate([mask, mask[-1:].repeat(extra, 0)])
        rows, placed = sharding.put_global({"ids": ids, "mask": mask}), sharding.put_replicated(scalars)
        context = sharding.context()
    with context:
        out, _ = _sample(
            params,
            rows["ids"],
            rows["mask"],
            placed["seed"],
            placed["eot"],
            model=model,
            max_new_tokens=int(max_new_tokens),
            sampling=sampling,
        )
    tokens = np.asarray(out if sharding is None else sharding.fetch(out))[:real]
    completions = []
    for row in tokens.tolist():
        if eot_id is not None and eot_id in row:
            completions.append(Completion(row[: row.index(eot_id)], True))
        else:
            completions.append(Completion(row, False))
    return completions
