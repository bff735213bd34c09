"""How the optimizer state is kept: its dtype (``optimizer/state_dtype``) and its memory (``optimizer/offload``).

AdamW keeps two moments a parameter: with float32 parameters and gradients that is 16 bytes a parameter,
and a 1.1B model's 17.4 GB do not fit a 16 GB chip. Two wrappers around any optax transformation lower
what the device holds, for every optimizer alike:

- :func:`stored_as` keeps the state's floating-point leaves in a narrower dtype (bfloat16 halves the
  moments). The update itself runs in float32: the stored leaves are widened first and rounded after.
  bfloat16 keeps float32's exponent range, so no moment underflows; its 8-bit mantissa rounds an
  exponential average's increment away once it is under about 0.4 % of the average, so a second-moment
  decay ``beta2`` above about 0.99 stalls (the default 0.95 moves it by 5 % a step).
- ``optimizer/offload`` keeps the state in the host's pinned memory (:data:`HOST`): the state's shardings
  say where it lives (:func:`on_host`), and :func:`one_parameter_at_a_time` moves each parameter's state
  to the device for its update and back, so the device holds one parameter's state at a time. The first
  leaves, up to ``optimizer/offload_keep_gb`` a device, stay on the device: every byte kept there is a byte
  that does not cross the host link twice a step (``model/remat=auto`` keeps as much as its step leaves
  room for, :func:`theseus.training.memory.keep_state_on_device`).

Either choice runs the update one parameter at a time (a state per parameter path, and per layer of a
scanned model's stacked parameters), so the widened or transferred moments never exist for the whole
model at once. Offloading leaves the arithmetic as it is;
a narrower dtype rounds the stored state.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from theseus.base.tree import path_text
from theseus.training.matrices import judged_as_slice, stacked_length

#: The dtypes ``optimizer/state_dtype`` offers.
STATE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
#: The memory kind of an offloaded optimizer state.
HOST = "pinned_host"
#: Memory kinds that are not the device's own (a leaf there takes no device memory).
HOST_KINDS = frozenset({"pinned_host", "unpinned_host"})


def _floating(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)


def stored_as(tx: optax.GradientTransformation, dtype: Any) -> optax.GradientTransformation:
    """``tx`` with its floating-point state leaves stored in ``dtype`` and updated in float32."""

    def narrow(state: Any) -> Any:
        return jax.tree.map(lambda leaf: leaf.astype(dtype) if _floating(leaf) else leaf, state)

    def widen(state: Any) -> Any:
        return jax.tree.map(lambda leaf: leaf.astype(jnp.float32) if _floating(leaf) else leaf, state)

    def init(params: Any) -> Any:
        return narrow(tx.init(params))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        updates, new_state = tx.update(updates, widen(state), params)
        return updates, narrow(new_state)

    return optax.GradientTransformation(init, update)


def one_parameter_at_a_time(tx: optax.GradientTransformation, offload: bool) -> optax.GradientTransformation:
    """``tx`` run on each parameter in turn, with a state of its own per parameter (keyed by its path).

    A parameter that stacks independent ones on its first axis (a scanned model's layers, a mixture's
    experts: :func:`~theseus.training.matrices.stacked_length`) is updated a slice at a time, with a state
    per slice: a scanned 1.1B Llama's stacked MLP kernel is 268M parameters, whose widened moments alone
    would take 2 GB at once. Each update starts once the previous one is done (an optimisation barrier
    chains them), so what a whole-tree update would hold at once (every widened moment, or with ``offload``
    every moment brought in from the host) is held for about one parameter at a time. With ``offload`` each
    state comes to the device for its update and goes back to the host after it; the transfer in may start
    while the previous update runs. ``tx`` must treat parameters independently (AdamW, Lion, SGD, Muon do;
    global-norm clipping does not and stays outside). Each part sees a tree holding its one parameter at its
    own path, so masks and names by path still apply.
    """

    def init(params: Any) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for path, leaf in _parameters(params):
            if count := stacked_length(path, leaf):
                with judged_as_slice(path):
                    state[path_text(path)] = tuple(tx.init(_alone(path, leaf[i])) for i in range(count))
            else:
                state[path_text(path)] = tx.init(_alone(path, leaf))
        return state

    def update(updates: Any, state: dict[str, Any], params: Any = None) -> tuple[Any, dict[str, Any]]:
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        values = dict(_parameters(params)) if params is not None else {}
        finished: list[Any] = []  # each update's results, in order

        def after(value: Any, back: int) -> Any:
            """``value`` once the update ``back`` places before the next one is done."""
            return value if len(finished) < back else jax.lax.optimization_barrier((value, finished[-back]))[0]

        def one(path: tuple[Any, ...], gradient: Any, own: Any, param: Any) -> tuple[Any, Any]:
            away = jax.tree.map(in_host_memory, own)  # the leaves kept in host memory (optimizer/offload)
            if offload and any(jax.tree.leaves(away)):  # brought in while the previous update runs, then used after it
                own = _moved(after(own, 2), away, jax.memory.Space.Device)
            step, own = tx.update(_alone(path, gradient), after(own, 1), None if param is None else _alone(path, param))
            [(_, changed)] = jax.tree_util.tree_flatten_with_path(step)[0]
            own = _moved(own, away, jax.memory.Space.Host) if offload else own
            finished.append((changed, own))
            return changed, own

        new_updates, new_state = [], {}
        for path, gradient in flat:
            key, param = path_text(path), values.get(path)
            if count := stacked_length(path, gradient):
                with judged_as_slice(path):
                    parts = [
                        one(path, gradient[i], state[key][i], None if param is None else param[i]) for i in range(count)
                    ]
                new_updates.append(jnp.stack([changed for changed, _ in parts]))
                new_state[key] = tuple(own for _, own in parts)
            else:
                changed, new_state[key] = one(path, gradient, state[key], param)
                new_updates.append(changed)
        return jax.tree_util.tree_unflatten(treedef, new_updates), new_state

    return optax.GradientTransformation(init, update)


def in_host_memory(leaf: Any) -> bool:
    """Whether a traced (or concrete) array lives in host memory."""
    return getattr(jax.typeof(leaf), "memory_space", None) == jax.memory.Space.Host


def _moved(state: Any, away: Any, space: Any) -> Any:
    """``state`` with the leaves ``away`` marks put in memory ``space``, the others as they are."""
    return jax.tree.map(lambda leaf, move: jax.device_put(leaf, space) if move else leaf, state, away)


def _parameters(tree: Any) -> list[tuple[tuple[Any, ...], Any]]:
    return [(tuple(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _alone(path: tuple[Any, ...], leaf: Any) -> Any:
    """A tree of nested dicts holding ``leaf`` alone at ``path``."""
    tree = leaf
    for entry in reversed(path):
        tree = {getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry))): tree}
    return tree


def kept(tx: optax.GradientTransformation, dtype: str, offload: bool) -> optax.GradientTransformation:
    """``tx`` with its state kept as ``optimizer/state_dtype`` and ``optimizer/offload`` say: a narrower
    dtype, host memory, or both, updated one parameter at a time; unchanged for float32 on the device."""
    if dtype == "float32" and not offload:
        return tx
    if dtype != "float32":
        tx = stored_as(tx, STATE_DTYPES[dtype])
    return one_parameter_at_a_time(tx, offload)


def on_host(shardings: Any, state: Any = None, keep_bytes: int = 0) -> Any:
    """The same shardings in the host's pinned memory, but for the first leaves of the abstract ``state``
    (in its flattened order) whose bytes per device add up to at most ``keep_bytes``, which stay on the
    device; a ConfigError where the devices have no such memory (a deviceless GPU topology of ``theseus
    plan``, whose shardings would drop the memory kind silently)."""
    from theseus.errors import ConfigError

    kept = kept_on_device(shardings, state, keep_bytes) if state is not None and keep_bytes > 0 else None
    placed = jax.tree.map(lambda sharding: sharding.with_memory_kind(HOST), shardings)
    if any(sharding.memory_kind != HOST for sharding in jax.tree.leaves(placed)):
        raise ConfigError(
            "optimizer/offload=true needs devices with pinned host memory, and these have none (a GPU target of "
            "theseus plan is compiled without one); set optimizer/offload=false here"
        )
    if kept is None:
        return placed
    return jax.tree.map(lambda host, device, keep: device if keep else host, placed, shardings, kept)


def kept_on_device(shardings: Any, state: Any, keep_bytes: int) -> Any:
    """A tree of booleans over ``state``'s leaves: True for those kept on the device, taken in flattened
    order while their bytes per device (under ``shardings``) fit in ``keep_bytes``; a leaf too large for
    what is left is passed over for later, smaller ones."""
    import math

    import numpy as np

    left = keep_bytes

    def keep(leaf: Any, sharding: Any) -> bool:
        nonlocal left
        size = math.prod(sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
        if size > left:
            return False
        left -= size
        return True

    return jax.tree.map(keep, state, shardings)


def on_device(sharding: Any) -> bool:
    """Whether arrays of ``sharding`` take device memory (not a host memory kind)."""
    return getattr(sharding, "memory_kind", None) not in HOST_KINDS


def donates_offloaded_state(platform: str) -> bool:
    """Whether a step may donate an offloaded state's buffers: XLA's CPU client cannot alias pinned host
    buffers (nor needs to: its device memory is the host's), accelerators can."""
    return platform != "cpu"


__all__ = [
    "HOST",
    "STATE_DTYPES",
    "in_host_memory",
    "kept",
    "kept_on_device",
    "on_device",
    "on_host",
    "one_parameter_at_a_time",
    "stored_as",
]
