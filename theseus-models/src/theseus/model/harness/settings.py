"""lm-eval's generation settings (a task's ``generation_kwargs``), read as its Hugging Face model reads them.

``until`` (stop strings; end-of-text is always one), ``max_gen_toks`` (or its aliases
``max_new_tokens``, ``max_tokens``, ``max_completion_tokens``; default 256), and greedy decoding
unless ``do_sample`` is true (or absent with a temperature above 0), in which case tokens are drawn
with ``temperature``, ``top_k`` and ``top_p``. Any other setting is refused, naming it, rather
than silently ignored. Nothing here imports jax: tasks are checked before a model is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from theseus.errors import ConfigError

DEFAULT_MAX_GEN_TOKS = 256
#: Aliases of the number of tokens to generate, in lm-eval's order of priority.
LENGTH_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
SAMPLING_KEYS = ("temperature", "top_k", "top_p")
#: Settings accepted when they ask for what theseus does anyway.
NEUTRAL = {"num_beams": 1, "num_return_sequences": 1}


@dataclass(frozen=True)
class Settings:
    """How one group of requests is generated (``temperature == 0``: greedy)."""

    until: tuple[str, ...]
    max_gen_toks: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sampling(self) -> Any:
        """The :class:`~theseus.model.generation.sampling.SamplingParams` of these settings."""
        from theseus.model.generation.sampling import SamplingParams

        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


def _number(kwargs: Mapping[str, Any], key: str, where: str, cast: type) -> Any:
    value = kwargs[key]
    try:
        if isinstance(value, bool):
            raise ValueError
        return cast(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: generation_kwargs.{key}={value!r} is not a number") from None


def settings(kwargs: Mapping[str, Any] | None, *, eos: str, where: str) -> Settings:
    """The generation settings of ``kwargs``; ConfigError naming any field theseus cannot honour.

    ``where`` names the task in messages; ``eos`` (the end-of-text text) always stops generation.
    """
    kwargs = dict(kwargs or {})
    for key, neutral in NEUTRAL.items():
        if key in kwargs and kwargs[key] != neutral:
            raise ConfigError(
                f"{where} asks for generation_kwargs.{key}={kwargs[key]!r}, which theseus cannot honour "
                f"(it generates one sequence per request: {key} must be {neutral})"
            )
    unknown = sorted(set(kwargs) - {"until", "do_sample", *LENGTH_KEYS, *SAMPLING_KEYS, *NEUTRAL})
    if unknown:
        raise ConfigError(
            f"{where} asks for generation_kwargs.{unknown[0]}={kwargs[unknown[0]]!r}, which theseus cannot honour "
            "(it decodes greedily, or samples with temperature, top_k and top_p)"
        )
    until = kwargs.get("until")
    stops = [until] if isinstance(until, str) else list(until or [])
    if not all(isinstance(stop, str) for stop in stops):
        raise ConfigError(f"{where}: generation_kwargs.until={until!r} must be a string or a list of strings")
    if eos and eos not in stops:
        stops.append(eos)
    length = next((key for key in LENGTH_KEYS if kwargs.get(key) is not None), None)
    max_gen_toks = _number(kwargs, length, where, int) if length else DEFAULT_MAX_GEN_TOKS
    if max_gen_toks < 1:
        raise ConfigError(f"{where}: generation_kwargs.{length}={max_gen_toks} must be at least 1")
    temperature = _number(kwargs, "temperature", where, float) if kwargs.get("temperature") is not None else 0.0
    do_sample = kwargs.get("do_sample")
    if not (temperature > 0.0 if do_sample is None else bool(do_sample)):
        return Settings(tuple(stops), max_gen_toks)
    if not temperature > 0.0:
        raise ConfigError(
            f"{where} asks for generation_kwargs.do_sample=true with temperature={temperature:g}; "
            "sampling needs a temperature above 0 (or do_sample: false for greedy decoding)"
        )
    top_k = _number(kwargs, "top_k", where, int) if kwargs.get("top_k") is not None else 0
    top_p = _number(kwargs, "top_p", where, float) if kwargs.get("top_p") is not None else 1.0
    if top_k < 0:
        raise ConfigError(f"{where}: generation_kwargs.top_k={top_k} must be at least 0 (0 = off)")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"{where}: generation_kwargs.top_p={top_p:g} must lie in (0, 1] (1 = off)")
    return Settings(tuple(stops), max_gen_toks, temperature, top_k, top_p)


def cut(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first occurrence of each stop string in turn (empty stops ignored)."""
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


__all__ = ["DEFAULT_MAX_GEN_TOKS", "Settings", "cut", "settings"]
