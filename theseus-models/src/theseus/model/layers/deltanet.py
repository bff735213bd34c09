"""The Gated DeltaNet linear-attention layer (:class:`GatedDeltaNet`: the ``linear_attention`` layers of
Qwen3-Next, Qwen3.5 and OLMo Hybrid), and the gated delta rule it computes as two small pure functions,
:func:`chunk_gated_delta_rule` (training and prompts: chunks of ``chunk_size`` positions, the state carried
between chunks by ``lax.scan``) and :func:`recurrent_gated_delta_rule` (one step at a time: decoding against
the cached state). Both compute, per value head, with the state ``S`` ``[key_dim, value_dim]``::

    S_t = exp(g_t) * S_{t-1}
    S_t = S_t + k_t (beta_t * (v_t - k_t^T S_t))^T
    o_t = (q_t / sqrt(key_dim))^T S_t

(``g_t <= 0`` the decay in log space, ``beta_t`` in ``(0, 1)`` the write strength, or ``(0, 2)`` with OLMo
Hybrid's negative eigenvalues), in float32. ``g_t`` is one number per head (the Gated DeltaNet) or one per
key channel (Kimi Delta Attention, :mod:`theseus.model.layers.kda`: ``S_t = diag(exp(g_t)) S_{t-1}``); both
rules take either, and only the chunk's pairwise decays differ (:func:`_decayed_products`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from theseus.base.axis import Axis
from theseus.errors import ConfigError
from theseus.model.layers import lora
from theseus.model.layers._common import INIT_STD, cast, child, constrain, layer_width, normal, param
from theseus.model.layers.attention import missing_cache_error
from theseus.model.layers.context_parallel import refuse
from theseus.model.layers.layer_call import LayerCall, StackLayer
from theseus.model.layers.norms import RMSNorm

#: transformers' (and the FLA kernels') epsilon of the query/key L2 norm.
L2_EPS = 1e-6
#: transformers' chunk of the chunked rule.
CHUNK = 64


def l2_normalise(x: jax.Array, eps: float = L2_EPS) -> jax.Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, l2: bool
) -> tuple[jax.Array, ...]:
    """float32, the query/key heads repeated over their value heads, optionally L2-normalised, the
    query scaled by ``key_dim ** -0.5``; every tensor heads-major ``[B, H, T, ...]``."""
    n_k, n_v = k.shape[2], v.shape[2]
    if n_v % n_k:
        raise ConfigError(f"{n_v} value heads cannot share {n_k} query/key heads evenly")
    q, k = (jnp.repeat(x, n_v // n_k, axis=2) if n_v != n_k else x for x in (q, k))
    if g.ndim == 3:  # one decay per head: a trailing axis of one broadcasts it over the key channels
        g = g[..., None]
    q, k, v, g, beta = (jnp.swapaxes(x.astype(jnp.float32), 1, 2) for x in (q, k, v, g, beta))
    if l2:
        q, k = l2_normalise(q), l2_normalise(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    l2: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule one position at a time. ``q``/``k`` ``[B, T, Hk, Dk]``, ``v`` ``[B, T, Hv, Dv]``
    (each query/key head serves ``Hv / Hk`` consecutive value heads), ``beta`` ``[B, T, Hv]``, ``g`` the
    same (one decay per head) or ``[B, T, Hv, Dk]`` (one per key channel);
    ``initial_state`` ``[B, Hv, Dk, Dv]`` (None: zeros). Returns the output ``[B, T, Hv, Dv]`` in ``q``'s
    dtype and the final state (float32)."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, l2)
    batch, heads, _, dk = k.shape
    state = jnp.zeros((batch, heads, dk, v.shape[-1]), jnp.float32) if initial_state is None else initial_state
    state = state.astype(jnp.float32)

    def step(s: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        q_t, k_t, v_t, g_t, b_t = xs
        s = s * jnp.exp(g_t)[..., None]  # g_t [B, H, Dk or 1]: per key row of the state
        remembered = jnp.einsum("bhk,bhkv->bhv", k_t, s)
        s = s + k_t[..., :, None] * ((v_t - remembered) * b_t[..., None])[..., None, :]
        return s, jnp.einsum("bhk,bhkv->bhv", q_t, s)

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (q, k, v, g, beta))
    state, out = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(out, 0, 1).astype(dtype), state  # [T, B, H, Dv] -> [B, T, H, Dv]


def _strictly_lower(t: jax.Array) -> jax.Array:
    """``t`` with everything on and above its diagonal zeroed."""
    return jnp.tril(t, -1)


def _doubling_inverse(t: jax.Array) -> jax.Array:
    """The inverse of the unit lower-triangular matrices with ``t``'s strictly lower triangles: the inverse
    ``M`` of the diagonal blocks of size ``b`` gives that of the blocks of size ``2b``,
    ``M - M L M``, with ``L`` the lower-left ``b x b`` quarters of those blocks."""
    size = t.shape[-1]
    rows, cols = np.arange(size)[:, None], np.arange(size)[None, :]  # the block masks: constants of the program
    strict = _strictly_lower(t)
    inverse = jnp.broadcast_to(jnp.eye(size, dtype=t.dtype), t.shape)
    b = 1
    while b < size:
        quarters = (rows // (2 * b) == cols // (2 * b)) & (rows // b != cols // b)
        inverse = inverse - inverse @ jnp.where(quarters, strict, 0.0) @ inverse
        b *= 2
    return inverse


@jax.custom_vjp
def unit_lower_inverse(t: jax.Array) -> jax.Array:
    """The inverses of the unit lower-triangular matrices ``[..., C, C]`` whose strictly lower triangles
    are ``t``'s (the rest of ``t`` is not read), by doubling the inverted diagonal blocks (``log2 C``
    steps of two matrix products); its gradient is ``-M^T G M^T``'s strictly lower triangle. Matrix
    products only: XLA:CPU's triangular solve is a LAPACK call that parallelises its batch over the pool
    of the thunks calling it, and two such calls at once on a two-thread pool waited for each other
    forever."""
    return _doubling_inverse(t)


def _inverse_forward(t: jax.Array) -> tuple[jax.Array, jax.Array]:
    inverse = _doubling_inverse(t)
    return inverse, inverse


def _inverse_backward(inverse: jax.Array, grad: jax.Array) -> tuple[jax.Array]:
    transposed = jnp.swapaxes(inverse, -1, -2)
    return (_strictly_lower(-(transposed @ grad @ transposed)),)


unit_lower_inverse.defvjp(_inverse_forward, _inverse_backward)


def _decayed_products(a: jax.Array, b: jax.Array, cum: jax.Array, lower: np.ndarray) -> jax.Array:
    """``sum_d a[i, d] b[j, d] exp(cum[i, d] - cum[j, d])`` for ``j <= i`` (0 above the diagonal), per chunk:
    ``a``/``b`` ``[..., C, Dk]``, ``cum`` ``[..., C, 1]`` (one decay per head: the decay leaves the sum) or
    ``[..., C, Dk]`` (per key channel: it stays inside, a ``[C, C, Dk]`` product per chunk)."""
    if cum.shape[-1] == 1:
        cum = cum[..., 0]
        decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))
        return jnp.einsum("...id,...jd->...ij", a, b) * decay
    gap = jnp.where(lower[..., None], cum[..., :, None, :] - cum[..., None, :, :], -jnp.inf)
    return jnp.einsum("...id,...jd,...ijd->...ij", a, b, jnp.exp(gap))


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    chunk_size: int = CHUNK,
    l2: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule over chunks of ``chunk_size`` positions (the sequence padded with positions
    that neither decay nor write the state): within a chunk the updates are solved at once (the UT
    transform: a unit lower-triangular system, inverted by :func:`unit_lower_inverse`), between chunks
    the state is carried by ``lax.scan``. Arguments and results as :func:`recurrent_gated_delta_rule`."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, l2)
    batch, heads, steps, dk = k.shape
    dv = v.shape[-1]
    pad = -steps % chunk_size
    if pad:
        q, k, v, g = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v, g))
        beta = jnp.pad(beta, ((0, 0), (0, 0), (0, pad)))
    n = (steps + pad) // chunk_size
    q, k, v, g = (x.reshape(batch, heads, n, chunk_size, -1) for x in (q, k, v, g))
    beta = beta.reshape(batch, heads, n, chunk_size)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = jnp.cumsum(g, axis=-2)  # log of the decay from the chunk's start to each position: [.., C, Dk or 1]
    lower = np.tril(np.ones((chunk_size, chunk_size), np.bool_))  # a constant of the program
    # the system is the identity plus this product's strictly lower triangle, the only part the inverse reads
    inverse = unit_lower_inverse(_decayed_products(k_beta, k, cum, lower))
    values = inverse @ v_beta  # the chunk's new values before the state's prediction is taken out
    reads = inverse @ (k_beta * jnp.exp(cum))  # what each of them reads of the incoming state
    within = _decayed_products(q, k, cum, lower)
    q_in = q * jnp.exp(cum)
    k_out = k * jnp.exp(cum[..., -1:, :] - cum)
    chunk_decay = jnp.swapaxes(jnp.exp(cum[..., -1:, :]), -1, -2)  # [.., Dk or 1, 1]: per key row of the state

    def step(s: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        values_c, reads_c, within_c, q_c, k_c, decay_c = xs
        corrected = values_c - jnp.einsum("bhik,bhkv->bhiv", reads_c, s)
        out = jnp.einsum("bhik,bhkv->bhiv", q_c, s) + jnp.einsum("bhij,bhjv->bhiv", within_c, corrected)
        s = s * decay_c + jnp.einsum("bhik,bhiv->bhkv", k_c, corrected)
        return s, out

    state = jnp.zeros((batch, heads, dk, dv), jnp.float32) if initial_state is None else initial_state
    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (values, reads, within, q_in, k_out, chunk_decay))
    state, out = jax.lax.scan(step, state.astype(jnp.float32), xs)  # out [N, B, H, C, Dv]
    out = jnp.moveaxis(out, 0, 2).reshape(batch, heads, n * chunk_size, dv)[:, :, :steps]
    return jnp.swapaxes(out, 1, 2).astype(dtype), state


def causal_conv(x: jax.Array, kernel: jax.Array, history: jax.Array | None = None) -> jax.Array:
    """Depthwise causal convolution of ``x`` ``[B, T, C]`` with ``kernel`` ``[K, C]`` (the last tap on
    the current position), after ``history`` ``[B, K - 1, C]`` (None: zeros); float32 out."""
    taps = kernel.shape[0]
    if history is None:
        history = jnp.zeros((x.shape[0], taps - 1, x.shape[-1]), x.dtype)
    full = jnp.concatenate([history.astype(jnp.float32), x.astype(jnp.float32)], axis=1)
    steps = x.shape[1]
    return sum(full[:, j : j + steps] * kernel[j].astype(jnp.float32) for j in range(taps))  # type: ignore[return-value]


class GatedDeltaNet(lora.LoRAKeys, StackLayer):
    """The ``linear_attention`` layer of Qwen3-Next, Qwen3.5 and OLMo Hybrid, called as an attention layer:
    ``(x, *call, layer) -> [B, T, E]`` with a :class:`~theseus.model.stack.block.LayerCall` (its positions
    and ``layer`` unused).

    Parameters: ``query`` / ``key`` ``[embed, key_heads, key_dim]``, ``value`` / ``z`` (the output gate)
    ``[embed, value_heads, value_dim]``, ``b`` / ``a`` ``[embed, value_heads]`` (the write strength
    ``beta = beta_scale * sigmoid(b)`` and the decay ``g = -exp(A_log) * softplus(a + dt_bias)``), ``A_log``
    and ``dt_bias`` ``[value_heads]``, the depthwise causal convolutions ``conv_query`` / ``conv_key``
    ``[conv_kernel, key_heads, key_dim]`` and ``conv_value`` ``[conv_kernel, value_heads, value_dim]``
    (SiLU after), the output norm ``norm`` (an RMSNorm of ``value_dim``, plain scale, times ``SiLU(z)``, or
    ``sigmoid(z)`` with ``gate_activation="sigmoid"``)
    and ``out`` ``[value_heads, value_dim, embed]``. Queries and keys are L2-normalised. ``beta_scale`` 2
    lets the state's transition have negative eigenvalues (OLMo Hybrid's ``linear_allow_neg_eigval``).

    Training computes :func:`chunk_gated_delta_rule` (chunks of ``chunk_size``). With ``decode`` the
    ``cache`` collection holds ``conv`` (the last ``conv_kernel - 1`` inputs of the convolution, ``[B,
    K - 1, channels]``) and ``state`` (``[B, value_heads, key_dim, value_dim]``, float32); a step of one
    token runs :func:`recurrent_gated_delta_rule`, a longer one (a prompt) the chunked rule from the
    cached state. Padded positions (``padding_mask`` False) are zeroed on the way in and neither decay
    nor write the state, so left-padded rows start from the empty state.

    LoRA (``model/lora/*``, see :mod:`theseus.model.layers.lora`): the targets ``query`` and ``key`` adapt
    their projections, ``value`` adapts ``value`` and the output gate ``z`` (both per value head, as
    transformers' ``in_proj_qkvz`` holds them beside the query and key), ``out`` adapts ``out``. ``b`` and
    ``a`` (``in_proj_ba``: one output per value head each) stay frozen.
    """

    key_heads: int = 16
    value_heads: int = 32
    key_dim: int = 128
    value_dim: int = 128
    conv_kernel: int = 4
    chunk_size: int = CHUNK
    norm_eps: float = 1e-6
    beta_scale: float = 1.0
    #: The output gate's activation on ``z``: ``silu`` (Qwen3-Next, Qwen3.5, OLMo Hybrid) or ``sigmoid``.
    gate_activation: str = "silu"
    init_std: float = INIT_STD
    out_std: float | None = None
    #: The model width, for :meth:`flops` on an unbound layer (None: read from a bound layer's ``out``).
    n_embd: int | None = None

    #: What the layer is called in its one-line refusals.
    KIND: ClassVar[str] = "The Gated DeltaNet (linear attention)"
    #: The LoRA target that adapts each projection (``b`` and ``a`` have none).
    LORA_TARGETS: ClassVar[Mapping[str, str]] = {
        "query": "query",
        "key": "key",
        "value": "value",
        "z": "value",
        "out": "out",
    }

    @classmethod
    def components(cls) -> list[type]:
        return [RMSNorm]

    def _width(self) -> int:
        return layer_width(self, lambda params: nn.unbox(params["out"]).shape[-1] if "out" in params else None)

    def matmul_params(self) -> int:
        """Projection weights: query, key, value, the output gate ``z``, ``b`` / ``a`` and ``out``."""
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        return self._width() * (2 * keys + 3 * values + 2 * self.value_heads)

    def flops(self, seq: int, layer: int | None = None) -> int:
        """Forward + backward FLOPs: the projections ``6 * seq * matmul_params`` plus the matrix products
        of :func:`chunk_gated_delta_rule` on ``seq`` positions padded to whole chunks. Per value head and
        position, with ``C = chunk_size``: ``C * (6 * key_dim + 4 * value_dim) + 6 * key_dim * value_dim``
        forward (the chunk's key and query products, its values and state reads through the inverse, the
        state's reads and write), three times that with the backward, and the unit lower-triangular
        inverse, ``4 * C * C`` for each of its ``log2 C`` doubling steps and once more backward. The
        convolution, norms and gates are elementwise and not counted; ``layer`` is accepted as attention
        layers take it."""
        dk, dv, chunk = self.key_dim, self.value_dim, self.chunk_size
        padded = -(-seq // chunk) * chunk
        products = chunk * (6 * dk + 4 * dv) + 6 * dk * dv
        doublings = (chunk - 1).bit_length()
        per_position = 3 * products + 4 * chunk * chunk * (doublings + 1)
        return 6 * seq * self.matmul_params() + padded * self.value_heads * per_position

    def _adapted(self, name: str) -> bool:
        target = self.LORA_TARGETS.get(name)
        return self.lora_rank > 0 and target in lora.check_targets(self.lora_targets)

    def _proj(
        self,
        x: jax.Array,
        name: str,
        shape: tuple[int, ...],
        axes: tuple[str | None, ...],
        deterministic: bool = True,
    ) -> jax.Array:
        """``x`` through the input projection ``name`` (``[embed, *shape]``), plus its adapter if any."""
        kernel = param(self, name, normal(self.init_std), (x.shape[-1], *shape), (Axis.EMBED, *axes))
        y = jnp.einsum("bte,e...->bt...", x, cast(kernel, x.dtype))
        if self._adapted(name):
            y = y + lora.layer_adapter(self, name, x, (x.shape[-1],), shape, ((Axis.EMBED,), axes), deterministic)
        return y

    def _out(self, y: jax.Array, width: int, deterministic: bool) -> jax.Array:
        """``y`` ``[B, T, value_heads, value_dim]`` through the output projection ``out`` (to ``width``),
        plus its adapter if any."""
        out_std = self.init_std if self.out_std is None else self.out_std
        heads = (Axis.HEADS, Axis.HEAD_DIM)
        kernel = param(self, "out", normal(out_std), (*y.shape[2:], width), (*heads, Axis.EMBED))
        out = jnp.einsum("bthd,hde->bte", y, cast(kernel, y.dtype))
        if self._adapted("out"):
            out = out + lora.layer_adapter(self, "out", y, y.shape[2:], (width,), (heads, (Axis.EMBED,)), deterministic)
        return out

    def _masked_input(self, x: jax.Array, padding_mask: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
        """``x`` in the activation dtype with padded positions zeroed, and the padding mask (None: none);
        packed examples (segment ids) are refused: the state runs along each whole row."""
        mask = None
        if padding_mask is not None:
            if padding_mask.dtype != jnp.bool_:
                raise ConfigError(
                    f"{self.KIND} carries one state along each row, so packed examples (segment ids) are "
                    "not supported; feed one example per row"
                )
            mask = padding_mask
        x = cast(x, self._activation_dtype)
        return (x if mask is None else x * mask[..., None].astype(x.dtype)), mask

    def _short_conv(self, parts: list[jax.Array], decode: bool) -> tuple[list[jax.Array], jax.Array | None]:
        """The depthwise causal convolutions ``conv_query`` / ``conv_key`` / ``conv_value`` (SiLU after) of
        ``parts`` (the query, key and value projections, ``[B, T, heads, dim]`` each), as one over their
        joined channels; with ``decode`` from and into the ``cache`` collection's ``conv``. Returns the
        convolved parts and the cached delta-rule ``state`` (None without ``decode``)."""
        taps, dtype = self.conv_kernel, self._activation_dtype
        convs = [
            param(self, f"conv_{name}", normal(self.init_std), (taps, *p.shape[2:]), (None, Axis.HEADS, Axis.HEAD_DIM))
            for name, p in zip(("query", "key", "value"), parts, strict=True)
        ]
        batch, steps = parts[0].shape[:2]
        mixed = jnp.concatenate([t.reshape(batch, steps, -1) for t in parts], axis=-1)
        kernel = jnp.concatenate([c.reshape(taps, -1) for c in convs], axis=-1)
        history = state = None
        if decode:
            if not self.has_variable("cache", "state") and not self.is_initializing():
                raise missing_cache_error()
            conv_cache = self.variable("cache", "conv", jnp.zeros, (batch, taps - 1, mixed.shape[-1]), dtype)
            shape = (batch, self.value_heads, self.key_dim, self.value_dim)
            state = self.variable("cache", "state", jnp.zeros, shape, jnp.float32).value
            history = conv_cache.value
            conv_cache.value = jnp.concatenate([history, mixed.astype(dtype)], axis=1)[:, -(taps - 1) :]
        mixed = nn.silu(causal_conv(mixed, kernel, history)).astype(dtype)
        edges = np.cumsum([int(np.prod(p.shape[2:])) for p in parts])[:-1]
        return [m.reshape(p.shape) for m, p in zip(jnp.split(mixed, edges, axis=-1), parts, strict=True)], state

    def _delta_rule(
        self,
        qkv: list[jax.Array],
        g: jax.Array,
        beta: jax.Array,
        mask: jax.Array | None,
        state: jax.Array | None,
        decode: bool,
    ) -> jax.Array:
        """The gated delta rule on ``qkv`` from ``state``: recurrent for a decoding step of one token, else
        chunked; padded positions neither decay nor write; with ``decode`` the final state is cached.
        ``[B, T, value_heads, value_dim]``."""
        q, k, v = qkv
        if mask is not None:
            g = jnp.where(mask.reshape(*mask.shape, *(1,) * (g.ndim - 2)), g, 0.0)
        if decode and q.shape[1] == 1:
            y, state = recurrent_gated_delta_rule(q, k, v, g, beta, state)
        else:
            y, state = chunk_gated_delta_rule(q, k, v, g, beta, state, self.chunk_size)
        if decode:
            self.put_variable("cache", "state", state)
        return constrain(y, (Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM))

    def _decay_params(self, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
        """``A_log`` ``[value_heads]`` and ``dt_bias`` ``shape``, in float32."""
        heads = self.value_heads
        a_log = param(self, "A_log", nn.initializers.zeros_init(), (heads,), (Axis.HEADS,))
        axes = (Axis.HEADS, Axis.HEAD_DIM)[: len(shape)]
        dt_bias = param(self, "dt_bias", nn.initializers.ones_init(), shape, axes)
        return a_log.astype(jnp.float32), dt_bias.astype(jnp.float32)

    @nn.compact
    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        padding_mask, _positions, deterministic, decode = call
        refuse("Gated DeltaNet linear attention (Qwen3-Next)")
        dtype = self._activation_dtype
        hk, hv, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        if hv % hk:
            raise ConfigError(f"architecture/linear_num_value_heads={hv} must be a multiple of the key heads {hk}")
        x, mask = self._masked_input(x, padding_mask)
        heads = (Axis.HEADS, Axis.HEAD_DIM)
        q = self._proj(x, "query", (hk, dk), heads, deterministic)
        k = self._proj(x, "key", (hk, dk), heads, deterministic)
        v = self._proj(x, "value", (hv, dv), heads, deterministic)
        z = self._proj(x, "z", (hv, dv), heads, deterministic)
        b = self._proj(x, "b", (hv,), (Axis.HEADS,))
        a = self._proj(x, "a", (hv,), (Axis.HEADS,))
        qkv, state = self._short_conv([q, k, v], decode)
        a_log, dt_bias = self._decay_params((hv,))
        g = -jnp.exp(a_log) * jax.nn.softplus(a.astype(jnp.float32) + dt_bias)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        if self.beta_scale != 1.0:
            beta = beta * self.beta_scale
        y = self._delta_rule(qkv, g, beta, mask, state, decode)
        norm = child(self, RMSNorm, eps=self.norm_eps, zero_centred=False, name="norm")
        gate = nn.sigmoid if self.gate_activation == "sigmoid" else nn.silu
        y = (norm(y).astype(jnp.float32) * gate(z.astype(jnp.float32))).astype(dtype)
        return self._out(y, x.shape[-1], deterministic)


__all__ = [
    "CHUNK",
    "GatedDeltaNet",
    "causal_conv",
    "chunk_gated_delta_rule",
    "l2_normalise",
    "recurrent_gated_delta_rule",
]
