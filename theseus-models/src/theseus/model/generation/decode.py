"""Sampling continuations of token prompts with the KV cache, stopping at end-of-text (or any of several
stop tokens: a chat model's end of turn).

The whole generation (prefill of the left-padded prompts, then one cached step per token) is one
jitted function with a ``lax.while_loop`` over tokens: it compiles once per (batch, prompt length,
``max_new_tokens``, sampling settings) and stops as soon as every row has produced end-of-text. On an
accelerator a long generation runs as a few loops in a row, each reading only the cache slots filled by
its end (:func:`view_limits`); on the CPU as one. A scanned model's layers can run in a loop over the
stacked parameters and cache (:func:`layer_loop`), so that every loop holds one layer.
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

from theseus.base.accelerator import of_devices
from theseus.errors import ConfigError
from theseus.model.generation.sampling import SamplingParams, sample_logits
from theseus.model.layers.cache_view import cache_view
from theseus.model.stack.decoding import (
    cached_step,
    init_cache,
    looped_step,
    loops_layers,
    unrolled,
    unrolled_model,
)
from theseus.model.stack.transformer import TransformerLM

if TYPE_CHECKING:
    from theseus.training.sharding import TrainerSharding


@dataclass(frozen=True)
class Completion:
    """What was generated after one prompt: ``tokens`` (without the stop token), ``stopped`` (True when
    the row ended with a stop token, False when it hit ``max_new_tokens``) and ``stop``, the stop token
    that ended it (None when it did not stop)."""

    tokens: list[int]
    stopped: bool
    stop: int | None = None


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


#: On an accelerator a long generation is decoded in up to this many stretches, each reading only the
#: cache slots filled by its end (:func:`view_limits`); each stretch compiles its own copy of the step
#: (of one layer, where the layers run in a loop: :func:`layer_loop`).
DECODE_STRETCHES = 4
#: The shortest stretch, in new tokens: a generation of up to this many tokens is one stretch.
SHORTEST_STRETCH = 64


def decode_stretches(platform: str) -> int:
    """How many stretches a generation on ``platform`` is decoded in: ``DECODE_STRETCHES`` on an
    accelerator, one on the CPU, where XLA copies a stretch's narrower view of the cache at every step
    (64 x 128 new tokens of a 4-layer GPT: 4,185 tok/s in two stretches, 7,328 in one)."""
    return 1 if platform == "cpu" else DECODE_STRETCHES


#: Platforms whose generations run a scanned model's layers in one loop by default. On a v5e the loop compiles
#: a 24-layer 350M Llama's generation (64 x 256 new tokens, bf16) in 1.8 + 10.0 s against 9.2 + 87.6 s unrolled
#: and decodes 9,029 new tokens/s against 8,240 (``benchmarks/generation_compile.py --looped --unrolled``).
#: ``--agreement`` there: in float32 (12 layers) the two layouts' prefill logits are within 1.3e-6 of each other
#: and every greedy row is alike; in bfloat16 (24 layers) within 0.045 (logits std 0.64), the first token alike
#: in every row. The CPU keeps its layers unrolled: its programs compile in well under a second either way.
LOOPED_PLATFORMS: frozenset[str] = frozenset({"tpu"})


def layer_loop(platform: str) -> bool:
    """Whether a generation on ``platform`` runs each step's layers in one loop over their stacked
    parameters and cache by default (:func:`_sample`'s ``loop``, for a model that
    :func:`~theseus.model.stack.decoding.loops_layers`; :data:`LOOPED_PLATFORMS`): the program then holds
    one layer per stretch instead of every layer. ``generate_tokens(loop_layers=True)`` asks for it."""
    return platform in LOOPED_PLATFORMS


def view_limits(prompt_length: int, max_new_tokens: int, stretches: int = DECODE_STRETCHES) -> list[int]:
    """The cache slots each of up to ``stretches`` stretches of a generation reads, increasing, the last
    the whole cache.

    The cache has ``prompt_length + max_new_tokens - 1`` slots and fills from the front, so the steps
    early in a generation need only its first slots: at 64 prompt and 256 new tokens, four stretches
    read 30 % fewer cache bytes than reading the whole cache at every step (the step's attention reads
    the cache, which at a large batch outweighs the parameters)."""
    total = prompt_length + max_new_tokens - 1
    if stretches <= 1:
        return [total]
    stretch = max(SHORTEST_STRETCH, -(-max_new_tokens // stretches))
    return [*range(prompt_length + stretch, total, stretch), total]


def empty_cache(model: TransformerLM, rows: int, slots: int, sharding: TrainerSharding | None = None) -> Any:
    """The decoder's empty KV cache for ``rows`` rows of ``slots`` slots (``init_cache`` of the model the
    decoder runs: unrolled, or looped), made outside :func:`_sample`'s program and donated to it; under a
    mesh, each entry's rows are split over the data axis as the prompts are.

    On a TPU v5e a stacked cache of zeros made inside the decoder's program came back holding neither zeros
    in its unwritten slots nor finite keys in its written ones (a Llama of 8 layers, 1024 wide, bfloat16, 16
    rows: 3,913 NaN keys), and looped generations drew other tokens than the unrolled layers; the same
    step given the cache as a donated argument kept it exact."""
    return jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype, device=s.sharding), cache_layout(model, rows, slots, sharding)
    )


def cache_layout(model: TransformerLM, rows: int, slots: int, sharding: TrainerSharding | None = None) -> Any:
    """The shapes, dtypes and (under a mesh) shardings of :func:`empty_cache`'s entries: what a program that
    takes the cache is traced with where nothing is allocated (``theseus plan``)."""
    shapes = cache_shapes(model, rows, slots)
    if sharding is None:
        return shapes
    one, two = cache_shapes(model, 1, slots), cache_shapes(model, 2, slots)

    def placed(s: jax.ShapeDtypeStruct, a: jax.ShapeDtypeStruct, b: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        grown = [axis for axis, (m, n) in enumerate(zip(a.shape, b.shape, strict=True)) if m != n]
        where = sharding.batch_sharding(a.ndim, grown[0]) if grown else sharding.replicated
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where)

    return jax.tree.map(placed, shapes, one, two)


@functools.lru_cache(maxsize=64)
def cache_shapes(model: TransformerLM, rows: int, slots: int) -> Any:
    """The shapes and dtypes of :func:`init_cache`'s entries, traced once per model and size (a generation
    per rollout step asks again and again for the same)."""
    return jax.eval_shape(lambda: init_cache(model, rows, slots))


@functools.partial(
    jax.jit, static_argnames=("model", "max_new_tokens", "sampling", "limits", "loop"), donate_argnames=("cache",)
)
def _sample(
    params: Any,
    cache: Any,
    ids: jax.Array,
    mask: jax.Array,
    seed: jax.Array,
    eot: jax.Array,
    *,
    model: TransformerLM,
    max_new_tokens: int,
    sampling: SamplingParams,
    limits: tuple[int, ...],
    loop: bool = False,
) -> tuple[jax.Array, jax.Array, Any]:
    """``(tokens [B, N], stopped [B], cache)``; ``eot`` holds the stop ids ``[K]`` (-1: none), and rows that
    stopped are filled with the first of them after it. ``loop``: run the layers in a loop over their
    stacked cache (:func:`~theseus.model.stack.decoding.looped_step`), else unrolled. ``cache``: the
    :func:`empty_cache` of ``B`` rows and ``P + N - 1`` slots for that choice, donated; it comes back
    filled, in the same buffers (a caller drops it), so that the loops update it in place."""
    batch, prompt_length = ids.shape
    key = jax.random.key(seed)
    fill = jnp.maximum(eot[0], 0).astype(jnp.int32)
    if not loop:
        model, params = unrolled(model, params)  # per-layer caches, updated in place
    step_fn = looped_step if loop else cached_step

    def stops(token: jax.Array) -> jax.Array:
        return jnp.any(token[:, None] == eot[None, :], axis=-1)

    def run(tokens: jax.Array, step_mask: jax.Array | None, cache: Any) -> tuple[jax.Array, Any]:
        logits, cache = step_fn(model, params, cache, tokens, step_mask)
        return logits[:, -1].astype(jnp.float32), cache

    with cache_view(limits[0]):
        logits, cache = run(ids, mask, cache)
    first = sample_logits(logits, jax.random.fold_in(key, 0), sampling)
    out = jnp.full((batch, max_new_tokens), fill, jnp.int32).at[:, 0].set(first)

    def stretch(end: int, view: int) -> tuple[Any, Any]:
        """The loop's condition and body for steps up to ``end``, reading ``view`` cache slots: new
        functions per stretch, since jax reuses a loop body traced for the same function object."""

        def more(state: tuple[Any, ...]) -> jax.Array:
            step, _, _, _, done = state
            return (step < end) & ~jnp.all(done)

        def advance(state: tuple[Any, ...]) -> tuple[Any, ...]:
            step, token, cache, out, done = state
            with cache_view(view):
                logits, cache = run(token[:, None], None, cache)
            token = sample_logits(logits, jax.random.fold_in(key, step), sampling)
            token = jnp.where(done, fill, token)
            out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
            return step + 1, token, cache, out, done | stops(token)

        return more, advance

    state = (jnp.int32(1), first, cache, out, stops(first))
    for limit in limits:  # step s writes slot prompt_length + s - 1: the view holds it while s <= limit - P
        state = jax.lax.while_loop(*stretch(min(max_new_tokens, limit - prompt_length + 1), limit), state)
    _, _, cache, out, done = state
    return out, done, cache


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
    stop_ids: Sequence[int] = (),
    stretches: int | None = None,
    loop_layers: bool | None = None,
) -> list[Completion]:
    """Continue each token prompt by up to ``max_new_tokens`` tokens drawn with ``sampling``
    (default: temperature 1, no filtering), using the KV cache.

    A row stops at ``eot_id`` or any of ``stop_ids`` (not included in its tokens; ``Completion.stop``
    says which); generation ends when every row has stopped. The result is a pure function of (params,
    prompts, sampling, seed). ``width`` pads the prompts to at least that many positions, so that batches
    of different lengths share a compile.

    ``sharding``: the mesh ``params`` live on (rows are split over its data axis, every process
    passing the same prompts); None: the arrays go to the default device. ``stretches``: how many
    stretches of growing cache views the generation is decoded in (None: :func:`decode_stretches` of
    the devices; 1 reads the whole cache at every step). ``loop_layers``: run the layers of each step in a
    loop rather than unrolled (None: :func:`layer_loop` of the devices; a model that does not
    :func:`~theseus.model.stack.decoding.loops_layers` keeps them unrolled).
    """
    sampling = sampling or SamplingParams()
    ids, mask = left_pad(prompts, width)
    check_fits(model, ids.shape[1], max_new_tokens)
    check_rope_switch(model, max(len(p) for p in prompts), max_new_tokens)
    stop = list(dict.fromkeys(([] if eot_id is None else [int(eot_id)]) + [int(i) for i in stop_ids])) or [-1]
    scalars = {"seed": np.int32(seed), "eot": np.asarray(stop, np.int32)}
    real = len(ids)
    if sharding is None:
        rows = {"ids": jnp.asarray(ids), "mask": jnp.asarray(mask)}
        placed = {name: jnp.asarray(value) for name, value in scalars.items()}
        context: Any = contextlib.nullcontext()
        leaf = next(iter(jax.tree.leaves(params)), None)  # the decoder runs where the parameters live
        target = of_devices(list(getattr(leaf, "devices", jax.devices)()))
    else:  # whole rows per data shard: the last prompt repeated, its copies dropped below
        extra = -real % sharding.data_size
        ids, mask = np.concatenate([ids, ids[-1:].repeat(extra, 0)]), np.concatenate([mask, mask[-1:].repeat(extra, 0)])
        rows, placed = sharding.put_global({"ids": ids, "mask": mask}), sharding.put_replicated(scalars)
        context, target = sharding.context(), sharding.accelerator
    if stretches is None:
        stretches = decode_stretches(target.platform)
    wanted = layer_loop(target.platform) if loop_layers is None else loop_layers
    slots = ids.shape[1] + int(max_new_tokens) - 1
    loop = wanted and loops_layers(model, slots)
    with context:
        cache = empty_cache(model if loop else unrolled_model(model), len(ids), slots, sharding)
        out, _, _ = _sample(
            params,
            cache,
            rows["ids"],
            rows["mask"],
            placed["seed"],
            placed["eot"],
            model=model,
            max_new_tokens=int(max_new_tokens),
            sampling=sampling,
            limits=tuple(view_limits(ids.shape[1], int(max_new_tokens), stretches)),
            loop=loop,
        )
    tokens = np.asarray(out if sharding is None else sharding.fetch(out))[:real]
    completions = []
    ends = set(stop) - {-1}
    for row in tokens.tolist():
        at = next((i for i, token in enumerate(row) if token in ends), None)
        if at is None:
            completions.append(Completion(row, False))
        else:
            completions.append(Completion(row[:at], True, row[at]))
    return completions
