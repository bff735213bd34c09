"""Optimizers as factory containers: a config dataclass and a factory function.

A factory takes ``(config, learning_rate)`` (a float or a ``step -> lr`` schedule) and returns
an ``optax.GradientTransformation``. Weight decay applies to matrices only (see
:mod:`theseus.training.matrices`); norms' scales and biases are not decayed, in per-layer and in
stacked (scanned) models alike. Global-norm clipping is applied by the trainer
(``training/grad_clip``) in front of every optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import optax

from theseus.base.axis import Axis
from theseus.base.tree import path_text
from theseus.config import configure, current_configuration, field
from theseus.training.matrices import is_matrix, matrix_axes, parameter_axes

LearningRate = float | Callable[[Any], Any]


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Scale updates by ``min(1, max_norm / global_norm)``.

    Equivalent to ``optax.clip_by_global_norm`` but written as one multiply, which XLA fuses
    into the optimizer's update instead of materialising the clipped gradients.
    """

    def init(params: Any) -> optax.EmptyState:
        del params
        return optax.EmptyState()

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        del params
        scale = jax.numpy.minimum(1.0, max_norm / optax.tree.norm(updates))
        return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

    return optax.GradientTransformation(init, update)


@dataclass(frozen=True)
class Optimizer:
    """An optimizer: ``config`` (dataclass with ``field()`` keys) and ``factory``.

    ``factory(config_instance, learning_rate)`` returns an ``optax.GradientTransformation``.
    """

    name: str
    config: type
    factory: Callable[[Any, LearningRate], optax.GradientTransformation]

    def create(self, learning_rate: LearningRate, config: Any | None = None) -> optax.GradientTransformation:
        """Build the transformation from the active configuration (or ``config``)."""
        cfg = config if config is not None else configure(self.config)
        return self.factory(cfg, learning_rate)


def decay_mask(params: Any) -> Any:
    """True for parameters that take weight decay: the matrices (:func:`theseus.training.matrices.is_matrix`)."""
    return jax.tree_util.tree_map_with_path(is_matrix, params)


# -- AdamW ----------------------------------------------------------------------------------


@dataclass
class AdamWConfig:
    beta1: float = field("optimizer/adamw/beta1", default=0.9, min=0.0, below=1.0)
    beta2: float = field("optimizer/adamw/beta2", default=0.95, min=0.0, below=1.0)
    eps: float = field("optimizer/adamw/eps", default=1e-8, above=0.0)
    weight_decay: float = field("optimizer/adamw/weight_decay", default=0.1, help="decoupled weight decay of matrices")


def make_adamw(cfg: AdamWConfig, learning_rate: LearningRate) -> optax.GradientTransformation:
    return optax.adamw(
        learning_rate,
        b1=cfg.beta1,
        b2=cfg.beta2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )


AdamW = Optimizer("adamw", AdamWConfig, make_adamw)


# -- Lion -----------------------------------------------------------------------------------


@dataclass
class LionConfig:
    beta1: float = field("optimizer/lion/beta1", default=0.9, min=0.0, below=1.0)
    beta2: float = field("optimizer/lion/beta2", default=0.99, min=0.0, below=1.0)
    weight_decay: float = field("optimizer/lion/weight_decay", default=0.1, help="decoupled weight decay of matrices")


def make_lion(cfg: LionConfig, learning_rate: LearningRate) -> optax.GradientTransformation:
    return optax.lion(learning_rate, b1=cfg.beta1, b2=cfg.beta2, weight_decay=cfg.weight_decay, mask=decay_mask)


Lion = Optimizer("lion", LionConfig, make_lion)


# -- SGD ------------------------------------------------------------------------------------


@dataclass
class SGDConfig:
    momentum: float = field("optimizer/sgd/momentum", default=0.9, help="0 disables momentum")
    nesterov: bool = field("optimizer/sgd/nesterov", default=False)
    weight_decay: float = field("optimizer/sgd/weight_decay", default=0.0, help="decoupled weight decay of matrices")


def make_sgd(cfg: SGDConfig, learning_rate: LearningRate) -> optax.GradientTransformation:
    parts = []
    if cfg.weight_decay:
        parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask))
    parts.append(optax.sgd(learning_rate, momentum=cfg.momentum or None, nesterov=cfg.nesterov))
    return optax.chain(*parts)


SGD = Optimizer("sgd", SGDConfig, make_sgd)


# -- Muon -----------------------------------------------------------------------------------


