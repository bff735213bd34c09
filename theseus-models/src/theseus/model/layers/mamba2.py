"""The Mamba-2 mixer (:class:`Mamba2`): a selective state-space token mixer in its state-space-duality form
(SSD), the mixer of Nemotron-H, Granite 4 hybrid, Falcon-H1, Bamba and Zamba2.

One input projection gives the output gate ``z``, the scan's input ``x`` with its input and output maps
``B`` and ``C`` (``n_groups`` of them, shared by the heads of a group), and one time step per head. ``x``,
``B`` and ``C`` pass a depthwise causal convolution and SiLU first. Per head, with a scalar decay
``A = -exp(A_log)`` and ``dt = clip(softplus(dt_raw + dt_bias))``, the state ``S`` (``head_dim x
state_size``) runs::

    S_t = exp(dt_t * A) * S_{t-1} + dt_t * x_t B_t^T
    y_t = S_t C_t + D * x_t

then ``y`` is normalised in groups, gated by ``SiLU(z)`` and projected back. Training runs the chunked form
(:func:`ssd`: within a chunk of ``chunk_size`` positions a masked product like attention's, across chunks
one recurrence over their states); decoding keeps the state and the convolution's last inputs in the cache
and runs the same function over the new tokens, from the cached state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers import lora
from theseus.model.layers._common import INIT_STD, cast, constrain, layer_width, normal, param
from theseus.model.layers.attention import is_segment_ids, missing_cache_error
from theseus.model.layers.context_parallel import refuse
from theseus.model.layers.layer_call import LayerCall, StackLayer
from theseus.model.layers.short_conv import causal_conv, segment_taps

#: The ``layer_types`` entry of a Mamba-2 layer.
MAMBA = "mamba"
#: The LoRA targets that adapt each projection: ``in_proj`` holds the scan's counterparts of a query
#: (``C``), a key (``B``) and a value (``x``), so any of the three adapts it (one adapter on the whole
#: projection); ``out`` adapts ``out_proj``.
LORA_TARGETS = {"in_proj": ("query", "key", "value"), "out_proj": ("out",)}


def segment_sums(a: jax.Array) -> jax.Array:
    """``[..., L, L]``: entry ``[i, j]`` the sum of ``a[..., j + 1 : i + 1]`` for ``j <= i``, ``-inf`` above the
    diagonal. Summed without subtracting running totals, so a ``-inf`` in ``a`` (a reset) stays exact."""
    steps = a.shape[-1]
    rows = jnp.broadcast_to(a[..., :, None], (*a.shape, steps))  # [..., i, j] = a_i
    below = jnp.tril(jnp.ones((steps, steps), bool), -1)
    summed = jnp.cumsum(jnp.where(below, rows, 0.0), axis=-2)
    return jnp.where(jnp.tril(jnp.ones((steps, steps), bool)), summed, -jnp.inf)


def ssd(
    x: jax.Array, log_decay: jax.Array, b: jax.Array, c: jax.Array, chunk: int, state: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """The scan ``S_t = exp(log_decay_t) S_{t-1} + x_t b_t^T``, ``y_t = S_t c_t``, in chunks of ``chunk``
    positions; ``(y [B, T, H, P], the last state [B, H, P, N])``, in float32.

    ``x`` ``[B, T, H, P]`` (already scaled by the time step), ``log_decay`` ``[B, T, H]`` (``dt * A``; ``-inf``
    empties the state before the position), ``b`` and ``c`` ``[B, T, H, N]``, ``state`` ``[B, H, P, N]``
    (None: zeros)."""
    batch, steps, heads, width = x.shape
    size = b.shape[-1]
    chunk = max(1, min(chunk, steps))
    pad = -steps % chunk
    if pad:  # padded positions neither decay the state nor add to it
        x, b, c = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (x, b, c))
        log_decay = jnp.pad(log_decay, ((0, 0), (0, pad), (0, 0)))
    chunks = (steps + pad) // chunk
    x, b, c = (t.reshape(batch, chunks, chunk, heads, -1).astype(jnp.float32) for t in (x, b, c))
    a = jnp.moveaxis(log_decay.reshape(batch, chunks, chunk, heads).astype(jnp.float32), -1, -2)  # [B, C, H, L]
    within = segment_sums(a)  # [B, C, H, L, L]: decay from position j to position i of a chunk
    # inside each chunk: y_i = sum_{j <= i} (c_i . b_j) decay(j -> i) x_j
    scores = jnp.einsum("bclhn,bcshn->bchls", c, b) * jnp.exp(within)
    y = jnp.einsum("bchls,bcshp->bclhp", scores, x)
    # each chunk's own contribution to the state at its end, and its whole decay
    to_end = jnp.exp(within[..., -1, :])  # [B, C, H, L]: decay from position j to the chunk's last
    added = jnp.einsum("bclhn,bchl,bclhp->bchpn", b, to_end, x)
    through = jnp.exp(jnp.sum(a, axis=-1))  # [B, C, H]
    start = jnp.zeros((batch, heads, width, size), jnp.float32) if state is None else state.astype(jnp.float32)

    def carry(previous: jax.Array, chunk_terms: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        decay, own = chunk_terms
        return decay[..., None, None] * previous + own, previous

    last, starts = jax.lax.scan(carry, start, (jnp.moveaxis(through, 1, 0), jnp.moveaxis(added, 1, 0)))
    starts = jnp.moveaxis(starts, 0, 1)  # [B, C, H, P, N]: the state each chunk starts from
    from_start = jnp.exp(jnp.cumsum(a, axis=-1))  # [B, C, H, L]: decay from the chunk's start to position i
    y = y + jnp.einsum("bclhn,bchpn,bchl->bclhp", c, starts, from_start)
    return y.reshape(batch, chunks * chunk, heads, width)[:, :steps], last


def head_log_rates(_key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """``A_log``'s initial values: ``log(1), ..., log(n_heads)``, decays from slow to fast across the heads."""
    return jnp.log(jnp.arange(1, shape[0] + 1, dtype=jnp.float32)).astype(dtype)


