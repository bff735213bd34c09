"""Pipeline parallelism: a scanned layer stack split into contiguous stages over the ``pipeline`` mesh axis.

**Layout.** The stacked parameters ``[n_layers, ...]`` keep that form (checkpoints, Hugging Face export
and a run on another mesh read them unchanged); their layer axis (logical ``layers``) is split over
``pipeline``, so with ``S`` stages each device holds ``n_layers / S`` consecutive layers and their
optimizer state. The embeddings, the final norm, the head and the loss run outside the pipelined stack,
sharded over the other mesh axes as without a pipeline (``1f1b`` runs the head and the loss on the last
stage).

**Schedule** (:func:`pipeline_stack`). A micro-batch of ``B`` rows is cut into ``M`` pipeline
micro-batches (``mesh/pipeline_microbatches``). Under ``shard_map`` over ``pipeline`` every stage runs at
once on each tick: stage ``s`` passes the micro-batch it holds through its layers, then every stage sends
its output on to stage ``s + 1`` (one ``ppermute`` round the ring), stage 0 takes a new micro-batch and
the last stage's outputs are kept. ``gpipe`` takes ``M + S - 1`` ticks; differentiating the loop gives
the backward pass in reverse order, so the expected idle share (the bubble) is ``(S - 1) / (M + S - 1)``.
``interleaved`` gives each device ``V`` virtual stages (``mesh/pipeline_virtual``): the stack is cut into
``S x V`` pieces of ``n_layers / (S V)`` layers, piece ``p`` on stage ``p % S``, and the micro-batches go
round the ring ``V`` times (a circular pipeline; stage 0 keeps the returning micro-batches until their next
lap, which needs ``M >= S``); ``M V + S - 1`` ticks of ``1 / V`` the work each, a bubble of
``(S - 1) / (M V + S - 1)``. The contiguous ``[n_layers]`` layout holds ``gpipe``'s stages as they are;
``interleaved`` regroups the stack into its pieces once per step (an all-to-all of the stack's
parameters, and of their gradients). Each tick reads its piece of the stack inside the piece's own
computation, and with ``model/remat=full`` keeps only what it received, running the piece again in the
backward pass. ``1f1b`` runs the head and the loss inside the pipeline as well
(:mod:`~theseus.model.stack.one_f_one_b`, built on the helpers here).

**Refused.** Stacks that are not one plain scan (unrolled layers, several layer runs, repeating
``layer_types``), layers that sow auxiliary losses or metrics (mixture layers) and a pipeline beside
``mesh/context`` stop with one line naming the setting to change. Decoding runs the stack as usual.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from theseus.base.axis import MeshAxis, Pipelining, pipelining_of
from theseus.base.sown import AUX_COLLECTIONS
from theseus.errors import ConfigError
from theseus.model.stack.block import LayerCall
from theseus.model.stack.scan import LAYERS, run_stack

Tree = Any


def pipeline_size() -> int:
    """Size of the ``pipeline`` axis of the mesh the model runs under (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MeshAxis.PIPELINE not in mesh.axis_names:
        return 1
    return int(dict(mesh.shape)[MeshAxis.PIPELINE])


def _batch_parts() -> int:
    """How many ways the mesh splits batch rows (the data-parallel axes)."""
    mesh = jax.sharding.get_abstract_mesh()
    shape = dict(mesh.shape)
    return math.prod(shape[name] for name in (MeshAxis.EXPERT, MeshAxis.DATA) if name in shape)


def check_model(model: Any, stages: int, plan: Pipelining) -> None:
    """Raise a one-line ConfigError when ``model``'s stack cannot run as ``stages`` pipeline stages."""
    arch = model.architecture
    if not model.scans_layers:
        raise ConfigError(
            f"mesh/pipeline={stages} splits a scanned layer stack, but {type(model).__name__}'s layers are "
            "unrolled; set model/scan_layers=true (or mesh/pipeline=1)"
        )
    if arch.layer_types is not None or len(model.layer_runs) > 1 or model.scan_period is not None:
        raise ConfigError(
            f"mesh/pipeline={stages} splits one stack of alike layers, but {type(model).__name__}'s layers differ "
            "(layer_types, or layers of several shapes); set mesh/pipeline=1 for this model"
        )
    if MeshAxis.CONTEXT in dict(jax.sharding.get_abstract_mesh().shape):
        raise ConfigError("mesh/pipeline and mesh/context cannot both be above 1 yet; set one of them to 1")
    pieces = stages * plan.pieces
    if arch.n_layers % pieces:
        what = f"mesh/pipeline x mesh/pipeline_virtual = {pieces}" if plan.pieces > 1 else f"mesh/pipeline={stages}"
        raise ConfigError(
            f"{arch.n_layers} layers cannot be split into {what} equal stages; "
            f"set architecture/n_layers to a multiple of {pieces} or choose a divisor of {arch.n_layers}"
        )
    if plan.pieces > 1 and plan.microbatches_for(stages) < stages:
        raise ConfigError(
            f"the interleaved schedule needs at least as many micro-batches as stages; set "
            f"mesh/pipeline_microbatches to at least {stages} (or 0 = mesh/pipeline)"
        )


def microbatched(x: jax.Array, count: int) -> jax.Array:
    """``[B, ...]`` -> ``[count, B / count, ...]``, micro-batch ``m`` holding rows ``m, m + count, ...``
    (each data-parallel device keeps its own rows)."""
    rows = x.shape[0]
    return jnp.swapaxes(x.reshape(rows // count, count, *x.shape[1:]), 0, 1)


def unmicrobatched(x: jax.Array) -> jax.Array:
    """The inverse of :func:`microbatched`."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def varying(x: jax.Array) -> jax.Array:
    """``x`` typed as differing between pipeline stages (what a stage computes from its own layers is)."""
    return jax.lax.pcast(x, (MeshAxis.PIPELINE,), to="varying")


def check_rows(rows: int, microbatches: int) -> None:
    """Raise a one-line ConfigError when ``rows`` cannot be cut into ``microbatches`` equal micro-batches
    that the data-parallel axes split further."""
    if rows % microbatches:
        raise ConfigError(
            f"a batch of {rows} rows cannot be cut into mesh/pipeline_microbatches={microbatches} equal parts; "
            f"make the micro batch (training/micro_batch_size) a multiple of {microbatches}"
        )
    parts = _batch_parts()
    if (rows // microbatches) % parts:
        raise ConfigError(
            f"a pipeline micro-batch of {rows // microbatches} rows cannot be split over {parts} data-parallel "
            f"devices; make the micro batch (training/micro_batch_size) a multiple of {microbatches * parts}"
        )


def regrouped(params: Tree, stages: int, virtual: int) -> Tree:
    """The stacked ``params`` (leaves ``[n_layers, ...]``, layer axis over ``pipeline``) as
    ``[virtual, stages, n_layers / (stages virtual), ...]``, the stage axis over ``pipeline``."""
    pieces = stages * virtual

    def regroup(p: jax.Array) -> jax.Array:
        free = (PartitionSpec.UNCONSTRAINED,) * (p.ndim - 1)  # the other axes stay as the layout has them
        p = jax.lax.with_sharding_constraint(p, PartitionSpec(MeshAxis.PIPELINE, *free))  # and the gradient
        grouped = p.reshape(virtual, stages, p.shape[0] // pieces, *p.shape[1:])
        return jax.lax.with_sharding_constraint(grouped, PartitionSpec(None, MeshAxis.PIPELINE, None, *free))

    return jax.tree.map(regroup, params)


def pipeline_stack(
    stage_fn: Any,
    params: Tree,
    h: jax.Array,
    extras: tuple[jax.Array | None, ...],
    key: jax.Array | None,
    *,
    stages: int,
    microbatches: int,
    virtual: int,
    remat: bool = False,
) -> jax.Array:
    """``h`` ``[B, T, D]`` through the stacked layers ``params`` (leaves ``[n_layers, ...]``) as a pipeline
    of ``stages`` stages with ``virtual`` pieces each, ``microbatches`` micro-batches at a time.

    ``stage_fn(piece_params, h, extras, key)`` runs one piece (leaves ``[n_layers / (stages virtual), ...]``)
    on one micro-batch ``[B / microbatches, T, D]``; ``extras`` are per-row arrays ``[B, ...]`` (or None)
    cut into the same micro-batches; ``key`` (or None) is folded with the piece and micro-batch. ``remat``:
    each tick keeps only what it received for the backward pass and runs its piece again there (what
    ``model/remat=full`` asks of the layers, at the tick: otherwise every tick keeps its piece's
    activations of its micro-batch until the backward reaches it)."""
    check_rows(h.shape[0], microbatches)
    grouped = regrouped(params, stages, virtual)
    xs = microbatched(h, microbatches)
    cut = tuple(None if e is None else microbatched(e, microbatches) for e in extras)
    ticks = microbatches * virtual + stages - 1
    ring = [(s, (s + 1) % stages) for s in range(stages)]

    def local(grouped: Tree, xs: jax.Array, cut: tuple[jax.Array | None, ...], key: jax.Array | None) -> jax.Array:
        stage = jax.lax.axis_index(MeshAxis.PIPELINE)
        mine = jax.tree.map(lambda p: p[:, 0], grouped)  # [V, n_layers / (S V), ...]: this stage's pieces

        def piece_of(mine: Tree, lap: jax.Array, *args: Any) -> jax.Array:
            """The stage's piece of lap ``lap`` on one micro-batch. Its parameters are read here, from the
            stage's whole share: read outside, each tick's copy of them would be kept for the backward."""
            if virtual == 1:
                piece = jax.tree.map(lambda p: p[0], mine)
            else:
                piece = jax.tree.map(lambda p: jax.lax.dynamic_index_in_dim(p, lap, keepdims=False), mine)
            return stage_fn(piece, *args)

        run_piece = jax.checkpoint(piece_of, policy=jax.checkpoint_policies.nothing_saveable) if remat else piece_of

        def tick(carry: tuple[jax.Array, jax.Array | None], t: jax.Array) -> tuple[Any, jax.Array]:
            held, laps = carry  # held: what the previous stage sent; laps: micro-batches between laps
            fresh = jax.lax.dynamic_index_in_dim(xs, jnp.minimum(t, microbatches - 1), keepdims=False)
            if laps is not None:  # what stage 0 received is the last stage's output of item t - S
                laps = jax.lax.dynamic_update_index_in_dim(laps, held, (t - stages) % microbatches, 0)
                again = jax.lax.dynamic_index_in_dim(laps, t % microbatches, keepdims=False)
                fresh = jnp.where(t < microbatches, fresh, again)
            inputs = jnp.where(stage == 0, fresh, held)
            item = jnp.maximum(t - stage, 0)  # the stage's place in the stream: lap item // M, micro-batch item % M
            lap = jnp.minimum(item // microbatches, virtual - 1)
            micro = item % microbatches
            row_extras = tuple(
                None if e is None else jax.lax.dynamic_index_in_dim(e, micro, keepdims=False) for e in cut
            )
            piece_key = (
                None if key is None else jax.random.fold_in(jax.random.fold_in(key, lap * stages + stage), micro)
            )
            out = run_piece(mine, lap, inputs, row_extras, piece_key)
            return (jax.lax.ppermute(out, MeshAxis.PIPELINE, ring), laps), out

        held = varying(jnp.zeros_like(xs[0]))
        laps = varying(jnp.zeros_like(xs)) if virtual > 1 else None
        _, outs = jax.lax.scan(tick, (held, laps), jnp.arange(ticks))
        last = outs[(virtual - 1) * microbatches + stages - 1 :]  # the last lap's outputs of the last stage
        return jax.lax.psum(jnp.where(stage == stages - 1, last, jnp.zeros_like(last)), MeshAxis.PIPELINE)

    specs = (
        jax.tree.map(lambda _: PartitionSpec(None, MeshAxis.PIPELINE), grouped),
        PartitionSpec(),
        tuple(PartitionSpec() for _ in cut),
        PartitionSpec(),
    )
    run = jax.shard_map(local, in_specs=specs, out_specs=PartitionSpec(), axis_names={MeshAxis.PIPELINE})
    return unmicrobatched(run(grouped, xs, cut, key))


def _fields(module: Any) -> dict[str, Any]:
    """The dataclass fields a bound module was built with (what an unbound copy of another class needs)."""
    return {
        f.name: getattr(module, f.name)
        for f in dataclasses.fields(module)
        if f.init and f.name not in ("parent", "name")
    }


def stage_of(model: Any, stages: int, plan: Pipelining, deterministic: bool) -> tuple[Any, Tree, jax.Array | None]:
    """``(stage_fn, stacked parameters, dropout key or None)`` of ``model``'s stack cut into pieces of
    ``plan``: ``stage_fn(piece_params, h, (mask, positions), key)`` runs one piece on one micro-batch
    (:func:`per_row` gives a :class:`LayerCall`'s per-row arrays)."""
    per_piece = model.architecture.n_layers // (stages * plan.pieces)
    stack = getattr(model, LAYERS)
    unit = model.layer_runs[0].unit  # one layer, every one alike (check_model)
    piece = run_stack(model.BLOCK, unit, per_piece, model.remat_policy, min(model.scan_unroll, per_piece))(
        **_fields(stack),
        parent=None,  # unbound: applied to each piece's parameters
    )
    dropout = not deterministic and model.architecture.dropout > 0.0 and model.has_rng("dropout")
    key = model.make_rng("dropout") if dropout else None

    def stage_fn(p: Tree, x: jax.Array, extras: tuple[jax.Array | None, ...], k: jax.Array | None) -> jax.Array:
        rngs = {"dropout": k} if k is not None else {}
        mask, positions = extras  # per_row(call)
        call = LayerCall(mask, positions, deterministic)
        (out, _), sown = piece.apply({"params": p}, x, *call, rngs=rngs, mutable=list(AUX_COLLECTIONS))
        if jax.tree.leaves(sown):
            raise ConfigError(
                f"{type(model).__name__}'s layers record auxiliary losses or metrics, which the pipeline does not "
                "carry; set mesh/pipeline=1 for this model"
            )
        return out

    return stage_fn, model.variables["params"][LAYERS], key


def forward_of(stage_fn: Any, stages: int, plan: Pipelining, remat: bool) -> Any:
    """``forward(params, h, extras, key)``: the stack's pipelined forward with ``plan``'s schedule."""

    def forward(params: Tree, h: jax.Array, extras: tuple[jax.Array | None, ...], key: jax.Array | None) -> jax.Array:
        return pipeline_stack(
            stage_fn,
            params,
            h,
            extras,
            key,
            stages=stages,
            microbatches=plan.microbatches_for(stages),
            virtual=plan.pieces,
            remat=remat,
        )

    return forward


def per_row(call: LayerCall) -> tuple[jax.Array | None, jax.Array | None]:
    """The per-row arrays of a layer call, cut into micro-batches with the rows (the stage's function
    rebuilds the call from them)."""
    return call.padding_mask, call.positions


def run(model: Any, h: jax.Array, call: LayerCall) -> jax.Array | None:
    """``h`` through ``model``'s stack, each layer called with ``call``, as a pipeline over the mesh's
    ``pipeline`` axis, or None when the mesh has none (or while parameters are created: the plain stack
    lays them out)."""
    stages = pipeline_size()
    if stages == 1:
        return None
    plan = pipelining_of()
    check_model(model, stages, plan)
    if model.is_initializing():
        return None
    stage_fn, params, key = stage_of(model, stages, plan, call.deterministic)
    return forward_of(stage_fn, stages, plan, model.remat_policy == "full")(params, h, per_row(call), key)
