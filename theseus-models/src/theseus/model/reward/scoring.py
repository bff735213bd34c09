"""Scoring text with a trained reward run: the run's model and checkpoint, its tokenizer, one jitted call.

A completion is scored as the reward model was trained: the prompt's tokens then the completion's
(each encoded on its own, as ``dataset/preference`` encodes a standard row's prompt and response),
cut to the run's ``training/sequence_length``, and the reward read at the last token.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.data.tokenizers.base import Tokenizer, encode_arrays
from theseus.errors import ConfigError, TheseusError
from theseus.model.loading.run import run_model, run_params, run_tokenizer
from theseus.runs.ref import RunRef


@dataclass
class RewardScorer:
    """A reward run's model, parameters and tokenizer, scoring ``batch_size`` rows per call."""

    name: str
    step: int
    model: Any
    params: Any
    tokenizer: Tokenizer
    length: int
    batch_size: int

    @functools.cached_property
    def _fn(self) -> Any:
        model = self.model

        def rewards(params: Any, x: jax.Array, mask: jax.Array) -> jax.Array:
            return model.apply({"params": params}, x, padding_mask=mask, deterministic=True, method="rewards")

        return jax.jit(rewards)

    def encode(self, prompts: list[str], completions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(x, padding_mask)`` ``[N, length]``: prompt then completion tokens, cut to the length."""
        heads = encode_arrays(self.tokenizer, prompts)
        tails = encode_arrays(self.tokenizer, completions)
        x = np.zeros((len(prompts), self.length), np.int32)
        mask = np.zeros((len(prompts), self.length), bool)
        for row, (head, tail) in enumerate(zip(heads, tails, strict=True)):
            ids = np.concatenate([head, tail])[: self.length]
            x[row, : ids.size], mask[row, : ids.size] = ids, True
        return x, mask

    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """One reward per completion (``prompts[i]`` is the prompt of ``completions[i]``)."""
        x, mask = self.encode(prompts, completions)
        size, out = self.batch_size, list[float]()
        for start in range(0, len(x), size):
            rows = x[start : start + size]
            padded = np.zeros((size, self.length), np.int32)
            padded_mask = np.zeros((size, self.length), bool)
            padded[: len(rows)], padded_mask[: len(rows)] = rows, mask[start : start + size]
            values = self._fn(self.params, jnp.asarray(padded), jnp.asarray(padded_mask))
            out.extend(float(v) for v in np.asarray(values)[: len(rows)])
        return out


def load_scorer(ref: RunRef, batch_size: int) -> RewardScorer:
    """The reward run ``ref`` names (resolved: its latest checkpoint unless a step is given)."""
    ref = ref.resolve()
    config, provenance, model = run_model(ref.path)
    if not callable(getattr(model, "rewards", None)):
        raise ConfigError(
            f"{ref.key or 'the run'}={ref}: run {ref.name!r} trained a {type(model).__name__}, not a reward model; "
            "name a run of train/reward"
        )
    params = run_params(ref.root, ref.path, config, model, ref.checkpoint)
    tokenizer = run_tokenizer(provenance, model, None, ref.name)
    block = model.architecture.block_size
    length = min(int(config.get("training/sequence_length") or block), block)
    return RewardScorer(ref.name, ref.checkpoint, model, params, tokenizer, length, batch_size)


@functools.lru_cache(maxsize=4)
def cached_scorer(ref: RunRef, batch_size: int) -> RewardScorer:
    """:func:`load_scorer`, kept: a reward called at every step loads its run once."""
    return load_scorer(ref, batch_size)


def reward_ref(text: str, root: str | Path, key: str) -> RunRef:
    """``run:NAME[@STEP]`` (or ``NAME[@STEP]``) as a resolved reference to a run under ``root``."""
    body = text.strip()
    prefix = "run:" if body.startswith("run:") else ""
    ref = RunRef.parse(body.removeprefix("run:"), root, key=key, prefix=prefix, need_name=True)
    try:
        return ref.resolve()
    except TheseusError as exc:
        raise type(exc)(f"{key}={body}: {exc}") from exc


__all__ = ["RewardScorer", "cached_scorer", "load_scorer", "reward_ref"]