def gated_group_norm(y: jax.Array, gate: jax.Array, scale: jax.Array, groups: int, eps: float) -> jax.Array:
    """``y * SiLU(gate)`` normalised by its root mean square within each of ``groups`` equal slices of the
    last axis, times ``scale``; float32."""
    gated = y.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))
    sliced = gated.reshape(*gated.shape[:-1], groups, -1)
    normed = sliced * jax.lax.rsqrt(jnp.mean(sliced * sliced, axis=-1, keepdims=True) + eps)
    return normed.reshape(gated.shape) * scale.astype(jnp.float32)


#: The ``architecture/mamba_*`` keys of a model with Mamba-2 mixers: ``(default, minimum or None, help)``.
MAMBA_KEYS: dict[str, tuple[Any, float | None, str]] = {
    "mamba_heads": (None, None, "Mamba-2 heads (None: the preset's)"),
    "mamba_head_dim": (None, None, "width of one Mamba-2 head (None: the preset's)"),
    "mamba_state_size": (None, None, "Mamba-2 state size (None: the preset's)"),
    "mamba_groups": (None, None, "groups of Mamba-2's B and C (None: the preset's)"),
    "mamba_conv_kernel": (4, 1, "taps of Mamba-2's causal convolution"),
    "mamba_chunk_size": (128, 1, "chunk of Mamba-2's chunked scan"),
    "mamba_conv_bias": (True, None, "a bias on Mamba-2's convolution"),
    "mamba_bias": (False, None, "biases on Mamba-2's in_proj and out_proj"),
    "mamba_dt_min": (0.0, 0, "lower clip of Mamba-2's time step"),
    "mamba_dt_max": (None, None, "upper clip of Mamba-2's time step (None: no clip)"),
}


def mamba_key(name: str) -> Any:
    """The model field of key ``architecture/<name>`` (:data:`MAMBA_KEYS`), alike in every family that has it."""
    default, minimum, text = MAMBA_KEYS[name]
    return field(f"architecture/{name}", default=default, help=text, min=minimum)


