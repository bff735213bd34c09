"""Calling a reward on a batch of completions, and what a reward that raises does (``rl/reward_errors``).

A reward that raises, or gives a score that is no finite number, on some completion is found by
scoring the batch's completions one at a time. With ``stop`` (the default) that is a ``RewardError``:
one line naming the reward, the prompt and the completion; with ``zero`` the completion scores 0 and
is reported as a ``RewardFailure`` for the caller to count and show.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from theseus.errors import PluginError, RewardError, TheseusError, error_line

REWARD_ERRORS_KEY = "rl/reward_errors"
#: ``stop``: a reward that raises ends the run (one line); ``zero``: that completion scores 0.
REWARD_ERRORS = ("stop", "zero")
#: Characters of a prompt or a completion quoted in a message.
QUOTED = 60


def quoted(text: str, limit: int = QUOTED) -> str:
    """``text`` quoted on one line (newlines escaped), cut to ``limit`` characters with ``...``."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


@dataclass(frozen=True)
class RewardFailure:
    """A reward that raised on one completion: the reward, the prompt, the completion and the error."""

    reward: str
    prompt: str
    completion: str
    error: str

    def describe(self) -> str:
        """One line naming the reward, the error, the completion and the prompt (both truncated)."""
        return (
            f"reward {self.reward!r} raised {self.error} on the completion {quoted(self.completion)} "
            f"of the prompt {quoted(self.prompt)}"
        )


@dataclass
class Scored:
    """Scores of completions: the weighted ``total`` of each, each reward's ``per_reward`` scores, and
    the ``failures`` scored 0 (``on_error="zero"``)."""

    total: list[float]
    per_reward: dict[str, list[float]]
    failures: list[RewardFailure]


def _scores(name: str, values: Any, count: int) -> list[float]:
    """``values`` as ``count`` finite floats; ValueError for a value that is none, PluginError for a
    wrong count (the reward's contract, not one completion)."""
    values = list(values)
    if len(values) != count:
        raise PluginError(f"reward {name!r} returned {len(values)} scores for {count} completions")
    scores = []
    for value in values:
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"the score {number!r}, not a finite number")
        scores.append(number)
    return scores


def call_reward(
    name: str,
    reward: Callable[..., Sequence[float]],
    prompts: list[str],
    completions: list[str],
    metadata: list[Mapping[str, Any]],
    on_error: str = "stop",
) -> tuple[list[float], list[RewardFailure]]:
    """``reward``'s score of each completion and the completions it failed on (scored 0).

    When the batch raises, each completion is scored alone: with ``on_error="stop"`` the first that
    raises is a ``RewardError``, with ``"zero"`` every one that raises scores 0. A ``TheseusError`` from
    the reward (a configuration problem, such as a prompt without its reference answer) passes as it is.
    """
    if on_error not in REWARD_ERRORS:
        raise ValueError(f"on_error={on_error!r}; use one of: {', '.join(REWARD_ERRORS)}")
    try:
        return _scores(name, reward(prompts, completions, metadata), len(completions)), []
    except TheseusError:
        raise
    except Exception as batch_error:
        first_error: Exception = batch_error
    scores: list[float] = []
    failures: list[RewardFailure] = []
    for prompt, completion, meta in zip(prompts, completions, metadata, strict=True):
        try:
            scores.append(_scores(name, reward([prompt], [completion], [meta]), 1)[0])
            continue
        except TheseusError:
            raise
        except Exception as exc:
            failure = RewardFailure(name, prompt, completion, error_line(exc))
            if on_error == "stop":
                raise RewardError(
                    f"{failure.describe()}; fix the reward and run the same command to resume from the last "
                    f"checkpoint, or set {REWARD_ERRORS_KEY}=zero to score such completions 0"
                ) from exc
        failures.append(failure)
        scores.append(0.0)
    if not failures:
        raise RewardError(
            f"reward {name!r} raised {error_line(first_error)} on a batch of {len(completions)} completions but on "
            "none of them alone; a reward must score each completion on its own"
        ) from first_error
    return scores, failures


__all__ = ["REWARD_ERRORS", "REWARD_ERRORS_KEY", "RewardFailure", "Scored", "call_reward", "quoted"]
