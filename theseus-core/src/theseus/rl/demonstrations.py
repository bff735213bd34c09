"""``rl/demonstrations``: an environment's prompts with its reference solutions, written as chat data.

The supervised warm-up before reinforcement learning: ``theseus run rl/demonstrations
environment=arithmetic rl/demonstrations/out=arithmetic.jsonl``, then ``data/tokenize
data/dataset=chat data/chat/path=arithmetic.jsonl`` and an SFT run, whose chat template the GRPO
run then renders its prompts with (``rl/chat=true``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import click

from theseus.base.job import Job
from theseus.config import configuration, configure, field
from theseus.errors import ConfigError
from theseus.files import replace_file
from theseus.rl.environment import Environment, Prompt
from theseus.rl.selection import EnvironmentSelection, declared_environment
from theseus.training.selection import registered_name, select


@dataclass
class DemonstrationsConfig:
    """Where the conversations go and how many of each split."""

    out: str = field(
        "rl/demonstrations/out", default="", path="file", help="JSON-lines file to write (one conversation a line)"
    )
    count: int = field("rl/demonstrations/count", default=1000, min=1, help="conversations from the train split")
    val: int = field(
        "rl/demonstrations/val", default=100, min=0, help="conversations from the eval split, marked 'split': 'val'"
    )
    seed: int = field(
        "rl/demonstrations/seed", default=1, help="seed of the prompts drawn (GRPO draws its own with training/seed)"
    )


def conversation(environment: Environment, prompt: Prompt, split: str, name: str) -> dict[str, Any]:
    """One chat line: the prompt's messages and the environment's solution, as the assistant's turn or,
    for a solution of several turns, as its assistant and tool messages."""
    solution = environment.solution(prompt)
    if solution is None:
        raise ConfigError(
            f"environment {name!r} has no reference solutions to demonstrate; "
            "choose one that does (environment=arithmetic) or write its solution() method"
        )
    turns = (
        [{"role": "assistant", "content": solution}] if isinstance(solution, str) else solution_turns(solution, name)
    )
    line: dict[str, Any] = {"messages": [*prompt.messages, *turns]}
    if split == "eval":
        line["split"] = "val"
    return line


def solution_turns(solution: Any, name: str) -> list[dict[str, str]]:
    """A solution of several turns as chat messages; one ConfigError line naming the environment when it
    is not assistant and tool messages of text, assistant first and last, the two alternating."""
    fix = (
        f"environment {name!r}'s solution() must return a str or a list of "
        '{"role": "assistant"|"tool", "content": str} messages, assistant first and last, alternating'
    )
    try:
        turns = [{"role": m["role"], "content": m["content"]} for m in solution]
    except (TypeError, KeyError) as exc:
        raise ConfigError(f"{fix}; got {type(solution).__name__}") from exc
    roles = [m["role"] for m in turns]
    expected = ["assistant" if i % 2 == 0 else "tool" for i in range(len(turns))]
    if not turns or roles != expected or roles[-1] != "assistant":
        raise ConfigError(f"{fix}; got the roles {roles}")
    if not all(isinstance(m["content"], str) for m in turns):
        raise ConfigError(f"{fix}; a message's content is not text")
    return turns


class Demonstrations(Job):
    """Write ``rl/demonstrations/count`` train-split and ``rl/demonstrations/val`` eval-split prompts of
    ``ENVIRONMENT`` (``environment=`` selects another) with their reference solutions, as chat data."""

    CONFIG: ClassVar[type] = DemonstrationsConfig
    ENVIRONMENT: ClassVar[Any] = "arithmetic"

    @classmethod
    def config(cls) -> list[type]:
        return [DemonstrationsConfig, EnvironmentSelection, cls.environment_class()]

    @classmethod
    def selected(
        cls, file_values: Mapping[str, Any], overrides: Mapping[str, Any], root: Path | None = None
    ) -> tuple[type[Job], dict[str, Any], dict[str, Any]]:
        """This job with the environment a run selects by name (``environment=countdown``)."""
        return select(cls, file_values, overrides)

    @classmethod
    def environment_class(cls) -> type[Environment]:
        return declared_environment(cls)

    def run(self) -> None:
        args: DemonstrationsConfig = self.args
        if not args.out:
            raise ConfigError("rl/demonstrations/out is not set; name the JSON-lines file to write")
        with configuration(self.context.config):
            environment = configure(self.environment_class())
        name = registered_name("environment", self.ENVIRONMENT)
        train = environment.prompts("train", args.seed, 0, args.count)
        lines = [conversation(environment, p, "train", name) for p in train]
        if args.val:
            held_out = environment.prompts("eval", args.seed, 0, args.val)
            lines += [conversation(environment, p, "eval", name) for p in held_out]
        out = Path(args.out).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        replace_file(out, "".join(json.dumps(line) + "\n" for line in lines))
        click.echo(
            f"wrote {args.count} training and {args.val} validation conversations of environment {name!r} to {out}"
        )


__all__ = ["Demonstrations", "DemonstrationsConfig", "conversation", "solution_turns"]