@dataclass(frozen=True)
class MambaSpec:
    """The Mamba-2 mixers of one model, every one alike (Nemotron-H's ``mamba`` layers, Falcon-H1's parallel
    mixers); ``validate`` names the ``architecture/mamba_*`` keys."""

    n_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int = 4
    chunk_size: int = 128
    conv_bias: bool = True
    bias: bool = False
    dt_min: float = 0.0
    dt_max: float | None = None

    def keys(self) -> dict[str, Any]:
        """The values of the ``architecture/mamba_*`` keys (by name, without ``architecture/``) but the time
        step's clip."""
        return {
            "mamba_heads": self.n_heads,
            "mamba_head_dim": self.head_dim,
            "mamba_state_size": self.state_size,
            "mamba_groups": self.n_groups,
            "mamba_conv_kernel": self.conv_kernel,
            "mamba_chunk_size": self.chunk_size,
            "mamba_conv_bias": self.conv_bias,
            "mamba_bias": self.bias,
        }

    def validate(self) -> MambaSpec:
        for key, value in self.keys().items():
            if isinstance(MAMBA_KEYS[key][0], bool):
                continue
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"architecture/{key} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_groups:
            raise ConfigError(
                f"architecture/mamba_heads={self.n_heads} must be a multiple of architecture/mamba_groups="
                f"{self.n_groups}; change one of them"
            )
        return self

    def layer_options(self) -> dict[str, Any]:
        """The :class:`Mamba2` fields this spec sets (the time step's clip unbounded where ``dt_max`` is None)."""
        return {
            "n_heads": self.n_heads,
            "head_dim": self.head_dim,
            "state_size": self.state_size,
            "n_groups": self.n_groups,
            "conv_kernel": self.conv_kernel,
            "chunk_size": self.chunk_size,
            "conv_bias": self.conv_bias,
            "use_bias": self.bias,
            "time_step_min": self.dt_min,
            "time_step_max": float("inf") if self.dt_max is None else self.dt_max,
        }


