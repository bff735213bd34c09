"""The reference computations behind ``BaseTrainer.forward`` / ``train_step`` / ``val_step`` / ``trace``.

``train_step`` and ``val_step`` run any objective (:mod:`theseus.training.objective`): :func:`scores`
computes what it reads, :func:`objective_loss` its loss, :func:`update` one optimizer update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax

from theseus.base.logprobs import token_entropy, token_logps
from theseus.base.sown import AUX_COLLECTIONS, AUX_LOSSES, AUX_METRICS, PARAM_UPDATES
from theseus.errors import ConfigError, DataError
from theseus.training import adapters, packing
from theseus.training.objective import CrossEntropy, Objective, Scores, split_teacher, target_count
from theseus.training.sharding import TrainerSharding
from theseus.training.state import TrainState

Batch = Mapping[str, Any]
#: What an update returns: ``(state, loss, metadata, grad_norm)``.
StepResult = tuple[TrainState, jax.Array, dict[str, Any], jax.Array]


class HeldOut(Protocol):
    """Parameters an update does not differentiate (a trainer's ``HELD_OUT``: a quantized base): they
    stay in ``state.params`` but the update sees the rest, and the model call puts them back."""

    def split(self, params: Any) -> tuple[Any, Any]:
        """``(held, rest)`` of ``params``; nothing held (empty) leaves the update as it is."""
        ...

    def join(self, rest: Any, held: Any) -> Any:
        """The inverse of :meth:`split`."""
        ...


@dataclass(frozen=True)
class ModelCall:
    """A model and its ``apply``: what :func:`target_scores` reads of a train state, for a model called
    outside one (the frozen reference of preference tuning)."""

    model: Any
    apply_fn: Callable[..., Any]


def forward(
    state: TrainState | ModelCall,
    params: Any,
    batch: Batch,
    key: jax.Array | None = None,
    deterministic: bool = False,
    intermediates: bool = False,
) -> tuple[jax.Array, jax.Array | None, dict[str, Any]]:
    """Call the model with token ids, targets, padding mask and dropout controls.

    What the model sows for the trainer (:mod:`theseus.base.sown`) comes back in
    the metadata: the sum of its auxiliary losses as ``aux_loss`` (added to the returned loss in
    training, reported only with ``deterministic``), each metric under its own name (the mean over
    the places that sowed it) and the parameter updates as ``param_updates`` (applied by
    :func:`train_step`). A model that sows nothing returns its loss and no metadata."""
    inputs = {"y": batch.get("y"), "padding_mask": batch.get("padding_mask")}
    (logits, loss), meta = _call(state, params, batch["x"], inputs, key, deterministic, intermediates)
    if "aux_loss" in meta and loss is not None and not deterministic:
        loss = loss + meta["aux_loss"]
    return logits, loss, meta


def target_scores(
    state: TrainState | ModelCall,
    params: Any,
    batch: Batch,
    key: jax.Array | None = None,
    deterministic: bool = False,
    intermediates: bool = False,
    entropy: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None, dict[str, Any]]:
    """``(logits, log p(y), entropy or None, metadata)`` of ``batch`` (``x``, ``y``, ``padding_mask``):
    per position ``[B, T]`` (float32) the target's log-probability (0 where ``y == -1`` or padding) and,
    with ``entropy``, the entropy of the next-token distribution; the metadata as :func:`forward`'s.

    A model with a ``target_scores`` method (every ``TransformerLM``) computes them a chunk of logits at a
    time (``model/loss_chunk``); for any other model they come from the logits of :func:`forward`. Logits
    that nothing reads are dropped from the compiled program."""
    mask = batch.get("padding_mask")
    if callable(getattr(state.model, "target_scores", None)):
        inputs = {"y": batch["y"], "padding_mask": mask, "entropy": entropy, "method": "target_scores"}
        (logits, logps, entropies), meta = _call(state, params, batch["x"], inputs, key, deterministic, intermediates)
        return logits, logps, entropies, meta
    inputs = {"x": batch["x"], "padding_mask": mask}
    logits, _loss, meta = forward(state, params, inputs, key, deterministic, intermediates)
    return logits, token_logps(logits, batch["y"], mask), token_entropy(logits) if entropy else None, meta


def _call(
    state: TrainState | ModelCall,
    params: Any,
    x: jax.Array,
    inputs: Mapping[str, Any],
    key: jax.Array | None,
    deterministic: bool,
    intermediates: bool,
) -> tuple[Any, dict[str, Any]]:
    """``state.apply_fn`` on ``x`` and ``inputs`` (keyword arguments): what the model returns and the
    metadata of what it sowed (:func:`forward`)."""
    rngs = {"dropout": key} if key is not None else {}
    mutable = [*AUX_COLLECTIONS, "intermediates"] if intermediates else list(AUX_COLLECTIONS)
    extra = {"capture_intermediates": True} if intermediates else {}
    out, mutated = state.apply_fn(
        {"params": params}, x, mutable=mutable, deterministic=deterministic, rngs=rngs, **extra, **inputs
    )
    meta: dict[str, Any] = {"intermediates": mutated.get("intermediates", {})} if intermediates else {}
    losses = jax.tree.leaves(mutated.get(AUX_LOSSES, {}))
    if losses:
        meta["aux_loss"] = sum(jnp.sum(jnp.asarray(term, jnp.float32)) for term in losses)
    meta.update(aux_metrics(mutated.get(AUX_METRICS, {})))
    if mutated.get(PARAM_UPDATES):
        meta[PARAM_UPDATES] = mutated[PARAM_UPDATES]
    return out, meta


def aux_metrics(sown: Any) -> dict[str, jax.Array]:
    """Each sown metric name -> the mean of its values over every module (and stacked layer) that sowed it."""
    found: dict[str, list[jax.Array]] = {}
    for path, value in jax.tree_util.tree_flatten_with_path(sown)[0]:
        name = str(getattr(path[-1], "key", path[-1]))
        found.setdefault(name, []).append(jnp.ravel(jnp.asarray(value, jnp.float32)))
    return {name: jnp.mean(jnp.concatenate(values)) for name, values in found.items()}


def apply_param_updates(params: Any, updates: Any) -> Any:
    """``params`` with each sown update added to the parameter at its path (the rest unchanged)."""
    if not updates:
        return params
    flat = {tuple(str(k.key) for k in path): u for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]}

    def add(path: Any, leaf: Any) -> Any:
        update = flat.get(tuple(str(getattr(k, "key", k)) for k in path))
        return leaf if update is None else (leaf + update).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(add, params)


def _without_intermediates(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != "intermediates"}


def _without_updates(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != PARAM_UPDATES}


# -- objectives -----------------------------------------------------------------------------------
def scores(
    cls: Any,
    objective: Objective,
    state: TrainState,
    params: Any,
    batch: Batch,
    key: jax.Array | None,
    deterministic: bool,
    teacher: Any = None,
) -> tuple[Scores, dict[str, Any]]:
    """What ``objective`` reads (its :class:`~theseus.training.objective.Needs`) of one micro-batch, and
    the model's metadata. The model's own loss and the full logits come from ``cls.forward`` (so an
    overridden ``forward`` takes part), the targets' log-probabilities from :func:`target_scores`: of the
    packed rows where the batch carries them (:mod:`theseus.training.packing`), gathered back to its own rows
    (the packed rows' logits are not kept)."""
    needs = objective.needs
    missing = [name for name in needs.batch if name not in batch]
    if missing:
        raise DataError(f"{type(objective).__qualname__} reads {', '.join(missing)}, which the batch lacks")
    plain = {"x": batch["x"], "padding_mask": batch.get("padding_mask")}
    targets = {**plain, "y": batch["y"]}
    if needs.model == "target_logps":  # the packed rows where the batch carries them (theseus.training.packing)
        targets = packing.model_rows(batch)
    found: dict[str, Any] = {}
    if needs.model == "loss":
        found["logits"], found["loss"], meta = cls.forward(state, params, batch, key=key, deterministic=deterministic)
    elif needs.model == "logits":
        found["logits"], _loss, meta = cls.forward(state, params, plain, key=key, deterministic=deterministic)
    elif needs.model == "rewards":
        found["rewards"], meta = sequence_rewards(state, params, plain, key, deterministic)
    else:
        found["logits"], found["logps"], found["entropy"], meta = target_scores(
            state, params, targets, key=key, deterministic=deterministic, entropy=needs.entropy
        )
    if needs.frozen_base:
        base = target_scores(state, adapters.switched_off(params), targets, deterministic=True)[1]
        found["base_logps"] = jax.lax.stop_gradient(base)
    if needs.model == "target_logps" and packing.is_packed(batch):  # back to the batch's own rows
        found = {name: packing.unpack(v, batch) for name, v in found.items() if name != "logits"}
    if needs.old_policy:
        found["old_logps"] = batch["old_logps"] if "old_logps" in batch else jax.lax.stop_gradient(found["logps"])
    if needs.teacher is not None:
        teacher = objective.teacher_params if objective.teacher_params is not None else teacher
        if not teacher:
            raise DataError(
                f"{type(objective).__qualname__} reads a teacher, but its teacher_params are not set; "
                "give the objective its teacher's parameters (objective.with_arrays({'teacher_params': params}))"
            )
        found["teacher_logits"] = teacher_logits(needs.teacher, teacher, plain)
    return Scores(**found), meta


def sequence_rewards(
    state: TrainState | ModelCall, params: Any, batch: Batch, key: jax.Array | None, deterministic: bool
) -> tuple[jax.Array, dict[str, Any]]:
    """``(rewards [B] float32, metadata)``: the model's ``rewards`` method on ``x`` and ``padding_mask``
    (a reward model's score of each row); ConfigError for a model without one."""
    if not callable(getattr(state.model, "rewards", None)):
        raise ConfigError(
            f"{type(state.model).__name__} has no rewards(x, padding_mask, deterministic) method, which an "
            "objective reading Needs('rewards') calls; train a reward model (train/reward)"
        )
    inputs = {"padding_mask": batch.get("padding_mask"), "method": "rewards"}
    rewards, meta = _call(state, params, batch["x"], inputs, key, deterministic, False)
    return jnp.asarray(rewards, jnp.float32), meta


def objective_loss(
    cls: Any,
    objective: Objective,
    state: TrainState,
    params: Any,
    batch: Batch,
    key: jax.Array | None,
    deterministic: bool,
    teacher: Any = None,
) -> tuple[jax.Array, dict[str, Any]]:
    """``objective``'s loss of one micro-batch and the metadata (the model's, then the objective's
    metrics). In training the model's auxiliary losses join it (the model's own loss has them already)."""
    found, meta = scores(cls, objective, state, params, batch, key, deterministic, teacher)
    loss, metrics = objective(found, batch)
    if objective.needs.model != "loss" and "aux_loss" in meta and not deterministic:
        loss = loss + meta["aux_loss"]
    return loss, {**meta, **metrics}


def teacher_logits(model: Any, params: Any, batch: Batch) -> jax.Array:
    """A teacher's logits of ``batch`` (``x``, ``padding_mask``): no dropout, no gradient."""
    logits, _ = model.apply({"params": params}, batch["x"], padding_mask=batch.get("padding_mask"), deterministic=True)
    return jax.lax.stop_gradient(logits)


def old_policy_logps(state: TrainState, batch: Batch, sharding: TrainerSharding) -> jax.Array:
    """The targets' log-probabilities under ``state.params``, the policy that sampled the batch
    (``[accumulate, rows, T]``, no gradient, no dropout): the ``old_logps`` of every update taken on it."""

    def one(micro: Batch) -> jax.Array:
        return packing.unpack(
            target_scores(state, state.params, packing.model_rows(micro), deterministic=True)[1], micro
        )

    with sharding.context():
        read = ("x", "y", "padding_mask", *packing.PACKED_ROWS, packing.PACKED_INDEX)
        return jax.lax.stop_gradient(jax.lax.map(one, {k: batch[k] for k in read if k in batch}))


def holding_out(held_out: HeldOut | None, run: Callable[[TrainState], StepResult], state: TrainState) -> StepResult:
    """``run(state)`` (an update) with the parameters ``held_out`` splits off (a quantized base) kept out
    of the differentiated parameters and given back to the model at each call, unchanged."""
    if held_out is None:
        return run(state)
    held, rest = held_out.split(state.params)
    if not held:
        return run(state)
    apply = state.apply_fn

    def apply_fn(variables: Any, *args: Any, **kwargs: Any) -> Any:
        return apply({**variables, "params": held_out.join(variables["params"], held)}, *args, **kwargs)

    new, loss, meta, grad_norm = run(state.replace(params=rest, apply_fn=apply_fn))
    return new.replace(params=held_out.join(new.params, held), apply_fn=apply), loss, meta, grad_norm


# -- the update -----------------------------------------------------------------------------------
def train_step(
    cls: Any,
    state: TrainState,
    batch: Batch,
    key: jax.Array,
    accumulate_steps: int,
    *,
    objective: Objective,
    sharding: TrainerSharding,
    skip_nonfinite: bool = False,
    held_out: HeldOut | None = None,
) -> StepResult:
    """``objective.updates`` optimizer updates of ``objective`` on a batch of ``accumulate_steps``
    micro-batches (leading batch axis); ``cls`` gives ``forward``, ``held_out`` the parameters the update
    leaves out (a trainer's ``HELD_OUT``, see :func:`holding_out`). Several updates take the first at the batch's own
    log-probabilities and the later ones against those of the policy that sampled it; ``state.step``
    counts batches, and the loss, metrics and gradient norm are the updates' means (``skipped``:
    whether any update was skipped; :data:`TARGETS`: the batch's count of targets). A teacher's
    parameters come with the objective (``teacher_params``); a batch that still carries them
    (``with_teacher``, deprecated) has them taken out before it is split into micro-batches."""
    teacher, batch = split_teacher(batch)

    def once(current: TrainState, rows: Batch, update_key: jax.Array) -> StepResult:
        def run(inner: TrainState) -> StepResult:
            return update(cls, objective, inner, rows, update_key, accumulate_steps, sharding, skip_nonfinite, teacher)

        return holding_out(held_out, run, current)

    learned = {TARGETS: target_count(batch)} if "y" in batch and objective.needs.model != "rewards" else {}
    if objective.updates == 1:
        new_state, loss, meta, grad_norm = once(state, batch, key)
        return new_state, loss, {**meta, **learned}, grad_norm
    if objective.needs.old_policy:
        batch = {**batch, "old_logps": old_policy_logps(state, batch, sharding)}

    def body(current: TrainState, update_key: jax.Array) -> tuple[TrainState, Any]:
        new, loss, meta, grad_norm = once(current, batch, update_key)
        return new, (loss, meta, grad_norm)

    keys = jax.random.split(key, objective.updates)
    new_state, (losses, metas, norms) = jax.lax.scan(body, state, keys)
    meta = {name: jnp.max(v) if name == "skipped" else jnp.mean(v, axis=0) for name, v in metas.items()}
    return new_state.replace(step=state.step + 1), jnp.mean(losses), {**meta, **learned}, jnp.mean(norms)


def update(
    cls: Any,
    objective: Objective,
    state: TrainState,
    batch: Batch,
    key: jax.Array,
    accumulate_steps: int,
    sharding: TrainerSharding,
    skip_nonfinite: bool = False,
    teacher: Any = None,
) -> StepResult:
    """One optimizer update of ``objective`` from ``accumulate_steps`` micro-batches (leading batch axis).

    Gradients of the micro-batches are averaged with weights proportional to ``objective.weight_of`` (its
    target count for token-mean losses), so k micro-batches of b rows give the update of one batch of
    k*b rows. With adapters in the parameters (LoRA), gradients stop at the base and the base leaves
    the update bit for bit as it came in (:mod:`theseus.training.adapters`).
    """
    adapted = adapters.has_adapters(state.params)

    def grads_of(params: Any, micro: Batch, micro_key: jax.Array) -> tuple[jax.Array, dict[str, Any], Any]:
        def loss_fn(p: Any) -> tuple[jax.Array, dict[str, Any]]:
            p = adapters.freeze_base(p) if adapted else p
            loss, meta = objective_loss(cls, objective, state, p, micro, micro_key, False, teacher)
            return loss, _without_intermediates(meta)

        (loss, meta), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return loss, meta, grads

    with sharding.context():
        if accumulate_steps == 1:
            micro = jax.tree.map(lambda a: a[0], dict(batch))
            loss, meta, grads = grads_of(state.params, micro, jax.random.fold_in(key, 0))
        else:
            counts = jax.vmap(objective.weight_of)(dict(batch)).astype(jnp.float32)
            total = jnp.sum(counts)
            weights = jnp.where(total > 0, counts / jnp.maximum(total, 1.0), 1.0 / accumulate_steps)
            keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(accumulate_steps))
            zeros = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params), jnp.zeros((), jnp.float32))

            def body(carry: Any, inputs: Any) -> tuple[Any, dict[str, Any]]:
                grad_sum, loss_sum = carry
                micro, micro_key, weight = inputs
                loss, meta, grads = grads_of(state.params, micro, micro_key)
                grad_sum = jax.tree.map(lambda acc, g: acc + weight * g.astype(jnp.float32), grad_sum, grads)
                return (grad_sum, loss_sum + weight * loss.astype(jnp.float32)), meta

            # The metadata of each micro-batch leaves the loop and is summed after it: the model and its
            # gradient are traced once, where a carried sum would need the metadata's structure up front.
            (grad_sum, loss), metas = jax.lax.scan(body, zeros, (dict(batch), keys, weights))
            meta = weighted_sum(metas, weights)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grad_sum, state.params)
        grad_norm = optax.tree.norm(grads)
        new_state = state.apply_gradients(grads=grads)
        updates = meta.get(PARAM_UPDATES)
        if updates:  # accumulated: the micro-batches' updates averaged with the gradients' weights
            new_state = new_state.replace(params=apply_param_updates(new_state.params, updates))
        meta = _without_updates(meta)
        if adapted:
            new_state = new_state.replace(params=adapters.keep_base(new_state.params, state.params))
        if skip_nonfinite:
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            new_state = new_state.replace(
                params=jax.tree.map(keep, new_state.params, state.params),
                opt_state=jax.tree.map(keep, new_state.opt_state, state.opt_state),
            )
            meta = {**meta, "skipped": 1 - finite.astype(jnp.int32)}
    return new_state, loss, meta, grad_norm


