"""The benchmark workload: one theseus GPT preset, sequence length, batch size and a fixed set of batches.

Every loop that is compared (the bare flax + optax loop, the trainer, the PyTorch loop) trains the
same architecture on the same host batches, so their step times are directly comparable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from benchmarks.torch_baseline import Dims

#: ``architecture/vocab_size`` used for each preset unless given: GPT-2's BPE vocabulary for the
#: GPT-2 sizes (what a realistic 124M run uses), bytes for the small presets.
DEFAULT_VOCAB = {"tiny": 256, "small": 256}
GPT2_VOCAB = 50257


def default_vocab(preset: str) -> int:
    return DEFAULT_VOCAB.get(preset, GPT2_VOCAB)


@dataclasses.dataclass
class Workload:
    """A model configuration plus batches.

    ``config`` is the resolved theseus ``Configuration`` the model is built under; ``model`` is the
    unbound model (``GPT`` unless another is named; None when built with ``build=False``, e.g. for the
    PyTorch loop only).
    """

    preset: str
    batch: int
    seq: int
    vocab_size: int
    dims: Dims
    config: Any = None
    model: Any = None
    n_batches: int = 4

    @classmethod
    def create(
        cls,
        preset: str,
        *,
        batch: int,
        seq: int,
        vocab_size: int | None = None,
        param_dtype: str = "float32",
        activation_dtype: str = "float32",
        overrides: dict[str, Any] | None = None,
        build: bool = True,
        n_batches: int = 4,
        model: str = "gpt",
    ) -> Workload:
        """Resolve the configuration of the registered ``model`` (default GPT) for ``preset``
        (``block_size = seq``) and build the model."""
        from theseus.config import Schema, configuration, configure, resolve
        from theseus.training.declarations import resolve as resolve_declared

        model_class = resolve_declared("model", model)

        vocab = vocab_size or default_vocab(preset)
        values: dict[str, Any] = {
            "architecture/preset": preset,
            "architecture/vocab_size": vocab,
            "architecture/block_size": seq,
            "architecture/dropout": 0.0,
            "model/param_dtype": param_dtype,
            "model/activation_dtype": activation_dtype,
        }
        values.update(overrides or {})
        config = resolve(Schema.build(model_class.gather()), {}, values)
        with configuration(config):
            configured = configure(model_class)
        arch = configured.architecture
        dims = Dims(
            n_layer=arch.n_layers,
            n_head=arch.attention.n_heads,
            n_embd=arch.n_embd,
            vocab_size=arch.vocab_size,
            block_size=arch.block_size,
            mlp_ratio=arch.feed_forward.d_ff / arch.n_embd,
            bias=arch.norm.bias,
        )
        return cls(preset, batch, seq, vocab, dims, config, configured if build else None, n_batches)

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def flops_per_step(self) -> float:
        """Model FLOPs of one training step (forward + backward), from ``GPT.flops``."""
        if self.model is None:
            raise ValueError("flops_per_step needs the theseus model (create with build=True)")
        return float(self.model.flops(self.seq)) * self.batch

    def host_batches(self, seed: int = 0) -> list[dict[str, np.ndarray]]:
        """``n_batches`` random token batches ``{"x", "y", "padding_mask"}`` (numpy, host memory)."""
        rng = np.random.default_rng(seed)
        batches = []
        for _ in range(self.n_batches):
            tokens = rng.integers(0, self.vocab_size, size=(self.batch, self.seq + 1), dtype=np.int32)
            batches.append(
                {
                    "x": tokens[:, :-1].copy(),
                    "y": tokens[:, 1:].copy(),
                    "padding_mask": np.ones((self.batch, self.seq), dtype=bool),
                }
            )
        return batches

    def torch_batches(self, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(b["x"], b["y"]) for b in self.host_batches(seed)]
