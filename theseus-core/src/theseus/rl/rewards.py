"""Built-in rewards: ``correct``, ``format`` and ``overlong``.

A reward is any callable ``reward(prompts, completions, metadata) -> list[float]`` on decoded
text, one score per completion (``metadata[i]`` belongs to ``completions[i]``: the prompt's metadata,
with ``completion_tokens`` and ``truncated`` from a trainer; ``theseus.rl.completions``), registered as
``reward/<name>``: a plain function, or a ``Reward`` dataclass whose ``field()`` attributes are its
configuration keys (``reward/<name>/...``), configured when it is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.base.declared import Declared
from theseus.config import field
from theseus.errors import ConfigError
from theseus.rl.answers import DEFAULT_TAG, EXTRACT_MODES, extract, same

#: The metadata key of a completion's length in tokens (set by a trainer; ``overlong`` reads it).
COMPLETION_TOKENS = "completion_tokens"
#: The metadata key saying a completion was cut at the token limit before its turn ended (set by a trainer).
TRUNCATED = "truncated"


class Reward(Declared):
    """A reward with configuration keys: a dataclass called like a reward function."""

    def __call__(self, prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
        raise NotImplementedError(f"{type(self).__qualname__}.__call__() is not implemented")

    def prepare(self) -> None:
        """Load what scoring needs (a model, a file), once before a run's first rollout: a reward that
        cannot work fails there, in one line, not after the first step's generation."""


def reference(metadata: Mapping[str, Any], reward: str) -> str:
    """``metadata["answer"]`` as text; a ConfigError when the prompt has none."""
    if "answer" not in metadata:
        raise ConfigError(
            f"reward {reward!r} needs each prompt's reference answer (metadata 'answer'); this one has none"
        )
    return str(metadata["answer"])


@dataclass
class Correct(Reward):
    """1.0 when the completion's answer equals the reference (numbers compared by value), else 0.0."""

    name: ClassVar[str] = "correct"

    extract: str = field(
        "reward/correct/extract",
        default="",
        choices=("", *EXTRACT_MODES),
        help="how the answer is found in a completion ('' = the prompt's metadata 'extract', else auto)",
    )
    tag: str = field("reward/correct/tag", default=DEFAULT_TAG, help="the answer tag the tag and auto modes read")

    def __call__(self, prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
        scores = []
        for completion, meta in zip(completions, metadata, strict=True):
            expected = reference(meta, self.name)
            found = extract(completion, self.extract or str(meta.get("extract", "auto")), self.tag)
            scores.append(1.0 if found is not None and same(found, expected) else 0.0)
        return scores


@dataclass
class Format(Reward):
    """1.0 when the completion holds exactly one non-empty ``<tag>...</tag>``, else 0.0."""

    name: ClassVar[str] = "format"

    tag: str = field("reward/format/tag", default=DEFAULT_TAG, help="the tag the answer must be inside")

    def __call__(self, prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
        opening, closing = f"<{self.tag}>", f"</{self.tag}>"
        pattern = re.compile(rf"{re.escape(opening)}(.*?){re.escape(closing)}", re.DOTALL)
        scores = []
        for completion in completions:
            found = pattern.findall(completion)
            once = completion.count(opening) == completion.count(closing) == len(found) == 1
            scores.append(1.0 if once and found[0].strip() else 0.0)
        return scores


@dataclass
class Overlong(Reward):
    """DAPO's soft overlong punishment: 0 up to ``max_length - buffer``, then linearly down to -1
    at ``max_length``, and -1 beyond. The length is ``metadata["completion_tokens"]`` (tokens) when
    the trainer gives it, else the completion's length in characters."""

    name: ClassVar[str] = "overlong"

    max_length: int = field(
        "reward/overlong/max_length", default=512, above=0, help="length scored -1 (tokens, else characters)"
    )
    buffer: int = field(
        "reward/overlong/buffer", default=128, min=0, help="length before max_length where -1 is ramped in"
    )

    def __post_init__(self) -> None:
        if self.buffer > self.max_length:
            raise ConfigError(
                f"reward/overlong/buffer={self.buffer} exceeds reward/overlong/max_length={self.max_length}; lower it"
            )

    def __call__(self, prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
        return [
            self.score(int(meta.get(COMPLETION_TOKENS, len(completion))))
            for completion, meta in zip(completions, metadata, strict=True)
        ]

    def score(self, length: int) -> float:
        """The punishment of one completion of ``length``."""
        start = self.max_length - self.buffer
        if length <= start:
            return 0.0
        if length > self.max_length:
            return -1.0
        return (start - length) / self.buffer
