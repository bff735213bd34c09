"""``theseus runs show NAME --rollouts [--step S]``: the rollouts a run logged (``rl/log_completions``),
one step's at a time, readable in a terminal.

Each rollout shows its place in the step's batch, its group, the weighted reward, each reward's score and
the advantage, then the prompt and every turn of the episode under its role. What the model wrote is shown
as it is, but for control characters (escape sequences, carriage returns), which appear as ``\\xNN``
escapes as ``theseus.tracking.status.printable`` writes them; line breaks stay line breaks. A record that
is not of the expected form shows what it holds of it rather than failing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from theseus.errors import ConfigError
from theseus.runs.records import read_rollouts
from theseus.tracking.status import printable

#: The most characters of one line of a text shown (records are bounded when written; this bounds a file
#: written by anything else).
LINE_CHARS = 20_000


def step_ranges(steps: Sequence[int]) -> str:
    """Steps as ascending ranges: ``1-3, 5, 8-9``."""
    spans: list[list[int]] = []
    for step in sorted(set(steps)):
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)


def shown_text(value: Any) -> str:
    """``value`` as text safe for a terminal: control characters escaped, line breaks kept."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return "\n".join(printable(line, LINE_CHARS) for line in text.split("\n"))


def number(value: Any) -> str:
    """A score as a short number (``-`` for anything else)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else shown_text(value)
    return f"{value:.4g}"


def logged_steps(records: Sequence[Mapping[str, Any]]) -> list[int]:
    """The steps the records belong to, ascending."""
    return sorted({int(r["step"]) for r in records if isinstance(r.get("step"), int)})


def step_records(path: Path, name: str, step: int | None) -> tuple[int, list[dict[str, Any]], list[int]] | None:
    """The step shown (``step``, else the last one logged), its records and every step logged; None when the
    run logged no rollouts. A step without rollouts is a ConfigError naming the steps that have them."""
    records = read_rollouts(path)
    steps = logged_steps(records)
    if not steps:
        return None
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise ConfigError(
            f"run {name!r} logged no rollouts at step {chosen}; it logged them at steps {step_ranges(steps)}"
        )
    return chosen, [r for r in records if r.get("step") == chosen], steps


def show_rollouts(path: Path, name: str, step: int | None, as_json: bool) -> None:
    """Print the rollouts of one step of run ``name`` (in ``path``), or one line saying it logged none."""
    found = step_records(path, name, step)
    if found is None:
        click.echo(
            f"run {name!r} logged no rollouts; train it with rl/log_completions=N (train/grpo, train/distill) "
            f"to write N rollouts a step to {path / 'rollouts.jsonl'}"
        )
        return
    chosen, records, steps = found
    if as_json:
        click.echo(json.dumps(records, indent=2, default=str))
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    console.print(
        Text(
            f"run {printable(name)}: {len(records)} rollouts at step {chosen} (logged at steps "
            f"{step_ranges(steps)}; --step S shows another)"
        )
    )
    for record in records:
        console.print()
        _print_rollout(console, record)


def _print_rollout(console: Any, record: Mapping[str, Any]) -> None:
    """One rollout: a rule naming it and its scores, then its rewards, prompt and turns by role."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    heading = f"rollout {number(record.get('index'))} · group {number(record.get('group'))}"
    heading += f" · reward {number(record.get('reward'))}"
    if "advantage" in record:
        heading += f" · advantage {number(record.get('advantage'))}"
    console.print(Rule(Text(heading), align="left", style="dim"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rewards = record.get("rewards")
    if isinstance(rewards, Mapping) and rewards:
        grid.add_row(Text("rewards"), Text(", ".join(f"{shown_text(k)} {number(v)}" for k, v in rewards.items())))
    if record.get("system"):
        grid.add_row(Text("system"), Text(shown_text(record["system"])))
    grid.add_row(Text("prompt"), Text(shown_text(record.get("prompt", ""))))
    turns = record.get("turns")
    for turn in turns if isinstance(turns, list) else []:
        if isinstance(turn, Mapping):
            grid.add_row(Text(shown_text(turn.get("role", "?"))), Text(shown_text(turn.get("content", ""))))
    console.print(grid)


__all__ = ["show_rollouts", "step_ranges", "step_records"]
