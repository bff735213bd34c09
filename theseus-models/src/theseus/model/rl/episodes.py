"""Episodes: the policy's turns and the environment's replies after each prompt, as token rows.

A turn is generated up to ``rl/max_new_tokens`` tokens. It ends at a stop token (the tokenizer's end of
text, a checkpoint's end of turn: :mod:`theseus.model.rl.prompts`), which ends the episode, or at one of
the environment's stop strings (``Environment.STOP``, such as ``</calc>``): the turn is cut after the
token that completes the string, the environment's ``respond(prompt, transcript)`` gives its reply (a
tool result), whose tokens are appended after the policy's, and the policy writes its next turn after
them. With a chat template (``rl/chat``) the reply is rendered as the template renders a ``tool`` message
after the turn, closing the turn and opening the next assistant turn (``PolicyText.reply``); without one
it is appended as it is. ``respond`` returning None, ``rl/max_turns`` turns, or ``rl/max_episode_tokens``
tokens after the prompt (policy and environment together, within the sequence) end the episode. The environment's tokens
are marked as not the policy's (``Episode.learned``): no loss and no KL is taken on them. The text the
rewards score is the policy's turns joined.

An environment without stop strings has single-turn episodes: one generation, as before multi-turn
episodes existed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from theseus.errors import PluginError, TheseusError, error_line
from theseus.model.generation.decode import Completion
from theseus.model.rl.prompts import PolicyText
from theseus.rl.environment import Environment, Prompt, rng
from theseus.rl.scoring import quoted

#: Prompts (and later turns' contexts) are left-padded to a multiple of this many tokens, so that the
#: decoder compiles once for contexts of similar lengths.
WIDTH_STEP = 32
#: Rollout and turn seeds are kept below 2**31 (the decoder takes an int32).
SEED_RANGE = 2**31

#: ``generate(contexts, max_new_tokens, width, seed) -> completions``: the decoder with the policy's
#: current parameters and the rollout's sampling settings.
Generate = Callable[[list[list[int]], int, int, int], list[Completion]]


@dataclass
class Episode:
    """One prompt's episode: ``tokens`` after the prompt (the policy's turns with their stop tokens and
    the environment's replies), ``learned`` per token (written by the policy), whether it ended at a stop
    token, whether its last turn ran out of tokens (``rl/max_new_tokens`` or the episode's budget) rather
    than ending at a stop token or string, the policy's text (its turns joined) and how many tokens it
    wrote (stop tokens left out)."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    learned: list[bool] = field(default_factory=list)
    stopped: bool = False
    truncated: bool = False
    text: str = ""
    written: int = 0
    turns: int = 0
    transcript: list[dict[str, str]] = field(default_factory=list)
    open: bool = True

    @property
    def policy_tokens(self) -> list[int]:
        """The tokens the policy wrote, stop tokens left out (what ``completion_tokens`` counts)."""
        mine = [t for t, learned in zip(self.tokens, self.learned, strict=True) if learned]
        return mine[: self.written]

    def add(self, ids: Sequence[int], learned: bool) -> None:
        self.tokens += list(ids)
        self.learned += [learned] * len(ids)


@dataclass(frozen=True)
class Limits:
    """``rl/max_new_tokens`` per turn, ``rl/max_turns``, ``rl/max_episode_tokens`` (0: what the sequence
    holds after the prompt) and the sequence length rows are trained at."""

    max_new_tokens: int
    max_turns: int
    max_episode_tokens: int
    sequence_length: int

    def longest_completion(self, multi_turn: bool) -> int:
        """The most tokens an episode holds after its prompt (dr_grpo's constant normaliser, TRL's
        ``max_completion_length``): one turn, or ``max_turns`` of them within the episode's budget."""
        if not multi_turn:
            return self.max_new_tokens
        cap = self.budget(0)  # the episode's budget after an empty prompt: what the sequence holds at most
        return max(self.max_new_tokens, min(self.max_turns * self.max_new_tokens, cap))

    def budget(self, prompt: int) -> int:
        """The tokens an episode may hold after a prompt of ``prompt`` tokens."""
        room = self.sequence_length - prompt
        return min(room, self.max_episode_tokens) if self.max_episode_tokens > 0 else room


def policy_turns(learned: Sequence[bool]) -> int:
    """The policy's turns in an episode: one, and one more after each of the environment's replies."""
    return 1 + sum(1 for i, mine in enumerate(learned) if mine and i and not learned[i - 1])


def padded_width(longest: int, limits: Limits) -> int:
    """``longest`` rounded up to a multiple of ``WIDTH_STEP``, leaving room for a turn where it can."""
    rounded = -(-longest // WIDTH_STEP) * WIDTH_STEP
    return max(longest, min(rounded, limits.sequence_length - limits.max_new_tokens))


def stop_strings(environment: Environment) -> tuple[str, ...]:
    """The strings that end a turn (``Environment.STOP``): an environment that names any is multi-turn."""
    return tuple(getattr(environment, "STOP", ()) or ())


def stop_cut(text: PolicyText, tokens: Sequence[int], stops: Sequence[str]) -> int | None:
    """How many of ``tokens`` the turn keeps when it holds a stop string: up to the token that completes
    the first one; None when it holds none. A longer prefix's text extends a shorter one's, so the
    shortest prefix holding a stop string is found by bisection (a few decodes, not one per token)."""

    def holds(k: int) -> bool:
        return any(s in text.tokenizer.decode(tokens[:k]) for s in stops)

    if not stops or not holds(len(tokens)):
        return None
    return bisect.bisect_left(range(1, len(tokens) + 1), True, key=holds) + 1


def turn_seed(seed: int, turn: int) -> int:
    """The decoder's seed of a turn: the rollout's own for the first, one drawn from it for the others."""
    return seed if turn == 0 else rng("turn", seed, turn).randrange(SEED_RANGE)


def run_episodes(
    generate: Generate,
    text: PolicyText,
    environment: Environment,
    prompts: Sequence[Prompt],
    encoded: Sequence[list[int]],
    limits: Limits,
    seed: int,
) -> list[Episode]:
    """The episodes of ``prompts`` (``encoded``: their ids), all rows generated together each turn."""
    stops = stop_strings(environment)
    episodes = [Episode(list(ids), transcript=list(p.messages)) for p, ids in zip(prompts, encoded, strict=True)]
    turns = limits.max_turns if stops else 1
    for turn in range(turns):
        if not any(e.open for e in episodes):
            break
        # every row each turn (finished ones as their prompt): one batch shape, one compile
        contexts = [e.prompt + e.tokens if e.open else e.prompt for e in episodes]
        width = padded_width(max(len(c) for c in contexts), limits)
        new = min(limits.max_new_tokens, limits.sequence_length - width)
        done = generate(contexts, new, width, turn_seed(seed, turn))
        for prompt, episode, completion in zip(prompts, episodes, done, strict=True):
            if episode.open:
                _take_turn(text, environment, stops, prompt, episode, completion, limits)
    return episodes


def _take_turn(
    text: PolicyText,
    environment: Environment,
    stops: tuple[str, ...],
    prompt: Prompt,
    episode: Episode,
    completion: Completion,
    limits: Limits,
) -> None:
    """Add the policy's turn to ``episode`` and, where it ended at a stop string, the environment's reply."""
    room = limits.budget(len(episode.prompt)) - len(episode.tokens)
    cut = stop_cut(text, completion.tokens, stops)
    written = completion.tokens[:cut] if cut is not None else completion.tokens
    ended = completion.stopped and cut is None
    if len(written) + int(ended) > room:  # the episode's budget ends the turn
        written, ended, cut = written[:room], False, None
    episode.turns += 1
    episode.truncated = not ended and cut is None
    episode.add(written, True)
    words = text.tokenizer.decode(written)
    episode.text += words
    episode.written += len(written)
    episode.transcript.append({"role": "assistant", "content": words})
    episode.open = False
    if ended:
        assert completion.stop is not None
        episode.add([completion.stop], True)
        episode.stopped = True
        return
    if cut is None or episode.turns >= limits.max_turns:
        return
    reply = environment_reply(environment, prompt, episode.transcript)
    if reply is None:
        return
    ids = list(text.tokenizer.encode(text.reply(episode.transcript, reply)))
    if len(episode.tokens) + len(ids) >= limits.budget(len(episode.prompt)):  # no room to answer after it
        return
    episode.add(ids, False)
    episode.transcript.append({"role": "tool", "content": reply})
    episode.open = True


def environment_reply(environment: Environment, prompt: Prompt, transcript: Sequence[dict[str, str]]) -> str | None:
    """``environment.respond``'s reply to the transcript's last turn; a ``respond`` that raises or
    returns no text is a ``PluginError`` naming the environment, the turn and the prompt (the run stops
    before the step's update, so the same command resumes from the last checkpoint)."""
    where = f"to the turn {quoted(transcript[-1]['content'])} of the prompt {quoted(prompt.text)}"
    name = f"environment {environment.label()!r}"
    try:
        reply = environment.respond(prompt, list(transcript))
    except TheseusError:
        raise
    except Exception as exc:
        raise PluginError(
            f"{name} raised {error_line(exc)} in respond() {where}; fix the environment and run the same command to "
            "resume from the last checkpoint"
        ) from exc
    if reply is not None and not isinstance(reply, str):
        raise PluginError(
            f"{name} returned {type(reply).__name__} from respond() {where}; return a str, or None to end"
        )
    return reply


__all__ = [
    "WIDTH_STEP",
    "Episode",
    "Generate",
    "Limits",
    "environment_reply",
    "padded_width",
    "policy_turns",
    "run_episodes",
    "stop_cut",
    "stop_strings",
]
