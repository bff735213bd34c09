"""Size presets, the resolved ``Architecture`` of a model, and its analytic FLOP count."""

from __future__ import annotations

from dataclasses import dataclass

from theseus.errors import ConfigError
from theseus.model.layers._common import GATED, check_activation
from theseus.model.layers.attention import ATTENTION_IMPLEMENTATIONS
from theseus.model.layers.mlp import hidden_size
from theseus.model.layers.rotary import RopeScaling


@dataclass(frozen=True)
class Preset:
    """A named network shape. ``mlp_ratio`` and ``ffn_multiple`` give ``d_ff`` from ``n_embd``."""

    n_layers: int
    n_heads: int
    n_embd: int
    n_kv_heads: int | None = None  # None: n_heads (multi-head attention)
    head_dim: int | None = None  # None: n_embd / n_heads
    mlp_ratio: float = 4.0
    ffn_multiple: int = 1
    description: str = ""


@dataclass(frozen=True)
class Architecture:
    """Every size and switch of one model, resolved from its preset and explicit keys.

    ``use_bias`` is the family's default for every bias (LayerNorm included);
    ``attention_bias`` (query/key/value), ``attention_out_bias`` (attention output) and
    ``mlp_bias`` override it per projection when not ``None`` (read the resolved values from
    :attr:`qkv_bias`, :attr:`out_bias`, :attr:`ffn_bias`). ``explicit_head_dim`` sets the head
    width when it is not ``n_embd / n_heads`` (read :attr:`head_dim`). ``qk_norm`` normalises each
    head's query and key (RMSNorm over ``head_dim``) before RoPE. ``sliding_window``: every layer's
    tokens attend to themselves and the ``sliding_window - 1`` tokens before them.
    ``qk_norm_span="projection"`` normalises the whole query and key projections instead of each
    head (OLMo 2). ``norm_placement="post"`` normalises each branch's output before the residual
    sum instead of its input (``x + norm(attn(x))``, OLMo 2).
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    n_embd: int
    d_ff: int
    activation: str
    vocab_size: int
    block_size: int
    norm: str  # "layernorm" | "rmsnorm"
    norm_eps: float
    use_bias: bool
    rotary: bool
    rope_theta: float
    tied_embeddings: bool
    learned_positions: bool
    dropout: float
    attention_impl: str
    attention_bias: bool | None = None
    attention_out_bias: bool | None = None
    mlp_bias: bool | None = None
    explicit_head_dim: int | None = None
    rope_scaling: RopeScaling = RopeScaling()
    sliding_window: int | None = None
    vocab_multiple: int = 1
    qk_norm: bool = False
    qk_norm_span: str = "head"
    norm_placement: str = "pre"

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and columns of the output head: ``vocab_size`` rounded up to
        a multiple of ``vocab_multiple`` (the ids past ``vocab_size`` are never produced: their
        logits are masked out of the loss and cut from the returned logits)."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads if self.explicit_head_dim is None else self.explicit_head_dim

    @property
    def qkv_bias(self) -> bool:
        """Whether the query, key and value projections have biases."""
        return self.use_bias if self.attention_bias is None else self.attention_bias

    @property
    def out_bias(self) -> bool:
        """Whether the attention output projection has a bias (default: as the query/key/value ones)."""
        return self.qkv_bias if self.attention_out_bias is None else self.attention_out_bias

    @property
    def ffn_bias(self) -> bool:
        """Whether the MLP projections have biases."""
        return self.use_bias if self.mlp_bias is None else self.mlp_bias

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    def attention_params(self) -> int:
        """Query, key, value and output projection weights of one layer."""
        return 2 * self.n_embd * self.n_heads * self.head_dim + 2 * self.n_embd * self.n_kv_heads * self.head_dim

    def mlp_params(self) -> int:
        """MLP weights of one layer."""
        return (3 if self.gated else 2) * self.n_embd * self.d_ff

    def matmul_params(self) -> int:
        """Weights used in matrix multiplications: every layer's projections plus the output head at
        its padded width (the tied token embedding counts once, as the head; lookups, norms and
        biases are excluded)."""
        return self.n_layers * (self.attention_params() + self.mlp_params()) + self.n_embd * self.padded_vocab_size

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of one sequence of ``seq`` tokens.

        ``6 * seq * matmul_params`` (2 per multiply-add forward, twice that backward) plus the
        attention scores and weighted values, ``12 * n_layers * seq^2 * n_heads * head_dim``
        (= ``12 * n_layers * n_embd * seq^2``: the full square, the usual MFU convention; for
        ``seq >= 256`` the XLA attention path skips the blocks above the diagonal, so it executes
        somewhat fewer). Elementwise work (norms, activations, softmax, the loss) is not counted.
        """
        attention = 12 * self.n_layers * seq * seq * self.n_heads * self.head_dim
        return 6 * seq * self.matmul_params() + attention

    def validate(self) -> Architecture:
        for key, value in (
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("n_embd", self.n_embd),
            ("d_ff", self.d_ff),
            ("vocab_size", self.vocab_size),
            ("vocab_multiple", self.vocab_multiple),
            ("block_size", self.block_size),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"architecture/{key} must be a positive integer, got {value!r}")
        if self.explicit_head_dim is not None and (
            not isinstance(self.explicit_head_dim, int) or self.explicit_head_dim < 1
        ):
            raise ConfigError(f"architecture/head_dim must be a positive integer, got {self.explicit_head_dim!r}")
        if self.explicit_head_dim is None and self.n_embd % self.n_heads:
            raise ConfigError(
                f"architecture/n_embd={self.n_embd} is not divisible by architecture/n_heads={self.n_heads}; "
                "change one of them, or set architecture/head_dim"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"architecture/n_kv_heads={self.n_kv_heads} must divide architecture/n_heads={self.n_heads}"
            )
        if self.rotary and self.head_dim % 2:
            raise ConfigError(
                f"rotary embeddings need an even head dimension, got {self.head_dim}; "
                "change architecture/head_dim, architecture/n_embd or architecture/n_heads"
            )
        self.rope_scaling.validate()
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ConfigError(
                f"architecture/sliding_window must be a positive integer or null, got {self.sliding_window!r}"
            )
        check_activation(self.activation)
        if self.qk_norm_span not in ("head", "projection") or self.norm_placement not in ("pre", "post"):
            raise ConfigError(
                f"qk_norm_span {self.qk_norm_span!r} / norm_placement {self.norm_placement!r}: "
                "use 'head' or 'projection' / 'pre' or 'post'"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"architecture/dropout must be in [0, 1), got {self.dropout}")
        if self.attention_impl not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(
                f"unknown architecture/attention_impl {self.attention_impl!r}; "
                f"choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
            )
        return self


def preset_d_ff(preset: Preset, n_embd: int, mlp_ratio: float | None) -> int:
    ratio = preset.mlp_ratio if mlp_ratio is None else mlp_ratio
    return hidden_size(n_embd, None, ratio, preset.ffn_multiple)


def lookup_preset(presets: dict[str, Preset], name: str, family: str) -> Preset:
    if name not in presets:
        raise ConfigError(f"unknown architecture/preset {name!r} for {family}; choose one of {', '.join(presets)}")
    return presets[name]