class Mamba2(lora.LoRAKeys, StackLayer):
    """The Mamba-2 mixer, called as the stack calls its layers (a :class:`StackLayer`): ``(x, *call, layer)
    -> [B, T, E]`` (the call's positions and ``layer`` unused).

    Parameters, named as transformers names them: ``in_proj`` ``[embed, n_heads * head_dim + conv_dim +
    n_heads]`` (the gate ``z``, then ``x``, ``B`` and ``C``, then the time steps; ``conv_dim = n_heads *
    head_dim + 2 * n_groups * state_size``), ``conv1d`` ``[conv_kernel, conv_dim]`` (depthwise), ``dt_bias``,
    ``A_log`` and ``D`` ``[n_heads]``, ``norm`` ``[n_heads * head_dim]`` and ``out_proj`` ``[n_heads *
    head_dim, embed]``; ``conv1d_bias`` with ``conv_bias``, ``in_proj_bias`` and ``out_proj_bias`` with
    ``use_bias``. Projections run in the activation dtype; the convolution, the scan and the norm in float32.

    Padding: a boolean ``padding_mask`` zeroes the layer's input and the convolution's output at padded
    positions, so a left-padded row starts from an empty state; integer segment ids (packed examples) keep
    the convolution's taps within an example and empty the state where an example starts. With ``decode``
    the ``cache`` collection holds ``conv`` (``[B, conv_kernel - 1, conv_dim]``, the convolution's last
    inputs) and ``ssm`` (``[B, n_heads, head_dim, state_size]``, float32).

    Falcon-H1's variant: ``projection_multipliers`` (five numbers) scale ``in_proj``'s output by part (``z``,
    ``x``, ``B``, ``C``, the time steps; its mup multipliers), ``gated_norm=False`` gates the scan's output
    as ``y * SiLU(z)`` without the group norm (no ``norm`` parameter), and ``out_bias`` (None: ``use_bias``)
    gives ``out_proj`` its own bias.

    LoRA (``model/lora/*``, see :mod:`theseus.model.layers.lora`): ``in_proj`` takes one adapter
    (``in_proj_lora_a`` / ``in_proj_lora_b``) when ``query``, ``key`` or ``value`` is a target, ``out_proj``
    one when ``out`` is (:data:`LORA_TARGETS`); the convolution, ``dt_bias``, ``A_log``, ``D`` and the norm
    stay as they are.
    """

    n_heads: int = 8
    head_dim: int = 64
    state_size: int = 128
    n_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 128
    conv_bias: bool = True
    use_bias: bool = False
    norm_eps: float = 1e-5
    time_step_min: float = 0.0
    time_step_max: float = float("inf")
    init_std: float = INIT_STD
    out_std: float | None = None
    #: The model width, for :meth:`flops` on an unbound layer (None: read from a bound layer's ``out_proj``).
    n_embd: int | None = None
    projection_multipliers: tuple[float, ...] | None = None
    gated_norm: bool = True
    out_bias: bool | None = None

    def _adapted(self, name: str) -> bool:
        """Whether projection ``name`` (``in_proj`` or ``out_proj``) carries a LoRA adapter."""
        if self.lora_rank <= 0:
            return False
        return bool(set(LORA_TARGETS[name]) & set(lora.check_targets(self.lora_targets)))

    def _project(
        self, x: jax.Array, name: str, kernel: jax.Array, axes: tuple[str, str], deterministic: bool
    ) -> jax.Array:
        """``x`` through projection ``name`` (``kernel`` ``[in, out]``), plus its adapter if any."""
        y = jnp.einsum("bti,io->bto", x, cast(kernel, x.dtype))
        if self._adapted(name):
            shapes, axis_pairs = (kernel.shape[:1], kernel.shape[1:]), ((axes[0],), (axes[1],))
            y = y + lora.layer_adapter(self, name, x, *shapes, axis_pairs, deterministic)
        return y

    @property
    def inner(self) -> int:
        """The scan's width: ``n_heads * head_dim``."""
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """The convolution's channels: ``x``, ``B`` and ``C``."""
        return self.inner + 2 * self.n_groups * self.state_size

    def _width(self) -> int:
        return layer_width(
            self, lambda params: nn.unbox(params["out_proj"]).shape[-1] if "out_proj" in params else None
        )

    def matmul_params(self) -> int:
        """Projection weights: ``in_proj`` and ``out_proj``."""
        width = self._width()
        return width * (self.inner + self.conv_dim + self.n_heads) + self.inner * width

    def flops(self, seq: int, layer: int | None = None) -> int:
        """Forward + backward FLOPs: ``6 * seq`` times the projection weights, the convolution's taps, and
        the scan's products per position (within a chunk of ``chunk_size``: ``c . b`` and the weighted sum of
        ``x``, ``chunk_size`` positions each on average half; the chunk state in and out: ``2 * head_dim *
        state_size`` per head)."""
        chunk = min(self.chunk_size, seq)
        scan = self.n_heads * (chunk * (self.state_size + self.head_dim) // 2 + 2 * self.head_dim * self.state_size)
        return 6 * seq * (self.matmul_params() + self.conv_kernel * self.conv_dim + scan)

    def _bias(self, name: str, shape: tuple[int, ...], axes: tuple[str | None, ...]) -> jax.Array:
        return param(self, name, nn.initializers.zeros_init(), shape, axes)

    def _cached(self, name: str, shape: tuple[int, ...], dtype: jnp.dtype) -> nn.Variable:
        if not self.has_variable("cache", name) and not self.is_initializing():
            raise missing_cache_error()
        return self.variable("cache", name, jnp.zeros, shape, dtype)

    @nn.compact
    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        padding_mask, _positions, deterministic, decode = call
        refuse("the Mamba-2 mixer")
        dtype, width, heads, inner, groups, size = (
            self._activation_dtype,
            x.shape[-1],
            self.n_heads,
            self.inner,
            self.n_groups,
            self.state_size,
        )
        segments = padding_mask is not None and is_segment_ids(padding_mask)
        keep = None if padding_mask is None or segments else padding_mask.astype(dtype)[..., None]
        x = cast(x, dtype) if keep is None else cast(x, dtype) * keep
        projected_width = inner + self.conv_dim + heads
        kernel = param(self, "in_proj", normal(self.init_std), (width, projected_width), (Axis.EMBED, Axis.MLP))
        projected = self._project(x, "in_proj", kernel, (Axis.EMBED, Axis.MLP), deterministic)
        if self.use_bias:
            projected = projected + cast(self._bias("in_proj_bias", (projected_width,), (Axis.MLP,)), dtype)
        if self.projection_multipliers is not None:
            projected = projected * cast(self._part_scales(), dtype)
        gate, xbc, dt_raw = jnp.split(projected, [inner, inner + self.conv_dim], axis=-1)

        conv = param(self, "conv1d", normal(self.init_std), (self.conv_kernel, self.conv_dim), (None, Axis.MLP))
        history, ssm_state = None, None
        if decode:
            conv_state = self._cached("conv", (x.shape[0], self.conv_kernel - 1, self.conv_dim), dtype)
            ssm_cache = self._cached("ssm", (x.shape[0], heads, self.head_dim, size), jnp.float32)
            history, ssm_state = conv_state.value, ssm_cache.value
            conv_state.value = jnp.concatenate([history, xbc.astype(dtype)], axis=1)[:, xbc.shape[1] :]
        taps_mask = segment_taps(padding_mask, self.conv_kernel) if segments and padding_mask is not None else None
        mixed = causal_conv(xbc, conv, history, taps_mask)
        if self.conv_bias:
            mixed = mixed + self._bias("conv1d_bias", (self.conv_dim,), (Axis.MLP,)).astype(jnp.float32)
        mixed = jax.nn.silu(mixed)
        if keep is not None:
            mixed = mixed * keep.astype(jnp.float32)
        xs, b, c = jnp.split(mixed, [inner, inner + groups * size], axis=-1)

        dt_bias = param(self, "dt_bias", nn.initializers.ones_init(), (heads,), (None,))
        a_log = param(self, "A_log", head_log_rates, (heads,), (None,))
        skip = param(self, "D", nn.initializers.ones_init(), (heads,), (None,))
        dt = jax.nn.softplus(dt_raw.astype(jnp.float32) + dt_bias.astype(jnp.float32))
        dt = jnp.clip(dt, self.time_step_min, self.time_step_max)
        log_decay = dt * -jnp.exp(a_log.astype(jnp.float32))
        if segments:  # an example's first position starts from an empty state
            ids = jnp.asarray(padding_mask)
            starts = ids != jnp.pad(ids, ((0, 0), (1, 0)))[:, :-1]
            log_decay = jnp.where(starts[..., None], -jnp.inf, log_decay)
        batch, steps = x.shape[:2]
        xs = xs.reshape(batch, steps, heads, self.head_dim)
        per_head = heads // groups
        b, c = (jnp.repeat(t.reshape(batch, steps, groups, size), per_head, axis=2) for t in (b, c))
        y, last = ssd(xs * dt[..., None], log_decay, b, c, self.chunk_size, ssm_state)
        if decode:
            ssm_cache.value = last
        y = y + skip.astype(jnp.float32)[:, None] * xs
        y = y.reshape(batch, steps, inner)
        if self.gated_norm:
            scale = param(self, "norm", nn.initializers.ones_init(), (inner,), (Axis.MLP,))
            y = gated_group_norm(y, gate, scale, groups, self.norm_eps)
        else:
            y = y * jax.nn.silu(gate.astype(jnp.float32))
        y = constrain(cast(y, dtype), (Axis.BATCH, Axis.SEQUENCE, Axis.MLP))
        out_std = self.init_std if self.out_std is None else self.out_std
        out_kernel = param(self, "out_proj", normal(out_std), (inner, width), (Axis.MLP, Axis.EMBED))
        out = self._project(y, "out_proj", out_kernel, (Axis.MLP, Axis.EMBED), deterministic)
        if self.use_bias if self.out_bias is None else self.out_bias:
            out = out + cast(self._bias("out_proj_bias", (width,), (Axis.EMBED,)), dtype)
        return out

    def _part_scales(self) -> jax.Array:
        """``projection_multipliers`` spread over ``in_proj``'s columns: ``z`` and ``x`` ``inner`` each, ``B``
        and ``C`` ``n_groups * state_size`` each, the time steps ``n_heads``."""
        scales = tuple(self.projection_multipliers or ())
        if len(scales) != 5:
            raise ConfigError(f"Mamba-2's projection_multipliers={scales!r} must be five numbers (z, x, B, C, dt)")
        bc = self.n_groups * self.state_size
        widths = (self.inner, self.inner, bc, bc, self.n_heads)
        return jnp.concatenate([jnp.full((w,), m, jnp.float32) for w, m in zip(widths, scales, strict=True)])


__all__ = [
    "LORA_TARGETS",
    "MAMBA",
    "MAMBA_KEYS",
    "Mamba2",
    "MambaSpec",
    "gated_group_norm",
    "mamba_key",
    "segment_sums",
    "ssd",
]
