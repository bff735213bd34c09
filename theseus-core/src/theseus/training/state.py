"""The train state: parameters, optimizer state and step, plus the model that applies them."""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec

from theseus.config import current_configuration
from theseus.training.optimizer_state import on_host
from theseus.training.sharding import TrainerSharding, check_divisible


class TrainState(train_state.TrainState):
    """``flax`` TrainState (``step``, ``params``, ``opt_state``, ``apply_fn``, ``tx``) plus ``model``.

    ``apply_fn`` is ``model.apply`` and follows the model call contract
    ``apply_fn(variables, x, y=None, padding_mask=None, deterministic=False, rngs=...)``.
    """

    model: Any = struct.field(pytree_node=False, default=None)


def init_variables(model: nn.Module, key: jax.Array, sequence_length: int) -> Any:
    """``model.init`` on a one-row dummy batch (boxed with logical partitioning metadata)."""
    x = jnp.zeros((1, sequence_length), jnp.int32)
    return model.init({"params": key, "dropout": key}, x, deterministic=True)


def variables_initialiser(model: nn.Module, sharding: TrainerSharding, sequence_length: int) -> Callable[..., Any]:
    """``init_variables`` of ``model`` jitted, one function per model, sharding, sequence length and active
    configuration: :func:`abstract_variables` traces it and :func:`create_state` calls it inside its own
    program, where jax reuses that trace (a model's initialiser is traced once, not twice)."""
    config = current_configuration()
    key = (id(model), id(sharding), id(config), sequence_length)
    found = _INITIALISERS.get(key)
    if found is None:
        found = (
            model,
            sharding,
            config,
            jax.jit(functools.partial(init_variables, model, sequence_length=sequence_length)),
        )
        _INITIALISERS[key] = found  # the objects are held with it, so their ids stay theirs
        while len(_INITIALISERS) > INITIALISERS_KEPT:
            _INITIALISERS.pop(next(iter(_INITIALISERS)))
    else:
        _INITIALISERS.move_to_end(key)
    return found[-1]


#: How many models' jitted initialisers are kept (the newest): one trainer's setup and state share one.
INITIALISERS_KEPT = 2
_INITIALISERS: OrderedDict[tuple[int, int, int, int], tuple[Any, Any, Any, Callable[..., Any]]] = OrderedDict()


def abstract_variables(model: nn.Module, sharding: TrainerSharding, key: jax.Array, sequence_length: int) -> Any:
    """The model's variables as shapes and dtypes, boxed with their logical axis names (nothing is computed)."""
    with sharding.context():
        return jax.eval_shape(variables_initialiser(model, sharding, sequence_length), key)


def state_shardings(
    model: nn.Module,
    tx: optax.GradientTransformation,
    sharding: TrainerSharding,
    key: jax.Array,
    sequence_length: int,
    boxed: Any = None,
    offload: bool = False,
    keep_bytes: int = 0,
) -> tuple[TrainState, TrainState]:
    """The abstract state (shapes/dtypes) and the matching tree of ``NamedSharding``.

    ``boxed``: the model's :func:`abstract_variables`, when the caller has them already; ``offload``: the
    optimizer state lives in host memory (``optimizer/offload``), but for its first leaves up to
    ``keep_bytes`` a device (``optimizer/offload_keep_gb``).
    """
    if boxed is None:
        boxed = abstract_variables(model, sharding, key, sequence_length)
    logical_specs = nn.get_partition_spec(boxed)
    param_shardings = sharding.logical_shardings(logical_specs)["params"]
    params = nn.unbox(boxed)["params"]
    check_divisible(params, param_shardings, logical_specs["params"], sharding.mesh)
    opt_state = jax.eval_shape(tx.init, params)
    replicated = sharding.replicated
    opt_shardings = optimizer_state_shardings(opt_state, params, param_shardings, replicated)
    if offload:
        opt_shardings = on_host(opt_shardings, opt_state, keep_bytes)
    abstract = TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32),  # type: ignore[arg-type]
        apply_fn=model.apply,
        params=params,
        tx=tx,
        opt_state=opt_state,
        model=model,
    )
    shardings = abstract.replace(step=replicated, params=param_shardings, opt_state=opt_shardings)
    return abstract, shardings


def optimizer_state_shardings(opt_state: Any, params: Any, param_shardings: Any, default: Any) -> Any:
    """Shard each optimizer-state leaf like the parameter it mirrors, others with ``default``.

    A leaf mirrors a parameter when its key path ends with that parameter's path and the shapes
    agree (Adam moments, momentum, Muon buffers, also inside masked or partitioned states). A leaf shaped
    like one slice of a stacked parameter (a state kept per layer:
    :func:`~theseus.training.optimizer_state.one_parameter_at_a_time`) is sharded like that slice.
    """
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], Any]] = {}
    for (path, leaf), shard in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(param_shardings), strict=True
    ):
        by_path[_dict_keys(path)] = (tuple(leaf.shape), shard)

    def pick(path: tuple[Any, ...], leaf: Any) -> Any:
        keys: list[str] = []
        for entry in reversed(path):
            if not isinstance(entry, jax.tree_util.DictKey):
                break
            keys.insert(0, str(entry.key))
        for start in range(len(keys)):
            match = by_path.get(tuple(keys[start:]))
            shape = tuple(getattr(leaf, "shape", ()))
            if match is not None and match[0] == shape:
                return match[1]
            if match is not None and match[0][1:] == shape and isinstance(match[1], NamedSharding):
                spec = tuple(match[1].spec) + (None,) * (len(match[0]) - len(match[1].spec))
                return match[1].update(spec=PartitionSpec(*spec[1:]))
        return default

    return jax.tree_util.tree_map_with_path(pick, opt_state)


def _dict_keys(path: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(getattr(entry, "key", entry)) for entry in path)


def create_state(
    model: nn.Module,
    tx: optax.GradientTransformation,
    sharding: TrainerSharding,
    key: jax.Array,
    sequence_length: int,
    shardings: TrainState,
) -> TrainState:
    """Initialise parameters and optimizer state directly with their shardings."""

    initialiser = variables_initialiser(model, sharding, sequence_length)

    def init(k: jax.Array) -> TrainState:
        with sharding.context():
            variables = nn.unbox(initialiser(k))
        params = variables["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            apply_fn=model.apply,
            params=params,
            tx=tx,
            opt_state=tx.init(params),
            model=model,
        )

    initialise = jax.jit(init, out_shardings=shardings)
    if jax.default_backend() != "cpu":
        return initialise(key)
    lowered = initialise.lower(key)
    values = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(lowered.out_info))
    if values > RUN_ONCE_MAX_VALUES:
        return lowered.compile()(key)
    return lowered.compile(compiler_options=RUN_ONCE_COMPILER_OPTIONS)(key)


#: XLA options for a small program that runs once (the parameter initialiser of a small model):
#: LLVM's optimisation of the many unrolled random-number kernels costs more than it saves (on 2
#: CPU cores the tiny preset's initialiser compiles in 2.3 s instead of 4.7 s and runs in 0.1 s
#: instead of 0.015 s); values agree to float32 rounding. The unoptimised code runs ~7x slower,
#: so states of more than ``RUN_ONCE_MAX_VALUES`` numbers (parameters + optimizer state) are
#: compiled as usual (at 124M parameters the unoptimised initialiser ran for ~20 s).
RUN_ONCE_COMPILER_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}
RUN_ONCE_MAX_VALUES = 12_000_000


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct`` leaves of ``abstract`` carrying the matching sharding."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract,
        shardings,
    )
