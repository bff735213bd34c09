"""``Environment`` and ``Prompt``: where reinforcement-learning prompts come from and how they are scored.

An environment is a registered component (``environment/<name>``): a dataclass whose ``field()``
attributes are its configuration keys (``environment/<name>/...``). It gives prompts, deterministic
in ``(split, seed, step)``, from a ``"train"`` and an ``"eval"`` split that never share a prompt,
and scores completions with weighted rewards (``reward/<name>`` components, see
``theseus.rl.rewards``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.base.declared import Declared
from theseus.errors import ConfigError
from theseus.rl.scoring import RewardFailure, Scored, call_reward

SPLITS = ("train", "eval")

#: A reward: ``reward(prompts, completions, metadata) -> scores``, one score per completion.
RewardFn = Callable[[list[str], list[str], list[Mapping[str, Any]]], Sequence[float]]


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, what scoring needs (``metadata["answer"]``: the reference answer), and
    an optional system message for chat models (``messages`` is the chat form)."""

    text: str
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    system: str = ""

    @property
    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (``[{"role": ..., "content": ...}]``)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.text}]


def rng(*parts: object) -> random.Random:
    """A generator seeded by ``parts`` alone (the same in every process, whatever PYTHONHASHSEED)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()
    return random.Random(int.from_bytes(digest, "big"))


def split_of(key: str, eval_fraction: float) -> str:
    """``"eval"`` for a stable ``eval_fraction`` of keys, ``"train"`` for the rest."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return "eval" if int.from_bytes(digest, "big") / 2**64 < eval_fraction else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")


class Environment(Declared):
    """Prompts for a policy to complete, and the rewards that score the completions.

    Subclasses are dataclasses (keys under ``environment/<name>/``) and implement ``prompts``; their
    ``name`` (a class attribute) is the registered ``<name>``: error messages name the environment by
    it (``label()``: the class name in lower case without it), and ``generate(self.name, ...)`` keys
    the prompts' draws with it;
    ``REWARDS`` names the registered rewards scored by default, with their weights (a run may
    choose others: ``rl/rewards=correct:1.0,format:0.2``); ``ACCURACY`` names the reward whose score
    of 1 means solved, which a trainer's ``accuracy`` counts (None: the environment has none).

    Episodes are single-turn by default. A multi-turn environment names ``STOP`` strings (such as
    ``</calc>``) and overrides ``respond``: a policy turn that writes one ends there, and ``respond``
    gets the prompt and the transcript so far (chat messages, the policy's turns as
    ``"assistant"``, earlier replies as ``"tool"``) and returns the environment's reply (a tool
    result, a hint), which the policy reads before its next turn, or ``None`` to end the episode.
    A turn that ends at the end of text ends the episode. The completion scored is the policy's
    turns joined. A trainer that only runs single turns can ignore the hook.
    """

    REWARDS: ClassVar[Mapping[str, float]] = {"correct": 1.0}
    #: Strings that end a policy turn and hand it to ``respond`` (none: single-turn episodes).
    STOP: ClassVar[tuple[str, ...]] = ()
    ACCURACY: ClassVar[str | None] = "correct"

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        """``count`` prompts of ``split`` (``"train"`` or ``"eval"``), the same for the same
        ``(split, seed, step)``."""
        raise NotImplementedError(f"{type(self).__qualname__}.prompts() is not implemented")

    def solution(self, prompt: Prompt) -> str | Sequence[Mapping[str, str]] | None:
        """A reference completion of ``prompt`` (the supervised warm-up's target, written by
        ``theseus run rl/demonstrations``), or None when the environment has none. A multi-turn
        environment may give a conversation instead: ``{"role": "assistant" | "tool", "content": ...}``
        messages, assistant first and last, each assistant turn but the last ending at one of ``STOP``
        and each tool message the reply ``respond`` gives to it; the warm-up learns the assistant turns."""
        return None

    def respond(self, prompt: Prompt, transcript: Sequence[Mapping[str, str]]) -> str | None:
        """The environment's reply to the policy's last turn, or None when the episode is over."""
        return None

    def reward(self, name: str) -> RewardFn:
        """The reward ``name`` (the registered ``reward/<name>``, configured), built once."""
        cache: dict[str, RewardFn] = self.__dict__.setdefault("_rewards", {})
        if name not in cache:
            from theseus.rl.selection import load_reward

            cache[name] = load_reward(name)
        return cache[name]

    def prepare_rewards(self, weights: Mapping[str, float] | None = None) -> None:
        """Build the rewards of ``weights`` (default ``REWARDS``) and let each load what it needs
        (``Reward.prepare``), before the first rollout."""
        from theseus.rl.rewards import Reward

        for name in dict(self.REWARDS if weights is None else weights):
            reward = self.reward(name)
            if isinstance(reward, Reward):
                reward.prepare()

    def score(
        self, prompts: Sequence[Prompt], completions: Sequence[str], weights: Mapping[str, float] | None = None
    ) -> tuple[list[float], dict[str, list[float]]]:
        """``(total, {reward: scores})`` of ``completions`` (one per prompt, in order): each reward's
        scores, and their sum weighted by ``weights`` (default ``REWARDS``); a reward that raises on a
        completion is a ``RewardError`` naming it, the prompt and the completion."""
        done = self.scored(prompts, completions, weights)
        return done.total, done.per_reward

    def scored(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[str],
        weights: Mapping[str, float] | None = None,
        on_error: str = "stop",
    ) -> Scored:
        """``score``'s totals and each reward's scores, with ``on_error`` (``rl/reward_errors``): ``"stop"``
        raises a ``RewardError`` for a reward that raises on a completion, ``"zero"`` scores that
        completion 0 for that reward and lists it in ``failures``."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        weights = dict(self.REWARDS if weights is None else weights)
        texts, metadata = [p.text for p in prompts], [p.metadata for p in prompts]
        scores: dict[str, list[float]] = {}
        failures: list[RewardFailure] = []
        for name in weights:
            scores[name], failed = call_reward(name, self.reward(name), texts, list(completions), metadata, on_error)
            failures += failed
        total = [sum(weights[name] * scores[name][i] for name in weights) for i in range(len(completions))]
        return Scored(total, scores, failures)

    def solved(self, per_reward: Mapping[str, Sequence[float]]) -> list[bool] | None:
        """Which completions are solved: those the ``ACCURACY`` reward scores 1 or more (None when that
        reward is not among ``per_reward``, the scores of each reward)."""
        if self.ACCURACY is None or self.ACCURACY not in per_reward:
            return None
        return [score >= 1.0 for score in per_reward[self.ACCURACY]]


#: How many problems ``generate`` draws for one prompt before it gives up.
MAX_TRIES = 1000


def generate(
    name: str,
    make: Callable[[random.Random], Prompt | None],
    split: str,
    seed: int,
    step: int,
    count: int,
    eval_fraction: float,
) -> list[Prompt]:
    """``count`` prompts drawn by ``make`` (None: draw again), keeping those whose text falls in
    ``split`` (``split_of``), so the splits never share a prompt; deterministic in (split, seed, step)."""
    check_split(split)
    draw = rng(name, split, seed, step)
    prompts: list[Prompt] = []
    for _ in range(count):
        for _ in range(MAX_TRIES):
            prompt = make(draw)
            if prompt is not None and split_of(prompt.text, eval_fraction) == split:
                prompts.append(prompt)
                break
        else:
            raise ConfigError(
                f"environment {name!r} found no {split} prompt in {MAX_TRIES} draws; "
                f"allow more problems (its difficulty keys) or change environment/{name}/eval_fraction"
            )
    return prompts
