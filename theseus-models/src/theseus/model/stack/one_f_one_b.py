"""The ``1f1b`` pipeline schedule: each stage alternates one micro-batch's forward with another's backward,
the head and the loss running on the last stage inside the loop.

**Why the loss moves inside.** With the loss after the pipelined stack (``gpipe``), no backward can start
before every forward has finished, so every stage keeps something of all ``M`` micro-batches. Here the last
stage turns each micro-batch it finishes into its share of the loss and that share's cotangent at once,
and the cotangents flow back through the stages while later micro-batches still flow forward.

**Ticks.** With ``S`` stages, stage ``s`` at tick ``t`` runs the forward of micro-batch ``t - s`` and the
backward of micro-batch ``t - 2 (S - 1) + s`` (the last stage: the micro-batch it just ran forward), each
when it exists; ``M + 2 (S - 1)`` ticks. A stage keeps only the inputs of the micro-batches between its
forward and its backward (at most ``2 S - 1``, whatever ``M``) and runs its piece again in the backward
tick. A tick skips (``lax.cond``) the half it has no micro-batch for, so the step costs as many stage-times as ``gpipe``
with ``model/remat=full``: the bubble is ``(S - 1) / (M + S - 1)`` too. What changes is memory.

**Differentiation.** :func:`pipelined_loss` is a ``custom_vjp``: its forward runs the schedule above and
returns the loss with every gradient (the stack's, the head's and the embeddings' output's), which its
backward scales by the incoming cotangent. Called without differentiation (evaluation) it runs the stack
forward (``gpipe``) and the loss after it. Logits, when a caller uses them, come from the usual forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from theseus.base.axis import MeshAxis, pipelining_of
from theseus.base.logprobs import scored_positions
from theseus.model.stack.block import LayerCall
from theseus.model.stack.pipeline import (
    check_model,
    check_rows,
    forward_of,
    microbatched,
    per_row,
    pipeline_size,
    regrouped,
    stage_of,
    unmicrobatched,
    varying,
)

Tree = Any
#: ``piece(params, h, extras, key) -> h``: one stage's layers on one micro-batch.
Piece = Callable[[Tree, jax.Array, tuple[jax.Array | None, ...], jax.Array | None], jax.Array]
#: ``tail(params, h, targets, mask) -> summed loss``: the final norm, the head and the loss of one micro-batch.
Tail = Callable[[Tree, jax.Array, jax.Array, jax.Array | None], jax.Array]


def _zero_cotangent(x: Any) -> Any:
    """The cotangent of an input that is not differentiated (integers, keys: ``float0``)."""
    if x is None:
        return None
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def _when(pred: jax.Array, compute: Callable[[], Tree], like: Tree) -> Tree:
    """``compute()`` where ``pred`` holds, zeros shaped as ``like`` elsewhere (the work skipped)."""
    return jax.lax.cond(pred, compute, lambda: jax.tree.map(lambda a: varying(jnp.zeros(a.shape, a.dtype)), like))


def _schedule(
    piece: Piece,
    tail: Tail,
    params: Tree,
    tail_params: Tree,
    h: jax.Array,
    extras: tuple[jax.Array | None, ...],
    targets: jax.Array,
    mask: jax.Array | None,
    key: jax.Array | None,
    *,
    stages: int,
    microbatches: int,
) -> tuple[jax.Array, Tree, Tree, jax.Array]:
    """``(summed loss, stack gradients, tail gradients, gradient of h)`` by the 1F1B schedule."""
    grouped = regrouped(params, stages, 1)
    xs = microbatched(h, microbatches)
    cut = tuple(None if e is None else microbatched(e, microbatches) for e in extras)
    ys = microbatched(targets, microbatches)
    masks = None if mask is None else microbatched(mask, microbatches)
    kept = min(microbatches, 2 * stages - 1)  # inputs a stage holds between a forward and its backward
    ticks = microbatches + 2 * (stages - 1)
    forward_ring = [(s, (s + 1) % stages) for s in range(stages)]
    backward_ring = [((s + 1) % stages, s) for s in range(stages)]

    def local(grouped: Tree, tail_params: Tree, xs: jax.Array, cut: Any, ys: jax.Array, masks: Any, key: Any) -> Any:
        stage = jax.lax.axis_index(MeshAxis.PIPELINE)
        last = stage == stages - 1
        mine = jax.tree.map(lambda p: p[0, 0], grouped)  # [n_layers / S, ...]
        # the head's own copy on each stage: its gradient is then the stage's own, with no sum over
        # the stages inside a branch that only the last stage takes
        tail_params = jax.tree.map(varying, tail_params)

        def pick(a: Any, micro: jax.Array) -> Any:
            return None if a is None else jax.lax.dynamic_index_in_dim(a, micro, keepdims=False)

        def run(p: Tree, x: jax.Array, micro: jax.Array) -> jax.Array:
            micro_key = None if key is None else jax.random.fold_in(jax.random.fold_in(key, stage), micro)
            return piece(p, x, tuple(pick(e, micro) for e in cut), micro_key)

        def tick(carry: Any, t: jax.Array) -> tuple[Any, jax.Array]:
            received, returned, held, grads, tail_grads, loss = carry
            ahead, behind = t - stage, t - 2 * (stages - 1) + stage  # the forward's and the backward's micro-batch
            do_forward = (ahead >= 0) & (ahead < microbatches)
            do_backward = (behind >= 0) & (behind < microbatches)
            ahead, behind = jnp.clip(ahead, 0, microbatches - 1), jnp.clip(behind, 0, microbatches - 1)
            inputs = jnp.where(stage == 0, pick(xs, ahead), received)
            held = jnp.where(do_forward, jax.lax.dynamic_update_index_in_dim(held, inputs, ahead % kept, 0), held)
            out = _when(do_forward, lambda: run(mine, inputs, ahead), inputs)

            def tail_step() -> tuple[jax.Array, Tree, jax.Array]:
                share, pull = jax.vjp(
                    lambda tp, o: tail(tp, o, pick(ys, behind), pick(masks, behind)), tail_params, out
                )
                d_tail, d_out = pull(jnp.ones_like(share))
                return share, d_tail, d_out

            share, d_tail, d_out = _when(last & do_backward, tail_step, (loss, tail_params, out))
            cotangent = jnp.where(last, d_out.astype(out.dtype), returned)

            def backward_step() -> tuple[Tree, jax.Array]:
                _, pull = jax.vjp(lambda p, x: run(p, x, behind), mine, pick(held, behind % kept))
                return pull(cotangent)

            d_mine, d_inputs = _when(do_backward, backward_step, (mine, inputs))
            grads = jax.tree.map(lambda acc, g: acc + g.astype(jnp.float32), grads, d_mine)
            tail_grads = jax.tree.map(lambda acc, g: acc + g.astype(jnp.float32), tail_grads, d_tail)
            sent = jax.lax.ppermute(out, MeshAxis.PIPELINE, forward_ring)
            sent_back = jax.lax.ppermute(d_inputs, MeshAxis.PIPELINE, backward_ring)
            return (sent, sent_back, held, grads, tail_grads, loss + share), d_inputs

        f32 = lambda tree: jax.tree.map(lambda a: varying(jnp.zeros(a.shape, jnp.float32)), tree)  # noqa: E731
        blank = varying(jnp.zeros_like(xs[0]))
        start = (blank, blank, varying(jnp.zeros((kept, *xs.shape[1:]), xs.dtype)), f32(mine), f32(tail_params))
        (*_, grads, tail_grads, loss), d_inputs = jax.lax.scan(
            tick, (*start, varying(jnp.zeros((), jnp.float32))), jnp.arange(ticks)
        )
        d_xs = d_inputs[2 * (stages - 1) :]  # stage 0's backward of micro-batch m: tick m + 2 (S - 1)
        per_stage = lambda tree: jax.tree.map(lambda a: a[None], tree)  # noqa: E731
        return per_stage(loss), jax.tree.map(lambda g: g[None, None], grads), per_stage(tail_grads), per_stage(d_xs)

    pipelined, whole, staged = PartitionSpec(None, MeshAxis.PIPELINE), PartitionSpec(), PartitionSpec(MeshAxis.PIPELINE)
    stack_specs = jax.tree.map(lambda _: pipelined, grouped)
    specs = (stack_specs, whole, whole, tuple(whole for _ in cut), whole, whole, whole)
    run = jax.shard_map(
        local, in_specs=specs, out_specs=(staged, stack_specs, staged, staged), axis_names={MeshAxis.PIPELINE}
    )
    losses, grouped_grads, tail_grads, d_xs = run(grouped, tail_params, xs, cut, ys, masks, key)
    # each stage's share: the loss and the head's gradient are the last stage's, the inputs' gradient the first's
    loss, tail_grads, d_xs = losses[-1], jax.tree.map(lambda g: g[-1], tail_grads), d_xs[0]
    grads = jax.tree.map(lambda g, p: g.reshape(p.shape), grouped_grads, params)
    return loss, grads, tail_grads, unmicrobatched(d_xs)


def pipelined_loss(
    piece: Piece,
    tail: Tail,
    forward: Callable[[Tree, jax.Array, Any, Any], jax.Array],
    *,
    stages: int,
    microbatches: int,
) -> Callable[..., jax.Array]:
    """``loss(params, tail_params, h, extras, targets, mask, key, count)``: the mean loss of the batch
    (``tail``'s sums over ``count`` scored targets) of ``h`` through the stacked layers ``params``, with the
    1F1B schedule as its gradient. ``forward(params, h, extras, key)`` is the stack's plain pipelined
    forward, for calls that are not differentiated."""

    @jax.custom_vjp
    def loss(
        params: Tree, tail_params: Tree, h: jax.Array, extras: Any, targets: Any, mask: Any, key: Any, count: Any
    ) -> jax.Array:
        return tail(tail_params, forward(params, h, extras, key), targets, mask) / count

    def loss_forward(
        params: Tree, tail_params: Tree, h: jax.Array, extras: Any, targets: Any, mask: Any, key: Any, count: Any
    ) -> tuple[jax.Array, Any]:
        summed, grads, tail_grads, d_h = _schedule(
            piece, tail, params, tail_params, h, extras, targets, mask, key, stages=stages, microbatches=microbatches
        )
        grads = (
            jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params),
            jax.tree.map(lambda g, p: g.astype(p.dtype), tail_grads, tail_params),
            d_h.astype(h.dtype),
        )
        return summed / count, (grads, (extras, targets, mask, key), count)

    def loss_backward(saved: Any, cotangent: jax.Array) -> tuple[Any, ...]:
        grads, rest, count = saved
        scale = cotangent / count
        scaled = jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)
        return (*scaled, *jax.tree.map(_zero_cotangent, rest), jnp.zeros_like(count))

    loss.defvjp(loss_forward, loss_backward)
    return loss


def loss_in_pipeline(model: Any, decode: bool) -> bool:
    """Whether ``model``'s loss is computed inside the pipeline (``mesh/pipeline_schedule=1f1b``)."""
    return not decode and pipeline_size() > 1 and pipelining_of().schedule == "1f1b" and not model.is_initializing()


def loss(model: Any, h: jax.Array, targets: jax.Array, call: LayerCall) -> jax.Array:
    """The batch's mean loss of the embedded tokens ``h`` through ``model``'s stack (each layer called with
    ``call``, whose padding mask also masks the loss), its final norm and head, with the 1F1B schedule
    (:mod:`~theseus.model.stack.one_f_one_b`) as its gradient: the head and the loss of each micro-batch run
    on the last stage as soon as it leaves the stack."""
    stages, plan = pipeline_size(), pipelining_of()
    check_model(model, stages, plan)
    microbatches = plan.microbatches_for(stages)
    check_rows(h.shape[0], microbatches)
    stage_fn, params, key = stage_of(model, stages, plan, call.deterministic)
    head = model.clone(parent=None)  # unbound: applied to the head's parameters
    every = model.variables["params"]
    head_params = {name: every[name] for name in model.head_parameters()}

    def tail(p: Tree, out: jax.Array, y: jax.Array, m: jax.Array | None) -> jax.Array:
        return head.apply({"params": p}, out, y, m, method="summed_loss")

    count = jnp.maximum(jnp.sum(scored_positions(targets, call.padding_mask)), 1).astype(jnp.float32)
    forward = forward_of(stage_fn, stages, plan, model.remat_policy == "full")
    pipelined = pipelined_loss(stage_fn, tail, forward, stages=stages, microbatches=microbatches)
    return pipelined(params, head_params, h, per_row(call), targets, call.padding_mask, key, count)
