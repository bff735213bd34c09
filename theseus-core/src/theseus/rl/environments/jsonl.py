"""``environment/jsonl``: prompts and reference answers from a local JSON-lines file.

Each line is an object with a prompt field and an answer field (GSM8K's ``question`` /
``answer``, MATH's ``problem`` / ``solution``: set the field keys). The reference answer is found
in the answer field by ``extract`` (``#### 72``, ``\\boxed{72}``, the last number, ...); the rows
are split into train and eval by a hash of the prompt (or ``eval_path`` holds the eval rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from theseus.config import field
from theseus.data.json_lines import json_lines
from theseus.errors import ConfigError
from theseus.rl.answers import EXTRACT_MODES, extract
from theseus.rl.environment import Environment, Prompt, check_split, rng, split_of

KEY = "environment/jsonl"


@dataclass
class JSONL(Environment):
    """Rows of a local ``.jsonl`` file, drawn without repeats within an epoch of each split."""

    name: ClassVar[str] = "jsonl"
    REWARDS: ClassVar[dict[str, float]] = {"correct": 1.0}

    path: str = field(f"{KEY}/path", path="file", help="JSON-lines file of prompt/answer rows")
    eval_path: str = field(
        f"{KEY}/eval_path", default="", path="file", help="file of eval rows ('' = hold out eval_fraction of path)"
    )
    prompt_field: str = field(f"{KEY}/prompt_field", default="prompt", help="field holding the prompt")
    answer_field: str = field(f"{KEY}/answer_field", default="answer", help="field holding the reference answer")
    extract: str = field(
        f"{KEY}/extract", default="auto", choices=EXTRACT_MODES, help="how the reference is found in the answer field"
    )
    template: str = field(f"{KEY}/template", default="{prompt}", help="prompt text; {prompt} stands for the row's")
    eval_fraction: float = field(
        f"{KEY}/eval_fraction", default=0.1, min=0.0, below=1.0, help="share of rows held out when eval_path is ''"
    )

    def __post_init__(self) -> None:
        if "{prompt}" not in self.template:
            raise ConfigError(f"{KEY}/template={self.template!r} must contain {{prompt}}")
        rows = self.read(self.path)
        if self.eval_path:
            held_out = self.read(self.eval_path)
            seen = {prompt.text for prompt in held_out}
            self.rows = {"train": [p for p in rows if p.text not in seen], "eval": held_out}
        else:
            self.rows = {
                split: [p for p in rows if split_of(p.text, self.eval_fraction) == split] for split in ("train", "eval")
            }
        self._orders: dict[tuple[str, int, int], list[int]] = {}

    def read(self, path: str) -> list[Prompt]:
        """The prompts of ``path``; a missing file or a bad line is one ConfigError naming it."""
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"{KEY}: no file {str(file)!r}; set {KEY}/path to a JSON-lines file")
        fix = f"fix the line or set {KEY}/path"
        prompts = [self.row(row, where) for where, row in json_lines(file, fix, error=ConfigError)]
        if not prompts:
            raise ConfigError(f"{KEY}: {file} holds no rows")
        return prompts

    def row(self, row: Any, where: str) -> Prompt:
        """The prompt of one parsed line, ``row``, at ``where`` (``path:line``)."""
        if not isinstance(row, dict):
            raise ConfigError(f"{KEY}: {where}: expected a JSON object, got {type(row).__name__}")
        for key, name in (("prompt_field", self.prompt_field), ("answer_field", self.answer_field)):
            if name not in row:
                raise ConfigError(
                    f"{KEY}: {where}: no field {name!r} (it has {', '.join(map(repr, row)) or 'none'}); set {KEY}/{key}"
                )
        answer = extract(str(row[self.answer_field]), self.extract)
        if answer is None:
            raise ConfigError(
                f"{KEY}: {where}: extract={self.extract} finds no answer in {str(row[self.answer_field])[-60:]!r}"
            )
        text = self.template.replace("{prompt}", str(row[self.prompt_field]))
        return Prompt(text, {"answer": answer})

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        check_split(split)
        rows = self.rows[split]
        if not rows:
            raise ConfigError(
                f"{KEY}: the {split} split is empty; give {KEY}/eval_path "
                f"or change {KEY}/eval_fraction={self.eval_fraction}"
            )
        picked = []
        for position in range(step * count, (step + 1) * count):
            epoch, index = divmod(position, len(rows))
            picked.append(rows[self.order(split, seed, epoch, len(rows))[index]])
        return picked

    def order(self, split: str, seed: int, epoch: int, size: int) -> list[int]:
        """The rows of ``split`` in the order of one epoch (a permutation keyed by seed and epoch)."""
        key = (split, seed, epoch)
        if key not in self._orders:
            if len(self._orders) > 8:
                self._orders.clear()
            self._orders[key] = rng(self.name, split, seed, epoch).sample(range(size), size)
        return self._orders[key]
