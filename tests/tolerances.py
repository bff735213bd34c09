"""Tolerances for comparing float32 results that two computations of the same value round differently.

Two programs computing one float32 value (scanned or unrolled layers, chunked or full logits, another
fusion, another CPU's vector width, a reference implementation) agree only up to rounding: each operation
is off by up to half an ulp, and over the ``ops`` operations feeding a value those errors add up like a
random walk, to about ``sqrt(ops)`` machine epsilons relative to the magnitude of the values involved. A
flat ``1e-6`` is a handful of ulps at magnitude 1, which another machine's kernels can cross; these
tolerances follow the dtype, the operation count and the magnitude instead. They never apply to results
that must be exact (a resumed run's bits, a masked value's zero).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

#: float32's machine epsilon (2**-23): the spacing of float32 numbers just above 1.
FLOAT32_EPS = float(np.finfo(np.float32).eps)
#: How many typical (random-walk) rounding errors a comparison allows.
SAFETY = 4.0


def float32_tolerance(ops: int, scale: float = 1.0) -> float:
    """The absolute tolerance between two float32 computations of a value through ``ops`` rounded
    operations on values of magnitude ``scale``: ``SAFETY * eps * sqrt(ops) * scale``. With the default
    ``scale`` of 1 it is a relative tolerance (``rel=``, ``rtol=``)."""
    if ops < 1:
        raise ValueError(f"ops={ops}: a computation has at least one operation")
    return SAFETY * FLOAT32_EPS * math.sqrt(ops) * abs(scale)


def transformer_ops(n_layers: int, width: int, positions: int, vocab: int) -> int:
    """The operations behind one output of a transformer's forward pass, its loss included: per layer two
    norms, the attention's projections, scores, softmax and weighted sum over ``positions``, its output
    projection and the MLP's two contractions (the second over 4 x ``width``), about ``10 * width + 2 *
    positions``; then the final norm and the head (``width``) and the log-softmax over ``vocab``. A
    gradient's backward pass takes about twice as many again: ``3 *`` this."""
    return n_layers * (10 * width + 2 * positions) + 2 * width + vocab


def model_ops(model: Any) -> int:
    """``transformer_ops`` of a model, read from its architecture."""
    arch = model.architecture
    vocab = getattr(arch, "padded_vocab_size", None) or arch.vocab_size
    return transformer_ops(arch.n_layers, arch.n_embd, arch.block_size, vocab)


def magnitude(tree: Any) -> float:
    """The largest absolute value among the arrays of ``tree`` (a gradient, logits): the ``scale`` of a
    comparison whose errors follow the values that flowed through it, not each element's own size."""
    return max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree.leaves(tree))
