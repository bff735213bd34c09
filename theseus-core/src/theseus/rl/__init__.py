"""Reinforcement learning's inputs: environments that give prompts and rewards that score completions.

Both are plugin components, listed by ``theseus components --kind environment|reward``:

- ``environment/<name>``: an ``Environment`` dataclass (keys ``environment/<name>/...``);
- ``reward/<name>``: a callable ``reward(prompts, completions, metadata) -> list[float]``, a plain
  function or a ``Reward`` dataclass (keys ``reward/<name>/...``).

Nothing here imports jax.
"""

from theseus.rl.completions import end_marker, reward_text
from theseus.rl.environment import SPLITS, Environment, Prompt, RewardFn
from theseus.rl.rewards import COMPLETION_TOKENS, TRUNCATED, Correct, Format, Overlong, Reward
from theseus.rl.scoring import REWARD_ERRORS, REWARD_ERRORS_KEY, RewardFailure, Scored
from theseus.rl.selection import (
    REWARDS_KEY,
    environment_class,
    load_environment,
    load_reward,
    parse_weights,
    reward_config,
)

__all__ = [
    "COMPLETION_TOKENS",
    "REWARDS_KEY",
    "REWARD_ERRORS",
    "REWARD_ERRORS_KEY",
    "SPLITS",
    "TRUNCATED",
    "Correct",
    "Environment",
    "Format",
    "Overlong",
    "Prompt",
    "Reward",
    "RewardFailure",
    "RewardFn",
    "Scored",
    "end_marker",
    "environment_class",
    "load_environment",
    "load_reward",
    "parse_weights",
    "reward_config",
    "reward_text",
]