@dataclass
class MuonConfig:
    beta: float = field("optimizer/muon/beta", default=0.95, help="momentum of the orthogonalised updates")
    nesterov: bool = field("optimizer/muon/nesterov", default=True)
    ns_steps: int = field("optimizer/muon/ns_steps", default=5, help="Newton-Schulz iterations")
    weight_decay: float = field("optimizer/muon/weight_decay", default=0.1)
    consistent_rms: float = field(
        "optimizer/muon/consistent_rms",
        default=0.2,
        help="scale updates to AdamW-like RMS so one training/lr serves both parts (0 = width scaling)",
    )
    adam_beta1: float = field("optimizer/muon/adam_beta1", default=0.9)
    adam_beta2: float = field("optimizer/muon/adam_beta2", default=0.95)
    adam_lr_ratio: float = field("optimizer/muon/adam_lr_ratio", default=1.0, help="lr of the AdamW part / training/lr")
    exclude: list[str] = field(
        "optimizer/muon/exclude",
        default_factory=lambda: ["embed", "wte", "wpe", "lm_head", "unembed"],
        help="parameters whose path contains one of these names use AdamW",
    )


#: Logical axes of parameters that Muon leaves to AdamW (embeddings and output heads).
MUON_EXCLUDED_AXES = frozenset({Axis.VOCAB, Axis.POSITION})


def muon_parameters(params: Any, exclude: list[str], vocab_size: int | None = None) -> Any:
    """``MuonDimensionNumbers`` for hidden matrices, None (AdamW) for everything else.

    A matrix's input and output axes come from :func:`theseus.training.matrices.matrix_axes`, so
    attention's three-axis kernels are orthogonalised as ``embed x (heads * head_dim)`` matrices and
    a scanned model's stacked matrices one layer at a time. Embeddings and output heads (a path
    containing an ``exclude`` name, a vocabulary or position axis, or, for a parameter without
    names, a dimension equal to the vocabulary size) are treated like vectors, as the Muon recipe
    prescribes.
    """
    from optax.contrib import MuonDimensionNumbers

    excluded = [name.lower() for name in exclude]

    def spec(path: tuple[Any, ...], p: Any) -> Any:
        axes = matrix_axes(path, p)
        if axes is None:
            return None
        text = path_text(path).lower()
        if any(name in text for name in excluded):
            return None
        names = parameter_axes(path, p)
        if names is not None and MUON_EXCLUDED_AXES & set(names):
            return None
        if names is None and vocab_size and vocab_size in tuple(p.shape):
            return None
        return MuonDimensionNumbers(reduction_axis=axes.inputs, output_axis=axes.outputs)

    return jax.tree_util.tree_map_with_path(spec, params)


def make_muon(cfg: MuonConfig, learning_rate: LearningRate) -> optax.GradientTransformation:
    """Orthogonalised momentum for hidden matrices (:mod:`theseus.training.muon`); AdamW without
    decay for the rest. The same updates and state as ``optax.contrib.muon``."""
    from theseus.training import muon

    active: Mapping[str, Any] = current_configuration() or {}
    vocab_size = active.get("architecture/vocab_size")
    if callable(learning_rate):
        schedule = learning_rate
        adam_lr: LearningRate = lambda step: schedule(step) * cfg.adam_lr_ratio  # noqa: E731
    else:
        adam_lr = learning_rate * cfg.adam_lr_ratio

    def dimension_numbers(params: Any) -> Any:
        return muon_parameters(params, cfg.exclude, vocab_size)

    def labels(params: Any) -> Any:
        return jax.tree.map(
            lambda dims: "adam" if dims is None else "muon", dimension_numbers(params), is_leaf=_dims_or_none
        )

    eps = 1e-8
    return optax.partition(
        {
            "muon": optax.chain(
                muon.scale_by_muon(dimension_numbers, cfg.beta, cfg.nesterov, cfg.ns_steps, eps),
                muon.scale_by_shape(dimension_numbers, cfg.consistent_rms or None),
                optax.add_decayed_weights(cfg.weight_decay, decay_mask),
                optax.scale_by_learning_rate(learning_rate),
            ),
            "adam": optax.adamw(
                adam_lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=eps, weight_decay=0.0, nesterov=cfg.nesterov
            ),
        },
        labels,
    )


def _dims_or_none(x: Any) -> bool:
    from optax.contrib import MuonDimensionNumbers

    return x is None or isinstance(x, MuonDimensionNumbers)


Muon = Optimizer("muon", MuonConfig, make_muon)

__all__ = [
    "SGD",
    "AdamW",
    "AdamWConfig",
    "Lion",
    "LionConfig",
    "Muon",
    "MuonConfig",
    "Optimizer",
    "SGDConfig",
    "decay_mask",
    "muon_parameters",
]