def weighted_sum(stacked: Any, weights: jax.Array) -> Any:
    """Each leaf of ``stacked`` (a leading axis of micro-batches) summed with ``weights``, in float32 and in
    micro-batch order: ``((0 + w0 * m0) + w1 * m1) + ...``."""

    def add(total: Any, inputs: Any) -> tuple[Any, None]:
        values, weight = inputs
        return jax.tree.map(lambda acc, m: acc + weight * jnp.asarray(m, jnp.float32), total, values), None

    zeros = jax.tree.map(lambda m: jnp.zeros(m.shape[1:], jnp.float32), stacked)
    return jax.lax.scan(add, zeros, (stacked, weights))[0]


#: Training metadata: the targets (``y != -1``, not padding) of the update's whole batch, which the loop
#: reads to refuse a run that learns from nothing (:data:`theseus.training.loop.EMPTY_STEPS_LIMIT`).
TARGETS = "targets"
#: Validation metadata of an objective other than cross-entropy: its loss times its weight, and the weight.
OBJECTIVE_LOSS_SUM, OBJECTIVE_WEIGHT = "objective_loss_sum", "objective_weight"


def val_step(
    cls: Any, state: TrainState, batch: Batch, *, objective: Objective, sharding: TrainerSharding
) -> tuple[Any, Any, dict[str, Any]]:
    """``(loss x count, count, metadata)`` of one batch without dropout: the mean cross-entropy of the
    targets that count and their count, whatever the objective, so that validation, the best checkpoint
    and perplexity mean the same for every objective. Another objective's own loss times its weight and
    that weight ride in the metadata (:data:`OBJECTIVE_LOSS_SUM`, :data:`OBJECTIVE_WEIGHT`). A model scored
    by rewards has no targets: its objective's loss and weight are the pair."""
    teacher, batch = split_teacher(batch)
    with sharding.context():
        found, meta = scores(cls, objective, state, state.params, batch, None, True, teacher)
        loss, metrics = objective(found, batch)
    meta = _without_updates(_without_intermediates({**meta, **metrics}))
    weight = objective.weight_of(batch)
    loss_sum = loss.astype(jnp.float32) * weight
    cross_entropy = targets_cross_entropy(objective.needs.model, found, batch)
    if cross_entropy is None:
        return loss_sum, weight, meta
    count = target_count(batch)
    if type(objective) is not CrossEntropy:
        meta = {**meta, OBJECTIVE_LOSS_SUM: loss_sum, OBJECTIVE_WEIGHT: jnp.asarray(weight, jnp.float32)}
    return cross_entropy.astype(jnp.float32) * count, count, meta


def targets_cross_entropy(reads: str, found: Scores, batch: Batch) -> jax.Array | None:
    """The mean cross-entropy of the targets that count, from what the step computed for an objective that
    reads ``reads``: the model's own loss, the targets' log-probabilities or the full logits; None for a
    model scored by rewards."""
    if reads == "loss":
        return found.loss
    if reads == "rewards":
        return None
    logps = found.logps if reads == "target_logps" else token_logps(found.logits, batch["y"], batch.get("padding_mask"))
    return -jnp.sum(logps) / jnp.maximum(target_count(batch), 1)


def trace(cls: Any, state: TrainState, batch: Batch, key: jax.Array, *, sharding: TrainerSharding) -> Any:
    """The model call used by debugging and analysis: dropout on, intermediates captured."""
    with sharding.context():
        return cls.forward(state, state.params, batch, key=key, deterministic=False, intermediates=True)
