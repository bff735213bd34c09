"""Rollouts you can read (``rl/log_completions=N``): the first N rollouts of each step, written to the run
folder's ``rollouts.jsonl`` and sent to the trackers as a table.

Each record holds the step, the rollout's place in the step's batch and its group, the prompt (and its
system message), every turn of the episode (the policy's as ``assistant``, the environment's replies as
``tool``), each reward's score by name, the weighted reward and, where the trainer computes one, the
advantage. A text longer than :data:`MAX_TEXT` characters is cut, with a marker saying how much was left
out, so one record stays small whatever the policy writes. The file is written like ``metrics.jsonl``
(process 0 appends and flushes each step; a resumed run first drops the records after the step it resumes
from), and ``theseus runs show NAME --rollouts`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from theseus.model.rl.rollouts import Rollouts
from theseus.runs.layout import ROLLOUTS_FILE
from theseus.training.callbacks import Callback, StepInfo
from theseus.training.metrics import RecordLog

#: The most characters of one text (a prompt, a turn) a record keeps.
MAX_TEXT = 2000
#: The table the trackers receive each step.
TABLE = "rollouts"


def clipped(text: str, limit: int = MAX_TEXT) -> str:
    """``text``, or its first ``limit`` characters and a marker naming how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters]"


def rollout_records(
    done: Rollouts, step: int, count: int, group_size: int, advantages: Sequence[float] | np.ndarray | None = None
) -> list[dict[str, Any]]:
    """The first ``count`` rollouts of ``done`` (whole groups first: a prompt's completions side by side) as
    records of update ``step``, with their ``advantages`` where given."""
    records = []
    for index in range(min(count, len(done.rewards))):
        messages = done.transcripts[index] if index < len(done.transcripts) else []
        first_turn = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        prompt = {m["role"]: m["content"] for m in messages[:first_turn]}
        record: dict[str, Any] = {"step": step, "index": index, "group": index // group_size}
        if prompt.get("system"):
            record["system"] = clipped(prompt["system"])
        record["prompt"] = clipped(prompt.get("user", ""))
        record["turns"] = [{"role": m["role"], "content": clipped(m["content"])} for m in messages[first_turn:]]
        record["rewards"] = {name: float(scores[index]) for name, scores in done.per_reward.items()}
        record["reward"] = float(done.rewards[index])
        if advantages is not None:
            record["advantage"] = float(advantages[index])
        records.append(record)
    return records


def table(records: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The records as a tracker table: the step, the rollout, the prompt, the episode's turns as text
    (``role: content`` paragraphs), each reward, the reward and the advantage."""
    names = list(dict.fromkeys(name for r in records for name in r.get("rewards", {})))
    advantage = any("advantage" in r for r in records)
    columns = ["step", "index", "prompt", "turns", *(f"reward/{n}" for n in names), "reward"]
    columns += ["advantage"] if advantage else []
    rows = []
    for r in records:
        turns = "\n\n".join(f"{turn['role']}: {turn['content']}" for turn in r["turns"])
        row = [r["step"], r["index"], r["prompt"], turns, *(r["rewards"].get(n) for n in names), r["reward"]]
        rows.append(row + ([r.get("advantage")] if advantage else []))
    return columns, rows


class RolloutLog(Callback):
    """Writes the rollouts a trainer kept at each step (``pending()``) to ``rollouts.jsonl`` and the trackers;
    at the start of an invocation, cuts the file back to the step it resumes from."""

    on = ("start", "step")

    def __init__(self, pending: Any) -> None:
        self.pending = pending  # () -> the records kept since the last call
        self.log: RecordLog | None = None

    def __call__(self, info: StepInfo) -> None:
        if info.event == "start":
            main = jax.process_index() == 0
            self.log = RecordLog(info.run_dir / ROLLOUTS_FILE, resume_step=info.step, enabled=main)
            self.pending()  # nothing of an earlier invocation in this process
            return
        records = self.pending()
        if not records or self.log is None:
            return
        self.log.write(records)
        columns, rows = table(records)
        info.log_table(TABLE, columns, rows)


__all__ = ["MAX_TEXT", "TABLE", "RolloutLog", "clipped", "rollout_records", "table"]
